"""Durable sleep in-process, on both backends: a sleep records its wake
time and releases the run, returns on the replay after it, cannot be
swallowed by the body, lets parallel branches go on and wakes the run at
the earliest wake time; check-deploy reads a sleeping run as resuming.

Nothing waits on a clock: a sleep is made over by moving its wake time
into the past in the database.
"""

from __future__ import annotations

import datetime as dt

import pytest

import everystep
from everystep import EverystepError, schedule
from everystep.models import STEP_DONE, STEP_FAILED, STEP_SLEEPING
from everystep.runner import Outcome
from everystep.store import Store, utcnow
from tests.apps.lifecycle_in_process import (
    plain, sleep_beside_a_failure, sleeps, sleeps_until, sleepy_branches, swallows_the_sleep,
)
from tests.support.runs import claim_run, execute_run, expire_wait

# The engine's own statements: also through PgBouncer in transaction mode.
pytestmark = pytest.mark.pooled

def test_a_sleep_records_its_wake_time_and_releases_the_run(store: Store) -> None:
    run = schedule(sleeps, 3600, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    released = store.get_run(run.id)
    steps = store.get_steps(run.id)
    assert [(s.step_id, s.name, s.status) for s in steps] == [
        ("1", plain.name, STEP_DONE), ("2", "everystep.sleep", STEP_SLEEPING)]
    assert steps[1].wake_at == released.not_before
    assert dt.timedelta(seconds=3590) < released.not_before - steps[1].started_at <= dt.timedelta(seconds=3600)
    assert store.claim("other", 10, [sleeps.name]) == []


def test_a_sleep_that_is_over_returns_on_replay(store: Store) -> None:
    run = schedule(sleeps, 3600, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    # An hour later, as far as the database is concerned.
    store.release(store.get_run(run.id).claim_as("nobody"), utcnow())  # refused: not running
    expire_wait(store, run.id, "2")
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert [s.status for s in store.get_steps(run.id)] == [STEP_DONE, STEP_DONE, STEP_DONE]


def test_sleep_zero_and_sleep_until_the_past_do_not_release(store: Store) -> None:
    run = schedule(sleeps, 0, database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    run = schedule(sleeps_until, utcnow() - dt.timedelta(minutes=5), database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_steps(run.id)[0].status == STEP_DONE


def test_the_body_cannot_swallow_a_sleep(store: Store) -> None:
    run = schedule(swallows_the_sleep, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED


def test_sleep_outside_a_workflow_is_a_plain_sleep_and_bad_arguments_are_refused() -> None:
    everystep.sleep(0)
    everystep.sleep_until(utcnow() - dt.timedelta(seconds=1))
    with pytest.raises(EverystepError, match="finite number of seconds"):
        everystep.sleep(-1)
    with pytest.raises(EverystepError, match="aware datetime"):
        everystep.sleep_until(dt.datetime(2030, 1, 1))


def test_parallel_branches_go_on_while_one_sleeps_and_the_run_wakes_at_the_earliest(store: Store) -> None:
    """Branch 0 sleeps an hour, branch 2 a day; branch 1 runs both its
    steps. The run is released once branch 1 settled, until the earliest
    wake time; on that replay branch 0 goes on, branch 2 still waits."""
    run = schedule(sleepy_branches, 3600, 86400, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    steps = {s.step_id: s for s in store.get_steps(run.id)}
    assert {sid: s.status for sid, s in steps.items()} == {
        "1.0.1": STEP_SLEEPING, "1.1.1": STEP_DONE, "1.1.2": STEP_DONE, "1.2.1": STEP_SLEEPING}
    assert store.get_run(run.id).not_before == steps["1.0.1"].wake_at
    expire_wait(store, run.id, "1.0.1")
    assert execute_run(store, run.id) == Outcome.RELEASED
    steps = {s.step_id: s for s in store.get_steps(run.id)}
    assert steps["1.0.1"].status == STEP_DONE and steps["1.0.2"].result == "a"
    assert steps["1.2.1"].status == STEP_SLEEPING
    assert store.get_run(run.id).not_before == steps["1.2.1"].wake_at
    expire_wait(store, run.id, "1.2.1")
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == ("a", ("b1", "b2"), "c")


def test_a_sleeping_branch_outranks_a_failing_one(store: Store) -> None:
    run = schedule(sleep_beside_a_failure, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    assert {s.step_id: s.status for s in store.get_steps(run.id)} == {"1.0.1": STEP_SLEEPING, "1.1.1": STEP_FAILED}
    expire_wait(store, run.id, "1.0.1")
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == "caught"


def test_a_sleep_in_place_of_a_recorded_step_is_a_code_error(store: Store) -> None:
    run = schedule(sleeps, 3600, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    with store.connection() as conn:
        marker = "?" if store.backend == "sqlite" else "%s"
        conn.execute(f"UPDATE everystep_step SET name = 'elsewhere.step' WHERE workflow_id = {marker} "
                     "AND step_id = '2'", (run.id,))
    expire_wait(store, run.id, "2")
    assert execute_run(store, run.id) == Outcome.FAILED
    assert store.get_run(run.id).error["type"] == "everystep.errors.WorkflowCodeError"


def test_check_deploy_says_a_waiting_run_resumes(store: Store) -> None:
    from everystep import dryrun

    run = schedule(sleeps, 3600, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    verdict = dryrun.replay(store.get_run(run.id), store.get_steps(run.id))
    assert verdict.outcome == dryrun.Prediction.RESUMES and "waits until" in verdict.detail
    fresh = schedule(sleeps, 3600, database=store, delay=60)
    with store.connection() as conn:
        marker = "?" if store.backend == "sqlite" else "%s"
        conn.execute(f"UPDATE everystep_workflow SET not_before = NULL WHERE id = {marker}", (fresh.id,))
    claimed = claim_run(store, fresh.id)
    store.requeue(claimed.claim)
    assert dryrun.replay(store.get_run(fresh.id), []).next_step == "1"
