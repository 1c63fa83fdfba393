"""The connection provider: a host lends its own connection, and plain
``schedule()`` / ``get_run()`` / ``get_steps()`` / ``wait()`` go through it
(the host's transaction decides whether a run exists); ``Store.migrate_on``
migrates through such a connection. The connections here are configured the
awkward ways a framework configures its own: dict or ``sqlite3.Row`` rows,
a loader that returns naive timestamps, an open transaction."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.datetime import TimestamptzLoader

import everystep
from everystep import get_run, get_steps, schedule, wait, workflow
from everystep.store import borrowed
from everystep.errors import EverystepError, RunNotFound
from everystep.models import COMPLETED, SCHEDULED
from everystep.provider import connection_provider, set_connection_provider
from everystep.store import connect, migrations
from everystep.store.postgres import PostgresStore
from everystep.store.sqlite import SQLiteStore
from tests.support.pgserver import PgServer
from tests.support.runs import execute_run


@workflow
def lend(value: str) -> str:
    return value * 2


@pytest.fixture(autouse=True)
def _no_provider_left_behind() -> Iterator[None]:
    previous = connection_provider()
    yield
    set_connection_provider(previous)


def lending(conn: Any) -> Any:
    """A provider handing out ``conn`` and counting how often it did."""

    @contextlib.contextmanager
    def provide() -> Iterator[Any]:
        provide.calls += 1  # type: ignore[attr-defined]
        yield conn

    provide.calls = 0  # type: ignore[attr-defined]
    return provide


class NaiveLoader(TimestamptzLoader):
    """What Django registers with USE_TZ = False: timestamps lose their zone."""

    def load(self, data: Any) -> Any:
        return super().load(data).replace(tzinfo=None)


def test_set_connection_provider_returns_the_previous_one_and_none_removes_it() -> None:
    first, second = lending(None), lending(None)
    assert set_connection_provider(first) is None
    assert everystep.set_connection_provider(second) is first
    assert connection_provider() is second
    assert set_connection_provider(None) is second
    assert connection_provider() is None


def test_sqlite_schedule_rolls_back_with_the_hosts_transaction(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'host.db'}"
    store = connect(url)
    host = sqlite3.connect(tmp_path / "host.db", isolation_level=None)
    host.row_factory = sqlite3.Row
    provide = lending(host)
    set_connection_provider(provide)
    try:
        host.execute("BEGIN")
        run = schedule(lend, "x")
        assert run.status == SCHEDULED and run.args == ["x"] and run.created_at.tzinfo is not None
        # The host's transaction sees its own run; everystep's connection does not.
        assert get_run(run.id).id == run.id
        assert get_steps(run.id) == []
        with pytest.raises(RunNotFound):
            store.get_run(run.id)
        host.execute("ROLLBACK")
        with pytest.raises(RunNotFound):
            get_run(run.id)
        assert provide.calls == 4
        assert isinstance(host.execute("SELECT 1 AS one").fetchone(), sqlite3.Row)  # left as it was
    finally:
        host.close()
        store.close()


def test_sqlite_commit_makes_the_run_executable_and_wait_reads_through_the_host(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'host.db'}"
    store = connect(url)
    host = sqlite3.connect(tmp_path / "host.db", isolation_level=None)
    set_connection_provider(lending(host))
    try:
        host.execute("BEGIN")
        run = schedule(lend, "ab", idempotency_key="k")
        assert schedule(lend, "ab", idempotency_key="k").id == run.id
        host.execute("COMMIT")
        assert execute_run(store, run.id) == COMPLETED
        assert wait(run.id, timeout=10).result == "abab"
        assert [step.status for step in get_steps(run.id)] == []  # no @step in lend: nothing recorded
    finally:
        host.close()
        store.close()


def test_an_explicit_database_or_conn_bypasses_the_provider(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'own.db'}"
    store = connect(url)
    provide = lending(object())  # would fail if it were used
    set_connection_provider(provide)
    try:
        run = schedule(lend, "y", database=url)
        assert get_run(run.id, database=url).status == SCHEDULED
        with pytest.raises(TimeoutError):
            wait(run.id, timeout=0, database=store)
        with sqlite3.connect(tmp_path / "own.db", isolation_level=None) as mine:
            assert schedule(lend, "z", conn=mine).args == ["z"]
        assert provide.calls == 0
        with pytest.raises(EverystepError, match="conn must be a psycopg, sqlite3 or pymysql connection"):
            schedule(lend, "w")
    finally:
        store.close()


def test_wait_times_out_through_the_provider(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'host.db'}"
    connect(url).close()
    host = sqlite3.connect(tmp_path / "host.db", isolation_level=None)
    set_connection_provider(lending(host))
    try:
        run = schedule(lend, "never")
        with pytest.raises(TimeoutError, match="still scheduled"):
            wait(run.id, timeout=0)
    finally:
        host.close()


def test_psycopg_provider_with_dict_rows_and_naive_timestamps(pg_url: str) -> None:
    store = connect(pg_url)
    host = psycopg.connect(pg_url, row_factory=dict_row)
    host.adapters.register_loader("timestamptz", NaiveLoader)
    set_connection_provider(lending(host))
    try:
        run = schedule(lend, "p")
        assert run.created_at is not None and run.created_at.tzinfo is not None
        assert get_run(run.id).args == ["p"]
        assert store.claim("elsewhere", 10, [lend.name]) == []  # not committed yet
        host.rollback()
        with pytest.raises(RunNotFound):
            get_run(run.id)

        run = schedule(lend, "q")
        host.commit()
        assert execute_run(store, run.id) == COMPLETED
        assert wait(run.id, timeout=10).result == "qq"
        # The host's own queries still see its row factory and loader.
        row = host.execute("SELECT now() AS at").fetchone()
        assert row["at"].tzinfo is None
        host.rollback()
    finally:
        host.close()
        store.close()


def test_psycopg_savepoint_rollback_takes_the_run_with_it(pg_url: str) -> None:
    store = connect(pg_url)
    set_connection_provider(None)
    try:
        with psycopg.connect(pg_url) as host:
            set_connection_provider(lending(host))
            with host.transaction():
                kept = schedule(lend, "kept")
                with pytest.raises(RuntimeError):
                    with host.transaction():  # a savepoint
                        schedule(lend, "dropped")
                        raise RuntimeError("inner block failed")
        assert [run.args for run in store.list_runs()] == [["kept"]]
        assert store.get_run(kept.id).status == SCHEDULED
    finally:
        store.close()


# -- migrating through a borrowed connection -------------------------------------------


def test_migrate_on_a_borrowed_sqlite_connection_matches_migrate(tmp_path: Path) -> None:
    host = sqlite3.connect(tmp_path / "borrowed.db", isolation_level=None)
    host.row_factory = sqlite3.Row
    try:
        applied = borrowed.migrate(host)
        assert applied == [f"{m.version:04d}_{m.name}" for m in migrations.available("sqlite")]
        assert borrowed.migrate(host) == []
        assert host.row_factory is sqlite3.Row
    finally:
        host.close()
    # everystep's own migrator finds nothing to do, and the store works.
    store = SQLiteStore(f"sqlite:///{tmp_path / 'borrowed.db'}")
    try:
        assert store.migrate() == [] and store.schema_version() == migrations.latest("sqlite")
    finally:
        store.close()


def test_migrate_on_a_borrowed_in_memory_sqlite_connection() -> None:
    """An in-memory database (Django's default test database on SQLite) is
    reachable only through its own connection: the borrowed path migrates it."""
    host = sqlite3.connect(":memory:", isolation_level=None)
    try:
        assert len(borrowed.migrate(host)) == migrations.latest("sqlite")
        run = borrowed.schedule(host, lend.name, '["m"]', None)
        assert borrowed.get_run(host, run.id).args == ["m"]
    finally:
        host.close()


def test_migrate_on_a_borrowed_psycopg_connection_matches_migrate(pg_server: PgServer) -> None:
    url = pg_server.create_database()
    try:
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as host:
            applied = borrowed.migrate(host)
            assert applied == [f"{m.version:04d}_{m.name}" for m in migrations.available("postgres")]
            assert borrowed.migrate(host) == []
            assert host.row_factory is dict_row
        store = PostgresStore(url)
        try:
            assert store.migrate() == [] and store.schema_version() == migrations.latest("postgres")
        finally:
            store.close()
    finally:
        pg_server.drop_database(url)
