"""unsafe_to_repeat steps, blocked runs, and their resolution through
``everystep.admin.resolve_step``: each path and every refusal."""

from __future__ import annotations

import dataclasses

import datetime as dt
import threading
from collections import Counter
from typing import Any

import pytest

from everystep import admin, parallel, runner, schedule, step, workflow
from everystep.admin import AdminError
from everystep.errors import EffectUncertain, EverystepError, RunNotFound, SimulatedCrash, StepFailure
from everystep.models import (
    BLOCKED,
    COMPLETED,
    FAILED,
    RUNNING,
    SCHEDULED,
    STEP_DONE,
    STEP_FAILED,
    STEP_STARTED,
    STOPPED,
)
from everystep.store import NewStep, connect
from tests.support.runs import claim_run, crash_at, execute_run

# The engine's own statements: also through PgBouncer in transaction mode.
pytestmark = pytest.mark.pooled

CALLS: Counter[str] = Counter()
SEEN: list[Any] = []
_lock = threading.Lock()
PROBE: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()
    SEEN.clear()
    PROBE.clear()
    RACE.clear()


def called(label: str) -> None:
    with _lock:
        CALLS[label] += 1


@step(unsafe_to_repeat=True)
def charge(order: str, amount: int) -> dict[str, Any]:
    called("charge")
    store = PROBE.get("store")
    if store is not None:
        # What the database holds while the effect is under way.
        PROBE["during"] = [(s.step_id, s.status, s.args) for s in store.get_steps(PROBE["run_id"])]
    return {"order": order, "charged": amount}


@step
def note(label: str) -> str:
    called(label)
    return label


@step
def refund(order: str) -> str:
    called("refund")
    return f"refunded {order}"


@workflow
def checkout(order: str) -> Any:
    note("reserve")
    receipt = charge(order, 42)
    note("ship")
    return receipt


@workflow
def checkout_with_cleanup(order: str) -> Any:
    note("reserve")
    try:
        receipt = charge(order, 42)
    except StepFailure as exc:
        SEEN.append(str(exc))
        refund(order)
        raise
    note("ship")
    return receipt


@step(unsafe_to_repeat=True)
def declined(order: str) -> None:
    called("declined")
    raise ValueError(f"card declined for {order}")


@workflow
def checkout_declined(order: str) -> Any:
    try:
        declined(order)
    except ValueError as exc:
        SEEN.append(str(exc))
    return note("after")


def blocked_run(store: Any, wf: Any = checkout, order: str = "o-1") -> str:
    """A run whose worker died in charge's effect window, then was claimed again."""
    run = schedule(wf, order, database=store)
    crash_at("2")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == BLOCKED
    return run.id


def statuses(store: Any, run_id: str) -> list[tuple[str, str]]:
    return [(s.step_id, s.status) for s in store.get_steps(run_id)]


# -- recording ------------------------------------------------------------------


def test_started_row_is_written_before_the_effect(store: Any) -> None:
    run = schedule(checkout, "o-7", database=store)
    PROBE.update(store=store, run_id=run.id)
    assert execute_run(store, run.id) == COMPLETED
    assert PROBE["during"] == [("1", STEP_DONE, ["reserve"]), ("2", STEP_STARTED, ["o-7", 42])]
    steps = store.get_steps(run.id)
    assert statuses(store, run.id) == [("1", STEP_DONE), ("2", STEP_DONE), ("3", STEP_DONE)]
    assert steps[1].result == {"order": "o-7", "charged": 42}
    assert steps[1].completed_at >= steps[1].started_at
    assert store.get_run(run.id).result == {"order": "o-7", "charged": 42}


def test_a_failing_unsafe_step_is_recorded_failed_and_replayed_like_any_failure(store: Any) -> None:
    run = schedule(checkout_declined, "o-2", database=store)
    crash_at("2")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert statuses(store, run.id) == [("1", STEP_FAILED)]
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == COMPLETED
    assert SEEN == ["card declined for o-2", "card declined for o-2"]
    assert CALLS["declined"] == 1


def test_crash_in_the_effect_window_blocks_the_run(store: Any) -> None:
    run = schedule(checkout, "o-1", database=store)
    crash_at("2")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    # Exactly what a death in the effect window leaves behind.
    assert statuses(store, run.id) == [("1", STEP_DONE), ("2", STEP_STARTED)]
    parked = store.get_run(run.id)
    assert parked.status == RUNNING and parked.claimed_by == "tester"

    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == BLOCKED
    blocked = store.get_run(run.id)
    assert blocked.status == "blocked"
    assert blocked.error["type"] == "everystep.errors.EffectUncertain"
    assert f"everystep resolve-step {run.id} 2" in blocked.error["message"]
    assert isinstance(blocked.exception, EffectUncertain)
    assert blocked.result is None
    # The effect was not repeated and nothing after it ran.
    assert CALLS == Counter({"reserve": 1, "charge": 1})
    assert statuses(store, run.id) == [("1", STEP_DONE), ("2", STEP_STARTED)]


@step(unsafe_to_repeat=True)
def dies_mid_effect() -> None:
    called("dies_mid_effect")
    raise SimulatedCrash("the process died half way through the effect")


@workflow
def dies_mid_effect_wf() -> Any:
    return dies_mid_effect()


def test_death_inside_the_effect_leaves_the_started_row(store: Any) -> None:
    run = schedule(dies_mid_effect_wf, database=store)
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert statuses(store, run.id) == [("1", STEP_STARTED)]
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == BLOCKED
    assert CALLS["dies_mid_effect"] == 1


def test_unmarked_step_with_a_leftover_started_row_runs_again(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run = schedule(checkout, "o-3", database=store)
    crash_at("2")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    # The current code no longer marks the step unsafe: it may repeat.
    monkeypatch.setattr(charge, "unsafe_to_repeat", False)
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == COMPLETED
    assert CALLS["charge"] == 2
    assert statuses(store, run.id) == [("1", STEP_DONE), ("2", STEP_DONE), ("3", STEP_DONE)]


def test_blocked_is_not_reported_as_a_failure(store: Any) -> None:
    from everystep.context import Observer

    class Recorder(Observer):
        def __init__(self) -> None:
            self.statuses: list[str] = []

        def run_finished(self, run: Any, ctx: Any, status: str, error: Any, token: Any) -> None:
            self.statuses.append(status)

    recorder = Recorder()
    run = schedule(checkout, "o-4", database=store)
    crash_at("2")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id, observer=recorder)
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id, observer=recorder) == BLOCKED
    assert recorder.statuses == ["crashed", BLOCKED]


# -- a racing claimant ---------------------------------------------------------------

RACE: dict[str, Any] = {}


@step(unsafe_to_repeat=True)
def charge_slowly(order: str) -> str:
    called("charge_slowly")
    RACE["a_in_effect"].set()
    assert RACE["release_a"].wait(30)
    return f"charged {order}"


@workflow
def raced(order: str) -> Any:
    if threading.current_thread().name == "claimant-b":
        # B has loaded the run's (empty) records; it reaches the step only
        # once A holds the step's started row.
        RACE["b_loaded"].set()
        assert RACE["a_in_effect"].wait(30)
    return charge_slowly(order)


def test_racing_claimant_gets_effect_uncertain_without_running_the_effect(store: Any) -> None:
    RACE.update(a_in_effect=threading.Event(), release_a=threading.Event(), b_loaded=threading.Event())
    run = schedule(raced, "o-9", database=store)
    claimed = claim_run(store, run.id, "tester")
    outcomes: dict[str, Any] = {}

    def execute(label: str) -> None:
        try:
            outcomes[label] = runner.execute(store, claimed, claimer="tester")
        except BaseException as exc:  # surfaced by the asserts below
            outcomes[label] = exc

    # Two executions of one run under one name (a restarted process doing
    # catchup while the old one still runs): B loads the records first.
    b = threading.Thread(target=execute, args=("b",), name="claimant-b")
    b.start()
    assert RACE["b_loaded"].wait(30)
    a = threading.Thread(target=execute, args=("a",), name="claimant-a")
    a.start()
    b.join(30)
    assert not b.is_alive()
    assert outcomes["b"] == BLOCKED
    RACE["release_a"].set()
    a.join(30)
    assert not a.is_alive()
    # A's outcome write is refused: the run moved on to blocked.
    assert outcomes["a"] == "lost"
    assert CALLS["charge_slowly"] == 1
    assert statuses(store, run.id) == [("1", STEP_STARTED)]
    assert store.get_run(run.id).status == BLOCKED


def test_started_insert_is_the_atomic_claim_on_the_effect(store: Any) -> None:
    run = schedule(checkout, "o-5", database=store)
    claim = claim_run(store, run.id, "tester").claim
    now = dt.datetime.now(dt.timezone.utc)
    first = store.start_step(claim, NewStep("9", "x.y", "[]", "{}", now))
    second = store.start_step(claim, NewStep("9", "x.y", "[]", "{}", now))
    assert first.ours and first.record.status == STEP_STARTED
    assert not second.ours and second.record.status == STEP_STARTED
    # A claimer that does not own the run cannot start a step at all.
    assert store.start_step(dataclasses.replace(claim, claimer="intruder"), NewStep("10", "x.y", "[]", "{}", now)) is None
    # Nor can a stale claim of the right claimer: the epoch fences it.
    assert store.start_step(dataclasses.replace(claim, epoch=claim.epoch - 1), NewStep("11", "x.y", "[]", "{}", now)) is None


@workflow
def parallel_uncertain() -> Any:
    try:
        return parallel(lambda: charge("p", 1), lambda: note("ok"), lambda: refund_fails())
    except BaseException as exc:
        SEEN.append(type(exc))
        raise


@step
def refund_fails() -> None:
    raise KeyError("no refund")


def test_effect_uncertain_in_a_branch_is_raised_ahead_of_other_failures(store: Any) -> None:
    run = schedule(parallel_uncertain, database=store)
    crash_at("1.0.1")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    SEEN.clear()
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == BLOCKED
    assert SEEN == [EffectUncertain]


# -- resolution -----------------------------------------------------------------------


def assert_rescheduled(store: Any, run_id: str) -> None:
    run = store.get_run(run_id)
    assert run.status == SCHEDULED
    assert run.error is None and run.completed_at is None and run.result is None
    assert run.claimed_by is None


def test_resolve_with_result_records_it_and_the_run_resumes(store: Any) -> None:
    run_id = blocked_run(store)
    resolved = admin.resolve_step(store, run_id, "2", result={"order": "o-1", "charged": 40, "at": dt.date(2024, 1, 1)})
    assert resolved.status == SCHEDULED
    assert_rescheduled(store, run_id)
    step = store.get_steps(run_id)[1]
    assert step.status == STEP_DONE and step.result["charged"] == 40
    assert execute_run(store, run_id) == COMPLETED
    assert store.get_run(run_id).result == {"order": "o-1", "charged": 40, "at": dt.date(2024, 1, 1)}
    assert CALLS == Counter({"reserve": 1, "charge": 1, "ship": 1})


def test_resolve_with_a_null_result(store: Any) -> None:
    run_id = blocked_run(store)
    admin.resolve_step(store, run_id, "2", result=None)
    assert store.get_steps(run_id)[1].status == STEP_DONE
    assert execute_run(store, run_id) == COMPLETED
    assert store.get_run(run_id).result is None


def test_resolve_with_error_runs_durable_cleanup(store: Any) -> None:
    run_id = blocked_run(store, checkout_with_cleanup, "o-6")
    admin.resolve_step(store, run_id, "2", error="card network says: declined")
    assert_rescheduled(store, run_id)
    step = store.get_steps(run_id)[1]
    assert step.status == STEP_FAILED
    assert step.error["type"] == "everystep.errors.StepFailure"
    assert execute_run(store, run_id) == FAILED
    assert SEEN == ["card network says: declined"]
    assert CALLS["refund"] == 1 and CALLS["ship"] == 0 and CALLS["charge"] == 1
    failed = store.get_run(run_id)
    assert isinstance(failed.exception, StepFailure)
    assert str(failed.exception) == "card network says: declined"


def test_resolve_with_discard_runs_the_step_again(store: Any) -> None:
    run_id = blocked_run(store)
    admin.resolve_step(store, run_id, "2", discard=True)
    assert_rescheduled(store, run_id)
    assert statuses(store, run_id) == [("1", STEP_DONE)]
    assert execute_run(store, run_id) == COMPLETED
    assert CALLS["charge"] == 2
    assert statuses(store, run_id) == [("1", STEP_DONE), ("2", STEP_DONE), ("3", STEP_DONE)]


# -- refusals --------------------------------------------------------------------------


def snapshot(store: Any, run_id: str) -> Any:
    run = store.get_run(run_id)
    return (run.status, run.claimed_by, run.error, run.result, run.completed_at,
            [(s.step_id, s.status, s.result, s.error) for s in store.get_steps(run_id)])


@pytest.mark.parametrize(
    "options",
    [{}, {"result": 1, "error": "x"}, {"result": 1, "discard": True}, {"error": "x", "discard": True},
     {"result": 1, "error": "x", "discard": True}],
    ids=["none", "result+error", "result+discard", "error+discard", "all"],
)
def test_refuses_anything_but_exactly_one_resolution(store: Any, options: dict[str, Any]) -> None:
    run_id = blocked_run(store)
    before = snapshot(store, run_id)
    with pytest.raises(AdminError, match="exactly one of --result, --error or --discard"):
        admin.resolve_step(store, run_id, "2", **options)
    assert snapshot(store, run_id) == before


def test_refuses_a_step_that_does_not_exist(store: Any) -> None:
    run_id = blocked_run(store)
    before = snapshot(store, run_id)
    with pytest.raises(AdminError, match=r"has no step '7' \(its started step: 2\)"):
        admin.resolve_step(store, run_id, "7", discard=True)
    assert snapshot(store, run_id) == before


def test_refuses_a_step_that_is_not_started(store: Any) -> None:
    run_id = blocked_run(store)
    before = snapshot(store, run_id)
    with pytest.raises(AdminError, match=r"step 1 .* is done, not started.*its started step: 2"):
        admin.resolve_step(store, run_id, "1", result="x")
    assert snapshot(store, run_id) == before


def test_refuses_an_unserializable_result(store: Any) -> None:
    run_id = blocked_run(store)
    before = snapshot(store, run_id)
    with pytest.raises(EverystepError, match="--result value cannot be stored"):
        admin.resolve_step(store, run_id, "2", result={1, 2})
    assert snapshot(store, run_id) == before


def test_refuses_an_unknown_run(store: Any) -> None:
    with pytest.raises(RunNotFound):
        admin.resolve_step(store, "0190a6f4-3f1e-7c3a-9e5b-1234567890ab", "1", discard=True)
    with pytest.raises(RunNotFound, match="run ids are UUIDs"):
        admin.resolve_step(store, "not-a-uuid", "1", discard=True)


def test_refuses_a_running_run_even_with_a_started_step(store: Any) -> None:
    run = schedule(checkout, "o-8", database=store)
    crash_at("2")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    before = snapshot(store, run.id)
    with pytest.raises(AdminError, match=f"run {run.id} is running, not blocked"):
        admin.resolve_step(store, run.id, "2", discard=True)
    assert snapshot(store, run.id) == before


@pytest.mark.parametrize("status", [SCHEDULED, COMPLETED, FAILED, STOPPED])
def test_refuses_a_run_that_is_not_blocked(store: Any, status: str) -> None:
    run = schedule(checkout, "o-10", database=store)
    if status != SCHEDULED:
        claim_run(store, run.id, "tester")
        assert store.finish_run(store.get_run(run.id).claim_as("tester"), status, None, None)
    before = snapshot(store, run.id)
    with pytest.raises(AdminError, match=f"is {status}, not blocked: only blocked runs can be resolved"):
        admin.resolve_step(store, run.id, "2", result=1)
    assert snapshot(store, run.id) == before


def test_refuses_a_second_resolution(store: Any) -> None:
    run_id = blocked_run(store)
    admin.resolve_step(store, run_id, "2", result="first")
    before = snapshot(store, run_id)
    with pytest.raises(AdminError, match="is scheduled, not blocked"):
        admin.resolve_step(store, run_id, "2", result="second")
    assert snapshot(store, run_id) == before


def test_resolution_through_a_second_store_object(db_url: str, store: Any) -> None:
    """The operator's process has its own connection to the database."""
    run_id = blocked_run(store)
    operator = connect(db_url)
    try:
        assert admin.resolve_step(operator, run_id, "2", discard=True).status == SCHEDULED
    finally:
        operator.close()
    assert store.get_run(run_id).status == SCHEDULED


def test_requeue_run_only_moves_running_runs(store: Any) -> None:
    run = schedule(checkout, "o-11", database=store)
    with pytest.raises(AdminError, match="is scheduled, not running"):
        admin.requeue_run(store, run.id)
    claim_run(store, run.id, "dead-worker")
    requeued = admin.requeue_run(store, run.id)
    assert requeued.status == SCHEDULED and requeued.claimed_by is None
