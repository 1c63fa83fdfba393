"""The run lifecycle with real supervisors, on both backends: retries and
their backoff, durable sleep, delayed start, periodic runs, cancel.

Nothing here times anything: gaps are read from the times the database
recorded (attempt starts and failures, claim and not-before times, cancel
and kill records), and waits are for conditions, with generous deadlines.
"""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from everystep import schedule
from everystep.models import CANCELLED, COMPLETED, SCHEDULED, STEP_DONE, STEP_FAILED, STEP_SLEEPING, STEP_STARTED
from everystep.store import Store
from tests.apps import lifecycle
from tests.apps.supervised import effect_lines, effects
from tests.support.supervisor import error_type, supervisors, wait_for_pids_gone, wait_run  # noqa: F401
from tests.support.waiting import wait_until

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]

APP = "tests.apps.lifecycle"


def everystep(env: dict[str, str], db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "everystep.cli", *args, "--database", db_url],
                          env=env, capture_output=True, text=True, timeout=120)


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """A refusal: exit code 2 and exactly one line on stderr."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def spec(directory: Path, **extra: Any) -> dict[str, Any]:
    return {"dir": str(directory), **extra}


def steps_by_id(store: Store, run_id: str) -> dict[str, Any]:
    return {record.step_id: record for record in store.get_steps(run_id)}


def waiting_run(store: Store, run_id: str) -> Any:
    """Wait until the run is released: scheduled with a not-before time."""
    return wait_until(lambda: (lambda run: run if run.status == SCHEDULED and run.not_before else None)(
        store.get_run(run_id)), f"run {run_id} to be released")


# -- retries ---------------------------------------------------------------------------------


def test_retries_wait_their_backoff_between_attempts(db_url, store, supervisors, tmp_path):
    """Attempts 1 to 3 fail, the 4th succeeds: three attempts are recorded,
    each with its error and next-attempt time, and each next attempt
    started no earlier than that time, 0.4 s, 0.8 s, 1.6 s after the start
    of the one before (read from the recorded times)."""
    sup = supervisors(db_url, procs=1, app=APP).start()
    run = schedule(lifecycle.flaky_flow, spec(tmp_path, succeed_on=4), database=store)
    done = wait_run(store, run.id, (COMPLETED,), supervisor=sup)
    assert done.result["attempts"] == 4

    step = steps_by_id(store, run.id)["2"]
    assert (step.status, step.attempt, step.result) == (STEP_DONE, 4, 4)
    history = step.attempts
    assert [attempt.attempt for attempt in history] == [1, 2, 3]
    assert [attempt.error["message"] for attempt in history] == [f"attempt {k} fails" for k in (1, 2, 3)]
    starts = [attempt.started_at for attempt in history] + [step.started_at]
    for k, attempt in enumerate(history, start=1):
        wait = lifecycle.FLAKY_BACKOFF * 2 ** (k - 1)
        assert attempt.retry_at - attempt.started_at >= dt.timedelta(seconds=wait)
        assert starts[k] >= attempt.retry_at, (k, starts[k], attempt.retry_at)
        assert starts[k] - starts[k - 1] >= dt.timedelta(seconds=wait)
    assert effects(tmp_path, run.id).count("flaky") == 4
    assert effects(tmp_path, run.id).count("first") == 1  # replays never redo recorded steps
    assert "step_retry" not in sup.log() or "attempt 1 failed" in sup.log()


def test_the_final_failure_reaches_the_body_after_the_retries(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=1, app=APP).start()
    run = schedule(lifecycle.doomed_flow, spec(tmp_path), database=store)
    done = wait_run(store, run.id, (COMPLETED,), supervisor=sup)
    assert done.result == {"caught": "never works"}
    step = steps_by_id(store, run.id)["1"]
    assert (step.status, step.attempt, error_type(step.error)) == (STEP_FAILED, 3, "builtins.ValueError")
    assert [attempt.attempt for attempt in step.attempts] == [1, 2]
    assert effects(tmp_path, run.id) == ["doomed", "doomed", "doomed", "cleanup"]


def test_retries_survive_a_supervisor_sigkill_between_attempts(db_url, store, supervisors, tmp_path):
    """The first supervisor dies (SIGKILL, parent and children) while the
    run waits for its second attempt; a new one, under another name, takes
    it up when it is due and the attempts go on from where they were."""
    first = supervisors(db_url, procs=1, app=APP).start()
    run = schedule(lifecycle.flaky_flow, spec(tmp_path, succeed_on=3), database=store)
    released = waiting_run(store, run.id)
    assert steps_by_id(store, run.id)["2"].attempts[0].attempt == 1
    first.send_signal(signal.SIGKILL)
    first.wait()
    first.cleanup()
    assert store.get_run(run.id).status == SCHEDULED  # released: nothing held it when the parent died

    second = supervisors(db_url, procs=1, app=APP).start(wait_idle=False)
    done = wait_run(store, run.id, (COMPLETED,), supervisor=second)
    assert done.result["attempts"] == 3
    step = steps_by_id(store, run.id)["2"]
    assert [attempt.attempt for attempt in step.attempts] == [1, 2]
    assert step.started_at >= step.attempts[-1].retry_at
    assert step.attempts[0].retry_at == released.not_before
    pids = {pid for pid, event in effect_lines(tmp_path, run.id) if event == "flaky"}
    assert len(pids) >= 2  # attempts ran in both supervisors' children


def test_a_timeout_is_retried_by_the_supervisor(db_url, store, supervisors, tmp_path):
    """``@step(timeout=1, retries=1)``: the parent kills the hung first
    attempt, records it (StepTimeout) for a retry, and the second attempt
    runs in a fresh child after its backoff."""
    sup = supervisors(db_url, procs=1, app=APP).start()
    run = schedule(lifecycle.timeout_retry_flow, spec(tmp_path), database=store)
    done = wait_run(store, run.id, (COMPLETED,), supervisor=sup)
    assert done.result == 2
    step = steps_by_id(store, run.id)["1"]
    assert (step.status, step.attempt) == (STEP_DONE, 2)
    [first] = step.attempts
    assert error_type(first.error) == "everystep.errors.StepTimeout"
    assert step.started_at >= first.retry_at
    pids = [pid for pid, event in effect_lines(tmp_path, run.id) if event == "hangs_once"]
    assert len(pids) == 2 and pids[0] != pids[1]


# -- sleeping and delayed runs -------------------------------------------------------------------


def test_a_sleeping_run_holds_no_child_and_resumes_after(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=1, app=APP).start()
    run = schedule(lifecycle.sleepy_flow, spec(tmp_path, seconds=3), database=store)
    released = waiting_run(store, run.id)
    sleep = steps_by_id(store, run.id)["2"]
    assert (sleep.name, sleep.status, sleep.wake_at) == ("everystep.sleep", STEP_SLEEPING, released.not_before)
    if store.get_run(run.id).status == SCHEDULED:
        status = sup.status()
        assert [child["state"] for child in status["children"]] == ["idle"]
        assert all(child["run_id"] is None for child in status["children"])

    done = wait_run(store, run.id, (COMPLETED,), supervisor=sup)
    steps = steps_by_id(store, run.id)
    assert steps["2"].status == STEP_DONE
    assert steps["3"].started_at >= released.not_before
    assert done.claimed_at >= released.not_before
    assert effects(tmp_path, run.id) == ["first", "last"]


def test_a_run_scheduled_in_2s_is_not_claimed_early(db_url, store, supervisors, tmp_path, subprocess_env):
    """On PostgreSQL the supervisor polls only every 60 s: the run starts
    on time from the timer set on the earliest due run (reset by the
    schedule's notification), not from polling."""
    poll = 60.0 if store.backend == "postgres" else 0.1
    sup = supervisors(db_url, procs=1, app=APP, poll=poll).start()
    result = everystep(subprocess_env, db_url, "schedule", "--app", APP, lifecycle.sleepy_flow.name,
                       f'{{"dir": "{tmp_path}", "seconds": 0}}', "--in", "2s")
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.strip()
    scheduled = store.get_run(run_id)
    # "--in 2s" is read before the insert: its not-before time is 2 s after a
    # moment just before created_at.
    assert scheduled.not_before - scheduled.created_at >= dt.timedelta(seconds=1.9)
    done = wait_run(store, run_id, (COMPLETED,), supervisor=sup)
    assert done.claimed_at >= scheduled.not_before
    if store.backend == "postgres":
        # Well before the next poll could have found it (a generous bound on a slow machine).
        assert done.claimed_at - scheduled.not_before < dt.timedelta(seconds=30)


# -- periodic runs -------------------------------------------------------------------------------


def test_two_supervisors_yield_one_run_per_tick(db_url, store, supervisors):
    """Both supervisors load the cron workflow (a tick every 2 s) and both
    enqueue every tick: three ticks later there is exactly one run per tick."""
    app = "tests.apps.periodic"
    # By name: importing the module here would register its cron workflow in
    # this process, where every threaded worker a later test starts would
    # enqueue its ticks.
    name = f"{app}.every_two_seconds"
    first = supervisors(db_url, procs=1, app=app).start(wait_idle=False)
    second = supervisors(db_url, procs=1, app=app).start(wait_idle=False)

    def three_done() -> Any:
        runs = store.list_runs(name=name, limit=100)
        return runs if len([run for run in runs if run.status == COMPLETED]) >= 3 else None

    wait_until(three_done, "three ticks to have run", timeout=90)
    for sup in (first, second):
        assert sup.stop() == 0
    runs = store.list_runs(name=name, limit=100)
    ticks = [run.args[0] for run in runs]
    assert len(ticks) == len(set(ticks)) >= 3, ticks
    assert all(run.idempotency_key == "cron:" + tick.strftime("%Y-%m-%dT%H:%M:%SZ") for run, tick in zip(runs, ticks))
    ordered = sorted(ticks)
    assert all(later - earlier == dt.timedelta(seconds=2) for earlier, later in zip(ordered, ordered[1:]))
    assert {run.result for run in runs if run.status == COMPLETED} <= {tick.isoformat() for tick in ticks}
    enqueued = first.log().count("for its tick at") + second.log().count("for its tick at")
    assert enqueued == len(runs)  # each run was enqueued by exactly one of them


# -- cancel --------------------------------------------------------------------------------------


@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
def test_cancel_kills_a_run_spinning_in_pure_python(db_url, store, supervisors, tmp_path, subprocess_env, unsafe):
    """The child is stuck in a CPU loop that never yields: the cancel turns
    the run cancelled, the supervisor kills the child and records the step
    cut off (an unsafe one keeps its started row: effect uncertain)."""
    sup = supervisors(db_url, procs=1, app=APP).start()
    run = schedule(lifecycle.spin_flow, spec(tmp_path, unsafe=unsafe), database=store)
    pid = sup.busy_child(run.id, step_id="2")["pid"]
    wait_until(lambda: (tmp_path / f"spinning-{run.id}").exists(), "the step to spin")

    result = everystep(subprocess_env, db_url, "cancel", run.id, "--reason", "no longer needed")
    assert result.returncode == 0, result.stderr
    assert "cancelled" in result.stdout
    wait_for_pids_gone([pid])
    cancelled = store.get_run(run.id)
    assert cancelled.status == CANCELLED
    assert cancelled.error["type"] == "everystep.errors.Cancelled"
    assert cancelled.error["message"] == "no longer needed"
    if unsafe:
        # The started row was written before the effect began.
        step = steps_by_id(store, run.id)["2"]
        assert step.status == STEP_STARTED
        shown = everystep(subprocess_env, db_url, "show", run.id)
        assert "started (effect uncertain)" in shown.stdout
    else:
        # A safe step has no row until the supervisor, having killed the
        # child, records it: the run's cancelled status may be read first.
        step = wait_until(lambda: (lambda s: s if s is not None and s.status == STEP_FAILED else None)(
            steps_by_id(store, run.id).get("2")), "the cut-off step to be recorded")
        assert error_type(step.error) == "everystep.errors.Cancelled"
        # Within 1 s of the cancel (read from the recorded times; a generous
        # bound for a loaded machine), and never before it.
        assert cancelled.completed_at <= step.completed_at
        assert step.completed_at - cancelled.completed_at < dt.timedelta(seconds=3), \
            (cancelled.completed_at, step.completed_at)
    assert "spin:end" not in effects(tmp_path, run.id) and "unreachable" not in effects(tmp_path, run.id)
    sup.wait_idle()
    assert "was cancelled; killing child" in sup.log()


def test_cancel_of_a_sleeping_run(db_url, store, supervisors, tmp_path, subprocess_env):
    sup = supervisors(db_url, procs=1, app=APP).start()
    run = schedule(lifecycle.sleepy_flow, spec(tmp_path, seconds=600), database=store)
    waiting_run(store, run.id)
    result = everystep(subprocess_env, db_url, "cancel", run.id)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"run {run.id} cancelled (it was scheduled)"
    cancelled = store.get_run(run.id)
    assert cancelled.status == CANCELLED and cancelled.error["message"] == "cancelled by an operator"
    assert sup.status()["children"][0]["state"] == "idle"
    assert effects(tmp_path, run.id) == ["first"]


def test_every_cancel_refusal_exits_2_with_one_line(db_url, store, supervisors, tmp_path, subprocess_env):
    sup = supervisors(db_url, procs=1, app=APP).start()
    done = wait_run(store, schedule(lifecycle.sleepy_flow, spec(tmp_path, seconds=0), database=store).id,
                    (COMPLETED,), supervisor=sup)
    assert "only scheduled, running or blocked runs can be cancelled" in refused(
        everystep(subprocess_env, db_url, "cancel", done.id))
    sleeping = schedule(lifecycle.sleepy_flow, spec(tmp_path, seconds=600), database=store)
    assert everystep(subprocess_env, db_url, "cancel", sleeping.id).returncode == 0
    assert f"run {sleeping.id} is cancelled" in refused(everystep(subprocess_env, db_url, "cancel", sleeping.id))
    assert "no run with id" in refused(everystep(subprocess_env, db_url, "cancel", "01a2bbbb-0000-7000-8000-000000000000"))
    assert "run ids are hexadecimal digits and dashes" in refused(everystep(subprocess_env, db_url, "cancel", "not-a-run"))
    other = schedule(lifecycle.sleepy_flow, spec(tmp_path, seconds=600), database=store)
    assert "must not be empty" in refused(everystep(subprocess_env, db_url, "cancel", other.id, "--reason", " "))
    assert store.get_run(other.id).status != CANCELLED
    assert refused(everystep(subprocess_env, db_url, "cancel"))  # no RUN: a usage error
