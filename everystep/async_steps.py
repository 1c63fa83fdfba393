"""Steps and forks in an async workflow body.

Inside an async body a step call is an awaitable (``step_call``), and its
position is taken when it is awaited (a coroutine does nothing until then).
Awaited, it goes through ``steps.step_phases``, the generator every step
call goes through: replay, begin, then the record. Only the call of the
step's own function differs:

- an async step is awaited on the loop, so many of them (``gather``) wait
  on I/O at once; its record is then written from a worker thread, so the
  records of concurrent steps are written side by side (a transactional
  step's on the loop's thread, in the task whose context holds its
  transaction);
- a sync step runs whole, record included, in a worker thread
  (``asyncio.to_thread``), so it does not block the loop.

``gather`` is the async form of ``parallel``: the same fork id, branch
prefixes and error rules (``forks.raise_branch_errors``), branches as tasks
on the run's loop, each in its own copy of the context (so each has its
own step-id scope). The waits (``sleep``, ``recv``, a child's result) run
their sync form in a worker thread (``loops.in_thread``): their writes are
the same, and a wait unwinds the body with ``Suspended`` as it does in a
sync one.

Step budgets: an async step is measured as a sync one (its cost is written
with its row) and its memory limit holds (the process's RLIMIT_DATA); its
CPU limit is held by the parent's backstop kill, since SIGXCPU cannot raise
inside a coroutine without breaking the loop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from . import forks, recording, stream_batches, steps
from .context import Context, StepGauge, SCOPE, IN_STEP, recording_context
from .errors import EverystepError
from .registry import DeclaredStep


async def step_call(step: DeclaredStep, args: tuple[Any, ...], kwargs: dict[str, Any], name: str | None) -> Any:
    """One step call in an async body, awaited: see the module docstring."""
    ctx = recording_context()
    if ctx is None:  # awaited where nothing records (inside a step's own code)
        result = step.fn(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result
    if not step.is_async:
        return await asyncio.to_thread(steps.run_step, ctx, step, args, kwargs, name)
    step_id = recording.next_step_id(ctx.execution, ctx, name)
    phases = steps.step_phases(ctx, step, args, kwargs, step_id)
    done, gauge = steps.advance(phases, None)
    if done:
        return gauge  # replayed: the recorded outcome
    try:
        ended = await _invoke(step, args, kwargs, gauge, step_id)
    except BaseException:
        phases.close()  # the task was cancelled, the process is going away: nothing is recorded
        raise
    if step.transactional:
        # Its transaction is this task's context (``step_connection()``):
        # the record commits with it, here.
        done, value = steps.advance(phases, ended)
    else:
        # The record's write in a worker thread: the loop goes on, and the
        # records of a gather's steps are written side by side.
        done, value = await asyncio.to_thread(steps.advance, phases, ended)
    assert done, "a step's phases yield once"
    return value


async def _invoke(step: DeclaredStep, args: tuple[Any, ...], kwargs: dict[str, Any],
                  gauge: StepGauge | None, step_id: str) -> tuple[Any, Exception | None]:
    """Await the step's coroutine, inside the step (nested step calls are
    plain calls): (its result, None) or (None, its exception)."""
    token = IN_STEP.set(step_id)
    try:
        result = await step.fn(*args, **kwargs)
        # The values its code wrote to streams commit before its record
        # (``stream_batches``); a refusal of them is its failure.
        if stream_batches.active():
            await asyncio.to_thread(stream_batches.settle, step_id)
        return result, None
    except MemoryError as exc:
        if stream_batches.active():
            await asyncio.to_thread(stream_batches.settle, step_id, True)
        return None, gauge.failed(exc) if gauge is not None else exc
    except Exception as exc:
        if stream_batches.active():
            await asyncio.to_thread(stream_batches.settle, step_id, True)
        return None, exc
    finally:
        IN_STEP.reset(token)


async def gather(branches: tuple[Any, ...], name: str | None) -> tuple[Any, ...]:
    """Run branches concurrently as tasks on the running loop; results in
    branch order. See ``everystep.gather``."""
    bodies = [_branch_body(branch, index) for index, branch in enumerate(branches)]
    ctx = recording_context()
    if ctx is None:
        return await _all([(body, None) for body in bodies])
    ex = ctx.execution
    fork_id = recording.next_step_id(ex, ctx, name)
    token = ex.observer.fork_started(ctx, fork_id, len(bodies))
    error: BaseException | None = None
    try:
        return await _all([(body, ctx.branch(fork_id, index)) for index, body in enumerate(bodies)])
    except BaseException as exc:
        error = exc
        raise
    finally:
        ex.observer.fork_finished(ctx, fork_id, error, token)


def _branch_body(branch: Any, index: int) -> Callable[[], Awaitable[Any]]:
    """A branch as one coroutine function: an awaitable (a step call, a
    coroutine), a zero-argument callable (its result awaited if it is
    awaitable), or a list of those, run in sequence (a tuple of results)."""
    if inspect.isawaitable(branch):
        async def awaited() -> Any:
            return await branch
        return awaited
    if callable(branch):
        return functools.partial(_call, branch)
    if isinstance(branch, (list, tuple)) and all(callable(item) or inspect.isawaitable(item) for item in branch):
        items = [_branch_body(item, index) for item in branch]

        async def in_sequence() -> tuple[Any, ...]:
            return tuple([await item() for item in items])
        return in_sequence
    raise EverystepError(
        f"gather branch {index} must be an awaitable, a zero-argument callable or a list of them, "
        f"not {type(branch).__name__}"
    )


async def _call(fn: Callable[[], Any]) -> Any:
    result = fn()
    return await result if inspect.isawaitable(result) else result


async def _all(jobs: list[tuple[Callable[[], Awaitable[Any]], Context | None]]) -> tuple[Any, ...]:
    """Every branch to its end (healthy ones complete and are recorded
    while another fails), then the branch error rules of ``parallel``."""
    async def branch(body: Callable[[], Awaitable[Any]], scope: Context | None) -> Any:
        SCOPE.set(scope)  # this task's own copy of the context
        return await body()

    tasks = [asyncio.ensure_future(branch(body, scope)) for body, scope in jobs]
    if not tasks:
        return ()
    try:
        await asyncio.wait(tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
    errors = [error for error in (task.exception() for task in tasks) if error is not None]
    forks.raise_branch_errors(errors)
    return tuple(task.result() for task in tasks)


__all__ = ["gather", "step_call"]
