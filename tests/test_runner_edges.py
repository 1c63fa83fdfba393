"""The runner at its edges: the fault hook, durable cleanup across a crash,
drains, lost claims, unstorable values, unknown workflows, plain calls
outside a run, and observers."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from everystep import runner, schedule, serde, step, workflow
from everystep.context import Context, SignalFlag
from everystep.errors import EverystepError, SimulatedCrash, WorkflowCodeError
from everystep.models import COMPLETED, FAILED, RUNNING, SCHEDULED, STEP_DONE, STEP_FAILED, Outcome
from everystep.context import Observer
from everystep.store import connect
from tests.support.runs import claim_run, crash_at, execute_run

# The engine's own statements: also through PgBouncer in transaction mode.
pytestmark = pytest.mark.pooled

CALLS: Counter[str] = Counter()
SEEN: list[Any] = []
SHARED: dict[str, Any] = {}
_lock = threading.Lock()


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()
    SEEN.clear()
    SHARED.clear()


def called(label: str) -> None:
    with _lock:
        CALLS[label] += 1


@step
def note(label: str, **extra: Any) -> str:
    called(label)
    hook = SHARED.get(f"during {label}")
    if hook is not None:
        hook()
    return label


@workflow
def three_steps() -> Any:
    return [note("one"), note("two"), note("three")]


def run_row(store: Any, run_id: str) -> tuple[Any, ...]:
    run = store.get_run(run_id)
    return (run.status, run.claimed_by, run.result, run.error, run.completed_at)


def step_rows(store: Any, run_id: str) -> list[tuple[str, str, Any]]:
    return [(s.step_id, s.status, s.result) for s in store.get_steps(run_id)]


# -- the fault hook ---------------------------------------------------------------


def test_fault_hook_leaves_the_database_as_a_death_would(store: Any) -> None:
    run = schedule(three_steps, database=store)
    seen = crash_at("2")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    # Called (ctx, step_id) after each effect, before its record.
    assert [step_id for _, step_id in seen] == ["1", "2"]
    assert isinstance(seen[0][0], Context) and seen[0][0].workflow_id == run.id
    # The effect of step 2 happened, its record did not; nothing else changed.
    assert CALLS == Counter({"one": 1, "two": 1})
    assert step_rows(store, run.id) == [("1", STEP_DONE, "one")]
    assert run_row(store, run.id) == (RUNNING, "tester", None, None, None)
    assert store.get_run(run.id).claimed_at is not None


def test_crash_raised_by_the_step_itself_writes_nothing(store: Any) -> None:
    def die() -> None:
        raise SimulatedCrash("killed mid-effect")

    SHARED["during two"] = die
    run = schedule(three_steps, database=store)
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert step_rows(store, run.id) == [("1", STEP_DONE, "one")]
    assert run_row(store, run.id) == (RUNNING, "tester", None, None, None)


@workflow
def swallows_crash() -> Any:
    try:
        note("one")
    except SimulatedCrash:
        SEEN.append("caught")
    return note("two")


def test_a_crash_cannot_be_swallowed_by_the_body(store: Any) -> None:
    run = schedule(swallows_crash, database=store)
    crash_at("1")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert SEEN == ["caught"]
    assert CALLS["two"] == 0
    assert step_rows(store, run.id) == []
    assert run_row(store, run.id) == (RUNNING, "tester", None, None, None)


@step
def create_vm(name: str) -> str:
    called("create_vm")
    return f"vm-{name}"


@step
def attach_ip(vm_id: str) -> str:
    called("attach_ip")
    raise ConnectionError(f"no address for {vm_id}")


@step
def delete_vm(vm_id: str) -> str:
    called("delete_vm")
    return f"deleted {vm_id}"


@workflow
def provision_vm(args: dict[str, str]) -> Any:
    vm_id = create_vm(args["name"])
    try:
        return attach_ip(vm_id)
    except Exception as exc:
        SEEN.append(type(exc))
        delete_vm(vm_id)
        raise


def test_durable_cleanup_runs_again_after_a_crash_mid_cleanup(store: Any) -> None:
    run = schedule(provision_vm, {"name": "web-1"}, database=store)
    crash_at("3")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert step_rows(store, run.id)[:1] == [("1", STEP_DONE, "vm-web-1")]
    assert [(s.step_id, s.status) for s in store.get_steps(run.id)] == [("1", STEP_DONE), ("2", STEP_FAILED)]

    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == FAILED
    # The stored attach_ip failure was re-raised, the except branch ran
    # again and delete_vm (never recorded) executed again.
    assert SEEN == [ConnectionError, ConnectionError]
    assert CALLS == Counter({"create_vm": 1, "attach_ip": 1, "delete_vm": 2})
    failed = store.get_run(run.id)
    assert failed.error["type"] == "builtins.ConnectionError"
    assert failed.error["message"] == "no address for vm-web-1"
    assert [(s.step_id, s.status) for s in store.get_steps(run.id)] == [
        ("1", STEP_DONE), ("2", STEP_FAILED), ("3", STEP_DONE),
    ]


# -- drain -------------------------------------------------------------------------


@pytest.mark.parametrize("flag_type", [threading.Event, SignalFlag])
def test_drain_requeues_at_the_next_step_boundary(store: Any, flag_type: type) -> None:
    draining = flag_type()
    SHARED["during two"] = draining.set
    run = schedule(three_steps, database=store)
    assert execute_run(store, run.id, draining=draining) == Outcome.REQUEUED
    # The step in flight finished and was recorded; no new step started.
    assert CALLS == Counter({"one": 1, "two": 1})
    assert step_rows(store, run.id) == [("1", STEP_DONE, "one"), ("2", STEP_DONE, "two")]
    assert run_row(store, run.id) == (SCHEDULED, None, None, None, None)
    assert store.get_run(run.id).claimed_at is None

    # Any runner resumes it from the recorded steps.
    SHARED.clear()
    assert execute_run(store, run.id, claimer="successor") == COMPLETED
    assert CALLS == Counter({"one": 1, "two": 1, "three": 1})
    assert store.get_run(run.id).result == ["one", "two", "three"]


def test_drain_before_the_first_step(store: Any) -> None:
    draining = threading.Event()
    draining.set()
    run = schedule(three_steps, database=store)
    assert execute_run(store, run.id, draining=draining) == Outcome.REQUEUED
    assert CALLS == Counter()
    assert step_rows(store, run.id) == []
    assert store.get_run(run.id).status == SCHEDULED


def test_drain_still_replays_recorded_steps(store: Any) -> None:
    run = schedule(three_steps, database=store)
    crash_at("3")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    draining = threading.Event()
    draining.set()
    assert execute_run(store, run.id, draining=draining) == Outcome.REQUEUED
    assert CALLS == Counter({"one": 1, "two": 1, "three": 1})
    assert [s.step_id for s in store.get_steps(run.id)] == ["1", "2"]


def test_drain_during_the_last_step_lets_the_run_complete(store: Any) -> None:
    draining = threading.Event()
    SHARED["during three"] = draining.set
    run = schedule(three_steps, database=store)
    assert execute_run(store, run.id, draining=draining) == COMPLETED


@workflow
def catches_drain() -> Any:
    note("one")
    try:
        note("two")
    except EverystepError as exc:
        SEEN.append(type(exc).__name__)
    return "pretends to finish"


def test_a_drain_cannot_be_swallowed_by_the_body(store: Any) -> None:
    draining = threading.Event()
    SHARED["during one"] = draining.set
    run = schedule(catches_drain, database=store)
    assert execute_run(store, run.id, draining=draining) == Outcome.REQUEUED
    assert SEEN == ["DrainOrphan"]
    assert store.get_run(run.id).status == SCHEDULED and store.get_run(run.id).result is None


# -- a lost claim -------------------------------------------------------------------


def test_a_lost_claim_stops_the_execution_and_writes_nothing_more(db_url: str, store: Any) -> None:
    operator = connect(db_url)
    run = schedule(three_steps, database=store)

    def requeue_from_elsewhere() -> None:
        assert operator.requeue(operator.get_run(run.id).claim)

    SHARED["during two"] = requeue_from_elsewhere
    try:
        assert execute_run(store, run.id) == Outcome.LOST
    finally:
        operator.close()
    # Step 2 ran but its record was refused; step 3 never started; the run
    # is left as the operator put it.
    assert CALLS == Counter({"one": 1, "two": 1})
    assert step_rows(store, run.id) == [("1", STEP_DONE, "one")]
    assert run_row(store, run.id) == (SCHEDULED, None, None, None, None)


def test_a_claim_taken_over_by_another_runner(db_url: str, store: Any) -> None:
    other = connect(db_url)
    run = schedule(three_steps, database=store)

    def hand_over() -> None:
        assert other.requeue(other.get_run(run.id).claim)
        claim_run(other, run.id, "successor")

    SHARED["during one"] = hand_over
    try:
        assert execute_run(store, run.id) == Outcome.LOST
        assert run_row(store, run.id) == (RUNNING, "successor", None, None, None)
        assert step_rows(store, run.id) == []
        # The successor carries on from the records and completes it.
        SHARED.clear()
        assert runner.execute(other, other.get_run(run.id), claimer="successor") == COMPLETED
    finally:
        other.close()
    assert store.get_run(run.id).result == ["one", "two", "three"]


@step(unsafe_to_repeat=True)
def unsafe_effect() -> str:
    called("unsafe_effect")
    return "done"


@workflow
def lost_before_unsafe() -> Any:
    note("one")
    return unsafe_effect()


def test_a_lost_claim_prevents_an_unsafe_effect(db_url: str, store: Any) -> None:
    operator = connect(db_url)
    run = schedule(lost_before_unsafe, database=store)
    SHARED["during one"] = lambda: operator.requeue(operator.get_run(run.id).claim) or None
    try:
        # Step 1's record is refused, so the unsafe step is never reached.
        assert execute_run(store, run.id) == Outcome.LOST
    finally:
        operator.close()
    assert CALLS["unsafe_effect"] == 0
    assert step_rows(store, run.id) == []


@workflow
def lost_between_steps() -> Any:
    note("one")
    store = SHARED["operator"]
    assert store.requeue(store.get_run(SHARED["run_id"]).claim_as("tester"))
    return unsafe_effect()


def test_a_lost_claim_refuses_the_started_row(db_url: str, store: Any) -> None:
    operator = connect(db_url)
    run = schedule(lost_between_steps, database=store)
    SHARED.update(operator=operator, run_id=run.id)
    try:
        assert execute_run(store, run.id) == Outcome.LOST
    finally:
        operator.close()
    assert CALLS["unsafe_effect"] == 0
    assert step_rows(store, run.id) == [("1", STEP_DONE, "one")]


# -- values that cannot be stored -----------------------------------------------------


@workflow
def unstorable_step_args(where: str) -> Any:
    note("one")
    try:
        if where == "args":
            note({1, 2})
        else:
            note("kw", extra=object())
    except EverystepError as exc:
        SEEN.append(str(exc))
    return note("after")


@pytest.mark.parametrize("where", ["args", "kwargs"])
def test_unstorable_step_arguments_fail_the_run_before_the_step_runs(store: Any, where: str) -> None:
    run = schedule(unstorable_step_args, where, database=store)
    assert execute_run(store, run.id) == FAILED
    # The step never ran and nothing was recorded for it; the body could not
    # carry on past the refusal.
    assert CALLS == Counter({"one": 1})
    assert step_rows(store, run.id) == [("1", STEP_DONE, "one")]
    error = store.get_run(run.id).error
    assert error["type"] == "everystep.errors.EverystepError"
    expected = "arguments of step 2" if where == "args" else "keyword arguments of step 2"
    assert error["message"].startswith(expected) and "cannot be stored" in error["message"]
    assert SEEN == [error["message"]]


@step
def returns_unstorable() -> Any:
    called("returns_unstorable")
    return {"handle": object()}


@workflow
def unstorable_step_result() -> Any:
    note("one")
    try:
        returns_unstorable()
    except EverystepError:
        SEEN.append("caught")
    return note("after")


def test_unstorable_step_result_fails_the_run_and_records_nothing(store: Any) -> None:
    run = schedule(unstorable_step_result, database=store)
    assert execute_run(store, run.id) == FAILED
    # The effect happened; the record could not be written, so a resumed run
    # would execute the step again.
    assert CALLS == Counter({"one": 1, "returns_unstorable": 1})
    assert step_rows(store, run.id) == [("1", STEP_DONE, "one")]
    error = store.get_run(run.id).error
    assert error["type"] == "everystep.errors.EverystepError"
    assert "result of step 2 (tests.test_runner_edges.returns_unstorable)" in error["message"]
    assert SEEN == ["caught"]


@workflow
def unstorable_run_result() -> Any:
    note("one")
    return lambda: "functions are not data"


def test_unstorable_run_result_fails_the_run(store: Any) -> None:
    run = schedule(unstorable_run_result, database=store)
    assert execute_run(store, run.id) == FAILED
    failed = store.get_run(run.id)
    assert failed.result is None and failed.completed_at is not None
    assert "result of run" in failed.error["message"] and "function" in failed.error["message"]


@workflow
def raises_huge(where: str) -> Any:
    if where == "step":
        return huge_failure()
    raise ValueError("x" * 200_000, {"blob": "y" * 200_000})


@step
def huge_failure() -> None:
    raise RuntimeError("z" * 200_000)


@pytest.mark.parametrize("where", ["body", "step"])
def test_an_oversized_failure_still_fails_the_run(store: Any, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """A failure too big to store whole is stored trimmed, never left running."""
    monkeypatch.setattr(serde, "MAX_BYTES", 64 * 1024)
    run = schedule(raises_huge, where, database=store)
    assert execute_run(store, run.id) == FAILED
    failed = store.get_run(run.id)
    expected = "builtins.ValueError" if where == "body" else "builtins.RuntimeError"
    assert failed.error["type"] == expected
    assert "(truncated)" in failed.error["message"]
    if where == "step":
        (record,) = store.get_steps(run.id)
        assert record.status == STEP_FAILED and record.error["type"] == expected


# -- unknown workflows and plain failures ------------------------------------------------


def test_an_unregistered_workflow_fails_with_workflow_code_error(store: Any) -> None:
    run = schedule("tests.test_runner_edges.not_in_this_process", 1, database=store)
    assert execute_run(store, run.id) == FAILED
    failed = store.get_run(run.id)
    assert failed.error["type"] == "everystep.errors.WorkflowCodeError"
    assert "not registered in this process" in failed.error["message"]
    assert isinstance(failed.exception, WorkflowCodeError)
    assert failed.completed_at is not None
    assert store.get_steps(run.id) == []


@workflow
def body_raises() -> Any:
    note("one")
    raise LookupError("the body itself failed")


def test_an_exception_in_the_body_fails_the_run(store: Any) -> None:
    run = schedule(body_raises, database=store)
    assert execute_run(store, run.id) == FAILED
    failed = store.get_run(run.id)
    assert failed.error["type"] == "builtins.LookupError"
    assert failed.error["message"] == "the body itself failed"
    assert "traceback" in failed.error and "body_raises" in failed.error["traceback"]


@workflow
def interrupted() -> Any:
    note("one")
    SHARED["raise"]()


def test_keyboard_interrupt_writes_nothing_and_propagates(store: Any) -> None:
    def stop() -> None:
        raise KeyboardInterrupt

    SHARED["raise"] = stop
    run = schedule(interrupted, database=store)
    with pytest.raises(KeyboardInterrupt):
        execute_run(store, run.id)
    assert run_row(store, run.id) == (RUNNING, "tester", None, None, None)
    assert step_rows(store, run.id) == [("1", STEP_DONE, "one")]


# -- plain calls outside a run --------------------------------------------------------


@step
def inner(x: int) -> int:
    called("inner")
    return x * 10


@step
def outer(x: int) -> int:
    called("outer")
    return inner(x, everystep_id="ignored-inside-a-step") + 1


@workflow
def uses_nested_steps(x: int) -> Any:
    return outer(x)


def test_steps_and_workflows_outside_a_run_are_plain_calls(store: Any) -> None:
    assert note("plain", everystep_id="not.even.valid") == "plain"
    assert inner(2, everystep_id="x") == 20
    assert outer(3) == 31
    with pytest.raises(ConnectionError):
        provision_vm({"name": "local"})
    assert SEEN == [ConnectionError]
    assert CALLS == Counter({"plain": 1, "inner": 2, "outer": 1, "create_vm": 1, "attach_ip": 1, "delete_vm": 1})
    assert three_steps() == ["one", "two", "three"]
    assert store.list_runs() == []


def test_a_step_called_inside_a_step_is_a_plain_call(store: Any) -> None:
    run = schedule(uses_nested_steps, 4, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == 41
    (record,) = store.get_steps(run.id)
    assert (record.step_id, record.name, record.args, record.kwargs) == ("1", outer.name, [4], {})


@workflow
def named_call() -> Any:
    return note("named", everystep_id="my-step", extra=1)


def test_everystep_id_is_not_passed_to_the_function_or_recorded(store: Any) -> None:
    run = schedule(named_call, database=store)
    assert execute_run(store, run.id) == COMPLETED
    (record,) = store.get_steps(run.id)
    assert record.step_id == "my-step" and record.kwargs == {"extra": 1}


# -- observers --------------------------------------------------------------------------


class Recorder(Observer):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def run_started(self, run: Any, ctx: Any) -> Any:
        self.events.append(("run_started", run.id))
        return "run-token"

    def run_finished(self, run: Any, ctx: Any, status: str, error: Any, token: Any) -> None:
        self.events.append(("run_finished", status, token))

    def step_started(self, ctx: Any, step_id: str, name: str, timeout: Any, unsafe: bool) -> Any:
        self.events.append(("step_started", step_id, name.rsplit(".", 1)[-1], unsafe))
        return step_id

    def step_finished(self, ctx: Any, step_id: str, name: str, status: str, error: Any, token: Any) -> None:
        self.events.append(("step_finished", step_id, status, token))


class Broken(Observer):
    def step_started(self, *args: Any) -> Any:
        raise RuntimeError("observer bug")

    def run_finished(self, *args: Any) -> None:
        raise RuntimeError("observer bug")


def test_observer_sees_runs_and_executed_steps(store: Any) -> None:
    run = schedule(three_steps, database=store)
    crash_at("3")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    recorder = Recorder()
    assert execute_run(store, run.id, observer=recorder) == COMPLETED
    # Replayed steps are not reported as executed.
    assert recorder.events == [
        ("run_started", run.id),
        ("step_started", "3", "note", False),
        ("step_finished", "3", STEP_DONE, "3"),
        ("run_finished", COMPLETED, "run-token"),
    ]


def test_a_broken_observer_never_fails_a_run(store: Any) -> None:
    run = schedule(three_steps, database=store)
    assert execute_run(store, run.id, observer=Broken()) == COMPLETED
    assert store.get_run(run.id).result == ["one", "two", "three"]
