"""Messages, child runs and deadlines with real supervisors, on every
backend: a waiting run holds no child (``ctl status`` shows every child
idle), a send or a child's end resumes it, a SIGKILL on either side of the
consuming commit delivers a message exactly once, a deadline kills a
spinning step, and a waiting run survives a supervisor restart and a
PostgreSQL restart.

Nothing is timed: waits are for conditions, with generous deadlines.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import everystep
from everystep import schedule
from everystep.models import CANCELLED, COMPLETED, SCHEDULED, STEP_WAITING, STEP_FAILED
from everystep.store import Store, connect
from tests.apps import waits as apps
from tests.support.pgserver import PgServer, start_server
from tests.support.supervisor import error_type, supervisors, wait_for_pids_gone, wait_run  # noqa: F401
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(300)]

APP = "tests.apps.waits"


def waiting(store: Store, run_id: str, kind: str = "message") -> Any:
    """Wait until the run waits: scheduled, its wait recorded."""
    return wait_until(lambda: (lambda run, links: run if run.status == SCHEDULED and links.wait_key
                               and links.wait_key.startswith(kind) else None)(store.get_run(run_id),
                                                                              store.links(run_id)),
                      f"run {run_id} to wait for a {kind}", timeout=60)


def all_idle(sup: Any) -> bool:
    return all(child["state"] == "idle" for child in sup.status()["children"])


def test_a_message_before_and_after_recv(db_url, store, supervisors):
    sup = supervisors(db_url, procs=2, app=APP).start()
    early = schedule(apps.approval, "early", database=store)
    everystep.send(early.id, "approved", "before", database=store)
    late = schedule(apps.approval, "late", database=store)
    waiting(store, late.id)
    assert store.get_steps(late.id)[0].status == STEP_WAITING
    wait_until(lambda: all_idle(sup), "every child idle while the run waits")
    everystep.send(late.id, "approved", "after", database=store)
    assert wait_run(store, early.id, (COMPLETED,), supervisor=sup).result["decision"] == "before"
    assert wait_run(store, late.id, (COMPLETED,), supervisor=sup).result["decision"] == "after"


def test_a_recv_times_out_under_a_supervisor(db_url, store, supervisors):
    sup = supervisors(db_url, procs=1, app=APP).start()
    run = schedule(apps.approval_with_timeout, 0.5, database=store)
    assert wait_run(store, run.id, (COMPLETED,), supervisor=sup).result == "timed out"


@pytest.mark.parametrize("kill_at", ["1", "2"], ids=["before-the-consuming-commit", "after-it"])
def test_sigkill_on_either_side_of_the_consuming_commit(db_url, store, supervisors, subprocess_env, tmp_path,
                                                         kill_at):
    env = {**subprocess_env, "EVERYSTEP_TEST_KILL_ONCE": "1"}
    sup = supervisors(db_url, procs=1, app=APP, env=env).start()
    run = schedule(apps.recv_then_kill, {"dir": str(tmp_path), "kill_at": kill_at}, database=store)
    everystep.send(run.id, "go", "m1", database=store)
    everystep.send(run.id, "go", "m2", database=store)
    done = wait_run(store, run.id, (COMPLETED,), supervisor=sup)
    assert (tmp_path / f"killed-{run.id}").exists()
    assert done.result == "m1"
    assert [(m.payload, m.consumed_step) for m in store.messages(run.id)] == [("m1", "1"), ("m2", None)]
    lines = (tmp_path / "effects.txt").read_text().splitlines()
    # Killed after the effect of step 2: it ran twice (at-least-once), with the one message.
    assert lines == (["got m1"] if kill_at == "1" else ["got m1", "got m1"])


def test_a_parent_waits_for_three_children_holding_no_child(db_url, store, supervisors):
    sup = supervisors(db_url, procs=2, app=APP).start()
    parent = schedule(apps.parent_of_waiters, 3, database=store)
    waiting(store, parent.id, "child")
    children = wait_until(lambda: (lambda kids: kids if len(kids) == 3 else None)(store.children(parent.id)),
                          "three children")
    for child in children:
        waiting(store, child.id)
    wait_until(lambda: all_idle(sup), "every child process idle while four runs wait")
    for child in children:
        everystep.send(child.id, "release", child.id, database=store)
    done = wait_run(store, parent.id, (COMPLETED,), supervisor=sup)
    assert done.result == [child.id for child in children]
    assert len(store.children(parent.id)) == 3


def test_a_failing_child_reaches_its_parent(db_url, store, supervisors):
    sup = supervisors(db_url, procs=2, app=APP).start()
    parent = schedule(apps.parent_of_three, database=store)
    done = wait_run(store, parent.id, (COMPLETED,), timeout=120, supervisor=sup)
    assert done.result[0] == 2 and done.result[2] == 6
    assert done.result[1]["status"] == "failed" and done.result[1]["cause"] == "boom"


def test_cancel_cascades_to_a_running_child(db_url, store, supervisors, subprocess_env):
    sup = supervisors(db_url, procs=2, app=APP).start()
    parent = schedule(apps.parent_of_spinner, 600, database=store)
    child = wait_until(lambda: (lambda kids: kids[0] if kids else None)(store.children(parent.id)), "the child")
    pid = sup.busy_child(child.id)["pid"]
    result = subprocess.run([sys.executable, "-m", "everystep.cli", "cancel", parent.id, "--database", db_url],
                            env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    wait_for_pids_gone([pid])
    assert wait_run(store, child.id, (CANCELLED,)).error["message"].startswith(f"parent run {parent.id}")
    assert store.get_run(parent.id).status == CANCELLED


def test_a_cancelled_parent_kills_every_running_child_at_once(db_url, store, supervisors, subprocess_env,
                                                              tmp_path):
    """Five children, each in a long step; the parent is cancelled. The
    first child killed is respawned at once, and the parent's LISTEN
    connection is closed around that fork: here the fork is held open until
    the whole cascade has committed (``hold_forks_while_cancelling``), so
    the other four cancels notify nobody. The docs promise a cancelled
    run's step is killed within milliseconds on PostgreSQL and a poll
    interval elsewhere; with ``--lease 600`` the periodic fence check
    comes only every 150 s, so killing them all within the (generous) 60 s
    wait means the supervisor looked again once it listened again."""
    gate = tmp_path / "fork-gate"
    gate.mkdir()
    env = {**subprocess_env, "EVERYSTEP_TEST_FORK_GATE": str(gate)}
    sup = supervisors(db_url, procs=5, app=APP, env=env, args=["--lease", "600"]).start()
    parent = schedule(apps.parent_of_spinners, 5, 600, database=store)
    children = wait_until(lambda: (lambda kids: kids if len(kids) == 5 else None)(store.children(parent.id)),
                          "five children")
    pids = [sup.busy_child(child.id)["pid"] for child in children]
    (gate / "cancelling").touch()
    result = subprocess.run([sys.executable, "-m", "everystep.cli", "cancel", parent.id, "--database", db_url],
                            env=subprocess_env, capture_output=True, text=True, timeout=120)
    (gate / "cancelled").touch()
    assert result.returncode == 0, result.stderr
    assert all(store.get_run(child.id).status == CANCELLED for child in children)
    wait_for_pids_gone(pids, timeout=60)
    for child in children:
        step = wait_until(lambda: (lambda steps: steps[0] if steps and steps[0].status == STEP_FAILED else None)(
            store.get_steps(child.id)), f"child {child.id}'s cut-off step to be recorded")
        assert error_type(step.error) == "everystep.errors.Cancelled"
    assert sup.log().count("was cancelled; killing child") == 5


def test_a_deadline_kills_a_spinning_step(db_url, store, supervisors):
    sup = supervisors(db_url, procs=1, app=APP).start()
    run = schedule(apps.spins, 600, timeout=2, database=store)
    pid = sup.busy_child(run.id)["pid"]
    wait_for_pids_gone([pid])
    cancelled = wait_run(store, run.id, (CANCELLED,), supervisor=sup)
    assert cancelled.error["message"] == "deadline"
    step = wait_until(lambda: (lambda steps: steps[0] if steps and steps[0].status == STEP_FAILED else None)(
        store.get_steps(run.id)), "the cut-off step to be recorded")
    assert error_type(step.error) == "everystep.errors.Cancelled"


def test_a_run_scheduled_on_the_command_line_keeps_its_workflows_timeout(db_url, store, supervisors,
                                                                        subprocess_env):
    """``@workflow(timeout=2)``, scheduled by ``everystep schedule`` with no
    deadline of its own: cancelled at its deadline, its step killed."""
    sup = supervisors(db_url, procs=1, app=APP).start()
    done = subprocess.run([sys.executable, "-m", "everystep.cli", "schedule", apps.spins_past_its_timeout.name, "[600]",
                           "--app", APP, "--database", db_url],
                          env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    assert store.links(run_id).deadline is not None
    cancelled = wait_run(store, run_id, (CANCELLED,), timeout=120, supervisor=sup)
    assert cancelled.error["message"] == "deadline"
    step = wait_until(lambda: (lambda steps: steps[0] if steps and steps[0].status == STEP_FAILED else None)(
        store.get_steps(run_id)), "the cut-off step to be recorded")
    assert error_type(step.error) == "everystep.errors.Cancelled"


def test_a_waiting_run_survives_a_supervisor_restart(db_url, store, supervisors):
    first = supervisors(db_url, procs=1, app=APP).start()
    run = schedule(apps.approval, "restart", database=store)
    waiting(store, run.id)
    assert first.stop() == 0
    second = supervisors(db_url, procs=1, app=APP).start()
    everystep.send(run.id, "approved", "after the restart", database=store)
    assert wait_run(store, run.id, (COMPLETED,), supervisor=second).result["decision"] == "after the restart"


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PgServer]:
    server = start_server(env_var="EVERYSTEP_NO_EXTERNAL_SERVER_FOR_WAITS")
    try:
        yield server
    finally:
        server.close()


@pytest.mark.backends("postgres")
def test_a_waiting_run_survives_a_postgres_restart(db_url, private_pg, supervisors):
    url = private_pg.create_database("everystep_waits")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{conn.info.dbname}" SET synchronous_commit = on')
    store = connect(url)
    try:
        store.migrate()
        sup = supervisors(url, procs=1, app=APP).start()
        run = schedule(apps.approval, "pg-restart", database=store)
        waiting(store, run.id)
        private_pg.restart()
        wait_until(lambda: _sends(store, run.id), "a send once PostgreSQL is back", timeout=120)
        assert wait_run(store, run.id, (COMPLETED,), timeout=120, supervisor=sup).result["decision"] == "back"
    finally:
        store.close()
        private_pg.drop_database(url)


def _sends(store: Store, run_id: str) -> bool:
    try:
        everystep.send(run_id, "approved", "back", idempotency_key="after-restart", database=store)
    except everystep.EverystepError:
        return False
    return True
