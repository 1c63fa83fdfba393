"""Fixtures: real databases for every test, on every backend.

``db_url`` is parametrized over SQLite (a fresh file per test), PostgreSQL
(one fresh database per test session, on the server named by
``EVERYSTEP_TEST_DATABASE_URL`` or a throwaway cluster started from the local
binaries) and MariaDB (one fresh database per session, on the server named
by ``EVERYSTEP_TEST_MARIADB_URL``, the local one at 127.0.0.1:3306, or a
throwaway ``mariadbd``; skipped, saying why, when there is none). Tables are
emptied before each test; session databases are dropped at the end.

A module or test marked ``pytest.mark.backends("sqlite", "postgres")`` runs
on those backends only (process-heavy modules, where a third backend would
only add time). One marked ``pooled`` also runs on ``pgbouncer``: the
PostgreSQL database through a real PgBouncer in transaction mode
(``?pooler=transaction``), started on a free port in front of the test
cluster (skipped, saying why, when pgbouncer is not installed);
``pgbouncer_session`` is one in session mode.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings

from everystep import runner
from everystep.store import Store, close_default_stores, connect
from everystep.store.base import core
from tests.support import lanes
from tests.support.pgbouncer import PgBouncer, start_pgbouncer
from tests.support.pgserver import PgServer, start_server
from tests.support.watchdog import Watchdog, grace_from_environment, timeout_of

if TYPE_CHECKING:
    from tests.support.mariadbserver import MariaDBServer

MARIADB_TABLES = ("everystep_stream", "everystep_attempt", "everystep_step", "everystep_message", "everystep_event",
                  "everystep_workflow", "everystep_runner",
                  "everystep_request", "everystep_cron", "everystep_queue", "everystep_queue_claim",
                  "everystep_debounce")

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Lanes. Tests of a backend that ``EVERYSTEP_TEST_BACKENDS`` leaves
    out, or that a ``backends`` marker leaves out, are deselected; tests
    that start processes get the ``procs`` marker (``tests/support/lanes.py``).
    Tests marked ``slow`` (the chaos session, the benchmark smoke run, the
    type check) run in CI (``CI`` set) or when asked for with ``-m``; a plain
    local ``python -m pytest`` leaves them out and says so."""
    _keep_marked_backends(config, items)
    kept, dropped = lanes.split_by_backend(items, lanes.chosen_backends())
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    lanes.mark_process_tests(items)
    for item in items:
        lanes.label(item)
    if not (os.environ.get("CI") or config.getoption("markexpr")):
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("slow") is None]
    # The longest first (slow, then process tests, then the quick in-process
    # ones): under xdist the long tests then overlap the rest of the run
    # instead of making its tail. A stable sort, so every worker collects
    # the same order.
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 item.get_closest_marker("procs") is None))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per core. Most of the suite waits on child
    processes, sockets and the database rather than computing, so a core
    serves two workers; more would only crowd the timing of process tests."""
    return 2 * (len(os.sched_getaffinity(0)) or 1)


# Tests deselected here (by backend, or ``slow`` under CI). Under xdist the
# workers collect and deselect; each reports its count to the controller,
# which writes the summary (every worker collects the same tests).
_deselected = 0


def pytest_deselected(items: list[pytest.Item]) -> None:
    global _deselected
    _deselected += len(items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["everystep_deselected"] = _deselected


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    global _deselected
    _deselected = max(_deselected, int(getattr(node, "workeroutput", {}).get("everystep_deselected", 0)))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The lanes' counts and the skip reasons, at the end of every run."""
    terminalreporter.write_sep("=", "lanes")
    for line in lanes.summary_lines(terminalreporter.stats, _deselected):
        terminalreporter.write_line(line)


_process_guard = lanes.ProcessGuard()
_outside_procs_lane: pytest.Item | None = None


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Any:
    """A fixture of a test outside the ``procs`` lane is watched as the test
    is (the database servers, started on first use, pause the watch)."""
    if _outside_procs_lane is None:
        return (yield)
    with _process_guard.watching():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """A test outside the ``procs`` lane that starts a process fails, naming
    it: the lane's marking missed a way of starting one."""
    if item.get_closest_marker("procs") is not None:
        return (yield)
    with _process_guard.watching():
        result = yield
    _fail_if_processes_started(item)
    return result


def _fail_if_processes_started(item: pytest.Item) -> None:
    started, _process_guard.started = _process_guard.started, []
    if started:
        pytest.fail(f"{item.nodeid} started a process but is not in the procs lane ({started[0]}); "
                    "tests/support/lanes.py must learn how it starts one", pytrace=False)


# Property tests run beside process tests on a loaded machine: a drawn
# example's wall time says nothing about the code, so neither Hypothesis's
# per-example deadline nor its "too slow to generate" check may fail a run.
settings.register_profile("everystep", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("everystep")

_watchdog: Watchdog | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Start the watchdog that ends a run stuck beyond pytest-timeout's reach
    (see ``tests/support/watchdog.py``), and the guard of the procs lane."""
    global _watchdog
    _process_guard.install()
    _watchdog = Watchdog(grace_from_environment(), config.pluginmanager.getplugin("capturemanager"))
    _watchdog.start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    global _outside_procs_lane
    if _watchdog is not None:
        _watchdog.entering(item.nodeid, timeout_of(item))
    _outside_procs_lane = None if item.get_closest_marker("procs") is not None else item
    try:
        yield
    finally:
        _outside_procs_lane = None
        _process_guard.started = []
        if _watchdog is not None:
            _watchdog.leaving()


_GUARDED_LIMITS = ("RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_AS")
# SIGALRM is pytest-timeout's own: it sets and restores its handler itself.
_GUARDED_SIGNALS = ("SIGXCPU", "SIGTERM", "SIGINT", "SIGCHLD")


@pytest.fixture(autouse=True)
def _process_state_is_left_as_found() -> Iterator[None]:
    """A test that runs supervisor or meter code in the pytest process must
    give back the rlimits, signal handlers and signal mask it changed: a
    leftover soft CPU or data limit, or a blocked SIGALRM, would strike a
    test much later (pytest-timeout itself relies on SIGALRM)."""
    limits = {name: resource.getrlimit(getattr(resource, name)) for name in _GUARDED_LIMITS}
    handlers = {name: signal.getsignal(getattr(signal, name)) for name in _GUARDED_SIGNALS}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    changed = []
    for name, value in limits.items():
        if resource.getrlimit(getattr(resource, name)) != value:
            changed.append(name)
            resource.setrlimit(getattr(resource, name), value)
    for name, handler in handlers.items():
        if signal.getsignal(getattr(signal, name)) != handler:
            changed.append(name)
            signal.signal(getattr(signal, name), handler)
    if signal.pthread_sigmask(signal.SIG_BLOCK, []) != mask:
        changed.append("signal mask")
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if changed:
        pytest.fail(f"the test left the pytest process changed: {', '.join(changed)}")


def _keep_marked_backends(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the backend parameters a ``backends`` marker leaves out
    (the pooled one is PostgreSQL's, behind PgBouncer)."""
    kept, dropped = [], []
    for item in items:
        marker = item.get_closest_marker("backends")
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("db_url") if callspec is not None else None
        if backend == lanes.POOLED:
            backend = "postgres"
        if marker is not None and backend is not None and backend not in marker.args:
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    with _process_guard.paused():  # the postgres lane's server, not the test's process
        server = start_server()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def pg_session_url(pg_server: PgServer) -> Iterator[str]:
    url = pg_server.create_database()
    connect(url).migrate()
    try:
        yield url
    finally:
        close_default_stores()
        pg_server.drop_database(url)


def _truncate(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE everystep_stream, everystep_attempt, everystep_step, everystep_message, everystep_event, "
                     "everystep_workflow, everystep_runner, "
                     "everystep_request, everystep_cron, everystep_queue, everystep_queue_claim, everystep_debounce")


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[MariaDBServer]:
    try:
        from tests.support.mariadbserver import start_server as start_mariadb
    except ImportError as exc:  # PyMySQL, from the test extra
        pytest.skip(f"MariaDB tests need PyMySQL (pip install -e '.[test]'): {exc}")
    with _process_guard.paused():  # the mariadb lane's server, not the test's process
        server, why = start_mariadb()
    if server is None:
        pytest.skip(f"MariaDB unavailable: {why}")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def mariadb_session_url(mariadb_server: MariaDBServer) -> Iterator[str]:
    url = mariadb_server.create_database()
    store = connect(url)
    store.migrate()
    store.close()
    try:
        yield url
    finally:
        close_default_stores()
        mariadb_server.drop_database(url)


def _empty_mariadb(url: str) -> None:
    import pymysql

    from everystep.store.mariadb import connect_args

    with pymysql.connect(**connect_args(url), autocommit=True) as conn, conn.cursor() as cursor:
        for table in MARIADB_TABLES:
            cursor.execute(f"DELETE FROM {table}")


@pytest.fixture
def mariadb_url(mariadb_session_url: str) -> str:
    """The MariaDB test database only, emptied."""
    _empty_mariadb(mariadb_session_url)
    return mariadb_session_url


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``db_url`` is parametrized over the backends (``lanes.db_url_backends``:
    the pooled one only for tests marked ``pooled``)."""
    if "db_url" in metafunc.fixturenames:
        metafunc.parametrize("db_url", lanes.db_url_backends(metafunc.definition.get_closest_marker),
                             indirect=True)


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database of each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'everystep.db'}"
    if request.param == "mariadb":
        return str(request.getfixturevalue("mariadb_url"))
    if request.param == lanes.POOLED:
        return str(request.getfixturevalue("pooled_url"))
    url = request.getfixturevalue("pg_session_url")
    _truncate(url)
    return url


def _pgbouncer(pg_server: PgServer, mode: str) -> Iterator[PgBouncer]:
    with _process_guard.paused():  # the pooled lane's PgBouncer, not the test's process
        bouncer = start_pgbouncer(pg_server.admin_url, mode)
    if bouncer is None:
        pytest.skip("PgBouncer unavailable: pgbouncer is not installed (apt-get install pgbouncer)")
    try:
        yield bouncer
    finally:
        bouncer.close()


@pytest.fixture(scope="session")
def pgbouncer_transaction(pg_server: PgServer) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode in front of the test cluster."""
    yield from _pgbouncer(pg_server, "transaction")


@pytest.fixture(scope="session")
def pgbouncer_session(pg_server: PgServer) -> Iterator[PgBouncer]:
    """PgBouncer in session mode in front of the test cluster."""
    yield from _pgbouncer(pg_server, "session")


@pytest.fixture
def pooled_url(pg_session_url: str, pgbouncer_transaction: PgBouncer) -> str:
    """The PostgreSQL test database, emptied, through PgBouncer in
    transaction mode (``?pooler=transaction``)."""
    _truncate(pg_session_url)
    return pgbouncer_transaction.url_for(pg_session_url)


@pytest.fixture
def empty_db_url(db_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of ``db_url``'s backend with nothing in it, not even the
    schema: for tests that build or change a schema of their own (an older
    one to upgrade, functions re-applied). Dropped after the test."""
    backend = request.node.callspec.params["db_url"]
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    server = request.getfixturevalue("pg_server" if backend == "postgres" else "mariadb_server")
    url = server.create_database("everystep_empty")
    try:
        yield url
    finally:
        close_default_stores()
        server.drop_database(url)


@pytest.fixture
def pg_url(pg_session_url: str) -> str:
    """The PostgreSQL test database only, emptied."""
    _truncate(pg_session_url)
    return pg_session_url


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    store = connect(db_url)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(autouse=True)
def _reset_fault_hook() -> Iterator[None]:
    yield
    runner.fault = None
    core.statement_fault = None


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for real child processes: the repository importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("EVERYSTEP_DATABASE_URL", None)
    return env


@pytest.fixture
def python() -> str:
    return sys.executable
