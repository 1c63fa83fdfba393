"""Patches: a deploy that adds a step under ``patched()`` carries the runs
already in flight on their old path, and new runs on the new one.

Runs are left part-way by ``patch_v1`` (the fault hook stops them right
after a step's effect, as a process death would), then resumed by
``patch_v2`` (the tax step under ``patched("tax")``) and ``patch_v3`` (the
patch deprecated). Every backend: the marker is one step row, written in
the transaction of the next write."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from everystep import dryrun, patched, schedule, send
from everystep.errors import SimulatedCrash, WorkflowCodeError
from everystep.models import COMPLETED, FAILED, STEP_WAITING, STEP_DONE, Claim, Outcome
from everystep.patches import PATCH_STEP, marker_id
from everystep.store import Marker, NewStep, Store, utcnow
from tests.apps import patch_v1, patch_v2, patch_v3
from tests.support.cli import run_in_process
from tests.support.deploys import deploy
from tests.support.runs import crash_at, execute_run

pytestmark = [pytest.mark.timeout(120)]

ORDER = {"sku": "A-1", "amount": 30}


@pytest.fixture(autouse=True)
def _v1_after() -> types.GeneratorType:  # type: ignore[type-arg]
    yield
    deploy(patch_v1)



def left_after(store: Store, step_id: str) -> str:
    """A ``patch_v1`` run whose process died right after step ``step_id``'s
    effect; back in the queue."""
    deploy(patch_v1)
    run = schedule(patch_v1.order, ORDER, database=store)
    crash_at(step_id)
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    return run.id


def steps(store: Store, run_id: str) -> dict[str, tuple[str, object]]:
    return {record.step_id: (record.name, record.result) for record in store.get_steps(run_id)}


def test_a_run_past_the_patch_point_keeps_the_old_branch(store: Store) -> None:
    run_id = left_after(store, "3")  # reserve and charge recorded by the old code
    deploy(patch_v2)
    assert execute_run(store, run_id) == COMPLETED
    assert steps(store, run_id) == {
        "1": ("patch.reserve", "A-1"), marker_id("tax"): (PATCH_STEP, False),
        "2": ("patch.charge", 30), "3": ("patch.ship", "shipped A-1"), "4": ("patch.notify", "shipped A-1"),
    }


def test_a_new_run_takes_the_new_branch(store: Store) -> None:
    deploy(patch_v2)
    run = schedule(patch_v2.order, ORDER, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert steps(store, run.id) == {
        "1": ("patch.reserve", "A-1"), marker_id("tax"): (PATCH_STEP, True), "2": ("patch.tax", 3),
        "3": ("patch.charge", 30), "4": ("patch.ship", "shipped A-1"), "5": ("patch.notify", "shipped A-1"),
    }


def test_a_run_short_of_the_patch_point_takes_the_new_branch(store: Store) -> None:
    run_id = left_after(store, "2")  # only reserve recorded
    deploy(patch_v2)
    assert execute_run(store, run_id) == COMPLETED
    recorded = steps(store, run_id)
    assert recorded[marker_id("tax")] == (PATCH_STEP, True)
    assert recorded["2"] == ("patch.tax", 3) and recorded["4"] == ("patch.ship", "shipped A-1")


def test_the_marker_rides_with_the_next_write_and_replays(store: Store) -> None:
    deploy(patch_v2)
    run = schedule(patch_v2.order, ORDER, database=store)
    crash_at("2")  # dies after tax's effect: nothing written since reserve
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert set(steps(store, run.id)) == {"1"}  # no marker on its own
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    crash_at("3")  # dies after charge's effect: tax and its marker are recorded
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert set(steps(store, run.id)) == {"1", marker_id("tax"), "2"}
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == COMPLETED
    assert [r.step_id for r in store.get_steps(run.id) if r.name == PATCH_STEP] == [marker_id("tax")]


def test_a_marker_with_the_runs_end(store: Store) -> None:
    """A patch after the last step: the marker goes with the run's status."""
    deploy(patch_v2)
    run = schedule(patch_v2.tail, ORDER, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result is True
    assert steps(store, run.id)[marker_id("tail")] == (PATCH_STEP, True)


def test_deprecating_a_patch_with_no_old_run_in_flight(store: Store) -> None:
    deploy(patch_v2)
    new = schedule(patch_v2.order, ORDER, database=store)
    crash_at("3")
    with pytest.raises(SimulatedCrash):
        execute_run(store, new.id)
    assert store.requeue(store.get_run(new.id).claim_as("tester"))
    deploy(patch_v3)
    fresh = schedule(patch_v3.order, ORDER, database=store)
    assert execute_run(store, new.id) == COMPLETED
    assert execute_run(store, fresh.id) == COMPLETED
    assert marker_id("tax") not in steps(store, fresh.id)  # deprecation records nothing
    assert steps(store, fresh.id)["2"] == ("patch.tax", 3)


def test_deprecating_a_patch_fails_a_run_that_took_the_old_branch(store: Store) -> None:
    old = left_after(store, "3")
    deploy(patch_v2)
    crash_at("4")  # the marker (False) rides with ship's record; notify dies
    with pytest.raises(SimulatedCrash):
        execute_run(store, old)
    assert steps(store, old)[marker_id("tax")] == (PATCH_STEP, False)
    assert store.requeue(store.get_run(old).claim_as("tester"))
    deploy(patch_v3)
    verdicts = {v.run_id: v for v in dryrun.check_deploy(store)}
    assert verdicts[old].outcome == dryrun.Prediction.CODE_ERROR
    assert execute_run(store, old) == FAILED
    error = store.get_run(old).exception
    assert isinstance(error, WorkflowCodeError) and "deprecated" in str(error)


def test_outside_a_workflow_the_new_branch() -> None:
    assert patched("anything") is True


def in_flight(store: Store, module: types.ModuleType, run_id: str, dies_after: str) -> None:
    """Execute ``run_id`` with ``module``'s code until it dies after step
    ``dies_after``'s effect; back in the queue."""
    deploy(module)
    crash_at(dies_after)
    with pytest.raises(SimulatedCrash):
        execute_run(store, run_id)
    assert store.requeue(store.get_run(run_id).claim_as("tester"))


def test_check_deploy_counts_each_patchs_branches(store: Store, db_url: str, subprocess_env: dict[str, str],
                                                  tmp_path: Path) -> None:
    old = left_after(store, "3")
    in_flight(store, patch_v2, old, "4")  # recorded False
    new = schedule(patch_v2.order, ORDER, database=store).id
    in_flight(store, patch_v2, new, "3")  # recorded True
    schedule(patch_v2.order, ORDER, database=store)  # not at the patch point yet

    def check(module: types.ModuleType) -> tuple[int, dict[str, Any]]:
        deploy(module)
        done = run_in_process(["check-deploy", "--database", db_url, "--app", module.__name__, "--json"],
                              subprocess_env, tmp_path)
        report = json.loads(done.stdout)
        (tax,) = [patch for patch in report["patches"] if patch["patch"] == "tax"]
        return done.returncode, tax

    code, tax = check(patch_v2)
    assert code == 0
    assert (tax["new"], tax["old"], tax["in_code"]) == (1, 1, "patched")
    assert "keep both branches" in tax["advice"]
    code, tax = check(patch_v3)
    assert code == 1  # the old run would fail
    assert (tax["new"], tax["old"], tax["in_code"]) == (1, 1, "deprecated")
    deploy(patch_v2)
    assert execute_run(store, old) == COMPLETED
    code, tax = check(patch_v2)
    assert (code, tax["old"]) == (0, 0) and "can be deprecated" in tax["advice"]
    code, tax = check(patch_v3)
    assert (code, tax["old"], tax["in_code"]) == (0, 0, "deprecated") and "can be deleted" in tax["advice"]
    deploy(patch_v3)
    done = run_in_process(["check-deploy", "--database", db_url, "--app", "tests.apps.patch_v3"], subprocess_env,
                          tmp_path)
    assert "PATCH" in done.stdout and "can be deleted" in done.stdout


def test_check_deploy_counts_the_branch_a_waiting_run_will_take(store: Store, db_url: str,
                                                                 subprocess_env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    """Runs waiting in recv, recorded by code without the patch, are past a
    patch added before the wait: they have not recorded it, yet each takes
    the old branch when it resumes. check-deploy counts them as old."""
    deploy(patch_v1)
    waiting = [schedule(patch_v1.approved, ORDER, database=store).id for _ in range(3)]
    for run_id in waiting:
        assert execute_run(store, run_id) == Outcome.RELEASED
        assert store.get_steps(run_id)[-1].status == STEP_WAITING
    deploy(patch_v2)
    fresh = schedule(patch_v2.approved, ORDER, database=store).id
    assert execute_run(store, fresh) == Outcome.RELEASED  # took the new branch, now waits too

    done = run_in_process(["check-deploy", "--database", db_url, "--app", "tests.apps.patch_v2", "--json"],
                          subprocess_env, tmp_path)
    assert done.returncode == 0, done.stderr
    (report,) = [patch for patch in json.loads(done.stdout)["patches"] if patch["patch"] == "approval-tax"]
    assert (report["new"], report["old"]) == (1, 3)
    assert "keep both branches" in report["advice"]

    # What it predicted is what happens.
    for run_id in (*waiting, fresh):
        send(run_id, "approval", True, database=store)
        assert execute_run(store, run_id) == COMPLETED
    assert [steps(store, run_id)[marker_id("approval-tax")][1] for run_id in (*waiting, fresh)] == [
        False, False, False, True]


def test_runs_record_the_code_version_they_started_under(store: Store, db_url: str,
                                                         subprocess_env: dict[str, str], tmp_path: Path) -> None:
    """A hash of the workflow's code and its steps: unchanged code keeps its
    version, changed code gets a new one; --app-version names it."""
    from everystep import versions

    deploy(patch_v1)
    old = schedule(patch_v1.order, ORDER, database=store)
    assert old.app_version == versions.code_version(patch_v1.order)
    deploy(patch_v2)
    new = schedule(patch_v2.order, ORDER, database=store)
    assert new.app_version == versions.code_version(patch_v2.order) != old.app_version
    assert schedule(patch_v2.order, ORDER, database=store).app_version == new.app_version
    named = run_in_process(["schedule", "patch.order", json.dumps([ORDER]), "--app-version", "blue-7",
                            "--database", db_url], subprocess_env, tmp_path)
    assert named.returncode == 0, named.stderr
    listed = run_in_process(["runs", "--version", "blue-7", "--json", "--database", db_url], subprocess_env, tmp_path)
    assert [run["app_version"] for run in json.loads(listed.stdout)] == ["blue-7"]
    shown = run_in_process(["show", old.id, "--database", db_url], subprocess_env, tmp_path)
    assert f"version    {old.app_version}" in shown.stdout


def test_branches_asking_about_one_patch_get_one_answer(store: Store) -> None:
    deploy(patch_v2)
    run = schedule(patch_v2.fan, ORDER, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == [[True, "A-1"], [True, 30]]
    markers = [r for r in store.get_steps(run.id) if r.name == PATCH_STEP]
    assert [(r.step_id, r.result) for r in markers] == [(marker_id("fan"), True)]


def _marker(patch_id: str) -> Marker:
    return Marker(marker_id(patch_id), PATCH_STEP, json.dumps([patch_id]), "true")


def _done(step_id: str, result: object) -> NewStep:
    return NewStep(step_id, "x.y", "[]", "{}", utcnow(), STEP_DONE, json.dumps(result))


def test_a_step_written_with_its_marker_says_what_was_written(store: Store) -> None:
    """Every outcome of a step record carrying a marker in its own
    statement: both rows new; the marker recorded already; the step
    recorded already; a claim no longer current (nothing written)."""
    run_id = store.schedule(patch_v1.order.name, "[]").id
    (run,) = store.claim("tester", 1, [patch_v1.order.name])
    assert run.id == run_id

    first = store.record_step(run.claim, _done("1", 1), markers=(_marker("a"),))
    assert first is not None and first.ours and first.record.result == 1
    assert steps(store, run_id) == {"1": ("x.y", 1), marker_id("a"): (PATCH_STEP, True)}

    again = store.record_step(run.claim, _done("2", 2), markers=(_marker("a"),))  # the marker is there already
    assert again is not None and again.record.result == 2
    assert steps(store, run_id)["2"] == ("x.y", 2)

    taken = store.record_step(run.claim, _done("1", 99), markers=(_marker("b"),))  # the step is there already
    assert taken is not None and not taken.ours and taken.record.result == 1
    assert steps(store, run_id)["1"] == ("x.y", 1)

    stale = Claim(run_id, "tester", run.claim_epoch - 1)
    assert store.record_step(stale, _done("3", 3), markers=(_marker("c"),)) is None
    assert {"3", marker_id("c")}.isdisjoint(steps(store, run_id))
