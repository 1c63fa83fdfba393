"""The database itself refuses a status that its enum does not declare, and
a status added to an enum reaches the database without a migration or a
table rebuild.

Each backend's check is ``store/functions/<backend>/statuses.sql``,
rendered from ``everystep.models`` and re-applied by the migrator when its
text changes: functions called by CHECK constraints on PostgreSQL, triggers
on SQLite, virtual columns tested by CHECK constraints on MariaDB. These
tests write through raw SQL, past every code path of the engine, and add a
status the way a change to ``models.py`` does: by what the file renders.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from everystep import schedule, step, workflow
from everystep.errors import EverystepError
from everystep.models import RequestStatus, RunStatus, Status, StepStatus
from everystep.store import Store, connect, functions, migrations
from tests.support.runs import execute_run


@step
def one() -> int:
    return 1


@workflow
def recorded() -> int:
    return one()


def _sql(store: Store, statement: str) -> None:
    with store.connection() as conn:
        conn.execute(statement)


def _rows(store: Store) -> dict[str, tuple[str, str]]:
    """A row of each status table: its table → (the WHERE that finds it,
    an INSERT … SELECT that copies it with status ``{status}``)."""
    run = schedule(recorded, database=store)
    execute_run(store, run.id)
    request = store.submit_request("nobody", "status", {}, "tester")
    return {
        "everystep_workflow": (
            f"id = '{run.id}'",
            f"INSERT INTO everystep_workflow (id, name, args, status, created_at) "
            f"SELECT '{{new_id}}', name, args, '{{status}}', created_at FROM everystep_workflow WHERE id = '{run.id}'"),
        "everystep_step": (
            f"workflow_id = '{run.id}' AND step_id = '1'",
            f"INSERT INTO everystep_step (workflow_id, step_id, name, status, started_at) "
            f"SELECT workflow_id, '{{new_id}}', name, '{{status}}', started_at FROM everystep_step "
            f"WHERE workflow_id = '{run.id}' AND step_id = '1'"),
        "everystep_request": (
            f"id = {int(request.id)}",
            f"INSERT INTO everystep_request (runner, command, args, status, requested_by, created_at) "
            f"SELECT runner, '{{new_id}}', args, '{{status}}', requested_by, created_at FROM everystep_request "
            f"WHERE id = {int(request.id)}"),
    }


VOCABULARIES: dict[str, type[Status]] = {"everystep_workflow": RunStatus, "everystep_step": StepStatus,
                                          "everystep_request": RequestStatus}


def _refused(store: Store, statement: str) -> None:
    with pytest.raises(EverystepError, match="database error") as caught:
        _sql(store, statement)
    cause = str(caught.value.__cause__)
    assert "status" in cause or "CHECK" in cause, cause


def test_every_declared_status_is_accepted_and_nothing_else(store: Store) -> None:
    for table, (where, insert) in _rows(store).items():
        vocabulary = VOCABULARIES[table]
        for status in vocabulary:
            _sql(store, f"UPDATE {table} SET status = '{status}' WHERE {where}")
            _sql(store, insert.format(new_id=uuid.uuid4(), status=status))
        for word in ("bogus", "", next(iter(vocabulary)).upper()):
            _refused(store, f"UPDATE {table} SET status = '{word}' WHERE {where}")
            _refused(store, insert.format(new_id=uuid.uuid4(), status=word))


def test_a_step_status_is_no_run_status(store: Store) -> None:
    """Each column holds its own vocabulary: the three are not one set."""
    rows = _rows(store)
    _refused(store, f"UPDATE everystep_workflow SET status = 'done' WHERE {rows['everystep_workflow'][0]}")
    _refused(store, f"UPDATE everystep_step SET status = 'completed' WHERE {rows['everystep_step'][0]}")
    _refused(store, f"UPDATE everystep_request SET status = 'running' WHERE {rows['everystep_request'][0]}")


# -- a new status ---------------------------------------------------------------------------------

def _identity(store: Store, table: str) -> Any:
    """What changes when a table is rebuilt (copied to new storage) and
    stays when only what checks it changes."""
    queries = {
        "sqlite": f"SELECT rootpage AS identity, sql AS definition FROM sqlite_master WHERE name = '{table}'",
        "postgres": f"SELECT relfilenode AS identity, 0 AS definition FROM pg_class WHERE relname = '{table}'",
        "mariadb": "SELECT TABLE_ID AS identity, 0 AS definition FROM information_schema.INNODB_SYS_TABLES "
                   f"WHERE NAME = CONCAT(DATABASE(), '/{table}')",
    }
    with store.connection() as conn:
        row = conn.execute(queries[store.backend]).fetchone()
    return row["identity"], row["definition"]


def _recorded_hash(store: Store) -> str:
    with store.connection() as conn:
        return str(conn.execute("SELECT sha256 FROM everystep_function WHERE name = 'statuses'").fetchone()["sha256"])


@pytest.fixture
def fresh_store(empty_db_url: str) -> Iterator[Store]:
    store = connect(empty_db_url)
    store.migrate()
    try:
        yield store
    finally:
        store.close()


def test_a_new_status_reaches_the_database_without_a_migration_or_a_rebuild(
    fresh_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = fresh_store
    where = _rows(store)["everystep_workflow"][0]
    _refused(store, f"UPDATE everystep_workflow SET status = 'new_in_test' WHERE {where}")
    before = {table: _identity(store, table) for table in VOCABULARIES}
    first_hash = _recorded_hash(store)

    monkeypatch.setitem(functions.STATUS_DOMAINS, "run_statuses", (*RunStatus, "new_in_test"))
    assert store.migrate() == []  # no numbered migration: the status file is re-rendered and re-applied
    assert store.schema_version() == migrations.latest(store.backend)
    assert _recorded_hash(store) != first_hash
    _sql(store, f"UPDATE everystep_workflow SET status = 'new_in_test' WHERE {where}")
    _refused(store, f"UPDATE everystep_workflow SET status = 'new_in_tests' WHERE {where}")
    assert {table: _identity(store, table) for table in VOCABULARIES} == before

    monkeypatch.undo()  # the status leaves the models again: its rows first, then the check
    _sql(store, f"UPDATE everystep_workflow SET status = 'completed' WHERE {where}")
    assert store.migrate() == []
    assert _recorded_hash(store) == first_hash
    _refused(store, f"UPDATE everystep_workflow SET status = 'new_in_test' WHERE {where}")
    assert {table: _identity(store, table) for table in VOCABULARIES} == before
