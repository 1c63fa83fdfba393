"""The event loops of async workflows: what a step call and a body need to
know about them, below everything that records.

An ``async def`` workflow runs on an event loop of its own, started for the
run on the thread that executes it (``run_body``). Inside it, a step call
is awaited (``everystep.async_steps``); ``in_async_body`` is how a call
knows it is made there. A sync body may call an async step: its coroutine
runs to its end on a loop owned by the calling thread (``blocking``).
``in_thread`` runs a sync call (a wait, a database call) in a worker
thread, in the calling task's context, so the run's scope goes with it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

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

async def as_body(body: Coroutine[Any, Any, Any]) -> Any:
    _async_body.set(True)
    return await body

def run_body(fn: Callable[..., Coroutine[Any, Any, Any]], args: tuple[Any, ...] | list[Any]) -> Any:
    """Run an async workflow body to its end on a new event loop, in this
    thread's context (the run's ``Context`` goes with it). The loop is
    closed when the body ends, with whatever tasks it left cancelled."""
    return asyncio.run(as_body(fn(*args)))

def call_body(fn: Callable[..., Any], args: tuple[Any, ...] | list[Any]) -> Any:
    """A workflow body, sync or async, run to its end on this thread."""
    return run_body(fn, args) if is_async(fn) else fn(*args)

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

async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn`` (a sync wait or a database call) in a worker thread, in this
    task's context (the run's scope goes with it)."""
    return await asyncio.to_thread(fn, *args, **kwargs)


__all__ = ["as_body", "blocking", "call_body", "in_async_body", "in_thread", "is_async", "loop_running", "run_body"]
