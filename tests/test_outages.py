"""Database outages: PostgreSQL goes away mid-load and comes back.

Runners must stay up, warn once per outage, reconnect, and recover any run
whose records could not be written by replaying it: never mark it failed
because the database blinked, never leave it claimed. A private cluster is
used so it can be stopped without disturbing the rest of the suite.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import everystep
from everystep import schedule, workflow
from everystep.models import COMPLETED, TERMINAL_STATUSES, Outcome
from everystep.store import connect
from everystep.worker import Worker
from tests.apps import supervised
from tests.apps.outages import outage_flow
from tests.support.pgserver import PgServer, start_server
from tests.support.runs import execute_run, worker_running
from tests.support.supervisor import supervisors  # noqa: F401
from tests.support.waiting import wait_until

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PgServer]:
    server = start_server(env_var="EVERYSTEP_NO_EXTERNAL_SERVER_FOR_OUTAGES")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def outage_url(private_pg: PgServer) -> Iterator[str]:
    url = private_pg.create_database("everystep_outage")
    with psycopg.connect(url, autocommit=True) as conn:
        # Acknowledged commits must survive the crash-restart below.
        conn.execute(f'ALTER DATABASE "{conn.info.dbname}" SET synchronous_commit = on')
    connect(url).migrate()
    try:
        yield url
    finally:
        if not _accepting(private_pg):
            private_pg.start()
        private_pg.drop_database(url)


def _accepting(server: PgServer) -> bool:
    try:
        psycopg.connect(server.admin_url, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


def _wait_all(store, run_ids: list[str], timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    statuses: dict[str, str] = {}
    while time.monotonic() < deadline:
        try:
            statuses = {run_id: store.get_run(run_id).status for run_id in run_ids}
        except Exception:
            statuses = {}
        if statuses and all(status in TERMINAL_STATUSES for status in statuses.values()):
            return statuses
        time.sleep(0.1)
    return statuses


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_threaded_worker_rides_out_a_restart(private_pg, outage_url, caplog, mode):
    store = connect(outage_url)
    runs = [schedule(outage_flow, index, database=store).id for index in range(8)]
    worker = Worker(pool_size=4, poll=0.05, name="outage-worker", database=connect(outage_url), lease=30)
    with worker_running(worker) as thread:
        deadline = time.monotonic() + 30
        while not any(store.get_steps(run_id) for run_id in runs) and time.monotonic() < deadline:
            time.sleep(0.02)
        private_pg.stop(mode)
        time.sleep(1.5)  # the worker keeps trying meanwhile
        assert thread.is_alive()
        private_pg.start()
        statuses = _wait_all(store, runs, 90)
    assert not thread.is_alive()
    assert statuses == {run_id: COMPLETED for run_id in runs}
    assert [store.get_run(run_id).result for run_id in runs] == [index + 4 for index in range(8)]
    assert store.list_runs(status="running") == []
    warnings = [r.getMessage() for r in caplog.records if "retrying until the database is back" in r.getMessage()]
    assert len(warnings) <= 2, warnings  # one per activity (claims, heartbeat), not one per retry


def test_supervisor_rides_out_a_restart(private_pg, outage_url, supervisors, tmp_path):
    store = connect(outage_url)
    sup = supervisors(outage_url, procs=2,
                      args=["--poll", "0.1", "--app", "tests.apps.supervised,tests.apps.outages"]).start()
    spec = {"dir": str(tmp_path)}
    runs = [schedule(supervised.tiny, spec, database=store).id for _ in range(4)]
    runs += [schedule(outage_flow, index, database=store).id for index in range(6)]
    private_pg.stop("immediate")
    time.sleep(2.0)
    assert sup.alive()
    private_pg.start()
    statuses = _wait_all(store, runs, 120)
    assert statuses == {run_id: COMPLETED for run_id in runs}, sup.log()
    assert sup.alive()
    assert sup.status()["children"], "the supervisor still has children and answers its socket"
    assert sup.stop() == 0, sup.log()
    assert store.list_runs(status="running") == []


def test_cli_worker_survives_an_outage_and_drains_cleanly(private_pg, outage_url, subprocess_env, tmp_path):
    store = connect(outage_url)
    runs = [schedule(outage_flow, index, database=store).id for index in range(4)]
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "everystep.cli", "worker", "--app", "tests.apps.outages", "--database",
             outage_url, "--name", "cli-outage", "--pool", "2", "--poll", "0.05", "--drain", "10"],
            env=subprocess_env, stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent,
        )
    try:
        # Restart only once the worker is at work (its name registered): a
        # restart during its start-up check is a bad command line, exit 3.
        wait_until(lambda: any(runner.name == "cli-outage" for runner in store.list_runners()),
                   "the worker to register", timeout=60, detail=log.read_text)
        private_pg.restart()
        statuses = _wait_all(store, runs, 90)
        assert proc.poll() is None, log.read_text()
        proc.terminate()
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert statuses == {run_id: COMPLETED for run_id in runs}, log.read_text()


def _roll_back_to_running(store, run_id: str, claimer: str) -> None:
    """What a crash does to a terminal write that was committed
    asynchronously and never flushed."""
    with store.connection() as conn:
        if store.backend != "sqlite":
            conn.execute("UPDATE everystep_workflow SET status = 'running', claimed_by = %s, result = NULL, "
                         "completed_at = NULL WHERE id = %s", (claimer, run_id))
        else:
            conn.execute("UPDATE everystep_workflow SET status = 'running', claimed_by = ?, result = NULL, "
                         "completed_at = NULL WHERE id = ?", (claimer, run_id))


def test_supervisor_resumes_a_run_rolled_back_to_running_under_its_name(db_url, supervisors, tmp_path):
    store = connect(db_url)
    sup = supervisors(db_url, procs=1, args=["--app", "tests.apps.supervised,tests.apps.outages"]).start()
    run = schedule(outage_flow, 1, database=store)
    assert _wait_all(store, [run.id], 60) == {run.id: COMPLETED}
    _roll_back_to_running(store, run.id, sup.name)
    assert _wait_all(store, [run.id], 60) == {run.id: COMPLETED}, sup.log()
    assert store.get_run(run.id).result == 5
    assert "that nothing here was executing" in sup.log()
    assert sup.stop() == 0


def test_worker_resumes_a_run_rolled_back_to_running_under_its_name(db_url):
    store = connect(db_url)
    worker = Worker(pool_size=1, poll=0.05, name="reconciler", database=connect(db_url))
    with worker_running(worker):
        run = schedule(outage_flow, 2, database=store)
        assert _wait_all(store, [run.id], 60) == {run.id: COMPLETED}
        _roll_back_to_running(store, run.id, "reconciler")
        assert _wait_all(store, [run.id], 60) == {run.id: COMPLETED}
        assert store.get_run(run.id).result == 6


def test_supervisor_logs_one_line_per_outage_with_a_periodic_workflow(private_pg, outage_url, supervisors):
    """A periodic workflow in the app: the parent's ticker has nothing due
    most of the time and must not report the database reachable then, or
    every retry of the other activities starts the outage again."""
    store = connect(outage_url)
    sup = supervisors(outage_url, procs=2,
                      args=["--poll", "0.1",
                            "--app", "tests.apps.supervised,tests.apps.outages,tests.apps.periodic"]).start()
    runs = [schedule(outage_flow, index, database=store).id for index in range(30)]
    wait_until(lambda: any(store.get_steps(run_id) for run_id in runs), "runs in flight", timeout=60)
    private_pg.stop("fast")
    time.sleep(12.0)  # the outage itself: every activity of the parent retries meanwhile
    assert sup.alive(), sup.log()
    private_pg.start()
    statuses = _wait_all(store, runs, 120)
    assert statuses == {run_id: COMPLETED for run_id in runs}, sup.log()
    parent = f"[{sup.pid}]"

    def parent_lines(text: str) -> list[str]:
        return [line for line in sup.log().splitlines() if parent in line and text in line]

    wait_until(lambda: parent_lines("database reachable again"), "the parent to see the database back",
               timeout=60, detail=sup.log)
    assert sup.stop() == 0, sup.log()
    started, ended = parent_lines("database unreachable"), parent_lines("database reachable again")
    assert (len(started), len(ended)) == (1, 1), "\n".join(started + ended)



@workflow
def publishes_then_waits() -> Any:
    everystep.set_event("progress", "halfway")
    return everystep.recv("approved")


FIRST_CALLS: dict[str, Callable[[str, str], Any]] = {
    "get_run": lambda url, run_id: everystep.get_run(run_id, database=url),
    "get_event": lambda url, run_id: everystep.get_event(run_id, "progress", database=url),
    "send": lambda url, run_id: everystep.send(run_id, "approved", "yes", database=url),
    "schedule": lambda url, run_id: everystep.schedule(outage_flow, 1, database=url),
    "get_run_async": lambda url, run_id: asyncio.run(everystep.get_run_async(run_id, database=url)),
    "send_async": lambda url, run_id: asyncio.run(everystep.send_async(run_id, "approved", "yes", database=url)),
    "schedule_async": lambda url, run_id: asyncio.run(everystep.schedule_async(outage_flow, 1, database=url)),
}


@pytest.mark.parametrize("call", list(FIRST_CALLS))
def test_the_first_client_call_after_a_restart_works(private_pg: PgServer, outage_url: str, call: str) -> None:
    """The client's pool holds connections the restart ended: the first
    call after the server is back must not be handed one of them."""
    store = connect(outage_url)
    run = everystep.schedule(publishes_then_waits, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED  # waits for its message, event published
    for name in ("get_run", "get_event", "get_run_async"):  # the default store's pool, warmed
        FIRST_CALLS[name](outage_url, run.id)
    private_pg.restart()
    assert _accepting(private_pg)
    answer = FIRST_CALLS[call](outage_url, run.id)
    if call == "get_event":
        assert answer == "halfway"
    elif call.startswith("get_run"):
        assert answer.id == run.id
