"""The parent never waits on one child: a child that stops reading its
channel cannot delay another child's step deadline, and is itself killed as
unresponsive once its run has waited ``--stall-timeout``; the run it never
received goes to another child."""

from __future__ import annotations

import signal
from pathlib import Path

import psutil
import pytest

from everystep import schedule
from everystep.models import COMPLETED
from tests.apps import supervised
from tests.support.supervisor import supervisors, wait_run  # noqa: F401
from tests.support.waiting import wait_until

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(180), pytest.mark.backends("sqlite", "postgres")]

STEP_TIMEOUT = 6.0
STALL_TIMEOUT = 12.0


def test_a_child_that_stops_reading_never_delays_another_childs_deadline(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2, args=["--step-timeout", str(STEP_TIMEOUT),
                                             "--stall-timeout", str(STALL_TIMEOUT)]).start()
    slow = schedule(supervised.timeout_flow, {"dir": str(tmp_path), "which": "sluggish"}, database=store)
    timed = sup.busy_child(slow.id, "2")
    [other] = [child["pid"] for child in sup.status()["children"] if child["pid"] != timed["pid"]]

    # The idle child freezes; the next run, far larger than a socket buffer,
    # is handed to it and cannot be written in one go.
    psutil.Process(other).send_signal(signal.SIGSTOP)
    try:
        big = schedule(supervised.tiny, {"dir": str(tmp_path), "pad": "x" * (8 << 20)}, database=store)
        sup.wait_status(lambda s: any(c["pid"] == other and c["run_id"] == big.id for c in s["children"]),
                        "the big run handed to the frozen child")

        caught = wait_run(store, slow.id, (COMPLETED,), supervisor=sup)
        assert caught.result == {"caught": "StepTimeout"}
        # The deadline was enforced while the frozen child still held its
        # undelivered run (it is killed only at the stall timeout).
        assert psutil.Process(other).status() == psutil.STATUS_STOPPED
        log = sup.log()
        assert "exceeded its timeout" in log and "has not read its channel" not in log
        step = {record.step_id: record for record in store.get_steps(slow.id)}["2"]
        # Not a speed bound: a deadline held up by the frozen child would
        # have waited for the stall timeout's kill.
        late = (step.completed_at - step.started_at).total_seconds() - STEP_TIMEOUT
        assert late < STALL_TIMEOUT, f"the timeout fired {late:.1f}s after its deadline"
    finally:
        try:
            psutil.Process(other).send_signal(signal.SIGCONT)
        except psutil.Error:
            pass

    # The frozen child is killed as unresponsive (or, thawed, reads at last);
    # either way the big run completes exactly once.
    done = wait_run(store, big.id, (COMPLETED,), supervisor=sup)
    assert done.status == COMPLETED
    assert supervised.effects(tmp_path, big.id) == ["whoami"]


def test_an_unresponsive_child_is_killed_and_its_run_goes_to_another(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2, args=["--stall-timeout", "2"]).start()
    first, second = (child["pid"] for child in sup.status()["children"])
    psutil.Process(first).send_signal(signal.SIGSTOP)
    psutil.Process(second).send_signal(signal.SIGSTOP)
    runs = [schedule(supervised.tiny, {"dir": str(tmp_path), "pad": "x" * (4 << 20)}, database=store)
            for _ in range(2)]
    wait_until(lambda: "has not read its channel" in sup.log(), "the stall to be noticed", timeout=60)
    for pid in (first, second):
        try:
            psutil.Process(pid).send_signal(signal.SIGCONT)
        except psutil.Error:
            pass
    for run in runs:
        assert wait_run(store, run.id, (COMPLETED,), supervisor=sup).status == COMPLETED
        assert supervised.effects(tmp_path, run.id) == ["whoami"]
    assert "it stopped reading its channel" in sup.log()
    assert set(sup.status()["restarts"]) <= {"exit"}
    assert Path(sup.socket_path).exists()
