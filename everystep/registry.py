"""Registry of workflows by qualified name (and of steps that declare limits).

A run stores its workflow's name (``module.qualname`` unless given
explicitly) and is executed by looking the name up here, so a runner knows a
workflow once the module defining it has been imported (``--app``).
Re-importing a module replaces its entries, which is what a reload wants.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .errors import EverystepError, describe
from .retry import RetryPolicy

class DeclaredStep(Protocol):
    """A step as the engine reads its declaration (``everystep.api``'s
    ``StepFunction`` is the one there is): said here, so the layers below
    the public face need not import it."""

    fn: Callable[..., Any]
    name: str
    is_async: bool
    unsafe_to_repeat: bool
    timeout: float | None
    retry: RetryPolicy | None
    memory_limit: int | None
    cpu_limit: float | None
    transactional: bool


_workflows: dict[str, Any] = {}
#: Steps that declare a memory or CPU limit, by name: what they declare. A
#: runner that cannot enforce limits (the threaded worker) refuses to start
#: while there is any, rather than run them unbounded.
_limited_steps: dict[str, str] = {}
#: Names of the transactional steps imported so far (check-deploy and the console mark them).
_transactional_steps: set[str] = set()
_lock = threading.Lock()


def qualified_name(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def register_workflow(name: str, workflow: Any) -> None:
    with _lock:
        _workflows[name] = workflow


def get_workflow(name: str) -> Any | None:
    return _workflows.get(name)


def workflow_names() -> list[str]:
    with _lock:
        return sorted(_workflows)


def schedules() -> dict[str, Any]:
    """``{name: CronSchedule}`` of the periodic workflows registered."""
    with _lock:
        return {name: wf.cron for name, wf in sorted(_workflows.items()) if getattr(wf, "cron", None) is not None}


def register_step_limits(name: str, limits: str) -> None:
    with _lock:
        _limited_steps[name] = limits


def limited_steps() -> dict[str, str]:
    """``{step name: "memory_limit=256 MiB, cpu_limit=30s"}`` for every
    step imported so far that declares a limit."""
    with _lock:
        return dict(_limited_steps)


def register_transactional_step(name: str) -> None:
    with _lock:
        _transactional_steps.add(name)


def transactional_steps() -> frozenset[str]:
    """The names of every ``@step(transactional=True)`` imported so far:
    their writes commit with their record, exactly once."""
    with _lock:
        return frozenset(_transactional_steps)


def import_apps(spec: str | Iterable[str] | None) -> list[str]:
    """Import the user's workflow modules (``"a.b,c"`` or a list).

    Raises ``EverystepError`` with the module name when an import fails, so
    the CLI can print one clear line.
    """
    if not spec:
        return []
    # Like gunicorn: the working directory is importable, so `--app myapp`
    # works from a console script whose sys.path[0] is its bin directory.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    modules = [part.strip() for part in (spec.split(",") if isinstance(spec, str) else spec)]
    imported = []
    for module in modules:
        if not module:
            continue
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
                # The module itself (or its package) is not there: no code
                # ran, so there is no file and line to name, only the module.
                raise EverystepError(f"cannot import app module {module!r}: no module named {exc.name!r} "
                                     f"(on the path: the working directory {os.getcwd()} and sys.path)") from exc
            raise EverystepError(f"cannot import app module {module!r}: {describe(exc)}") from exc
        except Exception as exc:
            raise EverystepError(f"cannot import app module {module!r}: {describe(exc)}") from exc
        imported.append(module)
    return imported
