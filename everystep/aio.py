"""asyncio: async workflows and steps, on the one recording path.

An ``async def`` workflow runs on an event loop of its own, started for the
run on the thread that executes it (``run_body``): a supervisor child's
main thread, or one of the threaded worker's pool threads. The process (a
supervisor child) stays the unit that is killed: a step timeout, a cancel
or a budget ends an async step exactly as a sync one, by the parent's
SIGKILL of the child.

Inside an async body, a step call is an awaitable (``step_call``), and
its position is taken when it is awaited (a coroutine does nothing until
then). Awaited, it goes through ``runner.step_phases``, the generator every
step call goes through: replay, begin, then the record. Only the call of
the step's own function differs:

- an async step is awaited on the loop, so many of them (``gather``) wait
  on I/O at once; its record is then written from a worker thread, so the
  records of concurrent steps are written side by side (a transactional
  step's on the loop's thread, in the task whose context holds its
  transaction);
- a sync step runs whole, record included, in a worker thread
  (``asyncio.to_thread``), so it does not block the loop.

A sync workflow may call an async step: the step's coroutine runs to its
end on a loop owned by the calling thread (``blocking``), and its record
is the same.

``gather`` is the async form of ``parallel``: the same fork id, branch
prefixes and error rules (``runner.raise_branch_errors``), branches as
tasks on the run's loop, each in its own copy of the context (so each
has its own step-id scope). The waits (``sleep``, ``recv``, a child's
result) run their sync form in a worker thread: their writes are the
same, and a wait unwinds the body with ``Suspended`` as it does in a sync
one.

Step budgets: an async step is measured as a sync one (its cost is written
with its row) and its memory limit holds (the process's RLIMIT_DATA); its
CPU limit is held by the parent's backstop kill, since SIGXCPU cannot raise
inside a coroutine without breaking the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from .context import Context, _current, _in_step, recording_context
from .errors import EverystepError

if TYPE_CHECKING:
    from .api import StepFunction
    from .context import Flag
    from .models import Outcome, Run
    from .observer import Observer
    from .resources import StepGauge
    from .store import Store

T = TypeVar("T")


def is_async(fn: Any) -> bool:
    """Whether ``fn`` is an ``async def`` function (a step or a body)."""
    return inspect.iscoroutinefunction(fn)


def loop_running() -> bool:
    """Whether an event loop runs on this thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


#: True in the context an async workflow body runs in (and the tasks it
#: starts, which copy it). A loop running on the thread is not enough to
#: say a step call comes from an async body: a sync body may run on a
#: thread where someone else's loop runs (a test driving a browser, a
#: notebook).
_async_body: contextvars.ContextVar[bool] = contextvars.ContextVar("everystep_async_body", default=False)


def in_async_body() -> bool:
    """Whether a step called here is called from an async workflow body:
    its context says so and its loop runs on this thread. (The worker
    thread of a sync step called from an async body has the context, not
    the loop: its steps run there and then.)"""
    return _async_body.get() and loop_running()


async def _as_body(body: Coroutine[Any, Any, Any]) -> Any:
    _async_body.set(True)
    return await body


def run_body(fn: Callable[..., Coroutine[Any, Any, Any]], args: tuple[Any, ...] | list[Any]) -> Any:
    """Run an async workflow body to its end on a new event loop, in this
    thread's context (the run's ``Context`` goes with it). The loop is
    closed when the body ends, with whatever tasks it left cancelled."""
    return asyncio.run(_as_body(fn(*args)))


def call_body(fn: Callable[..., Any], args: tuple[Any, ...] | list[Any]) -> Any:
    """A workflow body, sync or async, run to its end on this thread."""
    return run_body(fn, args) if is_async(fn) else fn(*args)


# -- a sync caller of an async step ------------------------------------------------

_loops = threading.local()


def blocking(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """``fn`` (async) as a plain function: each call runs its coroutine to
    the end on a loop of this thread. The main thread (a supervisor child's)
    keeps its loop for later calls; a short-lived thread (a ``parallel``
    branch) gets one per call, closed after it."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> T:
        if loop_running():  # someone else's loop runs here (a notebook's): the step gets a thread of its own
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="everystep-async-step") as pool:
                return pool.submit(contextvars.copy_context().run, asyncio.run, fn(*args, **kwargs)).result()
        if threading.current_thread() is not threading.main_thread():
            return asyncio.run(fn(*args, **kwargs))
        runner: asyncio.Runner | None = getattr(_loops, "runner", None)
        if runner is None:
            runner = _loops.runner = asyncio.Runner()
        return runner.run(fn(*args, **kwargs), context=contextvars.copy_context())

    return call


# -- steps in an async body --------------------------------------------------------


async def step_call(step: StepFunction, args: tuple[Any, ...], kwargs: dict[str, Any], name: str | None) -> Any:
    """One step call in an async body, awaited: see the module docstring."""
    from . import runner

    ctx = recording_context()
    if ctx is None:  # awaited where nothing records (inside a step's own code)
        result = step.fn(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result
    if not step.is_async:
        return await asyncio.to_thread(runner.run_step, ctx, step, args, kwargs, name)
    phases = runner.step_phases(ctx, step, args, kwargs, name)
    done, gauge = runner.advance(phases, None)
    if done:
        return gauge  # replayed: the recorded outcome
    try:
        ended = await _invoke(step, args, kwargs, gauge)
    except BaseException:
        phases.close()  # the task was cancelled, the process is going away: nothing is recorded
        raise
    if step.transactional:
        # Its transaction is this task's context (``step_connection()``):
        # the record commits with it, here.
        done, value = runner.advance(phases, ended)
    else:
        # The record's write in a worker thread: the loop goes on, and the
        # records of a gather's steps are written side by side.
        done, value = await asyncio.to_thread(runner.advance, phases, ended)
    assert done, "a step's phases yield once"
    return value


async def _invoke(step: StepFunction, args: tuple[Any, ...], kwargs: dict[str, Any],
                  gauge: StepGauge | None) -> tuple[Any, Exception | None]:
    """Await the step's coroutine, inside the step (nested step calls are
    plain calls): (its result, None) or (None, its exception)."""
    token = _in_step.set(True)
    try:
        return await step.fn(*args, **kwargs), None
    except MemoryError as exc:
        return None, gauge.failed(exc) if gauge is not None else exc
    except Exception as exc:
        return None, exc
    finally:
        _in_step.reset(token)


# -- gather ------------------------------------------------------------------------


async def gather(branches: tuple[Any, ...], name: str | None) -> tuple[Any, ...]:
    """Run branches concurrently as tasks on the running loop; results in
    branch order. See ``everystep.gather``."""
    from . import runner

    bodies = [_branch_body(branch, index) for index, branch in enumerate(branches)]
    ctx = recording_context()
    if ctx is None:
        return await _all([(body, None) for body in bodies])
    ex = ctx.execution
    fork_id = runner.next_step_id(ex, ctx, name)
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
    from . import runner

    async def branch(body: Callable[[], Awaitable[Any]], scope: Context | None) -> Any:
        _current.set(scope)  # this task's own copy of the context
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
    runner.raise_branch_errors(errors)
    return tuple(task.result() for task in tasks)


# -- many runs on one loop (the threaded worker) ---------------------------------------


async def execute_guarded(store: Store, run: Run, *, claimer: str, draining: Flag | None = None,
                          observer: Observer | None = None) -> Outcome:
    """``runner.execute_guarded`` of an async run, as a task on a loop that
    other runs share (``SharedLoop``). The same phases as ``execute``
    (``start_execution``, the body, ``finish_execution``) and the same
    guard; what touches the database before and after the body runs in a
    worker thread, so the loop goes on with the other runs meanwhile."""
    from . import runner

    try:
        status = await _execute(store, run, claimer, draining, observer)
    except BaseException as exc:
        status = await asyncio.to_thread(runner.guarded_failure, store, run, claimer, exc)
    return await asyncio.to_thread(runner.guarded_status, store, run, claimer, status)


async def _execute(store: Store, run: Run, claimer: str, draining: Flag | None,
                   observer: Observer | None) -> Outcome:
    from . import runner

    ex, ctx, token, workflow = await asyncio.to_thread(runner.start_execution, store, run, claimer, draining,
                                                       observer, None)
    raised: BaseException | None = None
    value: Any = None
    _current.set(ctx)  # this task's own context: the run's scope
    try:
        if workflow is None:
            raised = runner.unregistered(run)
        else:
            value = await _as_body(workflow.fn(*run.args))
    except BaseException as exc:
        raised = runner.body_raised(ctx, token, exc)
    return await asyncio.to_thread(runner.finish_execution, ctx, token, value, raised)


class SharedLoop:
    """One event loop on a thread of its own, holding many async runs at
    once (the threaded worker's): each run is a task, and each waits on
    I/O without holding a thread. Its default executor (``to_thread``: sync
    steps, the runs' database writes) has ``threads`` threads."""

    def __init__(self, threads: int = 32) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="everystep-async"))
        self.thread = threading.Thread(target=self._run, name="everystep-async-runs", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` as a task on the loop; its future, for any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the tasks still on the loop (runs given back past a drain
        deadline), give them ``timeout`` seconds to unwind, then stop the
        loop and close it once its thread ended."""

        async def wind_down() -> None:
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=timeout)

        with contextlib.suppress(Exception):
            self.submit(wind_down()).result(timeout + 5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
        if not self.thread.is_alive():
            self.loop.close()


# -- waits -------------------------------------------------------------------------


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn`` (a sync wait or a database call) in a worker thread, in this
    task's context (the run's scope goes with it)."""
    return await asyncio.to_thread(fn, *args, **kwargs)


__all__ = ["SharedLoop", "blocking", "call_body", "execute_guarded", "gather", "in_thread", "is_async",
           "in_async_body", "loop_running", "run_body", "step_call"]
