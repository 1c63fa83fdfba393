"""One executor per run, with real supervisors, workers, signals and the CLI.

Every step of ``fenced_flow`` appends its effect to a file, so a test counts
how often each effect ran and in which process; the database says what was
recorded and by whom. The scenarios are the operator mistakes fencing exists
for: requeueing a live run, forcing it, two runners under one name, taking
over a frozen runner's name, and the plain restart that must stay unattended.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

from everystep import schedule
from everystep.models import BLOCKED, COMPLETED, STEP_DONE, STEP_STARTED
from everystep.store import Store
from tests.apps import supervised
from tests.apps.supervised import effect_lines, effects, open_gate
from tests.support.supervisor import supervisors, wait_for_pids_gone, wait_run  # noqa: F401
from tests.support.waiting import wait_until

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]


def spec(directory: Path, **extra: Any) -> dict[str, Any]:
    return {"dir": str(directory), "gate": "gate", **extra}


def everystep(env: dict[str, str], db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "everystep.cli", *args, "--database", db_url],
                          env=env, capture_output=True, text=True, timeout=120)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def counts(directory: Path, run_id: str) -> Counter[str]:
    return Counter(effects(directory, run_id))


def step_record(store: Store, run_id: str, step_id: str) -> Any:
    return {record.step_id: record for record in store.get_steps(run_id)}[step_id]


def freeze(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            psutil.Process(pid).send_signal(sig)
        except psutil.Error:
            pass


# -- the scenario of the report --------------------------------------------------------


def test_requeue_of_a_live_run_is_refused_and_scaling_up_executes_it_once(
        db_url, store, supervisors, tmp_path, subprocess_env):
    sup = supervisors(db_url, procs=1).start()
    run = schedule(supervised.fenced_flow, spec(tmp_path), database=store)
    sup.busy_child(run.id, step_id="2")

    line = one_error_line(everystep(subprocess_env, db_url, "requeue", run.id))
    for part in (sup.name, f"pid {sup.pid}", "ctl kill", "--requeue", "--force"):
        assert part in line, line
    assert store.get_run(run.id).status == "running"

    assert sup.ctl({"cmd": "scale", "procs": 2})["ok"]
    status = sup.wait_status(lambda s: len(s["children"]) == 2 and {c["state"] for c in s["children"]} <= {"idle", "busy"},
                             "two children")
    assert [child["run_id"] for child in status["children"]].count(run.id) == 1

    open_gate(tmp_path, "gate")
    done = wait_run(store, run.id, (COMPLETED,), supervisor=sup)
    assert counts(tmp_path, run.id) == Counter({"first": 1, "gated:start": 1, "gated:end": 1, "last": 1})
    assert done.claim_epoch == 1
    assert sup.status()["runs"].get(COMPLETED) == 1


# -- requeue --force while a child is mid-step ----------------------------------------------


@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
def test_forced_requeue_fences_the_child_mid_step(db_url, store, supervisors, tmp_path, subprocess_env, unsafe):
    """One child and a lease long enough that no heartbeat check happens
    during the test. The supervisor learns at once (NOTIFY on PostgreSQL,
    its fence check at every poll on SQLite, which gets no notifications)
    and kills the stale child mid-step. The run completes exactly once and
    an unsafe effect never runs twice."""
    sup = supervisors(db_url, procs=1, args=["--lease", "600"]).start()
    run = schedule(supervised.fenced_flow, spec(tmp_path, unsafe=unsafe), database=store)
    stale_pid = sup.busy_child(run.id, step_id="2")["pid"]

    forced = everystep(subprocess_env, db_url, "requeue", run.id, "--force")
    assert forced.returncode == 0, forced.stderr

    wait_for_pids_gone([stale_pid])  # killed, its step cut short
    assert "was taken from this execution" in sup.log()
    open_gate(tmp_path, "gate")

    held = "unsafe" if unsafe else "gated"
    if unsafe:
        # The replay finds the started row: never a second effect, the run waits for a human.
        wait_run(store, run.id, (BLOCKED,), supervisor=sup)
        assert step_record(store, run.id, "2").status == STEP_STARTED
        resolved = everystep(subprocess_env, db_url, "resolve-step", run.id, "2", "--result", '{"pid": 0}')
        assert resolved.returncode == 0, resolved.stderr
    done = wait_run(store, run.id, (COMPLETED,), supervisor=sup)

    seen = counts(tmp_path, run.id)
    assert seen["first"] == 1 and seen["last"] == 1
    assert seen[f"{held}:start"] == (1 if unsafe else 2)
    assert seen[f"{held}:end"] == (0 if unsafe else 1)
    assert done.status == COMPLETED and sup.status()["runs"].get(COMPLETED) == 1


# -- owned names -------------------------------------------------------------------------------


def test_two_supervisors_racing_for_one_name_start_exactly_one(db_url, supervisors):
    first = supervisors(db_url, name="contested", procs=1).spawn()
    second = supervisors(db_url, name="contested", procs=1).spawn()

    def one_exited() -> Any:
        return [sup for sup in (first, second) if not sup.alive()]

    [loser] = wait_until(one_exited, "one of the two to give up", timeout=60)
    winner = second if loser is first else first
    assert loser.wait() == 2
    lines = [line for line in loser.log().splitlines() if line.strip()]
    assert len(lines) == 1, loser.log()
    assert "runner name 'contested' is held by a live supervisor" in lines[0]
    assert f"pid {winner.pid}" in lines[0] and "--takeover" in lines[0]
    winner.wait_idle()
    assert winner.alive()


def test_a_worker_refuses_a_name_a_live_supervisor_holds(db_url, supervisors, subprocess_env):
    sup = supervisors(db_url, name="taken-name", procs=1).start()
    refused = everystep(subprocess_env, db_url, "worker", "--name", "taken-name", "--app", supervised.__name__)
    line = one_error_line(refused)
    assert "held by a live supervisor" in line and f"pid {sup.pid}" in line and "--takeover" in line


def test_takeover_of_a_frozen_holder_fences_it(db_url, store, supervisors, tmp_path):
    """A frozen VM, simulated with SIGSTOP: its heartbeat still looks fresh,
    so a plain start under its name is refused; ``--takeover`` proceeds and
    finishes its run, and once thawed the old holder writes nothing and
    stops."""
    old = supervisors(db_url, name="frozen", procs=1, args=["--lease", "30"]).start()
    run = schedule(supervised.fenced_flow, spec(tmp_path), database=store)
    old_child = old.busy_child(run.id, step_id="2")["pid"]
    frozen = [old.pid, old_child]
    freeze(frozen, signal.SIGSTOP)
    try:
        plain = supervisors(db_url, name="frozen", procs=1).spawn()
        assert plain.wait() == 2
        assert "--takeover" in plain.log() and f"pid {old.pid}" in plain.log()

        new = supervisors(db_url, name="frozen", procs=1, args=["--takeover"]).start(wait_idle=False)
        new_child = new.busy_child(run.id, step_id="2")["pid"]
        open_gate(tmp_path, "gate")
        done = wait_run(store, run.id, (COMPLETED,), supervisor=new)
        assert done.result["held"] == new_child
    finally:
        freeze(frozen, signal.SIGCONT)

    # Thawed: the old child finishes its step, and its record is refused;
    # the old parent finds its name gone at its next heartbeat and stops.
    assert old.wait(timeout=120) == 1
    assert "now runs under this name" in old.log()
    after = store.get_run(run.id)
    assert (after.status, after.result, after.claim_epoch) == (COMPLETED, done.result, done.claim_epoch)
    assert step_record(store, run.id, "2").result["pid"] == new_child
    pids_of_end = [pid for pid, event in effect_lines(tmp_path, run.id) if event == "gated:end"]
    assert sorted(pids_of_end) == sorted([old_child, new_child])  # the frozen effect did happen...
    assert counts(tmp_path, run.id)["last"] == 1  # ...and nothing after it
    [holder] = [runner for runner in store.list_runners() if runner.name == "frozen"]
    assert holder.pid == new.pid and new.alive()


def test_a_restart_after_sigkill_needs_no_flag_and_fences_the_orphan(db_url, store, supervisors, tmp_path):
    first = supervisors(db_url, name="restarting", procs=1).start()
    run = schedule(supervised.fenced_flow, spec(tmp_path), database=store)
    orphan = first.busy_child(run.id, step_id="2")["pid"]
    first.send_signal(signal.SIGKILL)
    first.wait()

    # The orphan drains (its parent died), still inside the gated step.
    second = supervisors(db_url, name="restarting", procs=1).start(wait_idle=False)
    new_child = second.busy_child(run.id, step_id="2")["pid"]
    assert new_child != orphan and psutil.pid_exists(orphan)
    open_gate(tmp_path, "gate")
    done = wait_run(store, run.id, (COMPLETED,), supervisor=second)
    wait_for_pids_gone([orphan])

    assert done.result["held"] == new_child
    assert counts(tmp_path, run.id)["last"] == 1
    assert step_record(store, run.id, "2").status == STEP_DONE
    assert "error" not in second.log().lower()
