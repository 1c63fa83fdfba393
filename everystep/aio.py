"""Async runs: an async workflow body executed by a runner.

An ``async def`` workflow runs on an event loop of its own, started for the
run on the thread that executes it (``loops.run_body``: a supervisor
child's main thread, or one of the threaded worker's pool threads). The
process (a supervisor child) stays the unit that is killed: a step timeout,
a cancel or a budget ends an async step exactly as a sync one, by the
parent's SIGKILL of the child. The steps and forks inside such a body are
``everystep.async_steps``.

The threaded worker may hold many async runs on one loop (``SharedLoop``):
each run is a task (``execute_guarded``), with the same phases and guard as
``runner.execute_guarded``; what touches the database before and after the
body runs in a worker thread, so the loop goes on with the other runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from . import loops, runner
from .context import Flag, SCOPE
from .models import Outcome, Run
from .context import Observer
from .store import Store

T = TypeVar("T")


async def execute_guarded(store: Store, run: Run, *, claimer: str, draining: Flag | None = None,
                          observer: Observer | None = None) -> Outcome:
    """``runner.execute_guarded`` of an async run, as a task on a loop that
    other runs share (``SharedLoop``). The same phases as ``execute``
    (``start_execution``, the body, ``finish_execution``) and the same
    guard; what touches the database before and after the body runs in a
    worker thread, so the loop goes on with the other runs meanwhile."""
    try:
        status = await _execute(store, run, claimer, draining, observer)
    except BaseException as exc:
        status = await asyncio.to_thread(runner.guarded_failure, store, run, claimer, exc)
    return await asyncio.to_thread(runner.guarded_status, store, run, claimer, status)


async def _execute(store: Store, run: Run, claimer: str, draining: Flag | None,
                   observer: Observer | None) -> Outcome:
    ex, ctx, token, workflow = await asyncio.to_thread(runner.start_execution, store, run, claimer, draining,
                                                       observer, None)
    raised: BaseException | None = None
    value: Any = None
    SCOPE.set(ctx)  # this task's own context: the run's scope
    try:
        if workflow is None:
            raised = runner.unregistered(run)
        else:
            value = await loops.as_body(workflow.fn(*run.args))
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


__all__ = ["SharedLoop", "execute_guarded"]
