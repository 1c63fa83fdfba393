"""The run lifecycle in-process, on both backends: the retry policy as a
table, what the runner records and when it releases a run (retries, durable
sleep, parallel branches that wait), delayed starts, cancels (scheduled,
blocked, running under a threaded worker), the periodic ticker, the claim's
index with a large sleeping backlog, and the schema upgrade.

Nothing waits on a clock: backoffs of 0 make a retried run due at once,
sleeps far in the future are never reached, and the ticker runs on a fake
wall clock.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

import everystep
from everystep import Cancelled, EverystepError, admin, parallel, runner, schedule, step, workflow
from everystep.cron import CronSchedule, Ticker, tick_key
from everystep.errors import (
    DrainOrphan, EffectUncertain, StepKilled, StepTimeout, Suspended, Terminal, WorkflowCodeError,
)
from everystep.models import (
    BLOCKED, CANCELLED, COMPLETED, FAILED, RUNNING, SCHEDULED, STEP_DONE, STEP_FAILED, STEP_RETRYING,
    STEP_SLEEPING,
)
from everystep.retry import RetryPolicy
from everystep.runner import Outcome
from everystep.store import Store, connect, migrations, utcnow
from everystep.worker import Worker
from tests.support.runs import claim_run
from tests.support.waiting import wait_for_file, wait_until

UTC = dt.timezone.utc
FAR = dt.timedelta(days=30)

# -- the retry policy, as a table ------------------------------------------------------------

WAITS = [
    # (policy, attempt that failed, seconds before the next)
    (RetryPolicy(retries=5, backoff=1.0, jitter=False), 1, 1.0),
    (RetryPolicy(retries=5, backoff=1.0, jitter=False), 2, 2.0),
    (RetryPolicy(retries=5, backoff=1.0, jitter=False), 4, 8.0),
    (RetryPolicy(retries=5, backoff=0.5, backoff_max=3.0, jitter=False), 4, 3.0),
    (RetryPolicy(retries=99, backoff=1.0, backoff_max=300.0, jitter=False), 90, 300.0),
    (RetryPolicy(retries=5, backoff=0.0, jitter=False), 3, 0.0),
]


@pytest.mark.parametrize("policy, attempt, seconds", WAITS)
def test_backoff_doubles_up_to_its_cap(policy: RetryPolicy, attempt: int, seconds: float) -> None:
    assert policy.wait(attempt) == seconds


def test_jitter_draws_between_half_and_all_of_the_backoff() -> None:
    policy = RetryPolicy(retries=3, backoff=2.0)
    assert policy.wait(2, draw=lambda: 0.0) == 2.0
    assert policy.wait(2, draw=lambda: 0.5) == 3.0
    assert policy.wait(2, draw=lambda: 0.999999) == pytest.approx(4.0)
    assert all(2.0 <= policy.wait(2) < 4.0 for _ in range(200))


RETRIED = [
    (ValueError("x"), 1, True),
    (ValueError("x"), 3, True),
    (ValueError("x"), 4, False),  # retries=3: the 4th attempt is the last
    (StepTimeout("t"), 1, True),
    (KeyError("k"), 1, False),  # outside retry_on
    (Terminal("stop"), 1, False),
    (EffectUncertain("u"), 1, False),
    (DrainOrphan("d"), 1, False),
    (StepKilled("k"), 1, False),
    (Cancelled("c"), 1, False),
    (WorkflowCodeError("w"), 1, False),
]


@pytest.mark.parametrize("error, attempt, retried", RETRIED, ids=[f"{type(e).__name__}-{a}" for e, a, _ in RETRIED])
def test_what_is_retried(error: BaseException, attempt: int, retried: bool) -> None:
    policy = RetryPolicy(retries=3, retry_on=(ValueError, StepTimeout, Terminal, EverystepError))
    assert policy.retries_after(attempt, error) is retried
    assert (policy.delay_after(attempt, error) is not None) is retried


@pytest.mark.parametrize("options, message", [
    ({"retries": -1}, "retries must be a whole number"),
    ({"retries": 1.5}, "retries must be a whole number"),
    ({"retries": 2, "backoff": -1}, "backoff must be a finite number"),
    ({"retries": 2, "backoff_max": float("inf")}, "backoff_max must be a finite number"),
    ({"retries": 2, "retry_on": "ValueError"}, "retry_on must be an exception class"),
    ({"retries": 2, "retry_on": ()}, "retry_on must be an exception class"),
    ({"retries": 2, "unsafe_to_repeat": True}, "an unsafe_to_repeat step is never retried"),
])
def test_bad_retry_options_are_refused_at_declaration(options: dict[str, Any], message: str) -> None:
    with pytest.raises(EverystepError, match=message):
        step(**options)(lambda: None)


# -- workflows ---------------------------------------------------------------------------------

CALLS: dict[str, int] = {}


def _count(key: str) -> int:
    CALLS[key] = CALLS.get(key, 0) + 1
    return CALLS[key]


@step(retries=2, backoff=0.0, jitter=False)
def flaky(key: str, succeed_on: int) -> int:
    attempt = _count(key)
    if attempt < succeed_on:
        raise ValueError(f"attempt {attempt}")
    return attempt


@step(retries=5, backoff=0.0, retry_on=KeyError)
def only_key_errors(key: str) -> None:
    _count(key)
    raise ValueError("not retried")


@step
def plain(value: Any) -> Any:
    return value


@workflow
def retrying_flow(key: str, succeed_on: int) -> Any:
    try:
        return flaky(key, succeed_on)
    except ValueError as exc:
        return f"gave up: {exc}"


@workflow
def not_retried_flow(key: str) -> str:
    try:
        only_key_errors(key)
    except ValueError:
        return "caught"
    return "no"


@workflow
def sleeps(seconds: float) -> str:
    plain("before")
    everystep.sleep(seconds)
    return plain("after")


@workflow
def sleeps_until(when: dt.datetime) -> str:
    everystep.sleep_until(when)
    return "woke"


@workflow
def swallows_the_sleep() -> str:
    try:
        everystep.sleep(3600)
    except Exception:  # Suspended is not an Exception: this never runs
        return "swallowed"
    return "after"


@workflow
def sleepy_branches(first: float, second: float) -> Any:
    return parallel(lambda: (everystep.sleep(first), plain("a"))[1],
                    [lambda: plain("b1"), lambda: plain("b2")],
                    lambda: (everystep.sleep(second), plain("c"))[1])


@workflow
def sleep_beside_a_failure() -> Any:
    @step
    def boom() -> None:
        raise RuntimeError("boom")

    try:
        return parallel(lambda: everystep.sleep(3600), boom)
    except RuntimeError:
        return "caught"


@step
def gate_step(path: str) -> str:
    wait_for_file(Path(path), 60)
    return "through"


@workflow
def gated_then_last(path: str) -> str:
    gate_step(path)
    return plain("last")


def run_once(store: Store, run_id: str) -> Outcome:
    return runner.execute(store, claim_run(store, run_id), claimer="tester")


def run_until_settled(store: Store, run_id: str, limit: int = 10) -> list[Outcome]:
    """Claim and execute while the run is released due at once (backoff 0)."""
    outcomes = []
    for _ in range(limit):
        outcomes.append(run_once(store, run_id))
        if store.get_run(run_id).status != SCHEDULED:
            return outcomes
    raise AssertionError(f"run {run_id} still scheduled after {limit} executions: {outcomes}")


# -- retries in the runner ---------------------------------------------------------------------


def test_a_retried_step_records_its_attempts_and_releases_the_run(store: Store) -> None:
    key = f"flaky-{store.backend}-{utcnow().timestamp()}"
    run = schedule(retrying_flow, key, 3, database=store)
    assert run_until_settled(store, run.id) == [Outcome.RELEASED, Outcome.RELEASED, Outcome.COMPLETED]
    done = store.get_run(run.id)
    assert (done.status, done.result) == (COMPLETED, 3)
    [record] = everystep.get_steps(run.id, database=store)
    assert (record.status, record.attempt, record.result) == (STEP_DONE, 3, 3)
    assert [(a.attempt, a.error["message"]) for a in record.attempts] == [(1, "attempt 1"), (2, "attempt 2")]
    assert all(a.started_at <= a.failed_at and a.retry_at is not None for a in record.attempts)
    assert record.to_dict()["attempts"][0]["attempt"] == 1
    from prometheus_client import REGISTRY

    assert REGISTRY.get_sample_value("everystep_step_retries_total",
                                     {"workflow": retrying_flow.name, "step": flaky.name}) >= 2


def test_the_final_failure_is_recorded_as_before_and_caught_by_the_body(store: Store) -> None:
    key = f"doomed-{store.backend}-{utcnow().timestamp()}"
    run = schedule(retrying_flow, key, 99, database=store)
    run_until_settled(store, run.id)
    assert store.get_run(run.id).result == "gave up: attempt 3"
    [record] = store.get_steps(run.id)
    assert (record.status, record.attempt, len(record.attempts)) == (STEP_FAILED, 3, 2)


def test_a_failure_outside_retry_on_is_not_retried(store: Store) -> None:
    key = f"not-retried-{store.backend}-{utcnow().timestamp()}"
    run = schedule(not_retried_flow, key, database=store)
    assert run_once(store, run.id) == Outcome.COMPLETED
    assert CALLS[key] == 1
    [record] = store.get_steps(run.id)
    assert (record.status, record.attempt, record.attempts) == (STEP_FAILED, 1, [])


def test_a_released_run_is_not_claimable_before_its_next_attempt(store: Store) -> None:
    @step(retries=1, backoff=3600.0, backoff_max=7200.0, jitter=False)
    def slow_to_retry() -> None:
        raise ValueError("later")

    @workflow(name=f"slow_retry_{store.backend}")
    def slow_retry_flow() -> None:
        slow_to_retry()

    run = schedule(slow_retry_flow, database=store)
    assert run_once(store, run.id) == Outcome.RELEASED
    released = store.get_run(run.id)
    assert released.status == SCHEDULED and released.claimed_by is None
    [record] = store.get_steps(run.id)
    assert record.status == STEP_RETRYING and record.wake_at == released.not_before
    assert released.not_before - utcnow() > dt.timedelta(seconds=3500)
    assert store.claim("other", 10, [slow_retry_flow.name]) == []
    wait = store.next_due([slow_retry_flow.name])
    assert wait is not None and 3500 < wait <= 3600
    assert store.queue_stats()["waiting"] == 1 and store.queue_stats()["pending"] == 0


# -- durable sleep ------------------------------------------------------------------------------


def test_a_sleep_records_its_wake_time_and_releases_the_run(store: Store) -> None:
    run = schedule(sleeps, 3600, database=store)
    assert run_once(store, run.id) == Outcome.RELEASED
    released = store.get_run(run.id)
    steps = store.get_steps(run.id)
    assert [(s.step_id, s.name, s.status) for s in steps] == [
        ("1", plain.name, STEP_DONE), ("2", "everystep.sleep", STEP_SLEEPING)]
    assert steps[1].wake_at == released.not_before
    assert dt.timedelta(seconds=3590) < released.not_before - steps[1].started_at <= dt.timedelta(seconds=3600)
    assert store.claim("other", 10, [sleeps.name]) == []


def test_a_sleep_that_is_over_returns_on_replay(store: Store) -> None:
    run = schedule(sleeps, 3600, database=store)
    assert run_once(store, run.id) == Outcome.RELEASED
    # An hour later, as far as the database is concerned.
    store.release(store.get_run(run.id).claim_as("nobody"), utcnow())  # refused: not running
    _age_sleep(store, run.id, "2")
    assert run_once(store, run.id) == Outcome.COMPLETED
    assert [s.status for s in store.get_steps(run.id)] == [STEP_DONE, STEP_DONE, STEP_DONE]


def _age_sleep(store: Store, run_id: str, step_id: str) -> None:
    """Move a sleeping step's wake time (and its run's not-before) into the past."""
    past = utcnow() - dt.timedelta(seconds=1)
    value = past.isoformat() if store.backend == "sqlite" else past
    with store.connection() as conn:
        marker = "?" if store.backend == "sqlite" else "%s"
        conn.execute(f"UPDATE everystep_step SET wake_at = {marker} WHERE workflow_id = {marker} AND step_id = {marker}",
                     (value, run_id, step_id))
        conn.execute(f"UPDATE everystep_workflow SET not_before = {marker} WHERE id = {marker}", (value, run_id))


def test_sleep_zero_and_sleep_until_the_past_do_not_release(store: Store) -> None:
    run = schedule(sleeps, 0, database=store)
    assert run_once(store, run.id) == Outcome.COMPLETED
    run = schedule(sleeps_until, utcnow() - dt.timedelta(minutes=5), database=store)
    assert run_once(store, run.id) == Outcome.COMPLETED
    assert store.get_steps(run.id)[0].status == STEP_DONE


def test_the_body_cannot_swallow_a_sleep(store: Store) -> None:
    run = schedule(swallows_the_sleep, database=store)
    assert run_once(store, run.id) == Outcome.RELEASED


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
    assert run_once(store, run.id) == Outcome.RELEASED
    steps = {s.step_id: s for s in store.get_steps(run.id)}
    assert {sid: s.status for sid, s in steps.items()} == {
        "1.0.1": STEP_SLEEPING, "1.1.1": STEP_DONE, "1.1.2": STEP_DONE, "1.2.1": STEP_SLEEPING}
    assert store.get_run(run.id).not_before == steps["1.0.1"].wake_at
    _age_sleep(store, run.id, "1.0.1")
    assert run_once(store, run.id) == Outcome.RELEASED
    steps = {s.step_id: s for s in store.get_steps(run.id)}
    assert steps["1.0.1"].status == STEP_DONE and steps["1.0.2"].result == "a"
    assert steps["1.2.1"].status == STEP_SLEEPING
    assert store.get_run(run.id).not_before == steps["1.2.1"].wake_at
    _age_sleep(store, run.id, "1.2.1")
    assert run_once(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == ("a", ("b1", "b2"), "c")


def test_a_sleeping_branch_outranks_a_failing_one(store: Store) -> None:
    run = schedule(sleep_beside_a_failure, database=store)
    assert run_once(store, run.id) == Outcome.RELEASED
    assert {s.step_id: s.status for s in store.get_steps(run.id)} == {"1.0.1": STEP_SLEEPING, "1.1.1": STEP_FAILED}
    _age_sleep(store, run.id, "1.0.1")
    assert run_once(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == "caught"


def test_a_sleep_in_place_of_a_recorded_step_is_a_code_error(store: Store) -> None:
    run = schedule(sleeps, 3600, database=store)
    assert run_once(store, run.id) == Outcome.RELEASED
    with store.connection() as conn:
        marker = "?" if store.backend == "sqlite" else "%s"
        conn.execute(f"UPDATE everystep_step SET name = 'elsewhere.step' WHERE workflow_id = {marker} "
                     "AND step_id = '2'", (run.id,))
    _age_sleep(store, run.id, "2")
    assert run_once(store, run.id) == Outcome.FAILED
    assert store.get_run(run.id).error["type"] == "everystep.errors.WorkflowCodeError"


# -- delayed start ------------------------------------------------------------------------------


def test_a_delayed_run_is_claimable_only_from_its_time(store: Store) -> None:
    later = schedule(sleeps, 0, database=store, delay=3600)
    at = schedule(sleeps, 0, database=store, run_at=dt.datetime(2099, 1, 1, tzinfo=UTC))
    due = schedule(sleeps, 0, database=store, run_at=utcnow() - dt.timedelta(seconds=5))
    assert later.not_before - later.created_at >= dt.timedelta(seconds=3599)
    claimed = store.claim("tester", 10, [sleeps.name])
    assert [run.id for run in claimed] == [due.id]
    assert 3500 < (store.next_due([sleeps.name]) or 0) <= 3600.01  # float seconds: allow a rounding
    assert {store.get_run(r.id).status for r in (later, at)} == {SCHEDULED}


def test_due_runs_are_claimed_earliest_due_first(store: Store) -> None:
    now = utcnow()
    newer_but_due_first = schedule(sleeps, 0, database=store, run_at=now - dt.timedelta(minutes=10))
    plain_run = schedule(sleeps, 0, database=store)
    claimed = store.claim("tester", 10, [sleeps.name])
    assert [run.id for run in claimed][:2] == [newer_but_due_first.id, plain_run.id] or \
        sorted(run.id for run in claimed) == sorted([newer_but_due_first.id, plain_run.id])
    assert claimed[0].id == newer_but_due_first.id


@pytest.mark.parametrize("options, message", [
    ({"run_at": dt.datetime(2030, 1, 1)}, "aware datetime"),
    ({"delay": -5}, "finite number of seconds"),
    ({"delay": 5, "run_at": dt.datetime(2030, 1, 1, tzinfo=UTC)}, "not both"),
])
def test_bad_delays_are_refused_before_anything_is_written(store: Store, options: dict[str, Any],
                                                           message: str) -> None:
    with pytest.raises(EverystepError, match=message):
        schedule(sleeps, 0, database=store, **options)
    assert store.list_runs() == []


# -- cancel ---------------------------------------------------------------------------------------


def test_cancel_of_scheduled_and_blocked_runs_is_final(store: Store) -> None:
    waiting = schedule(sleeps, 0, database=store, delay=3600)
    cancelled = admin.cancel(store, waiting.id, "not needed")
    assert (cancelled.status, cancelled.error["message"]) == (CANCELLED, "not needed")
    assert cancelled.completed_at is not None
    assert store.claim("tester", 10, [sleeps.name]) == []
    with store.connection() as conn:
        marker = "?" if store.backend == "sqlite" else "%s"
        run = schedule(sleeps, 0, database=store)
        conn.execute(f"UPDATE everystep_workflow SET status = 'blocked' WHERE id = {marker}", (run.id,))
    assert admin.cancel(store, run.id).error["message"] == "cancelled by an operator"
    for finished in (waiting.id, run.id):
        with pytest.raises(admin.AdminError, match="only scheduled, running or blocked runs can be cancelled"):
            admin.cancel(store, finished)
    assert everystep.wait(run.id, timeout=1, database=store).status == CANCELLED


def test_cancel_of_a_running_run_fences_its_execution(store: Store) -> None:
    """The executor finds its next write refused, records the step it just
    finished through the cancelled claim's one write, and stops."""
    holder: dict[str, Any] = {}

    @step
    def cancels_itself(run_id: str) -> str:
        holder["cancelled"] = admin.cancel(store, run_id, "from inside")
        return "effect done"

    @workflow(name=f"cancelled_mid_step_{store.backend}")
    def cancelled_mid_step() -> str:
        from everystep.context import current

        ctx = current()
        assert ctx is not None
        cancels_itself(ctx.workflow_id)
        return plain("never")

    run = schedule(cancelled_mid_step, database=store)
    assert run_once(store, run.id) == Outcome.CANCELLED
    after = store.get_run(run.id)
    assert (after.status, after.error["message"]) == (CANCELLED, "from inside")
    assert [(s.step_id, s.status, s.result) for s in store.get_steps(run.id)] == [("1", STEP_DONE, "effect done")]


def test_a_threaded_worker_stops_a_cancelled_run_at_the_next_step_boundary(store: Store, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    run = schedule(gated_then_last, str(gate), database=store)
    worker = Worker(pool_size=1, poll=0.05, name=f"cancel-{store.backend}", database=store, drain=30)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: store.get_run(run.id).status == RUNNING, "the worker to claim the run")
        admin.cancel(store, run.id)
        gate.touch()
        wait_until(lambda: store.get_steps(run.id), "the gated step's record")
        wait_until(lambda: not worker._active or all(f.done() for f in worker._active), "the run's thread to end")
    finally:
        gate.touch()
        worker.stop()
        thread.join(60)
    assert [(s.step_id, s.status, s.result) for s in store.get_steps(run.id)] == [("1", STEP_DONE, "through")]
    assert store.get_run(run.id).status == CANCELLED


# -- periodic runs -------------------------------------------------------------------------------


#: Not registered as a workflow (a ticker is handed its schedules): every
#: runner a later test starts in this process would otherwise tick it.
HOURLY = "tests.lifecycle.hourly"
HOURLY_CRON = CronSchedule.parse("0 * * * *", "Europe/Paris")


def test_a_cron_workflow_is_registered_with_its_schedule() -> None:
    from everystep import registry

    @workflow(name="tests.lifecycle.new_year", cron="0 0 1 1 *", timezone="Pacific/Auckland")
    def new_year(tick: dt.datetime) -> str:
        return tick.isoformat()

    try:
        assert new_year.cron == CronSchedule("0 0 1 1 *", "Pacific/Auckland")
        assert registry.schedules()[new_year.name] == new_year.cron
        assert new_year.cron.next_after(dt.datetime(2030, 6, 1, tzinfo=UTC)) == \
            dt.datetime(2030, 12, 31, 11, 0, tzinfo=UTC)  # midnight in Auckland (summer time)
    finally:
        # Registered, it would be ticked by every runner later tests start here.
        with registry._lock:
            registry._workflows.pop(new_year.name, None)


class FakeClock:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


def ticker(store: Store, clock: FakeClock) -> Ticker:
    import logging

    return Ticker(store, {HOURLY: HOURLY_CRON}, logging.getLogger("test"), "test", clock=clock)


def test_tickers_enqueue_each_tick_once_however_many_there_are(store: Store) -> None:
    clock = FakeClock(dt.datetime(2030, 3, 30, 22, 30, tzinfo=UTC))
    first, second = ticker(store, clock), ticker(store, clock)
    assert first.tick(0.0) == [] and second.tick(0.0) == []  # no history: the first tick after start
    for hour in range(3):
        clock.now = dt.datetime(2030, 3, 30, 23 + hour, 0, 1, tzinfo=UTC) if hour == 0 else \
            dt.datetime(2030, 3, 31, hour - 1, 0, 1, tzinfo=UTC)
        made = first.tick(1.0) + second.tick(1.0)
        assert len(made) == 1
    runs = store.list_runs(name=HOURLY)
    ticks = sorted(run.args[0] for run in runs)
    assert [tick.isoformat() for tick in ticks] == [
        "2030-03-30T23:00:00+00:00", "2030-03-31T00:00:00+00:00", "2030-03-31T01:00:00+00:00"]
    assert {run.idempotency_key for run in runs} == {tick_key(tick) for tick in ticks}
    assert store.cron_ticks([HOURLY])[HOURLY][0] == ticks[-1]


def test_after_downtime_only_the_latest_missed_tick_runs(store: Store) -> None:
    clock = FakeClock(dt.datetime(2030, 1, 1, 9, 59, tzinfo=UTC))
    before = ticker(store, clock)
    before.tick(0.0)
    clock.now = dt.datetime(2030, 1, 1, 10, 0, 0, tzinfo=UTC)
    assert len(before.tick(0.0)) == 1
    clock.now = dt.datetime(2030, 1, 1, 15, 20, tzinfo=UTC)  # down from 10:00 to 15:20
    restarted = ticker(store, clock)
    [missed] = restarted.tick(0.0)
    assert missed.args[0] == dt.datetime(2030, 1, 1, 15, 0, tzinfo=UTC)
    assert restarted.tick(0.0) == []
    assert len(store.list_runs(name=HOURLY)) == 2
    assert restarted.next_due(100.0) == pytest.approx(100.0 + 40 * 60)


def test_cron_schedules_follow_their_time_zone_and_are_validated() -> None:
    paris = CronSchedule.parse("30 2 * * *", "Europe/Paris")
    # 2030-03-31: Paris skips from 02:00 to 03:00; the next 02:30 is on April 1st (00:30 UTC).
    assert paris.next_after(dt.datetime(2030, 3, 30, 12, 0, tzinfo=UTC)) == dt.datetime(2030, 3, 31, 1, 0, tzinfo=UTC) \
        or paris.next_after(dt.datetime(2030, 3, 31, 1, 30, tzinfo=UTC)) == dt.datetime(2030, 4, 1, 0, 30, tzinfo=UTC)
    assert paris.latest_at_or_before(dt.datetime(2030, 6, 1, 0, 30, tzinfo=UTC)) == \
        dt.datetime(2030, 6, 1, 0, 30, tzinfo=UTC)
    with pytest.raises(EverystepError, match="invalid cron expression"):
        CronSchedule.parse("61 * * * *")
    with pytest.raises(EverystepError, match="unknown timezone"):
        CronSchedule.parse("* * * * *", "Mars/Olympus")
    with pytest.raises(EverystepError, match="timezone= applies to a cron schedule"):
        workflow(timezone="UTC")(lambda: None)


def test_cron_without_the_extra_says_which_extra_in_one_line(tmp_path: Path) -> None:
    script = ("import sys; sys.modules['cronsim'] = None\n"
              "from everystep import workflow\n"
              "workflow(cron='* * * * *')(lambda tick: None)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode != 0
    assert "cron schedules need the cron extra: pip install 'everystep[cron]'" in result.stderr


# -- the claim with a large sleeping backlog --------------------------------------------------


@pytest.mark.timeout(300)
def test_the_claim_reads_only_due_runs_past_100000_sleeping_ones(pg_url: str) -> None:
    """100,000 runs sleep for a day ahead of five due ones in the claim's
    index: a claim reads the due index entries and stops at the first run
    that is not due (index entries read, from the server's statistics)."""
    store = connect(pg_url)
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO everystep_workflow (id, name, args, status, created_at, not_before) "
                "SELECT gen_random_uuid(), %s, '[0]', 'scheduled', clock_timestamp() - interval '1 hour', "
                "clock_timestamp() + interval '1 day' FROM generate_series(1, 100000)", (sleeps.name,))
            conn.execute("ANALYZE everystep_workflow")
        due = [schedule(sleeps, 0, database=store).id for _ in range(5)]

        def entries_read() -> int:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("SELECT pg_stat_force_next_flush()")
                row = conn.execute("SELECT idx_tup_read FROM pg_stat_user_indexes "
                                   "WHERE indexrelname = 'everystep_workflow_claimable'").fetchone()
                return int(row[0])

        store.claim("warm", 0, [sleeps.name])
        before = entries_read()
        claimed = store.claim("tester", 10, [sleeps.name])
        store.close()
        after = entries_read()
        assert sorted(run.id for run in claimed) == sorted(due)
        assert after - before <= len(due) + 2, after - before
        before = entries_read()
        assert store.next_due([sleeps.name]) is not None
        store.close()
        # The five claimed runs' entries stay in the index until vacuum.
        assert entries_read() - before <= len(due) + 2
    finally:
        store.close()


def test_sqlite_claims_along_the_due_time_index(tmp_path: Path) -> None:
    store = connect(f"sqlite:///{tmp_path / 'plan.db'}")
    try:
        with store.connection() as conn:
            plan = " ".join(str(tuple(row)) for row in conn.execute(
                "EXPLAIN QUERY PLAN " + store.sql["claim"],
                store._params(claimer="x", limit=10, names='["a"]', queue="default", priority=0)).fetchall())
        assert "everystep_workflow_claimable" in plan, plan
    finally:
        store.close()


# -- the schema upgrade -------------------------------------------------------------------------


def test_sqlite_upgrade_to_version_6_keeps_runs_steps_and_the_foreign_key(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    for migration in migrations.available("sqlite")[:5]:
        for statement in migration.statements():
            conn.execute(statement)
        conn.execute("CREATE TABLE IF NOT EXISTS everystep_migration (version INTEGER PRIMARY KEY, "
                     "name TEXT NOT NULL, applied_at TEXT NOT NULL)")
        conn.execute("INSERT INTO everystep_migration VALUES (?, ?, '2024-01-01')", (migration.version, migration.name))
    conn.execute("INSERT INTO everystep_workflow (id, name, args, status, created_at, claim_epoch) VALUES "
                 "('01a2aaaa-0000-7000-8000-000000000001', 'old.flow', '[]', 'scheduled', '2024-01-01T00:00:00+00:00', 4)")
    conn.execute("INSERT INTO everystep_step (workflow_id, step_id, name, status, result, started_at) VALUES "
                 "('01a2aaaa-0000-7000-8000-000000000001', '1', 'old.step', 'done', '1', '2024-01-01T00:00:00+00:00')")
    conn.close()

    store = connect(f"sqlite:///{path}")  # migrates itself
    try:
        assert store.schema_version() == migrations.latest("sqlite")
        run = store.get_run("01a2aaaa-0000-7000-8000-000000000001")
        assert (run.status, run.claim_epoch, run.not_before) == (SCHEDULED, 4, None)
        [record] = store.get_steps(run.id)
        assert (record.status, record.result, record.attempt) == (STEP_DONE, 1, 1)
        with store.connection() as conn:
            names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
            assert {"everystep_workflow_idempotency", "everystep_workflow_claimable", "everystep_workflow_running",
                    "everystep_workflow_status"} <= names
            assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
            with pytest.raises(sqlite3.IntegrityError):
                conn.execute("INSERT INTO everystep_step (workflow_id, step_id, name, status, started_at) "
                             "VALUES ('01a2ffff-0000-7000-8000-000000000000', '1', 'x', 'done', 'now')")
            conn.execute("DELETE FROM everystep_workflow WHERE id = ?", (run.id,))
            assert conn.execute("SELECT count(*) FROM everystep_step").fetchone()[0] == 0  # cascades
    finally:
        store.close()


def test_check_deploy_says_a_waiting_run_resumes(store: Store) -> None:
    from everystep import dryrun

    run = schedule(sleeps, 3600, database=store)
    assert run_once(store, run.id) == Outcome.RELEASED
    verdict = dryrun.replay(store.get_run(run.id), store.get_steps(run.id))
    assert verdict.outcome == dryrun.Outcome.RESUMES and "waits until" in verdict.detail
    fresh = schedule(sleeps, 3600, database=store, delay=60)
    with store.connection() as conn:
        marker = "?" if store.backend == "sqlite" else "%s"
        conn.execute(f"UPDATE everystep_workflow SET not_before = NULL WHERE id = {marker}", (fresh.id,))
    claimed = claim_run(store, fresh.id)
    store.requeue(claimed.claim)
    assert dryrun.replay(store.get_run(fresh.id), []).next_step == "1"
