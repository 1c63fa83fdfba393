"""parallel(): branches on their own threads, results in branch order,
sequence branches, the error rules, recording and replay of branch steps."""

from __future__ import annotations

import contextvars
import threading
from collections import Counter
from typing import Any

import pytest

from everystep import parallel, runner, schedule, step, workflow
from everystep.errors import DrainOrphan, EverystepError, SimulatedCrash
from everystep.models import COMPLETED, FAILED, SCHEDULED, STEP_DONE, STEP_FAILED, Outcome
from tests.support.runs import execute_run

CALLS: Counter[str] = Counter()
SEEN: list[Any] = []
EVENTS: dict[str, threading.Event] = {}
THREADS: dict[str, int] = {}
_lock = threading.Lock()


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()
    SEEN.clear()
    EVENTS.clear()
    THREADS.clear()


def event(name: str) -> threading.Event:
    with _lock:
        return EVENTS.setdefault(name, threading.Event())


def called(label: str) -> None:
    with _lock:
        CALLS[label] += 1


@step
def value(label: str) -> str:
    called(label)
    with _lock:
        THREADS[label] = threading.get_ident()
    return label


@step
def rendezvous(mine: str, theirs: str) -> str:
    """Only returns if the other branch runs at the same time."""
    called(mine)
    event(mine).set()
    assert event(theirs).wait(30), f"{mine}: branch {theirs} never ran concurrently"
    return mine


@step
def finish_after(label: str, other: str) -> str:
    """Finishes only after ``other`` finished: results still come back in branch order."""
    assert event(other).wait(30)
    called(label)
    return label


@step
def finish_first(label: str) -> str:
    called(label)
    event(label).set()
    return label


@step
def fail_with(kind: str, message: str) -> None:
    called(f"fail:{message}")
    raise {"value": ValueError, "key": KeyError, "runtime": RuntimeError}[kind](message)


@workflow
def ordered() -> Any:
    return parallel(
        lambda: finish_after("slow", "fast"),
        lambda: finish_first("fast"),
        [lambda: value("s1"), lambda: value("s2")],
    )


def test_results_come_back_in_branch_order(store: Any) -> None:
    run = schedule(ordered, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == ("slow", "fast", ("s1", "s2"))


@workflow
def concurrent() -> Any:
    main = threading.get_ident()
    results = parallel(lambda: rendezvous("left", "right"), lambda: rendezvous("right", "left"))
    SEEN.append(main)
    return results


def test_each_branch_runs_on_its_own_thread(store: Any) -> None:
    run = schedule(concurrent, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == ("left", "right")


BARRIER: dict[str, threading.Barrier] = {}


@step
def meet(label: str) -> str:
    """Passes only when every branch is inside this step at once."""
    BARRIER["fork"].wait(30)
    with _lock:
        THREADS[label] = threading.current_thread().name
    return label


@workflow
def three_at_once() -> Any:
    return parallel(lambda: meet("a"), lambda: meet("b"), [lambda: meet("c"), lambda: value("c2")])


def test_every_branch_runs_at_the_same_time_on_its_own_thread(store: Any) -> None:
    BARRIER["fork"] = threading.Barrier(3)
    run = schedule(three_at_once, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == ("a", "b", ("c", "c2"))
    names = {THREADS[label] for label in ("a", "b", "c")}
    assert len(names) == 3 and threading.current_thread().name not in names


@workflow
def one_failure() -> Any:
    try:
        parallel(lambda: value("ok"), lambda: fail_with("value", "only one"), [lambda: value("s1"), lambda: value("s2")])
    except Exception as exc:
        SEEN.append(exc)
        raise


def test_a_single_failure_is_re_raised_as_is(store: Any) -> None:
    run = schedule(one_failure, database=store)
    assert execute_run(store, run.id) == FAILED
    (exc,) = SEEN
    assert type(exc) is ValueError and str(exc) == "only one"
    failed = store.get_run(run.id)
    assert failed.error["type"] == "builtins.ValueError"
    # Healthy branches ran to completion and were recorded.
    steps = {s.step_id: s.status for s in store.get_steps(run.id)}
    assert steps == {"1.0.1": STEP_DONE, "1.1.1": STEP_FAILED, "1.2.1": STEP_DONE, "1.2.2": STEP_DONE}


@workflow
def several_failures() -> Any:
    try:
        parallel(
            lambda: fail_with("value", "first"),
            lambda: value("healthy"),
            lambda: fail_with("key", "second"),
        )
    except Exception as exc:
        SEEN.append(exc)
        raise


def test_several_failures_raise_an_exception_group(store: Any) -> None:
    run = schedule(several_failures, database=store)
    assert execute_run(store, run.id) == FAILED
    (group,) = SEEN
    assert type(group) is ExceptionGroup
    assert [type(exc) for exc in group.exceptions] == [ValueError, KeyError]
    failed = store.get_run(run.id)
    assert failed.error["type"] == "builtins.ExceptionGroup"
    decoded = failed.exception
    assert isinstance(decoded, ExceptionGroup)
    assert [type(exc) for exc in decoded.exceptions] == [ValueError, KeyError]
    assert decoded.message == group.message
    assert CALLS["healthy"] == 1


@workflow
def healthy_branches_finish() -> Any:
    try:
        parallel(
            lambda: fail_with("runtime", "early"),
            [lambda: value("h1"), lambda: value("h2"), lambda: value("h3")],
        )
    except RuntimeError:
        pass
    return value("after")


def test_healthy_branches_run_to_completion_and_are_recorded(store: Any) -> None:
    run = schedule(healthy_branches_finish, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert CALLS == Counter({"fail:early": 1, "h1": 1, "h2": 1, "h3": 1, "after": 1})
    steps = {s.step_id: s.status for s in store.get_steps(run.id)}
    assert steps == {"1.0.1": STEP_FAILED, "1.1.1": STEP_DONE, "1.1.2": STEP_DONE, "1.1.3": STEP_DONE, "2": STEP_DONE}


# -- drain ahead of a group ------------------------------------------------------------

DRAIN = threading.Event()


@step
def start_drain() -> str:
    # Both failing siblings are inside their step before the drain begins.
    assert event("value started").wait(30) and event("key started").wait(30)
    DRAIN.set()
    return "drained here"


@step
def fail_after_signal(kind: str) -> None:
    event(f"{kind} started").set()
    called(f"fail:{kind}")
    raise {"value": ValueError, "key": KeyError}[kind](kind)


@workflow
def drained_fork() -> Any:
    try:
        parallel(
            [start_drain, lambda: value("next")],
            lambda: fail_after_signal("value"),
            lambda: fail_after_signal("key"),
        )
    except BaseException as exc:
        SEEN.append(exc)
        if isinstance(exc, ExceptionGroup):
            return "group after resume"
        raise


def test_drain_orphan_is_raised_ahead_of_a_group_and_requeues(store: Any) -> None:
    DRAIN.clear()
    run = schedule(drained_fork, database=store)
    assert execute_run(store, run.id, draining=DRAIN) == Outcome.REQUEUED
    assert [type(exc) for exc in SEEN] == [DrainOrphan]
    requeued = store.get_run(run.id)
    assert requeued.status == SCHEDULED and requeued.claimed_by is None
    assert {s.step_id: s.status for s in store.get_steps(run.id)} == {
        "1.0.1": STEP_DONE, "1.1.1": STEP_FAILED, "1.2.1": STEP_FAILED,
    }
    assert CALLS["next"] == 0

    # The next claim (no drain) replays the recorded failures and runs the rest.
    SEEN.clear()
    assert execute_run(store, run.id) == COMPLETED
    assert [type(exc) for exc in SEEN] == [ExceptionGroup]
    assert CALLS == Counter({"fail:value": 1, "fail:key": 1, "next": 1})
    assert store.get_run(run.id).result == "group after resume"


# -- replay of a fork --------------------------------------------------------------


@workflow
def forked_chain() -> Any:
    first = value("head")
    pair = parallel([lambda: value("a1"), lambda: value("a2")], [lambda: value("b1"), lambda: value("b2")])
    return [first, pair, value("tail")]


def test_fork_replays_recorded_branch_steps(store: Any) -> None:
    run = schedule(forked_chain, database=store)

    def fault(ctx: Any, step_id: str) -> None:
        if step_id == "2.1.2":
            runner.fault = None
            raise SimulatedCrash("died in branch 1")

    runner.fault = fault
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    recorded = {s.step_id for s in store.get_steps(run.id)}
    assert {"1", "2.1.1"} <= recorded and "2.1.2" not in recorded and "3" not in recorded
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == ["head", (("a1", "a2"), ("b1", "b2")), "tail"]
    assert CALLS["head"] == 1 and CALLS["b1"] == 1 and CALLS["b2"] == 2 and CALLS["tail"] == 1
    assert sorted(s.step_id for s in store.get_steps(run.id)) == ["1", "2.0.1", "2.0.2", "2.1.1", "2.1.2", "3"]


# -- edges ---------------------------------------------------------------------------

TRACE: contextvars.ContextVar[str] = contextvars.ContextVar("trace", default="unset")


@workflow
def context_follows_branches() -> Any:
    TRACE.set("from the body")
    return parallel(lambda: TRACE.get(), lambda: TRACE.get())


def test_contextvars_follow_each_branch(store: Any) -> None:
    run = schedule(context_follows_branches, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == ("from the body", "from the body")


@workflow
def empty_fork() -> Any:
    nothing = parallel()
    return [nothing, value("after")]


def test_an_empty_fork_returns_an_empty_tuple_and_takes_a_position(store: Any) -> None:
    run = schedule(empty_fork, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == [(), "after"]
    assert [s.step_id for s in store.get_steps(run.id)] == ["2"]


@workflow
def bad_branch() -> Any:
    return parallel(lambda: value("fine"), 42)


def test_a_branch_that_is_not_callable_is_refused(store: Any) -> None:
    run = schedule(bad_branch, database=store)
    assert execute_run(store, run.id) == FAILED
    error = store.get_run(run.id).error
    assert error["type"] == "everystep.errors.EverystepError"
    assert "parallel branch 1 must be a zero-argument callable" in error["message"]
    assert CALLS["fine"] == 0


@step
def fans_out_inside_a_step() -> Any:
    return parallel(lambda: value("inner-a"), lambda: value("inner-b"))


@workflow
def fork_in_a_step() -> Any:
    return fans_out_inside_a_step()


def test_parallel_inside_a_step_is_a_plain_call(store: Any) -> None:
    run = schedule(fork_in_a_step, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == ("inner-a", "inner-b")
    assert [s.step_id for s in store.get_steps(run.id)] == ["1"]


# -- outside a run ---------------------------------------------------------------------


def test_parallel_outside_a_run_is_plain_threads() -> None:
    assert parallel(lambda: rendezvous("x", "y"), lambda: rendezvous("y", "x")) == ("x", "y")
    assert parallel([lambda: 1, lambda: 2], lambda: 3, everystep_id="ignored") == ((1, 2), 3)
    assert parallel() == ()


def test_error_rules_outside_a_run() -> None:
    with pytest.raises(ValueError, match="alone"):
        parallel(lambda: 1, lambda: fail_with("value", "alone"))
    with pytest.raises(ExceptionGroup) as info:
        parallel(lambda: fail_with("value", "a"), lambda: fail_with("key", "b"))
    assert [type(exc) for exc in info.value.exceptions] == [ValueError, KeyError]
    with pytest.raises(EverystepError, match="parallel branch 0"):
        parallel("not callable")
