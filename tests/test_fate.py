"""What becomes of a run whose child died: ``supervisor.fate.decide`` as a
table, in-process, no fork. Each row is one situation the arbiter can be in
when it reaps a child holding a run, and the decision it must apply."""

from __future__ import annotations

from typing import Any

import pytest

from everystep.errors import Cancelled, ChildCrashed, StepKilled, StepResourceExceeded, StepTimeout
from everystep.models import RUNNING, Run
from everystep.resources import Resource
from supervisor.fate import Action, ChildEnd, Decision, Overrun, decide, restart_reason
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
MIB = 1 << 20
HOG = StepInFlight(run=RUN.id, step="2", name="app.hog", started=100.0, memory_limit=256 * MIB, cpu_limit=2.0,
                   cpu_start=1.0, memory_start=50 * MIB)
UNSAFE_HOG = StepInFlight(run=RUN.id, step="3", name="app.charge", started=100.0, unsafe=True,
                          memory_limit=256 * MIB, cpu_start=1.0, memory_start=50 * MIB)
SIBLING = StepInFlight(run=RUN.id, step="4.1.1", name="app.sibling", started=100.0)
OOM = Overrun(Resource.MEMORY, "its process (pid 4242) was killed by the kernel's out-of-memory killer", 256 * MIB)
OOM_NO_PEAK = Overrun(Resource.MEMORY, "its process (pid 4242) was killed by the kernel's out-of-memory killer")
CPU_OVER = Overrun(Resource.CPU, "its process (pid 4242) was killed by the supervisor", 3.3)


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
    # Budgets: the parent killed the child for one, or the kernel ran out of memory.
    ("over-budget-killed-by-parent", end(kill_reason=KillReason.RESOURCE, steps=(HOG,), overrun=CPU_OVER),
     (Action.REDISPATCH, [("2", "StepResourceExceeded")], None, False)),
    ("over-budget-only-the-bounded-step-is-blamed",
     end(kill_reason=KillReason.RESOURCE, steps=(HOG, SIBLING), overrun=CPU_OVER),
     (Action.REDISPATCH, [("2", "StepResourceExceeded")], None, False)),
    ("over-budget-step-ended-meanwhile", end(kill_reason=KillReason.RESOURCE, overrun=CPU_OVER),
     (Action.REDISPATCH, [], None, False)),
    ("over-budget-while-stopping", end(kill_reason=KillReason.RESOURCE, steps=(HOG,), overrun=CPU_OVER,
                                       stopping=True),
     (Action.REQUEUE, [("2", "StepResourceExceeded")], None, False)),
    ("oom-kill-at-a-memory-limit", end(steps=(HOG, SIBLING), overrun=OOM),
     (Action.REDISPATCH, [("2", "StepResourceExceeded")], None, False)),
    ("oom-kill-without-limits-blames-every-step", end(steps=(UNTIMED, SIBLING), overrun=OOM_NO_PEAK),
     (Action.REDISPATCH, [("2", "StepResourceExceeded"), ("4.1.1", "StepResourceExceeded")], None, False)),
    ("oom-kill-of-an-unsafe-step-stays-started", end(steps=(UNSAFE_HOG,), overrun=OOM),
     (Action.REDISPATCH, [], None, False)),
    ("oom-kill-between-steps-is-a-crash", end(overrun=OOM_NO_PEAK), (Action.REDISPATCH, [], None, True)),
    ("oom-kill-after-a-fence-forgets", end(kill_reason=KillReason.FENCED, steps=(HOG,), overrun=OOM),
     (Action.FORGET, [], None, False)),
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


def test_resource_errors_name_the_limit_and_the_observed_peak() -> None:
    (step, error), = decide(end(steps=(HOG,), overrun=OOM)).fail_steps
    assert isinstance(error, StepResourceExceeded)
    assert str(error) == ("step 2 (app.hog) exceeded its memory limit of 256 MiB (peak 256 MiB above its start): "
                          "its process (pid 4242) was killed by the kernel's out-of-memory killer")
    assert (error.resource, error.limit, error.peak) == ("memory", 256 * MIB, 256 * MIB)
    (_, cpu), = decide(end(kill_reason=KillReason.RESOURCE, steps=(HOG,), overrun=CPU_OVER)).fail_steps
    assert str(cpu) == "step 2 (app.hog) exceeded its CPU limit of 2s (peak 3.3s): its process (pid 4242) " \
                       "was killed by the supervisor"
    (_, unbounded), *_ = decide(end(steps=(UNTIMED,), overrun=OOM_NO_PEAK)).fail_steps
    assert str(unbounded) == "step 2 (app.slow) exceeded memory: its process (pid 4242) was killed by the " \
                             "kernel's out-of-memory killer"
    assert isinstance(unbounded, StepResourceExceeded) and unbounded.limit is None and unbounded.peak is None


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
    (KillReason.RESOURCE, None, True, RestartReason.RESOURCE),
]


@pytest.mark.parametrize("kill, bye, had_run, expected", RESTARTS)
def test_restart_reason(kill: KillReason | None, bye: ByeReason | None, had_run: bool,
                        expected: RestartReason) -> None:
    assert restart_reason(kill, bye, had_run) == expected


def test_a_kernel_oom_kill_restarts_for_a_resource_not_a_crash() -> None:
    assert restart_reason(None, None, True, overrun=True) == RestartReason.RESOURCE
    assert restart_reason(KillReason.FENCED, None, True, overrun=True) == RestartReason.FENCED


def test_the_metrics_module_knows_every_restart_reason() -> None:
    from everystep import metrics

    assert set(metrics.RESTART_REASONS) == {reason.value for reason in RestartReason}
