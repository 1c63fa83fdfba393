"""Transactional steps for the supervisor tests (``--app tests.apps.transactional``).

Each step inserts a row into ``tx_app_row`` through ``step_connection()``,
then leaves a trace file in ``spec["dir"]`` (``<label>.inserted``) so the
test knows the insert happened and the transaction is still open; the
test creates the table. ``held`` then waits for the file ``<dir>/gate``,
``sleepy`` sleeps past its one-second timeout.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from everystep import StepTimeout, step, step_connection, workflow
from everystep.context import current
from tests.support.waiting import wait_for_file

TABLE = "tx_app_row"
GIVE_UP_SECONDS = 300.0


def create_table(conn: Any) -> None:
    run_sql(conn, f"CREATE TABLE IF NOT EXISTS {TABLE} (run_id VARCHAR(64) NOT NULL, label VARCHAR(64) NOT NULL)")


def run_sql(conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    sql = sql.replace("?", "?" if isinstance(conn, sqlite3.Connection) else "%s")
    cursor = conn.execute(sql, params)
    return [tuple(row) for row in cursor.fetchall()] if cursor.description else []


def _insert(spec: dict[str, Any], label: str) -> None:
    ctx = current()
    run_sql(step_connection(), f"INSERT INTO {TABLE} (run_id, label) VALUES (?, ?)",
            (ctx.workflow_id if ctx else "-", label))
    (Path(spec["dir"]) / f"{label}.inserted").touch()


@step(transactional=True)
def held(spec: dict[str, Any], label: str) -> str:
    _insert(spec, label)
    wait_for_file(Path(spec["dir"]) / "gate", GIVE_UP_SECONDS, 0.02)
    return label


@step(transactional=True, timeout=1)
def sleepy(spec: dict[str, Any], label: str) -> str:
    _insert(spec, label)
    time.sleep(GIVE_UP_SECONDS)
    return label


@step(transactional=True)
def quick(spec: dict[str, Any], label: str) -> str:
    _insert(spec, label)
    return label


@workflow
def gated(spec: dict[str, Any]) -> list[str]:
    return [quick(spec, "first"), held(spec, "held"), quick(spec, "last")]


@workflow
def timing_out(spec: dict[str, Any]) -> str:
    try:
        sleepy(spec, "sleepy")
    except StepTimeout:
        return quick(spec, "after the timeout")
    return "not timed out"
