"""Replay: every claim re-runs the body from the top; recorded steps return
their stored outcome without running; the first unrecorded step runs and is
recorded; a body that no longer matches its records fails loudly."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections import Counter
from typing import Any

import pytest

from everystep import registry, runner, schedule, step, workflow
from everystep.errors import SimulatedCrash, StepFailure, WorkflowCodeError
from everystep.models import COMPLETED, FAILED, RUNNING, STEP_DONE, STEP_FAILED
from tests.support.runs import crash_at, execute_run, resume

# The engine's own statements: also through PgBouncer in transaction mode.
pytestmark = pytest.mark.pooled

CALLS: Counter[str] = Counter()
SEEN: list[Any] = []
_lock = threading.Lock()


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()
    SEEN.clear()
    SWITCH["diverge"] = False


def called(label: str) -> None:
    with _lock:
        CALLS[label] += 1


# -- workflows --------------------------------------------------------------------


@step
def add(a: int, b: int) -> int:
    called(f"add{a}+{b}")
    return a + b


@step
def stamp(label: str) -> Any:
    called(f"stamp:{label}")
    return {"label": label, "at": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc), "pair": (1, b"\x01")}


@workflow
def chain(n: int) -> Any:
    called("body")
    one = add(n, 1)
    two = add(one, 1)
    three = add(two, 1)
    four = stamp(f"after {three}")
    return [one, two, three, four]


class CustomError(Exception):
    def __init__(self, code: int, where: str) -> None:
        super().__init__(code, where)
        self.code = code
        self.where = where


@step
def fail_custom(code: int) -> None:
    called("fail_custom")
    raise CustomError(code, "upstream")


@step
def fail_local(message: str) -> None:
    called("fail_local")

    class LocalOnly(Exception):
        """Its type cannot be imported back from its dotted name."""

    raise LocalOnly(message)


@step
def note(label: str) -> str:
    called(f"note:{label}")
    return label


@workflow
def catches_failures() -> Any:
    try:
        fail_custom(7)
    except CustomError as exc:
        SEEN.append(("custom", type(exc), exc.code, exc.where))
    try:
        fail_local("remote said no")
    except Exception as exc:
        SEEN.append(("local", type(exc), str(exc), getattr(exc, "type_name", None)))
    return note("end")


@workflow
def unhandled_failure() -> Any:
    note("first")
    fail_custom(3)
    note("never")


SWITCH = {"diverge": False}


@workflow
def divergent() -> Any:
    note("one")
    if SWITCH["diverge"]:
        result = add(1, 1)
    else:
        result = note("two")
    note("three")
    return result


@workflow
def divergent_caught() -> Any:
    note("one")
    try:
        if SWITCH["diverge"]:
            add(1, 1)
        else:
            note("two")
    except Exception as exc:
        SEEN.append(type(exc))
    return note("three")


@workflow
def echo_args(*args: Any) -> Any:
    SEEN.append(args)
    return note("x") and list(args)


@workflow(name="custom-name")
def explicitly_named() -> str:
    return "named"


# -- tests ------------------------------------------------------------------------


def test_workflows_register_by_qualified_name() -> None:
    assert chain.name == "tests.test_replay.chain"
    assert registry.get_workflow(chain.name) is chain
    assert explicitly_named.name == "custom-name"
    assert registry.get_workflow("custom-name") is explicitly_named
    assert "tests.test_replay.chain" in registry.workflow_names()


def test_a_run_completes_and_records_each_step(store: Any) -> None:
    run = schedule(chain, 10, database=store)
    assert run.name == "tests.test_replay.chain"
    assert execute_run(store, run.id) == COMPLETED
    done = store.get_run(run.id)
    assert done.status == "completed"
    assert done.result[:3] == [11, 12, 13]
    assert done.result[3]["pair"] == (1, b"\x01")
    assert done.completed_at is not None and done.error is None
    steps = store.get_steps(run.id)
    assert [(s.step_id, s.name, s.status) for s in steps] == [
        ("1", "tests.test_replay.add", STEP_DONE),
        ("2", "tests.test_replay.add", STEP_DONE),
        ("3", "tests.test_replay.add", STEP_DONE),
        ("4", "tests.test_replay.stamp", STEP_DONE),
    ]
    assert steps[0].args == [10, 1] and steps[0].kwargs == {}
    assert all(s.started_at is not None and s.completed_at >= s.started_at for s in steps)


def test_replay_skips_recorded_steps_and_resumes_at_the_first_unrecorded(store: Any) -> None:
    run = schedule(chain, 0, database=store)
    crash_at("3")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert [s.step_id for s in store.get_steps(run.id)] == ["1", "2"]
    assert store.get_run(run.id).status == RUNNING
    assert CALLS == Counter({"body": 1, "add0+1": 1, "add1+1": 1, "add2+1": 1})

    assert resume(store, run.id) == COMPLETED
    # The body ran from the top again; steps 1 and 2 returned their records;
    # step 3 had no record (its effect happened, the record did not) so it
    # ran again: at-least-once.
    assert CALLS == Counter({"body": 2, "add0+1": 1, "add1+1": 1, "add2+1": 2, "stamp:after 3": 1})
    assert store.get_run(run.id).result[:3] == [1, 2, 3]
    assert [s.step_id for s in store.get_steps(run.id)] == ["1", "2", "3", "4"]


def test_replayed_results_keep_their_types(store: Any) -> None:
    run = schedule(chain, 1, database=store)
    first = execute_run(store, run.id)
    assert first == COMPLETED
    # Re-execute the completed run's body against its records: nothing runs.
    with store.locked_run(run.id) as (conn, _):
        store.execute_named(conn, "reschedule", run_id=run.id, from_status=COMPLETED)
    CALLS.clear()
    assert execute_run(store, run.id) == COMPLETED
    assert CALLS == Counter({"body": 1})
    result = store.get_run(run.id).result
    assert result[3]["at"] == dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    assert result[3]["pair"] == (1, b"\x01")


def test_recorded_failures_are_re_raised_on_replay(store: Any) -> None:
    run = schedule(catches_failures, database=store)
    crash_at("3")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    first = list(SEEN)
    assert first[0] == ("custom", CustomError, 7, "upstream")
    assert first[1][0] == "local" and first[1][2] == "remote said no"
    steps = store.get_steps(run.id)
    assert [(s.step_id, s.status) for s in steps] == [("1", STEP_FAILED), ("2", STEP_FAILED)]
    assert steps[0].error["type"] == "tests.test_replay.CustomError"
    assert steps[0].error["args"] == [7, "upstream"]

    SEEN.clear()
    assert resume(store, run.id) == COMPLETED
    # Importable type: the original exception, rebuilt from its args.
    assert SEEN[0] == ("custom", CustomError, 7, "upstream")
    # Unimportable type: StepFailure carrying the stored message and type.
    kind, exc_type, message, type_name = SEEN[1]
    assert (kind, exc_type, message) == ("local", StepFailure, "remote said no")
    assert type_name.endswith("fail_local.<locals>.LocalOnly")
    # Neither failing step ran again.
    assert CALLS["fail_custom"] == 1 and CALLS["fail_local"] == 1
    assert CALLS["note:end"] == 2


def test_unhandled_step_failure_fails_the_run_with_that_exception(store: Any) -> None:
    run = schedule(unhandled_failure, database=store)
    assert execute_run(store, run.id) == FAILED
    done = store.get_run(run.id)
    assert done.status == "failed"
    assert done.error["type"] == "tests.test_replay.CustomError"
    assert done.error["args"] == [3, "upstream"]
    exc = done.exception
    assert isinstance(exc, CustomError) and exc.code == 3
    assert done.completed_at is not None and done.result is None
    assert CALLS["note:never"] == 0
    assert [(s.step_id, s.status) for s in store.get_steps(run.id)] == [("1", STEP_DONE), ("2", STEP_FAILED)]


def test_divergent_code_fails_the_run_with_workflow_code_error(store: Any) -> None:
    run = schedule(divergent, database=store)
    crash_at("3")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    SWITCH["diverge"] = True
    assert resume(store, run.id) == FAILED
    done = store.get_run(run.id)
    assert done.error["type"] == "everystep.errors.WorkflowCodeError"
    assert "tests.test_replay.note" in done.error["message"]
    assert "tests.test_replay.add" in done.error["message"]
    assert CALLS["add1+1"] == 0
    # Nothing after the divergence ran or was recorded.
    assert CALLS["note:three"] == 1
    assert [s.step_id for s in store.get_steps(run.id)] == ["1", "2"]


def test_divergence_cannot_be_caught_by_the_body(store: Any) -> None:
    run = schedule(divergent_caught, database=store)
    crash_at("3")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    SWITCH["diverge"] = True
    assert resume(store, run.id) == FAILED
    assert SEEN == [WorkflowCodeError]
    assert store.get_run(run.id).error["type"] == "everystep.errors.WorkflowCodeError"
    assert CALLS["note:three"] == 1


def test_workflow_args_are_stored_and_replayed_verbatim(store: Any) -> None:
    args = ({"when": dt.date(2024, 3, 1), "id": uuid.UUID(int=5)}, (1, 2), [b"raw"], None)
    run = schedule(echo_args, *args, database=store)
    assert run.args == list(args)
    assert store.get_run(run.id).args == list(args)
    crash_at("1")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert resume(store, run.id) == COMPLETED
    assert SEEN == [args, args]
    assert store.get_run(run.id).result == list(args)


def test_recorded_steps_of_other_runs_do_not_leak(store: Any) -> None:
    first = schedule(chain, 100, database=store)
    second = schedule(chain, 100, database=store)
    assert execute_run(store, first.id) == COMPLETED
    assert execute_run(store, second.id) == COMPLETED
    # Same arguments, separate runs: each executed its own steps.
    assert CALLS["add100+1"] == 2
    assert len(store.get_steps(second.id)) == 4


# -- two executions of one run ------------------------------------------------------

RACE: dict[str, threading.Event] = {}


@step
def who_am_i() -> str:
    me = threading.current_thread().name
    called(f"who:{me}")
    if me == "exec-a":
        assert RACE["b_in_step"].wait(30)
    else:
        RACE["b_in_step"].set()
        assert RACE["a_recorded"].wait(30)
    return me


@workflow
def first_record_wins() -> Any:
    me = threading.current_thread().name
    result = who_am_i()
    SEEN.append((me, result))
    if me == "exec-a":
        RACE["a_recorded"].set()
        assert RACE["b_finished"].wait(30)
    else:
        RACE["b_finished"].set()
    return result


def test_when_two_executions_race_the_first_record_wins(store: Any) -> None:
    """A restarted process under the same name re-executing a run its old
    self still runs: both execute the step, the first record is the one
    both go on with, and the stale execution writes nothing more."""
    from everystep.store import NewStep
    from tests.support.runs import claim_run

    RACE.update(b_in_step=threading.Event(), a_recorded=threading.Event(), b_finished=threading.Event())
    run = schedule(first_record_wins, database=store)
    claimed = claim_run(store, run.id)
    outcomes: dict[str, Any] = {}

    def go(name: str) -> None:
        try:
            outcomes[name] = runner.execute(store, claimed, claimer="tester")
        except BaseException as exc:  # reported by the asserts below
            outcomes[name] = exc

    threads = [threading.Thread(target=go, args=(name,), name=name) for name in ("exec-a", "exec-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    # Whichever finishes first completes the run; the other's write is refused.
    assert sorted(outcomes.values()) == [COMPLETED, "lost"], outcomes
    assert sorted(SEEN) == [("exec-a", "exec-a"), ("exec-b", "exec-a")]
    assert CALLS["who:exec-a"] == 1 and CALLS["who:exec-b"] == 1
    (record,) = store.get_steps(run.id)
    assert record.result == "exec-a"
    assert store.get_run(run.id).result == "exec-a"


def test_step_ids_are_unique_per_run(store: Any) -> None:
    from everystep.store import NewStep
    from tests.support.runs import claim_run

    run = schedule(chain, 0, database=store)
    claim = claim_run(store, run.id).claim
    now = dt.datetime.now(dt.timezone.utc)
    first = store.record_step(claim, NewStep("1", "n", "[]", "{}", now, STEP_DONE, '"first"'))
    second = store.record_step(claim, NewStep("1", "n", "[]", "{}", now, STEP_DONE, '"second"'))
    assert first.ours and not second.ours
    assert second.record.result == "first"
    assert [(s.step_id, s.result) for s in store.get_steps(run.id)] == [("1", "first")]
    # Another run may use the same step id.
    other = schedule(chain, 0, database=store)
    other_claim = claim_run(store, other.id).claim
    assert store.record_step(other_claim, NewStep("1", "n", "[]", "{}", now, STEP_DONE, '"x"')).ours
