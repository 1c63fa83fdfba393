"""PostgreSQL backend (psycopg 3), the production store.

Connections run in autocommit mode: each step record is its own short
transaction, and multi-statement operations (claims, admin changes) open an
explicit one. json columns (stored verbatim, so key order survives replay) are parsed straight into tagged Python values by
a per-connection loader, so rows need no second decoding pass. psycopg
prepares a statement server-side after it has been executed a few times on a
connection, which suits the handful of hot statements a runner repeats.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import psycopg.errors
import psycopg.sql
from psycopg.types.json import set_json_loads

from .. import serde
from .base import Store

# Any fixed 64-bit number: the advisory lock that serialises migrations.
_MIGRATION_LOCK = 0x657665727973746

NOTIFY_CHANNEL = "everystep_scheduled"


class PostgresStore(Store):
    backend = "postgres"
    # Connection loss, shutdowns, failovers (a demoted primary refuses writes)
    # and cancelled statements are transient: the run is retried, never failed.
    _unavailable = (
        psycopg.OperationalError,
        psycopg.InterfaceError,
        psycopg.errors.ReadOnlySqlTransaction,
    )
    _driver_errors = (psycopg.Error,)
    _insert_migration_sql = (
        "INSERT INTO everystep_migration (version, name, applied_at) VALUES (%(version)s, %(name)s, %(now)s)"
    )

    def __init__(self, url: str, connect_timeout: float = 10.0, application_name: str = "everystep") -> None:
        super().__init__(url)
        self.connect_timeout = connect_timeout
        self.application_name = application_name

    def _open(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=max(1, int(self.connect_timeout)),
            application_name=self.application_name,
        )
        set_json_loads(serde.loads, conn)
        return conn

    def _healthy(self, conn: Any) -> bool:
        return not conn.closed and not conn.broken

    @contextlib.contextmanager
    def _transaction(self, conn: Any) -> Iterator[Any]:
        with conn.transaction():
            yield conn

    def _migrate_locked(self, conn: Any) -> list[str]:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS everystep_migration ("
                " version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL)"
            )
            applied = {row[0] for row in conn.execute("SELECT version FROM everystep_migration")}
            return self._apply_pending(conn, applied)

    def schema_version(self) -> int:
        with self.connection() as conn:
            exists = conn.execute("SELECT to_regclass('everystep_migration') IS NOT NULL").fetchone()[0]
            if not exists:
                return 0
            return int(conn.execute("SELECT coalesce(max(version), 0) FROM everystep_migration").fetchone()[0])

    def listen_connection(self, channels: Sequence[str] = ()) -> psycopg.Connection[Any]:
        """A dedicated connection LISTENing for newly scheduled runs (and on
        ``channels`` too).

        The caller owns it (it is not pooled) and watches ``fileno()`` in its
        selector; ``conn.notifies(timeout=0)`` drains what arrived.
        """
        conn = self._open()
        conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        for channel in channels:
            conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        return conn
