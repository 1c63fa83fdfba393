"""Code versions: which code a run was started under.

Every run records a version when it is scheduled: the one the process was
given (``--app-version`` on ``everystep schedule``, the worker and the
supervisor, or ``set_app_version``; ``schedule(app_version=...)`` for one
run), else a hash of its workflow's code: the body's code object and the
code of every step it names (``code_version``). A deploy that leaves a
workflow and its steps unchanged leaves its version unchanged, so its runs
in flight are served by old and new runners alike; one that changes them
gives new runs a new version.

The hash reads what the code does, not where it sits: bytecode, names and
constants, nested code objects (lambdas, comprehensions) included, line
numbers and file names left out, so moving a function within its module
or adding a comment keeps its version. It is computed once per workflow per
process.

A runner serves the versions it is told to (``--serve-versions``): ``all``
(the default), ``current`` (the versions of the workflows it has loaded, or
its ``--app-version``), or a list. Runs scheduled before versions were
recorded have none, and are served by every runner.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from types import CodeType
from typing import Any

from . import registry

#: ``--serve-versions`` words.
SERVE_ALL = "all"
SERVE_CURRENT = "current"

_app_version: str | None = None


def set_app_version(version: str | None) -> None:
    """The version every run this process schedules records (None: each
    workflow's own code hash)."""
    global _app_version
    _app_version = version or None


def app_version() -> str | None:
    return _app_version


def version_for(name: str) -> str | None:
    """The version a run of workflow ``name`` scheduled here records: the
    process's ``--app-version``, else its code's hash (None when the
    workflow is not registered in this process)."""
    if _app_version is not None:
        return _app_version
    workflow = registry.get_workflow(name)
    if workflow is None:
        return None
    return code_version(workflow)


@functools.cache
def code_version(workflow: Any) -> str:
    """A short hash of ``workflow``'s body and of the steps it names."""
    digest = hashlib.sha256()
    fn = getattr(workflow, "fn", workflow)
    code: CodeType | None = getattr(fn, "__code__", None)
    if code is None:
        digest.update(repr(fn).encode())
        return digest.hexdigest()[:12]
    _feed(digest, code)
    names = sorted(set(_names(code)))
    scope = getattr(fn, "__globals__", {})
    for name in names:
        step = scope.get(name)
        step_fn = getattr(step, "fn", None)
        step_code = getattr(step_fn, "__code__", None)
        if step_code is not None and hasattr(step, "unsafe_to_repeat"):  # a StepFunction
            digest.update(f"step {name} {getattr(step, 'name', '')}".encode())
            _feed(digest, step_code)
    return digest.hexdigest()[:12]


def _names(code: CodeType) -> Iterable[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _names(const)


def _feed(digest: Any, code: CodeType) -> None:
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    digest.update(repr(code.co_varnames).encode())
    for const in code.co_consts:
        if isinstance(const, CodeType):
            _feed(digest, const)
        else:
            digest.update(_stable_repr(const).encode())


def _stable_repr(value: Any) -> str:
    """``repr``, but a frozenset (``x in {"a", "b"}``) in a fixed order:
    string hashes, and with them a set's order, change between processes."""
    if isinstance(value, frozenset):
        return "frozenset(" + ", ".join(sorted(_stable_repr(item) for item in value)) + ")"
    if isinstance(value, tuple):
        return "(" + ", ".join(_stable_repr(item) for item in value) + ")"
    return repr(value)


def served(spec: str | None) -> list[str] | None:
    """The versions ``--serve-versions SPEC`` serves: None for all, else the
    list (``current``: the versions of every workflow loaded here)."""
    if spec is None or spec.strip() == SERVE_ALL:
        return None
    if spec.strip() == SERVE_CURRENT:
        if _app_version is not None:
            return [_app_version]
        return sorted({code_version(registry.get_workflow(name)) for name in registry.workflow_names()})
    return [part.strip() for part in spec.split(",") if part.strip()]


__all__ = ["SERVE_ALL", "SERVE_CURRENT", "app_version", "code_version", "served", "set_app_version",
           "version_for"]
