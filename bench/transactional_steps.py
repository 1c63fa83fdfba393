"""Case 13, transactional steps against plain steps writing the same rows.

A 3-step run whose steps each insert one row into an application table,
in two forms, executed in this process (``runner.execute`` of claimed runs,
as a supervisor child does):

- **transactional**: ``@step(transactional=True)``, the insert on
  ``step_connection()``: per step one transaction holding the insert and
  the record (BEGIN, INSERT, record, COMMIT);
- **plain**: ``@step``, the same insert on an application connection of its
  own in autocommit (its own commit), then the step's record (the last
  step's folded with the run's status, as usual).

Paired: each repetition times ``runs`` runs of each form on the same
database, the order alternating between repetitions, and the ratio is taken
within the repetition. On PostgreSQL with the benchmark's durable commit
and on SQLite (WAL, ``synchronous=NORMAL``: commits do not wait for the disk).

``python -m bench.transactional_steps --database URL [--runs N] [--reps N]``
runs it alone.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

from everystep import step, step_connection, workflow
from everystep.store import connect

from . import paired_forms
from .context import Context
from .report import Section
from .stats import Series

CLAIMER = "bench-transactional"
TABLE = "bench_tx_row"
_app = threading.local()


def _placeholder(conn: Any) -> str:
    return "?" if isinstance(conn, sqlite3.Connection) else "%s"


def _insert(conn: Any, label: str) -> None:
    sql = f"INSERT INTO {TABLE} (label) VALUES ({_placeholder(conn)})"
    if hasattr(conn, "execute"):
        conn.execute(sql, (label,))
    else:  # PyMySQL
        with conn.cursor() as cursor:
            cursor.execute(sql, (label,))


def _own_connection() -> Any:
    """The plain steps' application connection (autocommit: each insert its own commit)."""
    conn = getattr(_app, "conn", None)
    if conn is None:
        conn = _app.conn = _open(_app.url)
    return conn


def _open(url: str) -> Any:
    if url.startswith("sqlite"):
        return sqlite3.connect(url[len("sqlite:///"):], isolation_level=None, timeout=30)
    if url.startswith("postgres"):
        import psycopg

        return psycopg.connect(url, autocommit=True)
    import pymysql

    from everystep.store.mariadb import connect_args

    return pymysql.connect(**connect_args(url), autocommit=True)


@step(transactional=True)
def insert_in_transaction(label: str) -> str:
    _insert(step_connection(), label)
    return label


@step
def insert_on_its_own(label: str) -> str:
    _insert(_own_connection(), label)
    return label


@workflow
def three_transactional(label: str) -> str:
    insert_in_transaction(f"{label}-1")
    insert_in_transaction(f"{label}-2")
    return insert_in_transaction(f"{label}-3")


@workflow
def three_plain(label: str) -> str:
    insert_on_its_own(f"{label}-1")
    insert_on_its_own(f"{label}-2")
    return insert_on_its_own(f"{label}-3")


FORMS = {"transactional": three_transactional, "plain": three_plain}


def _prepare(url: str) -> None:
    conn = _open(url)
    try:
        for sql in (f"CREATE TABLE IF NOT EXISTS {TABLE} (label VARCHAR(64) NOT NULL)", f"DELETE FROM {TABLE}"):
            if hasattr(conn, "execute"):
                conn.execute(sql)
            else:
                with conn.cursor() as cursor:
                    cursor.execute(sql)
    finally:
        conn.close()


def measure(url: str, runs: int, reps: int) -> dict[str, Series]:
    """ms per run of each form, and plain ÷ transactional within each repetition."""
    _prepare(url)
    _app.url = url
    store = connect(url)
    try:
        store.migrate()
        out = paired_forms.alternate(store, FORMS, runs, reps, CLAIMER)
    finally:
        store.close()
        conn = getattr(_app, "conn", None)
        if conn is not None:
            conn.close()
            _app.conn = None
    return out


def run(ctx: Context) -> None:
    paired_forms.run_both(ctx, "case13", measure, ("transactional", "plain"), "transactional.db")


def section(ctx: Context) -> Section:
    out = ctx.results.get("case13", {})
    section = Section(
        "case13", "Case 13 — transactional steps",
        method=(
            f"In process, `runner.execute` of claimed 3-step runs whose steps each insert one row: "
            f"`@step(transactional=True)` inserting on `step_connection()` (the insert and the record in one "
            f"transaction) against `@step` inserting on an application connection in autocommit (its own "
            "commit, then the record). " + paired_forms.how(out)
        ),
    )
    table = paired_forms.table(out, ["database", "transactional, ms per run", "plain, ms per run",
                                     "plain ÷ transactional (paired)"], ("transactional", "plain"))
    section.tables.append(table)
    return section


if __name__ == "__main__":
    paired_forms.main("python -m bench.transactional_steps", measure)
