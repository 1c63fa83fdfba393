"""The public API: ``@workflow``, ``@step``, ``parallel``, ``schedule``.

Decorated functions stay plain functions outside a running workflow, so they
can be unit-tested directly; inside one, each step call is recorded (or
replayed) by the runner.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar, overload

from . import borrowed, registry, resources, runner, serde
from .errors import EverystepError
from .models import TERMINAL_STATUSES, Run, StepRecord
from .provider import ConnectionProvider, connection_provider
from .store import Store, default_store

F = TypeVar("F", bound=Callable[..., Any])


class WorkflowFunction:
    """A registered workflow. Calling it directly runs the body as a plain
    function (steps inside are plain calls too)."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def schedule(self, *args: Any, **options: Any) -> Run:
        """Shorthand for ``schedule(this_workflow, *args, **options)``."""
        return schedule(self, *args, **options)

    def __repr__(self) -> str:
        return f"<workflow {self.name}>"


class StepFunction:
    """A step: recorded inside a running workflow, a plain call outside.

    The call-site keyword ``everystep_id="name"`` names the step (it is
    popped before the function is called, in both cases).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        unsafe_to_repeat: bool = False,
        timeout: float | None = None,
        memory_limit: int | None = None,
        cpu_limit: float | None = None,
    ) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = name
        self.unsafe_to_repeat = unsafe_to_repeat
        self.timeout = timeout
        #: Bytes the step may add to its process, and CPU seconds it may use
        #: (None: the supervisor's default, if any). See ``everystep.resources``.
        self.memory_limit = memory_limit
        self.cpu_limit = cpu_limit

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return runner.call_step(self, args, kwargs)

    def __repr__(self) -> str:
        flags = " unsafe_to_repeat" if self.unsafe_to_repeat else ""
        return f"<step {self.name}{flags}>"

    def describe_limits(self) -> str:
        """``memory_limit=256 MiB, cpu_limit=30s`` (empty without limits)."""
        parts = []
        if self.memory_limit is not None:
            parts.append(f"memory_limit={resources.format_size(self.memory_limit)}")
        if self.cpu_limit is not None:
            parts.append(f"cpu_limit={resources.format_cpu(self.cpu_limit)}")
        return ", ".join(parts)


@overload
def workflow(fn: F) -> WorkflowFunction: ...
@overload
def workflow(*, name: str | None = None) -> Callable[[F], WorkflowFunction]: ...


def workflow(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Register a workflow under ``module.qualname`` (or ``name``)."""

    def decorate(fn: Callable[..., Any]) -> WorkflowFunction:
        wf = WorkflowFunction(fn, name or registry.qualified_name(fn))
        registry.register_workflow(wf.name, wf)
        return wf

    return decorate(fn) if fn is not None else decorate


@overload
def step(fn: F) -> StepFunction: ...
@overload
def step(
    *, unsafe_to_repeat: bool = False, timeout: float | None = None, name: str | None = None,
    memory_limit: str | int | None = None, cpu_limit: float | None = None,
) -> Callable[[F], StepFunction]: ...


def step(
    fn: Callable[..., Any] | None = None,
    *,
    unsafe_to_repeat: bool = False,
    timeout: float | None = None,
    name: str | None = None,
    memory_limit: str | int | None = None,
    cpu_limit: float | None = None,
) -> Any:
    """Declare a step. ``unsafe_to_repeat=True`` records a ``started`` row
    before the effect so a crash mid-effect blocks the run instead of
    repeating it. ``timeout`` (seconds) is enforced by the supervisor, which
    kills the step's process and records ``StepTimeout``.

    ``memory_limit`` (``"512M"``, ``"2G"``, or bytes: what the step may add
    to its process) and ``cpu_limit`` (CPU seconds) are enforced by the
    supervisor too: a step over either fails with ``StepResourceExceeded``.
    The threaded worker cannot enforce them and refuses to start while a
    step declares one (see ``everystep.resources``)."""
    if timeout is not None and not timeout > 0:
        raise EverystepError(f"step timeout must be a positive number of seconds, not {timeout!r}")
    memory = resources.parse_size(memory_limit) if memory_limit is not None else None
    cpu = resources.parse_cpu(cpu_limit) if cpu_limit is not None else None

    def decorate(fn: Callable[..., Any]) -> StepFunction:
        declared = StepFunction(fn, name or registry.qualified_name(fn), unsafe_to_repeat, timeout, memory, cpu)
        if memory is not None or cpu is not None:
            registry.register_step_limits(declared.name, declared.describe_limits())
        return declared

    return decorate(fn) if fn is not None else decorate


def parallel(*branches: Any, everystep_id: str | None = None) -> tuple[Any, ...]:
    """Run branches concurrently, each on its own thread; return their results
    in branch order.

    A branch is a zero-argument callable, or a list of them run in sequence
    (that branch returns a tuple). One failing branch re-raises its exception
    as is; several raise ``ExceptionGroup``; ``Terminal``,
    ``EffectUncertain`` and ``DrainOrphan`` are raised ahead of any group.
    Healthy branches still run to completion and are recorded. Branch steps
    get ids under ``<fork id>.<branch index>.``.
    """
    return runner.run_parallel(branches, everystep_id)


def _workflow_name(wf: WorkflowFunction | str | Callable[..., Any]) -> str:
    if isinstance(wf, WorkflowFunction):
        return wf.name
    if isinstance(wf, str):
        if not wf:
            raise EverystepError("workflow name must not be empty")
        return wf
    raise EverystepError(f"{wf!r} is not a workflow: decorate it with @workflow")


def _store(database: str | Store | None) -> Store:
    if isinstance(database, Store):
        return database
    return default_store(database)


def _provided(database: str | Store | None) -> ConnectionProvider | None:
    """The host's connection provider, unless the caller named a database."""
    return connection_provider() if database is None else None


def schedule(
    wf: WorkflowFunction | str,
    *args: Any,
    idempotency_key: str | None = None,
    conn: Any = None,
    database: str | Store | None = None,
) -> Run:
    """Schedule a run of ``wf`` with positional ``args``; returns the ``Run``.

    The arguments are validated before anything is written. Without ``conn``
    the run is committed at once. With ``conn`` (a psycopg or sqlite3
    connection) it is inserted in the caller's open transaction: claimable
    on commit, gone on rollback. With ``idempotency_key``, scheduling the
    same workflow and key again (even concurrently) returns the existing run.
    ``wf`` may be a registered workflow or its name.

    When a host framework installed a connection provider
    (``everystep.provider``; ``everystep.contrib.django`` does) and neither
    ``conn`` nor ``database`` is given, the run is inserted through the
    host's connection, in whatever transaction it has open.
    """
    name = _workflow_name(wf)
    args_json = serde.dumps(list(args), f"arguments of workflow {name}")
    if idempotency_key is not None and not isinstance(idempotency_key, str):
        raise EverystepError("idempotency_key must be a string")
    if conn is not None:
        return borrowed.schedule(conn, name, args_json, idempotency_key)
    provider = _provided(database)
    if provider is not None:
        with provider() as provided:
            return borrowed.schedule(provided, name, args_json, idempotency_key)
    return _store(database).schedule(name, args_json, idempotency_key)


def get_run(run_id: str, database: str | Store | None = None) -> Run:
    """Read a run; raises ``RunNotFound`` for an unknown id. (Through the
    host's connection when a provider is installed, so a run scheduled in
    the host's open transaction is visible to it.)"""
    provider = _provided(database)
    if provider is not None:
        with provider() as provided:
            return borrowed.get_run(provided, run_id)
    return _store(database).get_run(run_id)


def get_steps(run_id: str, database: str | Store | None = None) -> list[StepRecord]:
    """The recorded steps of a run, in the order they were first recorded."""
    provider = _provided(database)
    if provider is not None:
        with provider() as provided:
            return borrowed.get_steps(provided, run_id)
    store = _store(database)
    store.get_run(run_id)
    return store.get_steps(run_id)


def wait(run_id: str, timeout: float = 60.0, poll: float = 0.1, database: str | Store | None = None) -> Run:
    """Poll until the run reaches a terminal status; ``TimeoutError`` past ``timeout``."""
    deadline = time.monotonic() + timeout
    if _provided(database) is None:
        database = _store(database)
    while True:
        run = get_run(run_id, database)
        if run.status in TERMINAL_STATUSES:
            return run
        if time.monotonic() >= deadline:
            raise TimeoutError(f"run {run_id} is still {run.status} after {timeout}s")
        time.sleep(poll)


__all__ = ["StepFunction", "WorkflowFunction", "get_run", "get_steps", "parallel",
           "schedule", "step", "wait", "workflow"]
