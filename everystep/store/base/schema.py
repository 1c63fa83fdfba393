"""The schema: applying migrations, and the version a database is at.

Migrations run in one transaction that serialises concurrent migrators
(``_migration_transaction``: an advisory lock on PostgreSQL, a named lock on
MariaDB, the write lock on SQLite), each recorded in the version table
inside it. A crash mid-way rolls the whole batch back, so the next
``migrate`` starts again from the last version recorded; a migration is
never half applied, and one applied is never applied twice.
"""

from __future__ import annotations

from typing import Any

from .. import functions, migrations
from .core import StoreCore


class Schema(StoreCore):
    """Migrations, through a pooled connection or one a host framework owns."""

    def migrate(self) -> list[str]:
        """Apply pending migrations; returns the names applied (idempotent,
        safe to run concurrently: the backend serialises migrators)."""
        with self.connection() as conn:
            return self._migrate_through(conn)

    def _migrate_through(self, conn: Any) -> list[str]:
        with self._migration_transaction(conn):
            conn.execute(self.sql["create_migration_table"])
            applied = {int(row["version"]): row["name"]
                       for row in conn.execute(self.sql["applied_migrations"]).fetchall()}
            done = []
            for migration in migrations.available(self.backend):
                # A version recorded as the placeholder of a migration that
                # did not exist yet is applied now that it does.
                placeholder = applied.get(migration.version) == migrations.PLACEHOLDER != migration.name
                if migration.version in applied and not placeholder:
                    continue
                for statement in migration.statements():
                    conn.execute(statement)
                record = "rename_migration" if placeholder else "insert_migration"
                conn.execute(self.sql[record], self._params(version=migration.version, name=migration.name))
                done.append(f"{migration.version:04d}_{migration.name}")
            functions.apply(conn, self.backend, self.sql, self._params, everything=bool(done))
            return done

    def schema_version(self) -> int:
        """The highest migration applied (0 on a database without everystep)."""
        with self.connection() as conn:
            if not conn.execute(self.sql["migration_table_exists"]).fetchone()["present"]:
                return 0
            return int(conn.execute(self.sql["schema_version"]).fetchone()["version"])

    @classmethod
    def migrate_on(cls, conn: Any) -> list[str]:
        """Apply pending migrations through ``conn``, a connection of this
        backend that a host framework owns (Django's ``manage.py migrate``
        runs this on its own connection, which may be a test database only
        that connection can see). Same files, same lock, same version table
        as ``migrate()``, so the two paths never disagree. ``conn`` must be
        in autocommit mode, outside any transaction; it is left open, with
        its own row factory."""
        # A bare instance: the migrator needs the backend's statements and
        # transaction hooks, not a pool or a URL of its own.
        migrator = cls.__new__(cls)
        StoreCore.__init__(migrator, "")
        with cls._named_rows(conn):
            return migrator._migrate_through(conn)
