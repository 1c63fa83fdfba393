"""Async runs under a real supervisor: the child is still the unit that is
killed. A SIGKILL mid-``await`` loses only the step in flight; a cancel of
a step stuck in ``await asyncio.sleep(3600)`` kills the child and records
the step cancelled; an async step's timeout is the parent's kill, recorded
``StepTimeout``. Outcomes are asserted, never durations."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from everystep import schedule
from everystep.models import CANCELLED, COMPLETED, FAILED, STEP_DONE, STEP_FAILED
from everystep.store import Store
from tests.apps import async_steps
from tests.support.supervisor import error_type, supervisors, wait_for_pids_gone, wait_run  # noqa: F401
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]

APP = "tests.apps.async_steps"


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _steps(store: Store, run_id: str) -> dict[str, object]:
    return {record.step_id: record for record in store.get_steps(run_id)}


def test_a_sigkill_mid_await_loses_only_the_step_in_flight(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=1, app=APP).start()
    before, marker, release = tmp_path / "before", tmp_path / "marker", tmp_path / "release"
    run = schedule(async_steps.awaits_a_file, str(before), str(marker), str(release), database=store)
    pid = sup.busy_child(run.id, step_id="2")["pid"]
    wait_until(lambda: _lines(marker), "the async step to be awaiting")
    os.kill(pid, signal.SIGKILL)
    wait_for_pids_gone([pid])
    # The run goes back to the queue and a fresh child replays it to step 2.
    wait_until(lambda: len(_lines(marker)) >= 2, "step 2 to run again in a new child", timeout=120)
    release.write_text("go")
    done = wait_run(store, run.id, (COMPLETED,), supervisor=sup, timeout=120)
    assert done.result == "done"
    assert len(_lines(before)) == 1  # step 1 was recorded before the kill: replayed, not run again
    assert str(pid) == _lines(marker)[0] and _lines(marker)[1] != str(pid)
    assert [(record.step_id, record.status) for record in store.get_steps(run.id)] == [
        ("1", STEP_DONE), ("2", STEP_DONE)]


def test_cancel_kills_a_child_stuck_in_an_async_sleep(db_url, store, supervisors, tmp_path, subprocess_env):
    sup = supervisors(db_url, procs=1, app=APP).start()
    before, marker = tmp_path / "before", tmp_path / "marker"
    run = schedule(async_steps.awaits_forever, str(before), str(marker), database=store)
    pid = sup.busy_child(run.id, step_id="2")["pid"]
    wait_until(marker.exists, "the async step to be awaiting")
    result = subprocess.run([sys.executable, "-m", "everystep.cli", "cancel", run.id, "--database", db_url],
                            env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    wait_for_pids_gone([pid])
    assert store.get_run(run.id).status == CANCELLED
    step = wait_until(lambda: (lambda s: s if s is not None and s.status == STEP_FAILED else None)(
        _steps(store, run.id).get("2")), "the cut-off step to be recorded")
    assert error_type(step.error) == "everystep.errors.Cancelled"  # type: ignore[attr-defined]
    sup.wait_idle()
    assert "was cancelled; killing child" in sup.log()


def test_an_async_step_past_its_timeout_is_killed_and_recorded(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=1, app=APP).start()
    marker = tmp_path / "marker"
    run = schedule(async_steps.times_out, str(marker), database=store)
    done = wait_run(store, run.id, (FAILED,), supervisor=sup, timeout=120)
    assert error_type(done.error) == "everystep.errors.StepTimeout"
    step = _steps(store, run.id)["1"]
    assert (step.status, error_type(step.error)) == (STEP_FAILED, "everystep.errors.StepTimeout")  # type: ignore
    killed = int(marker.read_text())
    wait_for_pids_gone([killed])
