"""Fixtures: real databases for every test, on both backends.

``db_url`` is parametrized over SQLite (a fresh file per test) and
PostgreSQL (one fresh database per test session, on the server named by
``EVERYSTEP_TEST_DATABASE_URL`` or a throwaway cluster started from the local
binaries; its tables are emptied before each test). The session database is
dropped at the end.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from everystep import runner
from everystep.store import Store, close_default_stores, connect
from tests.support.pgserver import PgServer, start_server

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` (the chaos session, the benchmark smoke run,
    the type check) run in CI (``CI`` set) or when asked for with ``-m``;
    a plain local ``python -m pytest`` leaves them out and says so."""
    if os.environ.get("CI") or config.getoption("markexpr"):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
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
        conn.execute("TRUNCATE everystep_attempt, everystep_step, everystep_workflow, everystep_runner, "
                     "everystep_request, everystep_cron, everystep_queue, everystep_queue_claim")


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database of each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'everystep.db'}"
    url = request.getfixturevalue("pg_session_url")
    _truncate(url)
    return url


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
