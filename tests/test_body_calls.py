"""What a workflow body may call: every public call is recorded, a recorded
wait, refused or plain, and a replay repeats no effect, on every backend.

Executions are driven by hand (claim, execute), so what is asserted is what
the database holds between them: one message per send, one run per
schedule, reads that replay what the first execution saw, waits that hold
a row and no process. The kill-at-every-boundary property at the end kills
a random body at each of its fault points in turn and checks the world
against an uninterrupted execution's.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import everystep
from everystep import BodyCallRefused, EverystepError, SendRefused, admin, dryrun, runner, schedule
from everystep.body_rules import BodyRule, declaration_of
from everystep.errors import SimulatedCrash
from everystep.models import COMPLETED, SCHEDULED, STEP_WAITING, STEP_DONE, STEP_FAILED, WAIT_FOREVER
from everystep.runner import Outcome
from everystep.store import Store
from tests.apps import body_calls as apps
from everystep.worker import Worker
from everystep.patches import PATCH_STEP, marker_id
from tests.support.runs import crash_at, due_now, execute_run, expire_wait, resume, worker_running


def _runs_of(store: Store, workflow: Any) -> list[Any]:
    return store.list_runs(name=workflow.name, limit=1000)


# -- the classification -----------------------------------------------------------


def test_every_public_callable_says_what_it_is_in_a_body() -> None:
    unclassified = [name for name in everystep.__all__
                    if callable(getattr(everystep, name)) and declaration_of(getattr(everystep, name)) is None]
    assert unclassified == []
    for name in everystep.__all__:
        declared = declaration_of(getattr(everystep, name))
        if declared is not None:
            assert declared.note.endswith("."), name
            assert (declared.instead is not None) == (declared.rule == BodyRule.REFUSED), name


def test_every_async_twin_is_in_the_class_of_its_sync_form() -> None:
    for name in everystep.__all__:
        if name.endswith("_async") and name[:-6] in everystep.__all__:
            twin, sync = getattr(everystep, name), getattr(everystep, name[:-6])
            assert inspect.iscoroutinefunction(twin), name
            assert declaration_of(twin).rule == declaration_of(sync).rule, name  # type: ignore[union-attr]


# -- the reproductions: one message, one run ----------------------------------------


def test_a_body_send_then_a_sleep_stores_one_message(store: Store) -> None:
    target = schedule(apps.inbox, database=store)
    run = schedule(apps.sends_then_sleeps, target.id, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    expire_wait(store, run.id, "2")
    assert execute_run(store, run.id) == Outcome.COMPLETED
    [message] = store.messages(target.id)
    assert message.payload == {"n": 1}
    send = store.get_steps(run.id)[0]
    assert (send.name, send.status, send.result, send.args) == ("everystep.send", STEP_DONE, message.id,
                                                                [target.id, "t"])


def test_a_body_schedule_then_a_sleep_creates_one_detached_run(store: Store) -> None:
    run = schedule(apps.schedules_then_sleeps, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    expire_wait(store, run.id, "2")
    assert execute_run(store, run.id) == Outcome.COMPLETED
    [leaf] = _runs_of(store, apps.leaf)
    assert store.get_run(run.id).result == leaf.id
    assert store.links(leaf.id).parent_id is None  # detached: not cancelled with its scheduler


def test_under_the_threaded_worker_a_send_and_a_schedule_happen_once(store: Store) -> None:
    """The new user's trial as it was made: the threaded worker, real sleeps."""
    target = schedule(apps.inbox, database=store)
    sender = schedule(apps.sends_then_sleeps, target.id, database=store)
    scheduler = schedule(apps.schedules_then_sleeps, database=store)
    with worker_running(Worker(pool_size=2, poll=0.05, name=f"body-{store.backend}", database=store, drain=30)):
        assert everystep.wait(sender.id, timeout=60, database=store).status == COMPLETED
        assert everystep.wait(scheduler.id, timeout=60, database=store).status == COMPLETED
    assert len(store.messages(target.id)) == 1
    assert [run.id for run in _runs_of(store, apps.leaf)] == [store.get_run(scheduler.id).result]


def test_a_crash_before_the_send_commits_sends_nothing_and_the_replay_sends_once(store: Store) -> None:
    target = schedule(apps.inbox, database=store)
    run = schedule(apps.sends_then_sleeps, target.id, database=store)
    seen: list[str] = []

    def die_at_the_send(ctx: Any, step_id: str) -> None:
        seen.append(step_id)
        runner.fault = None
        raise SimulatedCrash("died before the send's commit")

    runner.fault = die_at_the_send
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert seen == ["1"] and store.messages(target.id) == [] and store.get_steps(run.id) == []
    assert resume(store, run.id) == Outcome.RELEASED
    assert len(store.messages(target.id)) == 1


def test_a_refused_send_is_recorded_and_every_replay_raises_it(store: Store) -> None:
    finished = schedule(apps.leaf, 1, database=store)
    assert execute_run(store, finished.id) == Outcome.COMPLETED
    run = schedule(apps.sends_then_sleeps, finished.id, database=store)
    assert execute_run(store, run.id) == Outcome.FAILED
    [send] = store.get_steps(run.id)
    assert send.status == STEP_FAILED and send.error["type"] == "everystep.errors.SendRefused"
    assert store.messages(finished.id) == []


# -- reads: what the first execution saw ---------------------------------------------


def test_a_replay_sees_the_event_the_first_execution_read(store: Store) -> None:
    target = schedule(apps.publisher, "old", database=store)
    assert execute_run(store, target.id) == Outcome.COMPLETED
    run = schedule(apps.reads_twice, target.id, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    with store.connection() as conn:  # the publisher's value changes while the reader sleeps
        marker = "?" if store.backend == "sqlite" else "%s"
        conn.execute(f"UPDATE everystep_event SET value = {marker} WHERE workflow_id = {marker}",
                     ('"new"', target.id))
    expire_wait(store, run.id, "2")
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == ["old", "new"]


def test_a_replay_sees_the_run_and_steps_the_first_execution_read(store: Store) -> None:
    target = schedule(apps.inbox, database=store)
    run = schedule(apps.reads_run_and_steps, target.id, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    assert execute_run(store, target.id) == Outcome.RELEASED  # the target moves on: a waiting step appears
    expire_wait(store, run.id, "3")
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == [SCHEDULED, []]
    assert [s.name for s in store.get_steps(run.id)] == ["everystep.get_run", "everystep.get_steps",
                                                          "everystep.sleep"]


def test_an_unset_event_read_without_a_timeout_is_recorded_as_a_timeout(store: Store) -> None:
    target = schedule(apps.inbox, database=store)
    run = schedule(apps.waits_for_event, target.id, 0, database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == "no event: TimeoutError"
    [read] = store.get_steps(run.id)
    assert read.status == STEP_FAILED and read.error["type"] == "builtins.TimeoutError"


# -- waits on other runs ---------------------------------------------------------------


def test_get_event_with_a_timeout_waits_holding_a_row_and_the_set_event_wakes_it(store: Store) -> None:
    target = schedule(apps.publisher, "approved", database=store)
    run = schedule(apps.waits_for_event, target.id, 3600, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    waiting = store.get_run(run.id)
    assert waiting.status == SCHEDULED and not due_now(store, run.id)
    [step] = store.get_steps(run.id)
    assert (step.name, step.status) == ("everystep.get_event", STEP_WAITING)
    assert store.links(run.id).wait_key == f"event:{target.id}:status"
    assert execute_run(store, target.id) == Outcome.COMPLETED  # its set_event ends the wait
    assert due_now(store, run.id)
    assert store.links(run.id).wait_key is None
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == "approved"


def test_get_event_with_a_timeout_times_out_as_outside_a_body(store: Store) -> None:
    target = schedule(apps.inbox, database=store)
    run = schedule(apps.waits_for_event, target.id, 3600, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    expire_wait(store, run.id, "1")
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == "no event: TimeoutError"


def test_an_event_set_before_the_release_commits_keeps_the_run_due(store: Store) -> None:
    """The releaser reads the event under the publisher's row lock: an
    event set between the wait's own read and its release ends the wait at
    once (no wait key is left for a wake that already happened)."""
    target = schedule(apps.publisher, "early", database=store)
    run = schedule(apps.waits_for_event, target.id, 3600, database=store)
    _publish_before_the_release(store, target.id)
    assert execute_run(store, run.id) == Outcome.RELEASED
    assert due_now(store, run.id) and store.links(run.id).wait_key is None
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == "early"


def _publish_before_the_release(store: Store, other: str) -> None:
    """The next release of a waiting run first runs ``other`` to its end."""
    original = store.release_waiting

    def release_after(*args: Any, **kwargs: Any) -> bool:
        store.release_waiting = original  # type: ignore[method-assign]
        assert execute_run(store, other, claimer="other") == Outcome.COMPLETED
        return original(*args, **kwargs)

    store.release_waiting = release_after  # type: ignore[method-assign]


def test_wait_in_a_body_is_a_durable_wait_for_the_run_s_end(store: Store) -> None:
    target = schedule(apps.leaf, 5, database=store)
    run = schedule(apps.waits_for_run, target.id, None, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    [step] = store.get_steps(run.id)
    assert (step.name, step.status, step.args) == ("everystep.wait", STEP_WAITING, [target.id])
    released = store.get_run(run.id)
    assert released.status == SCHEDULED and released.not_before < WAIT_FOREVER  # checked again soon
    assert store.links(run.id).wait_key == f"run:{target.id}"
    assert execute_run(store, target.id) == Outcome.COMPLETED
    expire_wait(store, run.id, "1")
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == [COMPLETED, 5]


def test_wait_in_a_body_times_out_as_outside_a_body(store: Store) -> None:
    target = schedule(apps.inbox, database=store)
    run = schedule(apps.waits_for_run, target.id, 60, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    expire_wait(store, run.id, "1")
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == "timed out"


def test_a_release_finds_a_run_that_ended_meanwhile_and_stays_due(store: Store) -> None:
    target = schedule(apps.leaf, 9, database=store)
    run = schedule(apps.waits_for_run, target.id, None, database=store)
    _publish_before_the_release(store, target.id)
    assert execute_run(store, run.id) == Outcome.RELEASED
    assert due_now(store, run.id)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == [COMPLETED, 9]


def test_a_child_handle_on_a_run_that_is_not_a_child_is_refused(store: Store) -> None:
    stranger = schedule(apps.leaf, 1, database=store)
    run = schedule(apps.handles_a_stranger, stranger.id, database=store)
    assert execute_run(store, run.id) == Outcome.FAILED
    error = store.get_run(run.id).error
    assert f"run {stranger.id} is not a child of run {run.id}" in error["message"]
    assert f"everystep.wait('{stranger.id}')" in error["message"]
    assert store.get_steps(run.id) == []


# -- refused calls and refused options ----------------------------------------------------


@pytest.mark.parametrize("workflow, function", [
    (apps.asks_for_step_connection, "step_connection"),
    (apps.sets_a_provider, "set_connection_provider"),
])
def test_a_refused_call_in_a_body_names_what_to_use_and_writes_nothing(store: Store, workflow: Any,
                                                                        function: str) -> None:
    run = schedule(workflow, database=store)
    assert execute_run(store, run.id) == Outcome.FAILED
    error = store.get_run(run.id).error
    assert error["type"] == "everystep.errors.BodyCallRefused"
    assert f"everystep.{function}() must not be called in a workflow body" in error["message"]
    assert "; use " in error["message"]
    assert store.get_steps(run.id) == []


def test_a_connection_of_the_caller_is_refused_in_a_body(store: Store) -> None:
    target = schedule(apps.inbox, database=store)
    run = schedule(apps.sends_with_a_connection, target.id, database=store)
    assert execute_run(store, run.id) == Outcome.FAILED
    assert "everystep.send(conn=...) in a workflow body" in store.get_run(run.id).error["message"]
    assert store.messages(target.id) == [] and store.get_steps(run.id) == []


def test_the_refused_functions_work_outside_a_body() -> None:
    previous = everystep.set_connection_provider(None)
    assert everystep.set_connection_provider(previous) is None
    with pytest.raises(EverystepError, match="only available inside a @step"):
        everystep.step_connection()
    assert not issubclass(EverystepError, BodyCallRefused)


def test_bad_input_to_the_client_calls_says_what_is_wrong(store: Store) -> None:
    with pytest.raises(SendRefused, match="no run with id 'nope'"):
        everystep.send("nope", "t", 1, database=store)
    with pytest.raises(EverystepError, match="get_event needs a key, a non-empty string, not 5"):
        everystep.get_event(schedule(apps.inbox, database=store).id, 5, database=store)  # type: ignore[arg-type]
    with pytest.raises(EverystepError, match="must be called inside a running workflow's body"):
        everystep.recv("x")


# -- async bodies ---------------------------------------------------------------------------


def test_an_async_body_records_its_calls_and_a_replay_repeats_none(store: Store) -> None:
    publisher = schedule(apps.publisher, "ok", database=store)
    assert execute_run(store, publisher.id) == Outcome.COMPLETED
    inbox = schedule(apps.inbox, database=store)
    run = schedule(apps.async_calls, inbox.id, publisher.id, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    expire_wait(store, run.id, "6")
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == [True, apps.leaf.name, SCHEDULED, 0, "ok"]
    assert len(store.messages(inbox.id)) == 1
    assert len(_runs_of(store, apps.leaf)) == 1
    names = [s.name for s in store.get_steps(run.id)]
    assert names == ["everystep.send", "everystep.schedule", "everystep.get_run", "everystep.get_steps",
                     "everystep.get_event", "everystep.sleep"]


# -- kill at every boundary -------------------------------------------------------------------------

OPS = ["step", "send", "schedule", "set_event", "get_event", "get_run", "get_steps", "parallel"]


def _world(store: Store, target: str, run_id: str) -> dict[str, Any]:
    """What the body left in the world, without the ids the database chose."""
    leaves = sorted(run.args[0] for run in _runs_of(store, apps.leaf))
    return {
        "messages": sorted((m.topic, m.payload) for m in store.messages(target)),
        "leaves": leaves,
        "events": {e.key: e.value for e in store.events(run_id)},
        "result": store.get_run(run_id).result,
        "status": store.get_run(run_id).status,
    }


def _uninterrupted(store: Store, ops: list[str]) -> tuple[dict[str, Any], int]:
    """The world after one execution that nothing kills, and its fault points."""
    target = schedule(apps.inbox, database=store)
    run = schedule(apps.script, ops, target.id, database=store)
    points: list[str] = []
    runner.fault = lambda ctx, step_id: points.append(step_id)
    try:
        assert execute_run(store, run.id) == Outcome.COMPLETED
    finally:
        runner.fault = None
    return _world(store, target.id, run.id), len(points)


def _clear_leaves(store: Store) -> None:
    with store.connection() as conn:
        marker = "?" if store.backend == "sqlite" else "%s"
        conn.execute(f"DELETE FROM everystep_workflow WHERE name = {marker}", (apps.leaf.name,))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=7))
def test_killed_at_every_boundary_each_effect_happens_once(store: Store, ops: list[str]) -> None:
    _clear_leaves(store)
    expected, points = _uninterrupted(store, ops)
    _clear_leaves(store)
    target = schedule(apps.inbox, database=store)
    run = schedule(apps.script, ops, target.id, database=store)
    crashes = 0
    while True:
        # The boundary killed last comes again first (its record was never
        # written): it passes this time, and the next one is killed.
        runner.fault = _killer(passes=1 if crashes else 0)
        try:
            outcome = execute_run(store, run.id) if crashes == 0 else resume(store, run.id)
        except SimulatedCrash:
            crashes += 1
            assert crashes <= 2 * points, "more kills than the body has boundaries"
            continue
        finally:
            runner.fault = None
        assert outcome == Outcome.COMPLETED
        break
    if "parallel" not in ops:  # branches reach their boundaries in any order
        assert crashes == points  # each boundary was killed once
    assert _world(store, target.id, run.id) == expected


def _killer(passes: int) -> Any:
    """A fault hook that lets ``passes`` boundaries by, then kills."""
    seen = [0]

    def fault(ctx: Any, step_id: str) -> None:
        seen[0] += 1
        if seen[0] > passes:
            runner.fault = None
            raise SimulatedCrash(f"killed at {step_id}")

    return fault


# -- patch markers ride with every write ---------------------------------------------------


@pytest.mark.parametrize("call", ["send", "schedule", "set_event", "start", "get_run", "recv"])
def test_an_engine_call_after_a_patch_point_writes_the_marker_with_it(store: Store, call: str) -> None:
    """A crash right after the call's commit must not leave a record past
    the patch point without its marker (a replay would then take the old
    branch): the call's own transaction writes the marker."""
    target = schedule(apps.inbox, database=store)
    everystep.send(target.id, "t", "for the recv", database=store)
    if call == "recv":  # the run receives the message itself
        target = schedule(apps.patched_then_calls, target.id, call, database=store)
        everystep.send(target.id, "t", "for the recv", database=store)
        run = target
    else:
        run = schedule(apps.patched_then_calls, target.id, call, database=store)
    crash_at("2")  # dies in the step after the call, before its record
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    recorded = {s.step_id: s.name for s in store.get_steps(run.id)}
    assert recorded == {marker_id("new-path"): PATCH_STEP, "1": f"everystep.{call}"}
    assert resume(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == [True, 2]


# -- check-deploy and replay ----------------------------------------------------------------


def test_a_dry_replay_reports_an_unrecorded_send_and_sends_nothing(store: Store) -> None:
    target = schedule(apps.inbox, database=store)
    run = schedule(apps.sends_then_sleeps, target.id, database=store)
    verdict = dryrun.replay(store.get_run(run.id), [])
    assert (verdict.outcome, verdict.next_step) == (dryrun.Prediction.RESUMES, "1")
    assert "runs step 1 (everystep.send)" in verdict.detail
    assert store.messages(target.id) == []


def test_a_dry_replay_matches_recorded_calls_and_stops_at_their_wait(store: Store) -> None:
    target = schedule(apps.inbox, database=store)
    run = schedule(apps.reads_run_and_steps, target.id, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    verdict = dryrun.replay(store.get_run(run.id), store.get_steps(run.id))
    assert verdict.outcome == dryrun.Prediction.RESUMES and "then waits until" in verdict.detail
    waiting = schedule(apps.waits_for_run, target.id, None, database=store)
    assert execute_run(store, waiting.id) == Outcome.RELEASED
    verdict = dryrun.replay(store.get_run(waiting.id), store.get_steps(waiting.id))
    assert f"then waits for run {target.id}" in verdict.detail


def test_a_fork_waits_for_the_child_its_copied_start_recorded(store: Store) -> None:
    """A fork copies its source's ``start`` steps, whose children keep their
    first parent: the fork may still wait for them."""
    from tests.apps import waits as wait_apps

    parent = schedule(wait_apps.parent_calls, database=store)
    assert execute_run(store, parent.id) == Outcome.RELEASED
    [child] = store.children(parent.id)
    assert execute_run(store, child.id) == Outcome.COMPLETED
    assert execute_run(store, parent.id) == Outcome.COMPLETED
    fork, copied = admin.fork(store, parent.id, "2")
    assert copied == 1
    assert execute_run(store, fork.id) == Outcome.COMPLETED
    assert store.get_run(fork.id).result == 42
    assert store.children(fork.id) == []
