"""Stored functions live in store/functions/<backend>/ and are re-applied by
the migrator when their text changes (store/functions/__init__.py); the
numbered migrations hold DDL only."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from everystep.store import functions, migrations
from everystep.store.postgres import PostgresStore


@pytest.fixture
def fresh_pg(pg_server: Any) -> Iterator[str]:
    url = pg_server.create_database("everystep_functions")
    try:
        yield url
    finally:
        pg_server.drop_database(url)


def definitions(url: str) -> dict[str, str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {row[0]: row[1] for row in conn.execute(
            "SELECT proname, pg_get_functiondef(oid) FROM pg_proc WHERE proname LIKE 'everystep%'")}


def recorded(url: str) -> dict[str, tuple[str, Any]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {row[0]: (row[1], row[2]) for row in conn.execute(
            "SELECT name, sha256, applied_at FROM everystep_function")}


def test_numbered_migrations_hold_no_function_bodies() -> None:
    postgres_files = "\n".join(function.sql for function in functions.available("postgres"))
    for backend in ("postgres", "sqlite", "mariadb"):
        for migration in migrations.available(backend):
            text = "\n".join(migration.statements()).upper()
            # A body never; a DROP FUNCTION only to change a signature or a
            # result type, as the function files say (the file re-creates it).
            # One exception: the first body of a function that a CHECK
            # constraint of the same migration calls (it must exist for the
            # constraint to be created); its file replaces it at once.
            for name in re.findall(r"(?:CREATE|REPLACE)\s+(?:FUNCTION|PROCEDURE)\s+(\w+)", text):
                assert re.search(rf"CHECK \({name}\(", text), (migration.name, name)
                assert f"CREATE OR REPLACE FUNCTION {name.lower()}(" in postgres_files, (migration.name, name)
    for function in functions.available("postgres"):
        assert all(statement.startswith("CREATE OR REPLACE FUNCTION") for statement in function.statements())
    for function in functions.available("mariadb"):
        kind = "ALTER TABLE" if function.name == "statuses" else "CREATE OR REPLACE PROCEDURE"
        assert all(statement.startswith(kind) for statement in function.statements()), function.name
    assert [function.name for function in functions.available("mariadb")] == ["claim", "statuses", "wake"]
    # SQLite claims in Python: its only file is the status columns' triggers.
    [statuses] = functions.available("sqlite")
    assert statuses.name == "statuses"
    assert all(statement.startswith(("DROP TRIGGER IF EXISTS", "CREATE TRIGGER"))
               for statement in statuses.statements())


def test_a_fresh_database_gets_every_file_once(fresh_pg: str) -> None:
    store = PostgresStore(fresh_pg)
    try:
        store.migrate()
        first = recorded(fresh_pg)
        assert {name: sha for name, (sha, _) in first.items()} == {
            function.name: function.sha256 for function in functions.available("postgres")}
        assert set(definitions(fresh_pg)) == {"everystep_claim", "everystep_claim_limited",
                                              "everystep_next_due", "everystep_served_queues",
                                              "everystep_is_run_status", "everystep_is_step_status",
                                              "everystep_is_request_status", "everystep_record_step",
                                              "everystep_record_step_marked", "everystep_finish_run_with_step",
                                              "everystep_finish_run_with_step_marked"}
        assert store.migrate() == []
        assert recorded(fresh_pg) == first  # an unchanged file is not applied again
    finally:
        store.close()


def test_a_changed_or_missing_function_is_applied_again(fresh_pg: str) -> None:
    """What an upgrade does: a recorded hash that differs from the file's
    (or none, as on a database the previous release migrated) brings the
    function back to the file's text, without a numbered version."""
    store = PostgresStore(fresh_pg)
    try:
        store.migrate()
        expected = definitions(fresh_pg)
        with psycopg.connect(fresh_pg, autocommit=True) as conn:
            conn.execute("CREATE OR REPLACE FUNCTION everystep_next_due(p_queues text[]) RETURNS double precision"
                         " LANGUAGE sql AS $$ SELECT 42::float8 $$")
            conn.execute("UPDATE everystep_function SET sha256 = 'older' WHERE name = 'next_due'")
            conn.execute("DELETE FROM everystep_function WHERE name = 'claim'")
        assert definitions(fresh_pg) != expected
        assert store.migrate() == []
        assert definitions(fresh_pg) == expected
        assert store.next_due(["any"]) is None
        assert {name: sha for name, (sha, _) in recorded(fresh_pg).items()} == {
            function.name: function.sha256 for function in functions.available("postgres")}
    finally:
        store.close()
