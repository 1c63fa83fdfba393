"""``everystep-supervisor`` executing runs: real processes on both backends.

Each test starts the real console script (``tests/support/supervisor.py``),
schedules runs of ``tests/apps/supervised.py`` from the test process and
watches the database, the steps' traces (pids, effects) and the control
socket. Waits poll with generous deadlines; no fixed sleep is an assertion.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from everystep import schedule
from everystep.models import BLOCKED, COMPLETED, FAILED, STEP_DONE, STEP_FAILED, STEP_STARTED
from everystep.store import Store, connect
from tests.apps import supervised
from tests.apps.supervised import effect_lines, effects, open_gate
from tests.support.waiting import wait_until
from tests.support.supervisor import error_type, supervisors, wait_for_pids_gone, wait_run  # noqa: F401

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(180), pytest.mark.backends("sqlite", "postgres")]

STEP_TIMEOUT = "everystep.errors.StepTimeout"


def spec(directory: Path, **extra: Any) -> dict[str, Any]:
    return {"dir": str(directory), **extra}


def steps_by_id(store: Store, run_id: str) -> dict[str, Any]:
    return {record.step_id: record for record in store.get_steps(run_id)}


# -- parallelism ------------------------------------------------------------------


def test_two_cpu_bound_runs_execute_at_the_same_time_in_two_processes(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    child_pids = {child["pid"] for child in sup.status()["children"]}
    work = spec(tmp_path, peers=2, seconds=1.0, give_up=30.0)
    runs = [schedule(supervised.cpu_bound, work, database=store) for _ in range(2)]

    done = [wait_run(store, run.id, (COMPLETED, FAILED), timeout=90, supervisor=sup) for run in runs]

    assert [run.status for run in done] == [COMPLETED, COMPLETED], [run.error for run in done]
    first, second = (run.result for run in done)
    assert first["pid"] != second["pid"]
    assert {first["pid"], second["pid"]} <= child_pids, "runs execute in the children, never the parent"
    assert sup.pid not in (first["pid"], second["pid"])
    # Each saw the other start, and their busy intervals overlap.
    assert first["peers"] == second["peers"] == 2
    assert max(first["start"], second["start"]) < min(first["end"], second["end"])


# -- hung steps ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("which", "flags", "reraise", "outcome"),
    [
        ("slow", [], False, COMPLETED),                          # @step(timeout=1), body swallows it
        ("sluggish", ["--step-timeout", "1"], True, FAILED),    # --step-timeout, body re-raises
    ],
    ids=["step-timeout-decorator", "step-timeout-flag"],
)
def test_step_past_its_timeout_is_killed_recorded_and_the_body_cleans_up(
    db_url, store, supervisors, tmp_path, which, flags, reraise, outcome
):
    sup = supervisors(db_url, procs=1, args=flags).start()
    run = schedule(supervised.timeout_flow, spec(tmp_path, which=which, reraise=reraise), database=store)
    hung = sup.busy_child(run.id, "2")

    finished = wait_run(store, run.id, (COMPLETED, FAILED, BLOCKED), timeout=60, supervisor=sup)

    assert finished.status == outcome, finished.error
    steps = steps_by_id(store, run.id)
    assert steps["2"].status == STEP_FAILED
    assert error_type(steps["2"].error) == STEP_TIMEOUT
    assert "timeout" in steps["2"].error["message"]
    assert steps["3"].status == STEP_DONE and steps["3"].result["reason"] == "StepTimeout"
    if outcome == COMPLETED:
        assert finished.result == {"caught": "StepTimeout"}
    else:
        assert error_type(finished.error) == STEP_TIMEOUT
    # The hung step ran once and never finished; its process is gone and the
    # cleanup step ran in a fresh child.
    trace = effect_lines(tmp_path, run.id)
    assert [event for _, event in trace] == ["before", f"{which}:start", "cleanup:StepTimeout"]
    assert trace[1][0] == hung["pid"]
    assert trace[2][0] != hung["pid"]
    wait_for_pids_gone([hung["pid"]])
    status = sup.wait_idle()
    assert status["restarts"].get("timeout") == 1


@pytest.mark.parametrize(
    ("which", "flags"),
    [("unsafe_slow", []), ("unsafe_sluggish", ["--step-timeout", "1"])],
    ids=["step-timeout-decorator", "step-timeout-flag"],
)
def test_unsafe_step_past_its_timeout_leaves_its_started_row_and_the_run_blocked(
    db_url, store, supervisors, tmp_path, which, flags
):
    sup = supervisors(db_url, procs=1, args=flags).start()
    run = schedule(supervised.timeout_flow, spec(tmp_path, which=which), database=store)
    hung = sup.busy_child(run.id, "2")

    finished = wait_run(store, run.id, (COMPLETED, FAILED, BLOCKED), timeout=60, supervisor=sup)

    assert finished.status == BLOCKED, finished.error
    assert error_type(finished.error) == "everystep.errors.EffectUncertain"
    steps = steps_by_id(store, run.id)
    assert set(steps) == {"1", "2"}, "the body's cleanup step cannot run once the run is blocked"
    assert steps["2"].status == STEP_STARTED
    assert steps["2"].error is None and steps["2"].result is None
    assert effects(tmp_path, run.id) == ["before", f"{which}:start"], "the unsafe effect never repeats"
    wait_for_pids_gone([hung["pid"]])
    assert sup.wait_idle()["restarts"].get("timeout") == 1


# -- child deaths ----------------------------------------------------------------------


def test_kill_9_of_a_busy_child_redispatches_its_run_to_a_new_child(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    run = schedule(supervised.gated_flow, spec(tmp_path, gate="go"), database=store)
    victim = sup.at_gate(run.id, tmp_path)

    os.kill(victim["pid"], signal.SIGKILL)
    again = wait_until(
        lambda: (lambda child: child if child["pid"] != victim["pid"] else None)(sup.busy_child(run.id, "2")),
        "the run to be busy in another child",
    )
    open_gate(tmp_path, "go")
    finished = wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup)

    assert finished.status == COMPLETED, finished.error
    assert finished.result["gated"] == again["pid"] != victim["pid"]
    assert effects(tmp_path, run.id) == ["first", "gated:start", "gated:start", "gated:end", "last"]
    status = sup.wait_idle()
    pids = {child["pid"] for child in status["children"]}
    assert victim["pid"] not in pids and len(pids) == 2, "the dead child was replaced"
    assert status["restarts"].get("crash") == 1
    wait_for_pids_gone([victim["pid"]])


def test_a_run_that_keeps_killing_its_child_fails_after_max_crashes(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=1, args=["--max-crashes", "2"]).start()
    run = schedule(supervised.crash_flow, spec(tmp_path), database=store)

    finished = wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup)

    assert finished.status == FAILED
    assert error_type(finished.error) == "everystep.errors.ChildCrashed"
    assert "killed by SIGKILL" in finished.error["message"]
    assert "2 times" in finished.error["message"]
    assert effects(tmp_path, run.id) == ["first", "suicide", "suicide"]
    # No crash loop, and the supervisor carries on with other work.
    after = schedule(supervised.tiny, spec(tmp_path), database=store)
    assert wait_run(store, after.id, (COMPLETED, FAILED), supervisor=sup).status == COMPLETED
    assert sup.alive()


# -- recycling ------------------------------------------------------------------------


def test_max_runs_per_child_recycles_children_between_runs(db_url, store, supervisors, tmp_path):
    # --max-crashes 1: a run handed to a child that is on its way out would
    # count as a crash and fail at once.
    sup = supervisors(db_url, procs=2, args=["--max-runs-per-child", "1", "--max-crashes", "1"]).start()
    runs = [schedule(supervised.tiny, spec(tmp_path), database=store) for _ in range(20)]

    finished = [wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup) for run in runs]

    assert [run.status for run in finished] == [COMPLETED] * 20, [run.error for run in finished]
    assert len({run.result for run in finished}) == 20, "one run per child, then a new child"
    status = sup.wait_idle()
    assert not {child["pid"] for child in status["children"]} & {run.result for run in finished}
    assert set(status["restarts"]) == {"recycle"} and status["restarts"]["recycle"] >= 20, status["restarts"]
    wait_for_pids_gone([run.result for run in finished])


def test_max_memory_per_child_recycles_a_child_above_the_limit(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=1, args=["--max-memory-per-child", "200"]).start()

    def run_one(workflow: Any, **extra: Any) -> Any:
        run = schedule(workflow, spec(tmp_path, **extra), database=store)
        finished = wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup)
        assert finished.status == COMPLETED, finished.error
        return finished.result

    small = [run_one(supervised.tiny) for _ in range(2)]
    assert small[0] == small[1], "a child under the limit keeps serving runs"
    hog_pid = run_one(supervised.hog_flow, mb=300)
    assert hog_pid == small[0]
    after = run_one(supervised.tiny)
    assert after != hog_pid, "the child above the limit was replaced after its run"
    wait_for_pids_gone([hog_pid])
    status = sup.wait_idle()
    assert status["restarts"].get("recycle") == 1
    owned = re.search(rf"child 1 \(pid {hog_pid}\) exited with code 0 \(replaced: it owned (\d+) MB, USS, over "
                      r"--max-memory-per-child 200\)", sup.log())
    assert owned and 300 <= int(owned.group(1)) < 400, sup.log()


# -- burst -----------------------------------------------------------------------------


def test_burst_exits_0_once_everything_scheduled_is_done(db_url, store, supervisors, tmp_path):
    runs = [schedule(supervised.tiny, spec(tmp_path), database=store) for _ in range(5)]
    runs.append(schedule(supervised.gated_flow, spec(tmp_path, gate="open"), database=store))
    open_gate(tmp_path, "open")
    sup = supervisors(db_url, procs=2, args=["--burst"]).spawn()
    code = sup.wait(timeout=90)
    output = sup.log()

    assert code == 0, output
    assert all(store.get_run(run.id).status == COMPLETED for run in runs), output
    assert "progress:" in output
    assert "done: 6 runs" in output and "6 completed" in output, output
    assert not os.path.exists(sup.socket_path), "the control socket is removed at exit"


# -- process titles -----------------------------------------------------------------------


def _title(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def test_process_titles_show_the_master_and_what_each_child_runs(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    run = schedule(supervised.gated_flow, spec(tmp_path, gate="go"), database=store)
    busy = sup.busy_child(run.id, "2")
    idle = next(child for child in sup.status()["children"] if child["pid"] != busy["pid"])

    wait_until(lambda: f"everystep-supervisor: master {sup.name}" in _title(sup.pid), "the master's title")
    expected = f"everystep-supervisor: child {busy['slot']} tests.apps.supervised.gated_flow {run.id} step 2"
    wait_until(lambda: expected in _title(busy["pid"]), f"title {expected!r}, got {_title(busy['pid'])!r}")
    wait_until(lambda: f"everystep-supervisor: child {idle['slot']} idle" in _title(idle["pid"]),
               "the idle child's title")
    open_gate(tmp_path, "go")
    assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup).status == COMPLETED
    wait_until(lambda: f"everystep-supervisor: child {busy['slot']} idle" in _title(busy["pid"]),
               "the child's title back to idle")


# -- PostgreSQL LISTEN/NOTIFY ----------------------------------------------------------------

# The supervisor polls every LONG_POLL seconds, so a run finished within
# NOTIFIED_WITHIN was picked up by its notification: a margin of ten times,
# not a speed bound, so a loaded machine cannot fail it.
LONG_POLL = 600.0
NOTIFIED_WITHIN = 60.0


def test_listen_notify_picks_up_new_runs_promptly_despite_a_long_poll(pg_url, supervisors, tmp_path):
    store = connect(pg_url)
    sup = supervisors(pg_url, procs=1, poll=LONG_POLL).start()
    for _ in range(3):
        started = time.monotonic()
        run = schedule(supervised.tiny, spec(tmp_path), database=store)
        finished = wait_run(store, run.id, (COMPLETED, FAILED), timeout=NOTIFIED_WITHIN, supervisor=sup)
        assert finished.status == COMPLETED
        assert time.monotonic() - started < NOTIFIED_WITHIN


@pytest.mark.timeout(300)
def test_listen_still_works_after_100_child_respawns(pg_url, supervisors, tmp_path):
    store = connect(pg_url)
    sup = supervisors(pg_url, procs=2, poll=LONG_POLL, args=["--max-runs-per-child", "1"]).start()
    runs = [schedule(supervised.tiny, spec(tmp_path), database=store) for _ in range(100)]
    finished = [wait_run(store, run.id, (COMPLETED, FAILED), timeout=120, supervisor=sup) for run in runs]
    assert [run.status for run in finished] == [COMPLETED] * 100
    assert len({run.result for run in finished}) == 100
    status = sup.wait_idle()
    assert set(status["restarts"]) == {"recycle"} and status["restarts"]["recycle"] >= 100, status["restarts"]

    started = time.monotonic()
    last = schedule(supervised.tiny, spec(tmp_path), database=store)
    assert wait_run(store, last.id, (COMPLETED, FAILED), timeout=NOTIFIED_WITHIN, supervisor=sup).status == COMPLETED
    assert time.monotonic() - started < NOTIFIED_WITHIN
    assert "terminating connection" not in sup.log()


def test_listen_reconnects_after_its_connection_is_terminated(pg_url, supervisors, tmp_path):
    store = connect(pg_url)
    sup = supervisors(pg_url, procs=1, poll=LONG_POLL).start()
    query = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
             "AND query LIKE 'LISTEN %%' AND pid <> pg_backend_pid()")
    with psycopg.connect(pg_url, autocommit=True) as admin:
        def listeners() -> set[int]:
            return {row[0] for row in admin.execute(query).fetchall()}

        first = wait_until(listeners, "the supervisor's LISTEN connection")
        assert len(first) == 1
        admin.execute("SELECT pg_terminate_backend(%s)", (next(iter(first)),))
        wait_until(lambda: listeners() and not listeners() & first, "a new LISTEN connection", timeout=30)

    started = time.monotonic()
    run = schedule(supervised.tiny, spec(tmp_path), database=store)
    assert wait_run(store, run.id, (COMPLETED, FAILED), timeout=NOTIFIED_WITHIN, supervisor=sup).status == COMPLETED
    assert time.monotonic() - started < NOTIFIED_WITHIN
    assert sup.alive()
