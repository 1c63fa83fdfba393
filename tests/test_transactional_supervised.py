"""Transactional steps under a real supervisor: a child SIGKILLed while its
step's transaction is open, and a step killed at its timeout, write nothing
of that step; the run goes on and every row is written exactly once."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from everystep import schedule
from everystep.models import COMPLETED, STEP_DONE, STEP_FAILED
from everystep.store import Store
from tests.apps import transactional as app
from tests.support.supervisor import supervisors, wait_for_pids_gone, wait_run  # noqa: F401
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]

APP = "tests.apps.transactional"


def connection(url: str) -> Any:
    import sqlite3

    if url.startswith("sqlite"):
        return sqlite3.connect(url[len("sqlite:///"):], isolation_level=None, timeout=30)
    return psycopg.connect(url, autocommit=True)


def rows(url: str, run_id: str) -> list[str]:
    conn = connection(url)
    try:
        return sorted(label for owner, label in app.run_sql(conn, f"SELECT run_id, label FROM {app.TABLE}")
                      if owner == run_id)
    finally:
        conn.close()


@pytest.fixture
def table(db_url: str) -> str:
    conn = connection(db_url)
    try:
        app.create_table(conn)
        app.run_sql(conn, f"DELETE FROM {app.TABLE}")
    finally:
        conn.close()
    return db_url


def test_a_child_killed_with_its_transaction_open_writes_nothing_of_the_step(
        table: str, store: Store, supervisors: Any, tmp_path: Path) -> None:
    sup = supervisors(table, procs=1, app=APP).start()
    run = schedule(app.gated, {"dir": str(tmp_path)}, database=store)
    wait_until(lambda: (tmp_path / "held.inserted").exists(), "the held step's insert")
    child = sup.busy_child(run.id, step_id="2")
    assert rows(table, run.id) == ["first"]  # the insert is in the open transaction only

    os.kill(child["pid"], signal.SIGKILL)
    wait_for_pids_gone([child["pid"]])
    (tmp_path / "gate").touch()
    done = wait_run(store, run.id, (COMPLETED,), supervisor=sup)
    assert done.result == ["first", "held", "last"]
    assert rows(table, run.id) == ["first", "held", "last"]  # the replay inserted "held" once more, alone
    assert {s.step_id: s.status for s in store.get_steps(run.id)} == {"1": STEP_DONE, "2": STEP_DONE, "3": STEP_DONE}


def test_a_step_killed_at_its_timeout_writes_nothing(
        table: str, store: Store, supervisors: Any, tmp_path: Path) -> None:
    sup = supervisors(table, procs=1, app=APP).start()
    run = schedule(app.timing_out, {"dir": str(tmp_path)}, database=store)
    done = wait_run(store, run.id, (COMPLETED,), timeout=120, supervisor=sup)
    assert (tmp_path / "sleepy.inserted").exists()
    assert done.result == "after the timeout"
    assert rows(table, run.id) == ["after the timeout"]
    steps = {s.step_id: s for s in store.get_steps(run.id)}
    assert steps["1"].status == STEP_FAILED and steps["1"].error["type"] == "everystep.errors.StepTimeout"
    assert steps["2"].status == STEP_DONE
