"""``parallel``: branches of a body on threads of their own, one scope each.

A fork takes a step id of its own (``everystep_id=`` names it); the steps of
its branch ``i`` get ids under ``<fork id>.<i>.``. Every branch runs to its
end, so healthy branches are recorded while another fails; then the
branches' errors are raised by one rule (``raise_branch_errors``), which
``gather`` (``everystep.async_steps``) shares.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any

from . import recording
from .context import NOT_AN_INTERRUPT, Context, SCOPE, interrupt_rank, recording_context
from .errors import EverystepError, Suspended


def run_parallel(branches: tuple[Any, ...], name: str | None) -> tuple[Any, ...]:
    """Run branches on threads; results in branch order. See ``api.parallel``."""
    bodies = [_branch_body(branch, index) for index, branch in enumerate(branches)]
    ctx = recording_context()
    if ctx is None:
        return _gather([(body, None) for body in bodies])
    ex = ctx.execution
    fork_id = recording.next_step_id(ex, ctx, name)
    token = ex.observer.fork_started(ctx, fork_id, len(bodies))
    error: BaseException | None = None
    try:
        return _gather([(body, ctx.branch(fork_id, index)) for index, body in enumerate(bodies)])
    except BaseException as exc:
        error = exc
        raise
    finally:
        ex.observer.fork_finished(ctx, fork_id, error, token)


def _branch_body(branch: Any, index: int) -> Callable[[], Any]:
    if callable(branch):
        body: Callable[[], Any] = branch
        return body
    if isinstance(branch, (list, tuple)) and all(callable(item) for item in branch):
        return lambda: tuple(item() for item in branch)
    raise EverystepError(
        f"parallel branch {index} must be a zero-argument callable or a list of them, not {type(branch).__name__}"
    )


def _gather(jobs: list[tuple[Callable[[], Any], Context | None]]) -> tuple[Any, ...]:
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException | None] = [None] * len(jobs)

    def run(index: int, body: Callable[[], Any], scope: Context | None) -> None:
        SCOPE.set(scope)
        try:
            results[index] = body()
        except BaseException as exc:  # re-raised in the caller's thread
            errors[index] = exc

    threads = []
    for index, (body, scope) in enumerate(jobs):
        # Each branch runs in a copy of the caller's contextvars, so tracing
        # context follows it onto its thread.
        context = contextvars.copy_context()
        thread = threading.Thread(
            target=context.run, args=(run, index, body, scope), name=f"everystep-branch-{index}", daemon=True
        )
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    raise_branch_errors([error for error in errors if error is not None])
    return tuple(results)


def raise_branch_errors(errors: list[BaseException]) -> None:
    """One failure re-raises as is, several as ``ExceptionGroup``; interrupts
    (crash, lost claim, cancel, ``Terminal``, ``EffectUncertain``, drain) come
    first, and anything that is not an ``Exception`` (KeyboardInterrupt)
    before all. A branch that waits (``Suspended``) comes after interrupts and
    before failures: the fork cannot return before that branch is done, so
    the run waits; the failures are recorded and re-raised on the replay
    that finds every branch settled."""
    if not errors:
        return
    for error in errors:
        if not isinstance(error, (Exception, Suspended)):
            raise error
    interrupts = [error for error in errors if interrupt_rank(error) < NOT_AN_INTERRUPT]
    if interrupts:
        raise min(interrupts, key=interrupt_rank)
    waiting = [error for error in errors if isinstance(error, Suspended)]
    if waiting:
        raise min(waiting, key=lambda suspended: suspended.wake_at)
    if len(errors) == 1:
        raise errors[0]
    raise ExceptionGroup(f"{len(errors)} parallel branches failed", errors)  # type: ignore[type-var]


__all__ = ["raise_branch_errors", "run_parallel"]
