"""Migrations: idempotent, each version applied exactly once even when two
processes or threads migrate a fresh database at once; a fresh SQLite file
migrates itself on first use; an upgrade keeps the runs and steps an older
schema holds."""

from __future__ import annotations

import sqlite3
import subprocess
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from everystep import schedule, workflow
from everystep.models import SCHEDULED, STEP_DONE
from everystep.store import connect, migrations
from everystep.store.postgres import PostgresStore
from everystep.store.sqlite import SQLiteStore
from tests.support.runs import execute_run


@workflow
def tiny() -> str:
    return "ok"


def all_versions(backend: str) -> list[str]:
    return [f"{m.version:04d}_{m.name}" for m in migrations.available(backend)]


def pg_versions(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [row[0] for row in conn.execute("SELECT version FROM everystep_migration ORDER BY version")]


def sqlite_versions(path: Path) -> list[int]:
    with sqlite3.connect(path) as conn:
        return [row[0] for row in conn.execute("SELECT version FROM everystep_migration ORDER BY version")]


def test_migration_files_are_numbered_and_split_into_statements() -> None:
    for backend in ("postgres", "sqlite", "mariadb"):
        found = migrations.available(backend)
        assert [m.version for m in found] == list(range(1, len(found) + 1))
        assert migrations.latest(backend) == len(found)
        for migration in found:
            statements = migration.statements()
            # A version may be empty on one backend only to keep both numbered alike.
            assert statements or "Nothing to do" in migration.sql, migration
            assert all(statement.strip() for statement in statements)
            assert not any(statement.rstrip().endswith(";") for statement in statements)


def test_migrate_is_idempotent(store: Any) -> None:
    assert store.migrate() == []
    assert store.migrate() == []
    assert store.schema_version() == migrations.latest(store.backend)


def test_a_fresh_sqlite_file_migrates_itself(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    assert not path.exists()
    store = connect(f"sqlite:///{path}")
    try:
        assert store.schema_version() == migrations.latest("sqlite")
        run = schedule(tiny, database=store)
        assert execute_run(store, run.id) == "completed"
    finally:
        store.close()
    # Opening it again applies nothing twice.
    again = connect(f"sqlite:///{path}")
    try:
        assert again.migrate() == []
    finally:
        again.close()
    assert sqlite_versions(path) == [m.version for m in migrations.available("sqlite")]
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_sqlite_relative_url_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = connect("sqlite:///relative.db")
    store.close()
    assert (tmp_path / "relative.db").exists()


def test_threads_opening_a_fresh_sqlite_file_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'raced.db'}"
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []
    stores: list[SQLiteStore] = []

    def open_store() -> None:
        try:
            barrier.wait(30)
            stores.append(SQLiteStore(url))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for store in stores:
        store.close()
    assert errors == []
    assert sqlite_versions(tmp_path / "raced.db") == [m.version for m in migrations.available("sqlite")]


@pytest.fixture
def fresh_pg(pg_server: Any) -> Any:
    url = pg_server.create_database("everystep_migrate")
    try:
        yield url
    finally:
        pg_server.drop_database(url)


def test_fresh_postgres_database_migrates(fresh_pg: str) -> None:
    store = PostgresStore(fresh_pg)
    try:
        assert store.schema_version() == 0
        assert store.migrate() == all_versions("postgres")
        assert store.migrate() == []
        assert store.schema_version() == migrations.latest("postgres")
        run = schedule(tiny, database=store)
        assert execute_run(store, run.id) == "completed"
    finally:
        store.close()


def test_two_threads_migrating_a_fresh_postgres_database_apply_each_version_once(fresh_pg: str) -> None:
    stores = [PostgresStore(fresh_pg) for _ in range(2)]
    barrier = threading.Barrier(2)
    applied: list[list[str]] = []
    errors: list[BaseException] = []

    def migrate(store: PostgresStore) -> None:
        try:
            barrier.wait(30)
            applied.append(store.migrate())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=migrate, args=(store,)) for store in stores]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for store in stores:
            store.close()
    assert errors == []
    assert sorted(applied, key=len) == [[], all_versions("postgres")]
    assert pg_versions(fresh_pg) == [m.version for m in migrations.available("postgres")]


MIGRATE_SCRIPT = """
import sys
from everystep.store import connect
sys.stdin.readline()  # start together
print(",".join(connect(sys.argv[1]).migrate()))
"""


@pytest.mark.timeout(180)
def test_two_processes_migrating_a_fresh_postgres_database_apply_each_version_once(
    fresh_pg: str, python: str, subprocess_env: dict[str, str]
) -> None:
    procs = [
        subprocess.Popen(
            [python, "-c", MIGRATE_SCRIPT, fresh_pg],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env,
        )
        for _ in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            outputs.append(out.strip())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert sorted(outputs) == ["", ",".join(all_versions("postgres"))]
    assert pg_versions(fresh_pg) == [m.version for m in migrations.available("postgres")]


def test_sqlite_upgrade_to_version_6_keeps_runs_steps_and_the_foreign_key(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    for migration in migrations.available("sqlite")[:5]:
        for statement in migration.statements():
            conn.execute(statement)
        conn.execute("CREATE TABLE IF NOT EXISTS everystep_migration (version INTEGER PRIMARY KEY, "
                     "name TEXT NOT NULL, applied_at TEXT NOT NULL)")
        conn.execute("INSERT INTO everystep_migration VALUES (?, ?, '2024-01-01')", (migration.version, migration.name))
    conn.execute("INSERT INTO everystep_workflow (id, name, args, status, created_at, claim_epoch) VALUES "
                 "('01a2aaaa-0000-7000-8000-000000000001', 'old.flow', '[]', 'scheduled', '2024-01-01T00:00:00+00:00', 4)")
    conn.execute("INSERT INTO everystep_step (workflow_id, step_id, name, status, result, started_at) VALUES "
                 "('01a2aaaa-0000-7000-8000-000000000001', '1', 'old.step', 'done', '1', '2024-01-01T00:00:00+00:00')")
    conn.close()

    store = connect(f"sqlite:///{path}")  # migrates itself
    try:
        assert store.schema_version() == migrations.latest("sqlite")
        run = store.get_run("01a2aaaa-0000-7000-8000-000000000001")
        assert (run.status, run.claim_epoch, run.not_before) == (SCHEDULED, 4, None)
        [record] = store.get_steps(run.id)
        assert (record.status, record.result, record.attempt) == (STEP_DONE, 1, 1)
        with store.connection() as conn:
            names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
            assert {"everystep_workflow_idempotency", "everystep_workflow_claimable", "everystep_workflow_running",
                    "everystep_workflow_status"} <= names
            assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
            with pytest.raises(sqlite3.IntegrityError):
                conn.execute("INSERT INTO everystep_step (workflow_id, step_id, name, status, started_at) "
                             "VALUES ('01a2ffff-0000-7000-8000-000000000000', '1', 'x', 'done', 'now')")
            conn.execute("DELETE FROM everystep_workflow WHERE id = ?", (run.id,))
            assert conn.execute("SELECT count(*) FROM everystep_step").fetchone()[0] == 0  # cascades
    finally:
        store.close()
