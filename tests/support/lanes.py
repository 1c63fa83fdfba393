"""Test lanes: which tests start real processes, and which backends run.

A test is in the ``procs`` lane when it, or any fixture it uses, starts a
process: a supervisor, a worker or CLI subprocess, a server, a browser, a
fork. Nobody marks that by hand. At collection, ``starts_processes`` reads
the code a test runs (its function and its fixtures, and through them every
function and class of this project they name) and looks for the calls that
start processes. At run time, ``ProcessGuard`` watches the pytest process
itself: a test left out of the lane that starts a process after all fails,
naming what it started, so the fast lane can never quietly hold one.

``EVERYSTEP_TEST_BACKENDS`` (``sqlite``, ``postgres``, ``mariadb``,
``pgbouncer`` or a comma list) keeps the tests of those backends and the
tests that need no database; unset, every backend runs. ``pgbouncer`` is
PostgreSQL behind a real PgBouncer in transaction mode
(``?pooler=transaction``): the ``db_url`` of the tests marked ``pooled``
(the engine's own: claims, step records, the fold, waits, transactional
steps, cancels, fencing) and the tests that take a PgBouncer fixture.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

BACKENDS = ("sqlite", "postgres", "mariadb", "pgbouncer")
#: The backend that is PostgreSQL behind PgBouncer: a ``db_url`` parameter
#: of the tests marked ``pooled`` only.
POOLED = "pgbouncer"
# Fixtures that tie a test to one backend, whatever its parameters say.
BACKEND_FIXTURES = {
    "pg_server": "postgres", "pg_session_url": "postgres", "pg_url": "postgres",
    "mariadb_server": "mariadb", "mariadb_session_url": "mariadb", "mariadb_url": "mariadb",
    "pgbouncer_transaction": POOLED, "pgbouncer_session": POOLED, "pooled_url": POOLED,
}


def db_url_backends(item_markers: Any) -> tuple[str, ...]:
    """The ``db_url`` parameters of a test: every backend but the pooled
    one, which only tests marked ``pooled`` get (``item_markers``: the
    test's ``get_closest_marker``)."""
    return BACKENDS if item_markers("pooled") is not None else tuple(b for b in BACKENDS if b != POOLED)
# The project's own code, followed when a test names it.
OWN_PACKAGES = ("tests", "everystep", "supervisor", "bench")
# Modules any use of which starts a process.
PROCESS_MODULES = ("multiprocessing", "pty", "playwright")
# Functions of these modules that start one.
PROCESS_FUNCTIONS = {
    "subprocess": {"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "popen", "execv", "execvp",
           "execve", "spawnv", "spawnvp"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
}
_STARTER_IDS = frozenset(id(getattr(__import__(module), name)) for module, names in PROCESS_FUNCTIONS.items()
                         for name in names if hasattr(__import__(module), name))


def _own(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
    return isinstance(module, str) and module.split(".")[0] in OWN_PACKAGES


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """A code object and every one nested in it (closures, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


class ProcessScan:
    """Whether code starts processes, followed through the names it uses.

    Names are resolved in the globals of the function that uses them: a
    process module, a starting function of ``subprocess``, ``os`` or
    ``asyncio`` used with its attribute name, or a function, class or module of this project,
    followed in turn (for a module, only its members the code names). The
    answer errs towards ``procs``: a test that names a starter on a path it
    never takes only runs in the slower lane."""

    def __init__(self) -> None:
        self._known: dict[int, bool] = {}

    def __call__(self, obj: Any) -> bool:
        key = id(obj)
        if key not in self._known:
            self._known[key] = False  # a cycle adds nothing
            self._known[key] = self._scan(obj)
        return self._known[key]

    def _scan(self, obj: Any) -> bool:
        obj = inspect.unwrap(obj) if callable(obj) else obj
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            return any(self(part) for part in (obj.fget, obj.fset) if part is not None)
        if inspect.isclass(obj):
            return _own(obj) and any(self(member) for member in vars(obj).values()
                                     if inspect.isfunction(member) or isinstance(member, (staticmethod, classmethod,
                                                                                          property)))
        if not inspect.isfunction(obj) or not _own(obj):
            return id(obj) in _STARTER_IDS
        names = {name for code in _codes(obj.__code__) for name in code.co_names}
        if any(_is_process_module(name) for name in names) or (
                "subprocess" in names and PROCESS_FUNCTIONS["subprocess"] & names):  # imported inside the function
            return True
        scope = {**obj.__globals__, **_closure(obj)}
        # A module imported inside the function is named by its dotted name.
        return any(self._uses_starter(scope.get(name, sys.modules.get(name)), names) for name in names)

    def _uses_starter(self, value: Any, names: set[str]) -> bool:
        if value is None:
            return False
        if isinstance(value, types.ModuleType):
            name = value.__name__
            if _is_process_module(name):
                return True
            if name in PROCESS_FUNCTIONS:
                return bool(PROCESS_FUNCTIONS[name] & names)
            if name.split(".")[0] in OWN_PACKAGES:
                return any(self(getattr(value, member)) for member in names if hasattr(value, member))
            return False
        if id(value) in _STARTER_IDS or _from_process_module(value):
            return True
        return _own(value) and (inspect.isfunction(value) or inspect.isclass(value)) and self(value)


def _is_process_module(name: str) -> bool:
    return name.split(".")[0] in PROCESS_MODULES


def _from_process_module(value: Any) -> bool:
    """A function or class that a process module defines (``sync_playwright``)."""
    module = getattr(value, "__module__", None)
    return isinstance(module, str) and _is_process_module(module)


def _closure(function: types.FunctionType) -> dict[str, Any]:
    cells = function.__closure__ or ()
    values = {}
    for name, cell in zip(function.__code__.co_freevars, cells):
        try:
            values[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    return values


def _fixture_functions(item: pytest.Item) -> Iterator[Callable[..., Any]]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return
    for name in item.fixturenames:  # type: ignore[attr-defined]
        if name in BACKEND_FIXTURES:  # the database servers are the backend lanes' business
            continue
        for fixturedef in info.name2fixturedefs.get(name, ()):
            yield fixturedef.func


def mark_process_tests(items: list[pytest.Item]) -> None:
    """Add the ``procs`` marker to every test whose code or fixtures start processes."""
    scan = ProcessScan()
    for item in items:
        if item.get_closest_marker("procs") is not None:
            continue
        function = getattr(item, "function", None)
        code = [function] if function is not None else []
        if any(scan(part) for part in (*code, *_fixture_functions(item))):
            item.add_marker(pytest.mark.procs)


def chosen_backends() -> tuple[str, ...]:
    """The backends ``EVERYSTEP_TEST_BACKENDS`` names (all when unset); a
    name that is not a backend stops the run with one line."""
    value = os.environ.get("EVERYSTEP_TEST_BACKENDS", "").strip()
    if not value:
        return BACKENDS
    chosen = tuple(part.strip() for part in value.split(",") if part.strip())
    unknown = [name for name in chosen if name not in BACKENDS]
    if unknown:
        raise pytest.UsageError(f"EVERYSTEP_TEST_BACKENDS: unknown backend {', '.join(unknown)} "
                                f"(choose from {', '.join(BACKENDS)})")
    return chosen


def backends_of(item: pytest.Item) -> set[str]:
    """The backends a test uses: its ``db_url`` parameter and the fixtures
    that belong to one backend."""
    used = {backend for name, backend in BACKEND_FIXTURES.items() if name in getattr(item, "fixturenames", ())}
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("db_url") in BACKENDS:
        used.add(callspec.params["db_url"])
    if POOLED in used:
        used.discard("postgres")  # the server behind PgBouncer is the pooled lane's own
    return used


def split_by_backend(items: list[pytest.Item], chosen: tuple[str, ...]) -> tuple[list[pytest.Item],
                                                                                 list[pytest.Item]]:
    """The tests whose backends are all chosen (or that use none), and the rest."""
    kept, dropped = [], []
    for item in items:
        (kept if backends_of(item) <= set(chosen) else dropped).append(item)
    return kept, dropped


class ProcessGuard:
    """Records processes the pytest process starts while watching.

    ``os.fork``, ``os.posix_spawn(p)`` and ``subprocess.Popen`` (which
    ``subprocess.run``, ``multiprocessing`` and asyncio's subprocesses go
    through) are wrapped once for the session; they act exactly as before
    and, while a test outside the ``procs`` lane runs, note what started.
    Only the pytest process is watched: a forked child's own forks are its
    business."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._depth = 0
        self.started: list[str] = []

    def install(self) -> None:
        for name in ("fork", "posix_spawn", "posix_spawnp"):
            original = getattr(os, name)
            setattr(os, name, self._wrap(original, f"os.{name}"))
        original_init = subprocess.Popen.__init__
        guard = self

        def init(popen: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
            guard._note(f"subprocess {args!r}"[:200])
            original_init(popen, args, *rest, **kwargs)

        subprocess.Popen.__init__ = init  # type: ignore[method-assign]

    def _wrap(self, original: Callable[..., Any], what: str) -> Callable[..., Any]:
        def starter(*args: Any, **kwargs: Any) -> Any:
            self._note(what)
            return original(*args, **kwargs)
        return starter

    def _note(self, what: str) -> None:
        if self._depth and os.getpid() == self._pid:
            self.started.append(what)

    @contextmanager
    def watching(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    @contextmanager
    def paused(self) -> Iterator[None]:
        depth, self._depth = self._depth, 0
        try:
            yield
        finally:
            self._depth = depth


def label(item: pytest.Item) -> None:
    """Carry the test's lane and backends on its reports (they cross from
    xdist workers to the controller that writes the summary)."""
    item.user_properties.append(("lane", "procs" if item.get_closest_marker("procs") is not None else "in-process"))
    item.user_properties.append(("backends", ",".join(sorted(backends_of(item))) or "none"))


def _lane_of(report: pytest.TestReport) -> tuple[str, str]:
    properties = dict(report.user_properties)
    return str(properties.get("lane", "?")), str(properties.get("backends", "?"))


def summary_lines(stats: dict[str, list[Any]], deselected: int) -> list[str]:
    """Counts of passed, failed and skipped tests by lane and backend, the
    deselected count, and every skip reason with how often it struck: a run
    that left out a backend or the browsers says so in its last screen."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    reasons: dict[str, int] = {}
    for outcome in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        for report in stats.get(outcome, []):
            if not isinstance(report, pytest.TestReport):
                continue
            if outcome in ("passed",) and report.when != "call":
                continue
            row = counts.setdefault(_lane_of(report), {})
            row[outcome] = row.get(outcome, 0) + 1
            if outcome == "skipped" and isinstance(report.longrepr, tuple):
                reason = str(report.longrepr[2]).removeprefix("Skipped: ")
                reasons[reason] = reasons.get(reason, 0) + 1
    lines = [f"{'lane':<11} {'backends':<16} {'passed':>7} {'failed':>7} {'skipped':>8}"]
    for (lane, backends), row in sorted(counts.items()):
        lines.append(f"{lane:<11} {backends:<16} {row.get('passed', 0):>7} "
                     f"{row.get('failed', 0) + row.get('error', 0):>7} {row.get('skipped', 0):>8}")
    lines.append(f"deselected: {deselected}")
    for reason, count in sorted(reasons.items(), key=lambda pair: -pair[1]):
        lines.append(f"skipped {count}: {reason}")
    return lines
