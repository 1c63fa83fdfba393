"""Migrations: idempotent, each version applied exactly once even when two
processes or threads migrate a fresh database at once; a fresh SQLite file
migrates itself on first use; an upgrade keeps the runs and steps an older
schema holds."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from everystep import schedule, workflow
from everystep.errors import EverystepError
from everystep.models import SCHEDULED, STEP_DONE
from everystep.store import connect, migrations
from everystep.store.postgres import PostgresStore
from everystep.store.sqlite import SQLiteStore
from tests.support import every_status  # noqa: F401  (its workflows, for the run left due)
from tests.support.rawdb import reader
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


# -- an upgrade from the previous release, with data -----------------------------------------------

#: Every table everystep has.
TABLES = ("everystep_workflow", "everystep_step", "everystep_attempt", "everystep_message", "everystep_event",
          "everystep_request", "everystep_queue", "everystep_runner", "everystep_cron", "everystep_queue_claim")


#: Columns the newest migration adds, with the value an upgrade leaves in
#: every old row (the newest, 0020, adds ``everystep_workflow.debounce_calls``,
#: left NULL: no old run was debounced, and its table ``everystep_debounce``
#: starts empty).
ADDED_COLUMNS: dict[str, dict[str, Any]] = {"everystep_workflow": {"debounce_calls": None}}


def rows(url: str, added: dict[str, dict[str, Any]] | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (MariaDB leaves its invisible columns out of
    ``*``); with ``added``, each row without those columns, after checking
    they hold what an upgrade leaves there."""
    found = {}
    with reader(url) as conn:
        for table in TABLES:
            cursor = conn.cursor()
            cursor.execute(f"SELECT * FROM {table}")
            names = [column[0] for column in cursor.description]
            kept = []
            for row in cursor.fetchall():
                values = dict(zip(names, row))
                for column, value in (added or {}).get(table, {}).items():
                    assert values.pop(column) == value, (table, column)
                kept.append(tuple(values.values()))
            found[table] = sorted(kept, key=repr)
    return found


def schema(url: str) -> Any:
    """What the migrations built, less what the data decides (the next
    AUTO_INCREMENT value of a MariaDB table)."""
    with reader(url) as conn:
        cursor = conn.cursor()
        if url.startswith("sqlite"):
            cursor.execute("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_stat%' "
                           "AND name <> 'sqlite_sequence' ORDER BY type, name")
            return cursor.fetchall()
        if url.startswith("postgresql"):
            cursor.execute("SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), convalidated "
                           "FROM pg_constraint WHERE conrelid::regclass::text LIKE 'everystep%' ORDER BY 1, 2")
            constraints = cursor.fetchall()
            cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename LIKE 'everystep%' ORDER BY 1")
            indexes = cursor.fetchall()
            cursor.execute("SELECT proname, pg_get_functiondef(oid) FROM pg_proc WHERE proname LIKE 'everystep%' "
                           "ORDER BY 1, 2")
            return constraints, indexes, cursor.fetchall()
        tables = []
        for table in TABLES:
            cursor.execute(f"SHOW CREATE TABLE {table}")
            tables.append(re.sub(r" AUTO_INCREMENT=\d+", "", cursor.fetchone()[1]))
        return tables


@pytest.mark.timeout(300)
def test_an_upgrade_from_the_previous_release_keeps_every_row(
    empty_db_url: str, db_url: str, python: str, subprocess_env: dict[str, str]
) -> None:
    """A database the previous release (every migration but the newest)
    migrated and filled with a row in every status, upgraded by this one:
    every row kept as it was, the schema the same as a fresh database's,
    foreign keys and counters holding, and the status check in place."""
    url = empty_db_url
    previous = migrations.latest(connect_backend(url)) - 1
    filled = subprocess.run([python, "-m", "tests.support.older_schema", str(previous), "-m",
                             "tests.support.every_status", url], env=subprocess_env, capture_output=True, text=True,
                            timeout=240)
    assert filled.returncode == 0, filled.stderr[-3000:]
    runs = json.loads(filled.stdout.splitlines()[-1])
    before = rows(url)
    assert len(before["everystep_workflow"]) >= 10 and all(before[table] for table in
                                                            ("everystep_step", "everystep_attempt", "everystep_message",
                                                             "everystep_event", "everystep_request"))

    store = connect(url)
    try:
        store.migrate()
        assert store.schema_version() == migrations.latest(store.backend)
        assert rows(url, ADDED_COLUMNS) == before
        with pytest.raises(EverystepError, match="status"), store.connection() as conn:
            conn.execute(f"UPDATE everystep_workflow SET status = 'bogus' WHERE id = '{runs['due']}'")
        assert execute_run(store, runs["due"]) == "completed"
        # Counters continue: a new request's id is past every id handed out before.
        newest = store.submit_request("new-runner", "status", {}, "tester")
        assert newest.id > int(runs["deleted request"]) > max(row[0] for row in before["everystep_request"])
        # The steps, attempts, messages and events still belong to their run.
        deleted = (runs["retries"], runs["waits"])
        with store.connection() as conn:
            conn.execute(f"DELETE FROM everystep_workflow WHERE id IN ('{deleted[0]}', '{deleted[1]}')")
        after = rows(url)
        for table in ("everystep_step", "everystep_attempt", "everystep_message", "everystep_event"):
            theirs = [row for row in before[table] if set(deleted) & set(map(str, row))]
            assert theirs and not [row for row in after[table] if set(deleted) & set(map(str, row))], table
    finally:
        store.close()
    if url.startswith("sqlite"):
        with reader(url) as conn:
            assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    connect(db_url).close()  # a fresh SQLite file migrates itself; the others are migrated already
    assert schema(url) == schema(db_url)


def connect_backend(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgres" if url.startswith("postgresql") else "mariadb"

