"""``manage.py migrate`` and ``everystep migrate`` build the same everystep
schema and never fight: on a fresh database, one after the other in either
order, and when a database left at an older everystep version is upgraded
by either command. Real ``manage.py`` and ``everystep`` processes, on SQLite
files and on fresh PostgreSQL databases."""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("django", reason="the django extra is not installed")

from everystep.store import migrations  # noqa: E402
from tests.support.django_project import (  # noqa: E402
    manage,
    manage_env,
    postgres_database,
    sqlite_database,
    write_settings,
)
from tests.support.pgserver import PgServer  # noqa: E402

pytestmark = pytest.mark.timeout(300)

class Database:
    """A fresh database of one backend, with both commands pointed at it."""

    def __init__(self, backend: str, directory: Path, pg_server: PgServer | None) -> None:
        self.backend = backend
        self.directory = directory
        if backend == "sqlite":
            self.path = directory / "db.sqlite3"
            self.url = f"sqlite:///{self.path}"
            databases = {"default": sqlite_database(self.path)}
        else:
            self.url = pg_server.create_database("everystep_migrate")  # type: ignore[union-attr]
            databases = {"default": postgres_database(self.url)}
        self.env = manage_env(directory, write_settings(directory, databases))

    def django_migrate(self, older: int | None = None) -> str:
        prefix = ["-m", "tests.support.older_schema", str(older)] if older else None
        done = manage(["migrate", "--noinput"], self.env, self.directory, prefix=prefix)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def everystep_migrate(self, older: int | None = None) -> str:
        command = [sys.executable, *(["-m", "tests.support.older_schema", str(older)] if older else []),
                   "-m", "everystep.cli", "migrate", "--database", self.url]
        import subprocess

        done = subprocess.run(command, env=self.env, cwd=self.directory, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def schema(self) -> dict[str, Any]:
        """everystep's part of the catalog: tables, columns, indexes,
        constraints, functions and the version table's content."""
        if self.backend == "sqlite":
            with contextlib.closing(sqlite3.connect(self.path)) as conn:
                objects = conn.execute(
                    "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name LIKE 'everystep%' ORDER BY name"
                ).fetchall()
                versions = conn.execute("SELECT version, name FROM everystep_migration ORDER BY version").fetchall()
            return {"objects": objects, "versions": versions}
        with psycopg.connect(self.url, autocommit=True) as conn:
            columns = conn.execute(
                "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns"
                " WHERE table_schema = 'public' AND table_name LIKE 'everystep%' ORDER BY 1, 2").fetchall()
            indexes = conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename LIKE 'everystep%' ORDER BY 1").fetchall()
            constraints = conn.execute(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid::regclass::text LIKE 'everystep%' ORDER BY 1").fetchall()
            functions = conn.execute(
                "SELECT proname, pg_get_function_identity_arguments(oid), prosrc FROM pg_proc"
                " WHERE proname LIKE 'everystep%' ORDER BY 1, 2").fetchall()
            versions = conn.execute("SELECT version, name FROM everystep_migration ORDER BY version").fetchall()
        return {"columns": columns, "indexes": indexes, "constraints": constraints, "functions": functions,
                "versions": versions}

    def versions(self) -> list[int]:
        return [version for version, _ in self.schema()["versions"]]


@pytest.fixture(params=["sqlite", "postgres"])
def fresh(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Database]]:
    backend = request.param
    pg_server = request.getfixturevalue("pg_server") if backend == "postgres" else None
    made: list[Database] = []

    def make() -> Database:
        database = Database(backend, tmp_path_factory.mktemp(f"migrate-{backend}"), pg_server)
        made.append(database)
        return database

    yield make
    for database in made:
        if database.backend == "postgres":
            pg_server.drop_database(database.url)  # type: ignore[union-attr]


def all_versions(backend: str) -> list[int]:
    return [migration.version for migration in migrations.available(backend)]


def test_both_commands_build_the_same_schema(fresh: Callable[[], Database]) -> None:
    by_django, by_everystep = fresh(), fresh()
    out = by_django.django_migrate()
    assert "Applied everystep schema 0001_initial" in out
    by_everystep.everystep_migrate()
    assert by_django.schema() == by_everystep.schema()
    assert by_django.versions() == all_versions(by_django.backend)


def test_either_command_after_the_other_finds_nothing_to_do(fresh: Callable[[], Database]) -> None:
    reference = fresh()
    reference.everystep_migrate()
    expected = reference.schema()

    first_everystep = fresh()
    first_everystep.everystep_migrate()
    assert "Applied everystep schema" not in first_everystep.django_migrate()
    assert first_everystep.schema() == expected

    first_django = fresh()
    first_django.django_migrate()
    assert "schema is up to date" in first_django.everystep_migrate()
    assert "Applied everystep schema" not in first_django.django_migrate()  # again: still nothing
    assert first_django.schema() == expected


def test_a_newer_everystep_is_applied_by_either_command(fresh: Callable[[], Database]) -> None:
    """A database migrated by an everystep that shipped only version 1 is
    brought up to date by the current one, through either command."""
    reference = fresh()
    reference.everystep_migrate()
    expected = reference.schema()
    latest = all_versions(reference.backend)
    assert len(latest) >= 2

    old_by_everystep = fresh()
    old_by_everystep.everystep_migrate(older=1)
    assert old_by_everystep.versions() == [1]
    out = old_by_everystep.django_migrate()
    assert f"Applied everystep schema {', '.join(n for n in names(reference.backend)[1:])}" in out
    assert old_by_everystep.schema() == expected

    old_by_django = fresh()
    old_by_django.django_migrate(older=1)
    assert old_by_django.versions() == [1]
    # (On SQLite, opening the store already upgrades it; the command then
    # reports the version it found.)
    assert f"version {latest[-1]}" in old_by_django.everystep_migrate()
    assert old_by_django.versions() == latest
    assert old_by_django.schema() == expected


def names(backend: str) -> list[str]:
    return [f"{m.version:04d}_{m.name}" for m in migrations.available(backend)]
