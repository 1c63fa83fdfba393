"""Terminal: a deliberate stop. The step in flight is recorded (failed, with
the encoded Terminal), no further step starts, the run ends ``stopped``.
Terminal transitions are compare-and-set: a stale writer never clobbers a run
that moved on."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from everystep import Terminal, parallel, schedule, serde, step, workflow
from everystep.errors import EverystepError
from everystep.models import COMPLETED, FAILED, RUNNING, SCHEDULED, STEP_DONE, STEP_FAILED, STOPPED
from everystep.context import Observer
from tests.support.runs import claim_run, execute_run

CALLS: Counter[str] = Counter()
SEEN: list[Any] = []
_lock = threading.Lock()


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()
    SEEN.clear()


def called(label: str) -> None:
    with _lock:
        CALLS[label] += 1


@step
def upload(node: int) -> str:
    called("upload")
    raise Terminal("node-full", {"node_id": node, "free": (0, "bytes")})


@step
def note(label: str) -> str:
    called(label)
    return label


@workflow
def stops(node: int) -> Any:
    note("before")
    upload(node)
    note("after")
    return "unreachable"


@workflow
def stops_and_tries_to_carry_on() -> Any:
    note("before")
    try:
        upload(1)
    except Terminal as exc:
        SEEN.append(exc.reason)
    try:
        note("cleanup")
    except Terminal as exc:
        SEEN.append(("refused", exc.reason))
    return "swallowed"


@workflow
def stops_from_body() -> Any:
    note("before")
    raise Terminal("manual", [1, 2])


class Unstorable:
    pass


@step
def stop_with_unstorable_payload() -> None:
    raise Terminal("odd", Unstorable())


@workflow
def stops_with_unstorable_payload() -> Any:
    stop_with_unstorable_payload()


def test_terminal_stops_the_run(store: Any) -> None:
    run = schedule(stops, 9, database=store)
    assert execute_run(store, run.id) == STOPPED
    done = store.get_run(run.id)
    assert done.status == "stopped"
    assert done.result is None
    assert done.completed_at is not None
    assert done.error["type"] == "everystep.errors.Terminal"
    assert done.error["message"] == "node-full"
    terminal = serde.decode_exception(done.error)
    assert isinstance(terminal, Terminal)
    assert terminal.reason == "node-full"
    assert terminal.payload == {"node_id": 9, "free": (0, "bytes")}
    assert str(terminal) == "node-full"
    # The step in flight is recorded, failed, with the encoded Terminal.
    steps = store.get_steps(run.id)
    assert [(s.step_id, s.status) for s in steps] == [("1", STEP_DONE), ("2", STEP_FAILED)]
    assert steps[1].error["type"] == "everystep.errors.Terminal"
    assert steps[1].error["args"] == ["node-full", {"node_id": 9, "free": (0, "bytes")}]
    # No further step started.
    assert CALLS == Counter({"before": 1, "upload": 1})


def test_no_step_starts_after_terminal_even_if_the_body_catches_it(store: Any) -> None:
    run = schedule(stops_and_tries_to_carry_on, database=store)
    assert execute_run(store, run.id) == STOPPED
    assert SEEN == ["node-full", ("refused", "node-full")]
    assert CALLS["cleanup"] == 0
    assert [s.step_id for s in store.get_steps(run.id)] == ["1", "2"]
    assert store.get_run(run.id).result is None


def test_terminal_raised_by_the_body_itself_stops_the_run(store: Any) -> None:
    run = schedule(stops_from_body, database=store)
    assert execute_run(store, run.id) == STOPPED
    terminal = store.get_run(run.id).exception
    assert isinstance(terminal, Terminal) and terminal.reason == "manual" and terminal.payload == [1, 2]


def test_terminal_with_unstorable_payload_still_stops(store: Any) -> None:
    run = schedule(stops_with_unstorable_payload, database=store)
    assert execute_run(store, run.id) == STOPPED
    terminal = store.get_run(run.id).exception
    assert isinstance(terminal, Terminal) and terminal.reason == "odd"


def test_recorded_terminal_stops_the_run_again_on_replay(store: Any) -> None:
    run = schedule(stops, 2, database=store)
    assert execute_run(store, run.id) == STOPPED
    # An operator puts the stopped run back in the queue: replay meets the
    # recorded Terminal and stops again without running the step.
    with store.locked_run(run.id) as (conn, _):
        store.execute_named(conn, "reschedule", run_id=run.id, from_status=STOPPED)
    assert execute_run(store, run.id) == STOPPED
    assert CALLS == Counter({"before": 1, "upload": 1})
    assert store.get_run(run.id).exception.reason == "node-full"


class RecordingObserver(Observer):
    def __init__(self) -> None:
        self.runs: list[tuple[str, str | None]] = []

    def run_finished(self, run: Any, ctx: Any, status: str, error: BaseException | None, token: Any) -> None:
        self.runs.append((status, type(error).__name__ if error else None))


def test_stopped_is_reported_as_stopped_not_failed(store: Any) -> None:
    observer = RecordingObserver()
    run = schedule(stops, 1, database=store)
    assert execute_run(store, run.id, observer=observer) == STOPPED
    assert observer.runs == [(STOPPED, "Terminal")]


def test_terminal_is_an_everystep_error() -> None:
    exc = Terminal("why", {"p": 1})
    assert isinstance(exc, EverystepError)
    assert str(exc) == "why" and exc.reason == "why" and exc.payload == {"p": 1}
    assert str(Terminal(404)) == "404"


# -- Terminal in parallel branches ------------------------------------------------

GATE = {
    "terminal_raised": threading.Event(),
    "sibling_in_step": threading.Event(),
    "boom_started": threading.Event(),
}


@step
def slow_sibling() -> str:
    GATE["sibling_in_step"].set()
    # Stay in flight until the other branch has stopped the run.
    assert GATE["terminal_raised"].wait(30)
    called("slow_sibling")
    return "finished anyway"


@step
def stop_now() -> None:
    # Both siblings are inside a step before the run is stopped.
    assert GATE["sibling_in_step"].wait(30) and GATE["boom_started"].wait(30)
    called("stop_now")
    raise Terminal("halt", None)


@step
def boom() -> None:
    GATE["boom_started"].set()
    called("boom")
    raise ValueError("branch failure")


class AfterTerminal(Observer):
    def step_finished(self, ctx: Any, step_id: str, name: str, status: str, error: Any, token: Any) -> None:
        if isinstance(error, Terminal):
            GATE["terminal_raised"].set()


@workflow
def stops_in_a_branch() -> Any:
    try:
        return parallel(
            [slow_sibling, lambda: note("sibling-next")],
            stop_now,
            boom,
        )
    except BaseException as exc:
        SEEN.append(type(exc))
        raise


def test_terminal_in_a_branch_stops_the_whole_run_ahead_of_other_failures(store: Any) -> None:
    for event in GATE.values():
        event.clear()
    run = schedule(stops_in_a_branch, database=store)
    assert execute_run(store, run.id, observer=AfterTerminal()) == STOPPED
    # Terminal is raised ahead of the ValueError (no ExceptionGroup).
    assert SEEN == [Terminal]
    steps = {s.step_id: s for s in store.get_steps(run.id)}
    # The sibling's step in flight finished and was recorded; its next step
    # never started; the failing branch was recorded too.
    assert steps["1.0.1"].status == STEP_DONE and steps["1.0.1"].result == "finished anyway"
    assert steps["1.1.1"].status == STEP_FAILED and steps["1.1.1"].error["type"] == "everystep.errors.Terminal"
    assert steps["1.2.1"].status == STEP_FAILED and steps["1.2.1"].error["type"] == "builtins.ValueError"
    assert "1.0.2" not in steps and CALLS["sibling-next"] == 0
    assert store.get_run(run.id).exception.reason == "halt"


# -- compare-and-set terminal transitions -------------------------------------------


@workflow
def simple() -> str:
    return note("only")


def test_finish_run_is_guarded_by_status_and_claimer(store: Any) -> None:
    run = schedule(simple, database=store)
    # Not running yet: nobody can finish it.
    assert not store.finish_run(store.get_run(run.id).claim_as("tester"), COMPLETED, serde.dumps("x"), None)
    claim_run(store, run.id, "owner")
    # Another claimer's write is refused.
    assert not store.finish_run(store.get_run(run.id).claim_as("intruder"), FAILED, None, serde.dumps({"type": "x", "message": "m"}))
    current = store.get_run(run.id)
    assert current.status == RUNNING and current.claimed_by == "owner" and current.error is None
    assert store.finish_run(store.get_run(run.id).claim_as("owner"), COMPLETED, serde.dumps("ok"), None)
    # Once terminal, even the owner cannot move it again.
    assert not store.finish_run(store.get_run(run.id).claim_as("owner"), FAILED, None, serde.dumps({"type": "x", "message": "m"}))
    done = store.get_run(run.id)
    assert done.status == COMPLETED and done.result == "ok"


def test_requeue_is_guarded_by_status_and_claimer(store: Any) -> None:
    run = schedule(simple, database=store)
    assert not store.requeue(store.get_run(run.id).claim_as("owner"))
    claim_run(store, run.id, "owner")
    assert not store.requeue(store.get_run(run.id).claim_as("intruder"))
    assert store.get_run(run.id).status == RUNNING
    assert store.requeue(store.get_run(run.id).claim_as("owner"))
    requeued = store.get_run(run.id)
    assert requeued.status == SCHEDULED and requeued.claimed_by is None and requeued.claimed_at is None


@workflow
def hands_over_mid_body() -> str:
    note("mine")
    # Between steps, an operator requeues the run and another runner claims it.
    store = HANDOVER["store"]
    assert store.requeue(store.get_run(HANDOVER["run_id"]).claim_as("tester"))
    claim_run(store, HANDOVER["run_id"], "successor")
    return "stale result"


HANDOVER: dict[str, Any] = {}


def test_a_stale_runner_never_clobbers_a_run_that_moved_on(store: Any) -> None:
    run = schedule(hands_over_mid_body, database=store)
    HANDOVER.update(store=store, run_id=run.id)
    assert execute_run(store, run.id) == "lost"
    current = store.get_run(run.id)
    assert current.status == RUNNING and current.claimed_by == "successor"
    assert current.result is None and current.completed_at is None
