"""Retries: the retry policy as a table (backoff, jitter, what is retried,
options refused at declaration), and what the runner records and when it
releases a run whose step is retried, on both backends.

Nothing waits on a clock: backoffs of 0 make a retried run due at once.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

import everystep
from everystep import Cancelled, EverystepError, schedule, step, workflow
from everystep.errors import DrainOrphan, EffectUncertain, StepKilled, StepTimeout, Terminal, WorkflowCodeError
from everystep.models import COMPLETED, SCHEDULED, STEP_DONE, STEP_FAILED, STEP_RETRYING
from everystep.retry import RetryPolicy
from everystep.runner import Outcome
from everystep.store import Store, utcnow
from tests.apps.lifecycle_in_process import CALLS, flaky, not_retried_flow, retrying_flow
from tests.support.runs import execute_run, run_until_settled

# The engine's own statements: also through PgBouncer in transaction mode.
pytestmark = pytest.mark.pooled

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
    assert execute_run(store, run.id) == Outcome.COMPLETED
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
    assert execute_run(store, run.id) == Outcome.RELEASED
    released = store.get_run(run.id)
    assert released.status == SCHEDULED and released.claimed_by is None
    [record] = store.get_steps(run.id)
    assert record.status == STEP_RETRYING and record.wake_at == released.not_before
    assert released.not_before - utcnow() > dt.timedelta(seconds=3500)
    assert store.claim("other", 10, [slow_retry_flow.name]) == []
    wait = store.next_due([slow_retry_flow.name])
    assert wait is not None and 3500 < wait <= 3600
    assert store.queue_stats()["waiting"] == 1 and store.queue_stats()["pending"] == 0
