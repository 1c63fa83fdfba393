"""What becomes of a run whose child died: ``supervisor.fate.decide`` as a
table, in-process, no fork. Each row is one situation the arbiter can be in
when it reaps a child holding a run, and the decision it must apply."""

from __future__ import annotations

from typing import Any

import pytest

from everystep.errors import Cancelled, ChildCrashed, StepKilled, StepTimeout
from everystep.models import RUNNING, Run
from supervisor.fate import Action, ChildEnd, Decision, decide, restart_reason
from supervisor.protocol import StepInFlight
from supervisor.states import ByeReason, KillReason, RestartReason

RUN = Run(id="0193a7c4-0000-7000-8000-000000000001", name="app.flow", args=[], status=RUNNING,
          claimed_by="sup", claim_epoch=3)
SAFE = StepInFlight(run=RUN.id, step="2", name="app.slow", started=100.0, timeout=1.0, unsafe=False)
UNSAFE = StepInFlight(run=RUN.id, step="3", name="app.charge", started=100.0, timeout=1.0, unsafe=True)
UNTIMED = StepInFlight(run=RUN.id, step="2", name="app.slow", started=100.0, timeout=None, unsafe=False)
#: Attempt 2 of a step whose policy retries a timeout 4 s later.
RETRIED = StepInFlight(run=RUN.id, step="4", name="app.flaky", started=100.0, timeout=1.0, unsafe=False,
                       attempt=2, retry_in=4.0)


def end(**changes: Any) -> ChildEnd:
    base: dict[str, Any] = dict(run=RUN, pid=4242, how="killed by SIGKILL", clean_exit=False, kill_reason=None,
                                bye_reason=None, steps=(), crashes=0, max_crashes=3, stopping=False)
    base.update(changes)
    return ChildEnd(**base)


def summary(decision: Decision) -> tuple[Action, list[tuple[str, str]], str | None, bool]:
    """(action, [(step id, error type)], run error type, counted as a crash)."""
    failed = [(step.step, type(error).__name__) for step, error in decision.fail_steps]
    run_error = type(decision.run_error).__name__ if decision.run_error is not None else None
    return decision.action, failed, run_error, decision.crashed


CASES = [
    # (id, situation, expected summary)
    ("said-bye-before-starting", end(bye_reason=ByeReason.RELOAD, clean_exit=True, how="exited with code 0"),
     (Action.REDISPATCH, [], None, False)),
    ("said-bye-then-crashed", end(bye_reason=ByeReason.DRAIN, clean_exit=False),
     (Action.REDISPATCH, [], None, True)),
    ("timeout-safe-step", end(kill_reason=KillReason.TIMEOUT, steps=(SAFE,)),
     (Action.REDISPATCH, [("2", "StepTimeout")], None, False)),
    ("timeout-unsafe-step-stays-started", end(kill_reason=KillReason.TIMEOUT, steps=(UNSAFE,)),
     (Action.REDISPATCH, [], None, False)),
    ("timeout-two-branches", end(kill_reason=KillReason.TIMEOUT, steps=(SAFE, UNSAFE)),
     (Action.REDISPATCH, [("2", "StepTimeout")], None, False)),
    ("timeout-while-stopping", end(kill_reason=KillReason.TIMEOUT, steps=(SAFE,), stopping=True),
     (Action.REQUEUE, [("2", "StepTimeout")], None, False)),
    ("kill-mid-step", end(kill_reason=KillReason.KILL, steps=(UNTIMED,)),
     (Action.REDISPATCH, [("2", "StepKilled")], None, False)),
    ("kill-mid-unsafe-step", end(kill_reason=KillReason.KILL, steps=(UNSAFE,)),
     (Action.REDISPATCH, [], None, False)),
    ("kill-between-steps", end(kill_reason=KillReason.KILL),
     (Action.FAIL_RUN, [], "StepKilled", False)),
    ("kill-requeue", end(kill_reason=KillReason.KILL_REQUEUE, steps=(UNTIMED,)),
     (Action.REQUEUE, [], None, False)),
    ("fenced", end(kill_reason=KillReason.FENCED, steps=(SAFE,)),
     (Action.FORGET, [], None, False)),
    ("fenced-while-stopping", end(kill_reason=KillReason.FENCED, stopping=True),
     (Action.FORGET, [], None, False)),
    ("drain-deadline", end(kill_reason=KillReason.DRAIN_DEADLINE, steps=(UNTIMED,), stopping=True),
     (Action.REQUEUE, [], None, False)),
    ("fast-stop", end(kill_reason=KillReason.QUIT, stopping=True),
     (Action.REQUEUE, [], None, False)),
    ("unresponsive", end(kill_reason=KillReason.UNRESPONSIVE),
     (Action.REQUEUE, [], None, False)),
    ("crash-while-stopping", end(stopping=True),
     (Action.REQUEUE, [], None, False)),
    ("first-crash", end(), (Action.REDISPATCH, [], None, True)),
    ("second-crash", end(crashes=1), (Action.REDISPATCH, [], None, True)),
    ("third-crash-fails-the-run", end(crashes=2), (Action.FAIL_RUN, [], "ChildCrashed", True)),
    ("max-crashes-1", end(max_crashes=1), (Action.FAIL_RUN, [], "ChildCrashed", True)),
    ("exit-code-1-is-a-crash", end(how="exited with code 1"), (Action.REDISPATCH, [], None, True)),
    # An operator cancelled the run (it is 'cancelled' already): the steps cut
    # off fail with Cancelled, an unsafe one keeps its started row, nothing else.
    ("cancelled-mid-step", end(kill_reason=KillReason.CANCELLED, steps=(UNTIMED,)),
     (Action.CANCELLED, [("2", "Cancelled")], None, False)),
    ("cancelled-mid-unsafe-step", end(kill_reason=KillReason.CANCELLED, steps=(UNSAFE,)),
     (Action.CANCELLED, [], None, False)),
    ("cancelled-two-branches", end(kill_reason=KillReason.CANCELLED, steps=(SAFE, UNSAFE)),
     (Action.CANCELLED, [("2", "Cancelled")], None, False)),
    ("cancelled-between-steps", end(kill_reason=KillReason.CANCELLED),
     (Action.CANCELLED, [], None, False)),
    ("cancelled-while-stopping", end(kill_reason=KillReason.CANCELLED, steps=(UNTIMED,), stopping=True),
     (Action.CANCELLED, [("2", "Cancelled")], None, False)),
    ("cancelled-after-crashes", end(kill_reason=KillReason.CANCELLED, crashes=2),
     (Action.CANCELLED, [], None, False)),
    # A timeout the step's policy retries: not a failure (see test_timeout_retries).
    ("timeout-retried", end(kill_reason=KillReason.TIMEOUT, steps=(RETRIED,)),
     (Action.REDISPATCH, [], None, False)),
    ("timeout-retried-beside-a-final-one", end(kill_reason=KillReason.TIMEOUT, steps=(SAFE, RETRIED)),
     (Action.REDISPATCH, [("2", "StepTimeout")], None, False)),
]


@pytest.mark.parametrize("situation, expected", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_decide(situation: ChildEnd, expected: tuple[Any, ...]) -> None:
    assert summary(decide(situation)) == expected


RETRIES = [
    # (id, situation, [(step id, error type, attempt, retry in)])
    ("timeout-retried", end(kill_reason=KillReason.TIMEOUT, steps=(RETRIED,)), [("4", "StepTimeout", 2, 4.0)]),
    ("timeout-retried-while-stopping", end(kill_reason=KillReason.TIMEOUT, steps=(RETRIED,), stopping=True),
     [("4", "StepTimeout", 2, 4.0)]),
    ("final-timeout", end(kill_reason=KillReason.TIMEOUT, steps=(SAFE,)), []),
    ("killed-never-retried", end(kill_reason=KillReason.KILL, steps=(RETRIED,)), []),
    ("cancel-never-retried", end(kill_reason=KillReason.CANCELLED, steps=(RETRIED,)), []),
    ("crash-records-nothing", end(steps=(RETRIED,)), []),
]


@pytest.mark.parametrize("situation, expected", [case[1:] for case in RETRIES], ids=[case[0] for case in RETRIES])
def test_timeout_retries(situation: ChildEnd, expected: list[tuple[Any, ...]]) -> None:
    decision = decide(situation)
    assert [(step.step, type(error).__name__, step.attempt, step.retry_in)
            for step, error in decision.retry_steps] == expected
    if expected:
        assert decision.action == (Action.REQUEUE if situation.stopping else Action.REDISPATCH)


def test_a_cancelled_step_names_the_run_and_the_pid() -> None:
    [(step, error)] = decide(end(kill_reason=KillReason.CANCELLED, steps=(UNTIMED,))).fail_steps
    assert isinstance(error, Cancelled)
    assert str(error) == f"step 2 (app.slow) was cut off by a cancel of run {RUN.id}: its process (pid 4242) was killed"


def test_errors_name_the_step_the_pid_and_the_cause() -> None:
    timeout = decide(end(kill_reason=KillReason.TIMEOUT, steps=(SAFE,))).fail_steps[0][1]
    assert isinstance(timeout, StepTimeout)
    assert str(timeout) == "step 2 (app.slow) ran past its timeout of 1s and its process (pid 4242) was killed"
    killed = decide(end(kill_reason=KillReason.KILL, steps=(UNTIMED,))).fail_steps[0][1]
    assert isinstance(killed, StepKilled) and "pid 4242" in str(killed)
    crashed = decide(end(crashes=2, how="killed by SIGSEGV")).run_error
    assert isinstance(crashed, ChildCrashed)
    assert str(crashed) == "the process running this run died 3 times; last: killed by SIGSEGV"


RESTARTS = [
    (KillReason.TIMEOUT, None, True, RestartReason.TIMEOUT),
    (KillReason.FENCED, None, True, RestartReason.FENCED),
    (KillReason.CANCELLED, None, True, RestartReason.CANCELLED),
    (KillReason.KILL, None, True, RestartReason.KILL),
    (KillReason.KILL_REQUEUE, None, True, RestartReason.KILL),
    (KillReason.DRAIN_DEADLINE, None, True, RestartReason.EXIT),
    (KillReason.UNRESPONSIVE, None, False, RestartReason.EXIT),
    (None, ByeReason.MAX_RUNS, False, RestartReason.RECYCLE),
    (None, ByeReason.MAX_MEMORY, True, RestartReason.RECYCLE),
    (None, ByeReason.RELOAD, False, RestartReason.RECYCLE),
    (None, ByeReason.SCALE, False, RestartReason.EXIT),
    (None, ByeReason.DRAIN, True, RestartReason.CRASH),
    (None, None, False, RestartReason.CRASH),
]


@pytest.mark.parametrize("kill, bye, had_run, expected", RESTARTS)
def test_restart_reason(kill: KillReason | None, bye: ByeReason | None, had_run: bool,
                        expected: RestartReason) -> None:
    assert restart_reason(kill, bye, had_run) == expected


def test_the_metrics_module_knows_every_restart_reason() -> None:
    from everystep import metrics

    assert set(metrics.RESTART_REASONS) == {reason.value for reason in RestartReason}
