"""Fork: repair runs a bad deploy failed. The fixed code runs a new run
from the step that failed; the steps before it are copied (replayed, never
re-run), in one transaction, and both runs say how they are related."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from everystep import admin, get_event, recv, schedule, workflow
from everystep.admin import AdminError
from everystep.errors import SimulatedCrash, WorkflowArgumentsError
from everystep.models import BLOCKED, COMPLETED, FAILED, SCHEDULED, Outcome
from everystep.store import Store
from tests.apps import repair_v1, repair_v2
from tests.support.cli import run_in_process
from tests.support.deploys import deploy
from tests.support.runs import crash_at, execute_run

pytestmark = [pytest.mark.timeout(120)]

ORDER = {"sku": "A-1", "amount": 30}



@pytest.fixture(autouse=True)
def _bad_deploy() -> Iterator[None]:
    deploy(repair_v1)
    repair_v1.CALLS.clear()
    yield
    deploy(repair_v1)


def failed_run(store: Store) -> str:
    run = schedule(repair_v1.order, ORDER, database=store)
    assert execute_run(store, run.id) == FAILED
    return run.id


def test_fork_from_the_failed_step_completes_with_the_fixed_code(store: Store) -> None:
    old = failed_run(store)
    reservation = {r.step_id: r for r in store.get_steps(old)}["1"].result
    deploy(repair_v2)
    new, copied = admin.fork(store, old, "2")
    assert (copied, new.status, new.name, new.forked_from) == (1, SCHEDULED, "repair.order", old)
    assert execute_run(store, new.id) == COMPLETED
    assert store.get_run(new.id).result == f"shipped {reservation} for 30"
    assert repair_v1.CALLS["reserve"] == 1  # copied, not re-run
    steps = {r.step_id: (r.name, r.status, r.result) for r in store.get_steps(new.id)}
    assert steps == {"1": ("repair.reserve", "done", reservation), "2": ("repair.charge", "done", 30),
                     "3": ("repair.ship", "done", f"shipped {reservation} for 30")}
    assert store.get_run(old).status == FAILED  # the source is left as it was
    assert [run.id for run in store.forks_of(old)] == [new.id]


def test_fork_with_new_arguments(store: Store) -> None:
    old = failed_run(store)
    deploy(repair_v2)
    new, _ = admin.fork(store, old, "2", args=[{"sku": "A-1", "amount": 45}])
    assert execute_run(store, new.id) == COMPLETED
    assert store.get_run(new.id).result.endswith("for 45")


def test_fork_from_a_step_not_recorded_is_refused(store: Store) -> None:
    old = failed_run(store)
    with pytest.raises(AdminError, match="no recorded step '7'"):
        admin.fork(store, old, "7")


def test_fork_inside_an_uncertain_effect_window_is_refused(store: Store) -> None:
    run = schedule(repair_v1.checkout, ORDER, database=store)
    crash_at("2")  # pay's effect happened, its outcome was never recorded
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == BLOCKED
    with pytest.raises(AdminError, match="uncertain effect window of unsafe step 2"):
        admin.fork(store, run.id, "2", force=True)  # a blocked run is unfinished: forced
    new, copied = admin.fork(store, run.id, "1", force=True)  # before the window: allowed
    assert copied == 0 and new.forked_from == run.id


def test_the_cli_forks_and_refuses_in_one_line(store: Store, db_url: str, subprocess_env: dict[str, str],
                                               tmp_path: Path) -> None:
    old = failed_run(store)
    deploy(repair_v2)
    done = run_in_process(["fork", old, "--from-step", "2", "--database", db_url, "--app", "tests.apps.repair_v2",
                           "--json"], subprocess_env, tmp_path)
    assert done.returncode == 0, done.stderr
    new = json.loads(done.stdout)
    assert new["forked_from"] == old and new["copied_steps"] == 1
    refused = run_in_process(["fork", old, "--from-step", "nope", "--database", db_url], subprocess_env, tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.splitlines()) == 1 and "no recorded step 'nope'" in refused.stderr
    shown = run_in_process(["show", old, "--database", db_url], subprocess_env, tmp_path)
    assert new["id"] in shown.stdout
    shown = run_in_process(["show", new["id"], "--database", db_url], subprocess_env, tmp_path)
    assert f"forked from {old}" in shown.stdout


def test_a_fork_publishes_the_events_its_copied_steps_published(store: Store) -> None:
    """get_event on a fork answers as it did on the source at the fork's
    step: each key's last value among the copied set_event steps."""
    old = schedule(repair_v1.approval, ORDER, database=store)
    assert execute_run(store, old.id) == FAILED
    assert get_event(old.id, "status", database=store) == "approved"
    deploy(repair_v2)
    new, copied = admin.fork(store, old.id, "5")  # from the failed charge
    assert copied == 4
    assert get_event(new.id, "status", database=store) == "approved"
    assert get_event(new.id, "approver", database=store) == "ops"
    early, _ = admin.fork(store, old.id, "3")  # before "approved" was published: it is published again
    assert get_event(early.id, "status", database=store) == "reserved"
    with pytest.raises(TimeoutError):
        get_event(early.id, "approver", database=store)
    assert execute_run(store, new.id) == COMPLETED
    assert get_event(new.id, "status", database=store) == "charged"
    assert get_event(old.id, "status", database=store) == "approved"  # the source is left as it was


@workflow(name="repair.awaiting")
def awaiting(o: dict[str, object]) -> str:
    repair_v1.reserve(o)
    return str(recv("go"))


def test_a_run_that_is_not_finished_is_forked_only_when_forced(store: Store) -> None:
    """A fork beside a live run makes two live runs for one order: refused,
    saying why, unless forced."""
    scheduled = schedule(repair_v1.order, ORDER, database=store)
    waiting = schedule(awaiting, ORDER, database=store)
    assert execute_run(store, waiting.id) == Outcome.RELEASED
    for run_id, state in ((scheduled.id, "scheduled"), (waiting.id, 'scheduled, waiting for message "go"')):
        with pytest.raises(AdminError) as refused:
            admin.fork(store, run_id, "1")
        assert f"run {run_id} is not finished ({state}): a fork would be a second live run" in str(refused.value)
        assert f"everystep cancel {run_id}" in str(refused.value) and "--force" in str(refused.value)
        assert store.forks_of(run_id) == []
    with pytest.raises(AdminError, match="no recorded step"):
        admin.fork(store, scheduled.id, "1", force=True)  # nothing recorded yet: the other checks stand
    new, copied = admin.fork(store, waiting.id, "2", force=True)
    assert (copied, new.forked_from) == (1, waiting.id)
    assert store.get_run(waiting.id).status == SCHEDULED  # left as it was


def test_fork_arguments_are_checked_against_the_workflow(store: Store, db_url: str,
                                                         subprocess_env: dict[str, str], tmp_path: Path) -> None:
    old = failed_run(store)
    deploy(repair_v2)
    with pytest.raises(WorkflowArgumentsError, match=r"repair.order\(o\) cannot take 2 argument"):
        admin.fork(store, old, "2", args=[ORDER, "extra"])
    refused = run_in_process(["fork", old, "--from-step", "2", "--args", json.dumps([ORDER, 1]),
                              "--database", db_url, "--app", "tests.apps.repair_v2"], subprocess_env, tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.splitlines()) == 1
    assert "cannot take 2 argument(s)" in refused.stderr and "--args is the JSON array" in refused.stderr
    assert store.forks_of(old) == []
