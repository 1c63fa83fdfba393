"""Real signals to a real ``everystep-supervisor``, on both backends.

TERM drains (the step in flight finishes and is recorded, the run is
requeued, exit 0), ``--drain`` bounds that wait, QUIT stops fast, a
SIGKILLed parent's children notice and leave, HUP replaces every child,
TTIN/TTOU add and remove one, and systemd's notify socket hears about all
of it. Runs are held mid-step with gate files; every wait polls the
database or the control socket with a generous deadline.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from everystep import schedule
from everystep.models import COMPLETED, FAILED, RUNNING, SCHEDULED, STEP_DONE
from everystep.store import Store
from tests.apps import supervised
from tests.apps.supervised import effect_lines, effects, open_gate
from tests.support.waiting import wait_until
from tests.support.supervisor import short_socket_dir, supervisors, wait_for_pids_gone, wait_run  # noqa: F401

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(180), pytest.mark.backends("sqlite", "postgres")]


def spec(directory: Path, **extra: Any) -> dict[str, Any]:
    return {"dir": str(directory), **extra}


def claimed_by(store: Store, name: str) -> list[str]:
    return [run.id for run in store.list_runs(status=RUNNING, limit=10_000) if run.claimed_by == name]


def assert_requeued(store: Store, run_id: str, recorded: set[str]) -> None:
    run = store.get_run(run_id)
    assert run.status == SCHEDULED and run.claimed_by is None and run.claimed_at is None, run
    steps = {record.step_id: record.status for record in store.get_steps(run_id)}
    assert steps == {step_id: STEP_DONE for step_id in recorded}


# -- TERM / INT: drain ----------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_term_mid_step_finishes_the_step_requeues_the_run_and_exits_0(
    db_url, store, supervisors, tmp_path, sig
):
    sup = supervisors(db_url, procs=2).start()
    run = schedule(supervised.gated_flow, spec(tmp_path, gate="go"), database=store)
    busy = sup.busy_child(run.id, "2")
    children = [child["pid"] for child in sup.status()["children"]]

    sup.send_signal(sig)
    draining = sup.wait_status(lambda status: status["draining"], "the drain to start")
    assert {child["state"] for child in draining["children"] if child["pid"] == busy["pid"]} == {"stopping"}
    open_gate(tmp_path, "go")  # the step in flight finishes...
    assert sup.wait() == 0, sup.log()

    # ...and is recorded; the next step never starts; the run is back in the queue.
    assert_requeued(store, run.id, {"1", "2"})
    assert effects(tmp_path, run.id) == ["first", "gated:start", "gated:end"]
    assert claimed_by(store, sup.name) == []
    wait_for_pids_gone(children)
    assert not os.path.exists(sup.socket_path)

    # Any runner can resume it from its records: here one under another name.
    other = supervisors(db_url, procs=1).start(wait_idle=False)
    assert other.name != sup.name
    finished = wait_run(store, run.id, (COMPLETED, FAILED), supervisor=other)
    assert finished.status == COMPLETED, finished.error
    assert effects(tmp_path, run.id) == ["first", "gated:start", "gated:end", "last"]
    assert finished.result["last"] in {child["pid"] for child in other.status()["children"]}


def test_drain_deadline_kills_a_step_that_never_ends_and_requeues_its_run(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2, args=["--drain", "2"]).start()
    run = schedule(supervised.gated_flow, spec(tmp_path, gate="never"), database=store)
    busy = sup.at_gate(run.id, tmp_path)

    started = time.monotonic()
    sup.send_signal(signal.SIGTERM)
    assert sup.wait() == 0, sup.log()

    assert time.monotonic() - started >= 2.0, "the step in flight gets the whole --drain period"
    assert "drain deadline passed" in sup.log()
    assert_requeued(store, run.id, {"1"})
    assert claimed_by(store, sup.name) == []
    wait_for_pids_gone([busy["pid"]])

    open_gate(tmp_path, "never")
    other = supervisors(db_url, procs=1).start(wait_idle=False)
    assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=other).status == COMPLETED
    assert effects(tmp_path, run.id) == ["first", "gated:start", "gated:start", "gated:end", "last"]


# -- QUIT: fast stop ---------------------------------------------------------------------


def test_quit_stops_fast_killing_children_and_requeueing_their_runs(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2, args=["--drain", "600"]).start()
    runs = [schedule(supervised.gated_flow, spec(tmp_path, gate="never"), database=store) for _ in range(2)]
    busy = [sup.busy_child(run.id, "2")["pid"] for run in runs]

    sup.send_signal(signal.SIGQUIT)
    assert sup.wait(timeout=30) == 0, sup.log()  # far less than --drain: nothing waited for the gate

    for run in runs:
        assert_requeued(store, run.id, {"1"})
    assert claimed_by(store, sup.name) == []
    wait_for_pids_gone(busy)


# -- the parent dies ---------------------------------------------------------------------


def test_children_of_a_sigkilled_parent_drain_and_exit_and_a_restart_completes_their_runs(
    db_url, store, supervisors, tmp_path
):
    sup = supervisors(db_url, procs=2).start()
    run = schedule(supervised.gated_flow, spec(tmp_path, gate="go"), database=store)
    busy = sup.busy_child(run.id, "2")
    idle = [child["pid"] for child in sup.status()["children"] if child["pid"] != busy["pid"]]
    assert len(idle) == 1

    sup.send_signal(signal.SIGKILL)
    assert sup.wait() == -signal.SIGKILL
    wait_for_pids_gone(idle)  # an idle child notices at once (PR_SET_PDEATHSIG)
    open_gate(tmp_path, "go")  # the busy one finishes its step, then leaves
    wait_for_pids_gone([busy["pid"]])

    left = store.get_run(run.id)
    assert left.status in (SCHEDULED, RUNNING), left
    if left.status == RUNNING:
        assert left.claimed_by == sup.name
    assert {record.step_id for record in store.get_steps(run.id)} == {"1", "2"}

    again = supervisors(db_url, procs=1, name=sup.name).start(wait_idle=False)
    finished = wait_run(store, run.id, (COMPLETED, FAILED), supervisor=again)
    assert finished.status == COMPLETED, finished.error
    assert effects(tmp_path, run.id) == ["first", "gated:start", "gated:end", "last"]


def test_an_orphaned_child_stuck_in_a_step_exits_at_its_own_drain_deadline(db_url, store, supervisors, tmp_path):
    """With the parent gone nobody else enforces --drain: the child's kernel
    timer ends it, and the run stays claimed for a restart to resume."""
    sup = supervisors(db_url, procs=1, args=["--drain", "2"]).start()
    run = schedule(supervised.gated_flow, spec(tmp_path, gate="late"), database=store)
    busy = sup.busy_child(run.id, "2")

    sup.send_signal(signal.SIGKILL)
    assert sup.wait() == -signal.SIGKILL
    wait_for_pids_gone([busy["pid"]], timeout=60)  # the gate never opened: only the timer can end it

    left = store.get_run(run.id)
    assert (left.status, left.claimed_by) == (RUNNING, sup.name)
    assert {record.step_id for record in store.get_steps(run.id)} == {"1"}

    open_gate(tmp_path, "late")
    again = supervisors(db_url, procs=1, name=sup.name).start(wait_idle=False)
    assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=again).status == COMPLETED


def test_a_restart_under_the_same_name_catches_up_runs_left_running(db_url, store, supervisors, tmp_path):
    """Parent and children all SIGKILLed (a machine crash): the runs stay
    ``running`` under the name until a supervisor with that name starts."""
    sup = supervisors(db_url, procs=2).start()
    runs = [schedule(supervised.gated_flow, spec(tmp_path, gate="go"), database=store) for _ in range(2)]
    busy = [sup.at_gate(run.id, tmp_path)["pid"] for run in runs]

    sup.cleanup()  # SIGKILL to the parent and every child's process group
    wait_for_pids_gone([sup.pid, *busy])
    for run in runs:
        left = store.get_run(run.id)
        assert left.status == RUNNING and left.claimed_by == sup.name

    open_gate(tmp_path, "go")
    again = supervisors(db_url, procs=2, name=sup.name).start(wait_idle=False)
    for run in runs:
        finished = wait_run(store, run.id, (COMPLETED, FAILED), supervisor=again)
        assert finished.status == COMPLETED, finished.error
        # The step cut short by the crash ran again (at-least-once), elsewhere.
        trace = effect_lines(tmp_path, run.id)
        assert [event for _, event in trace] == ["first", "gated:start", "gated:start", "gated:end", "last"]
        assert trace[1][0] in busy and trace[2][0] not in busy
    assert "resuming 2 run(s) left running under this name" in again.log()


# -- HUP, TTIN, TTOU -----------------------------------------------------------------------


def test_ttin_and_ttou_add_and_remove_one_child(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    assert len(sup.live_child_pids()) == 2

    for sig, expected in ((signal.SIGTTIN, 3), (signal.SIGTTIN, 4), (signal.SIGTTOU, 3),
                          (signal.SIGTTOU, 2), (signal.SIGTTOU, 1)):
        sup.send_signal(sig)
        status = sup.wait_idle(procs=expected)
        assert status["procs"] == expected
        wait_until(lambda: len(sup.live_child_pids()) == expected,
                   f"{expected} live child processes, have {sup.live_child_pids()}")
        assert sup.live_child_pids() == {child["pid"] for child in status["children"]}

    run = schedule(supervised.tiny, spec(tmp_path), database=store)
    assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup).result in sup.live_child_pids()


def test_hup_replaces_every_child_and_the_supervisor_keeps_working(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    run = schedule(supervised.gated_flow, spec(tmp_path, gate="go"), database=store)
    busy = sup.busy_child(run.id, "2")
    before = {child["pid"] for child in sup.status()["children"]}

    sup.send_signal(signal.SIGHUP)
    # The idle child is replaced at once; the busy one finishes its step first.
    sup.wait_status(lambda s: len([c for c in s["children"] if c["pid"] not in before and c["state"] == "idle"]) >= 1,
                    "a new idle child")
    open_gate(tmp_path, "go")
    finished = wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup)
    assert finished.status == COMPLETED, finished.error
    status = sup.wait_status(
        lambda s: len(s["children"]) == 2 and all(c["state"] == "idle" and c["pid"] not in before
                                                  for c in s["children"]),
        "two new idle children",
    )
    after = {child["pid"] for child in status["children"]}
    wait_until(lambda: sup.live_child_pids() == after, "only the new children alive")
    wait_for_pids_gone(list(before))
    assert effects(tmp_path, run.id) == ["first", "gated:start", "gated:end", "last"]
    assert finished.result["gated"] == busy["pid"] and finished.result["last"] not in before

    more = schedule(supervised.tiny, spec(tmp_path), database=store)
    assert wait_run(store, more.id, (COMPLETED, FAILED), supervisor=sup).result in after
    assert sup.alive()


# -- systemd notify ------------------------------------------------------------------------


class NotifyListener:
    """The receiving end of NOTIFY_SOCKET, as systemd would bind it."""

    def __init__(self) -> None:
        self.directory = short_socket_dir()
        self.path = str(self.directory / "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # as systemd does: who sent it
        self.sock.settimeout(0.05)
        self.messages: list[dict[str, str]] = []
        self.senders: list[int] = []

    def drain(self) -> None:
        while True:
            try:
                data, ancillary, _flags, _address = self.sock.recvmsg(65536, socket.CMSG_SPACE(12))
            except (TimeoutError, BlockingIOError):
                return
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    self.senders.append(struct.unpack("3i", payload[:12])[0])
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append(fields)

    def wait_for(self, predicate: Any, what: str, timeout: float = 30.0) -> dict[str, str]:
        def check() -> dict[str, str] | None:
            self.drain()
            return next((message for message in self.messages if predicate(message)), None)

        return wait_until(check, what, timeout=timeout)

    def count(self, key: str) -> int:
        self.drain()
        return sum(1 for message in self.messages if key in message)

    def close(self) -> None:
        self.sock.close()
        for name in os.listdir(self.directory):
            os.unlink(self.directory / name)
        os.rmdir(self.directory)


def test_sd_notify_ready_status_watchdog_and_stopping(db_url, supervisors, subprocess_env, tmp_path):
    listener = NotifyListener()
    try:
        env = dict(subprocess_env, NOTIFY_SOCKET=listener.path, WATCHDOG_USEC="400000")
        env.pop("WATCHDOG_PID", None)
        sup = supervisors(db_url, procs=2, env=env).spawn()

        ready = listener.wait_for(lambda m: m.get("READY") == "1", "READY=1")
        assert "busy" in ready.get("STATUS", ""), ready
        sup.status()  # READY=1 means up: the control socket answers
        listener.wait_for(lambda m: "STATUS" in m and "READY" not in m, "a STATUS= line")
        # 0.4 s watchdog: a ping every 0.2 s; wait for a few of them.
        wait_until(lambda: listener.count("WATCHDOG") >= 5, "five WATCHDOG=1 pings")
        assert all(m["WATCHDOG"] == "1" for m in listener.messages if "WATCHDOG" in m)
        assert listener.count("STOPPING") == 0

        sup.send_signal(signal.SIGTERM)
        stopping = listener.wait_for(lambda m: m.get("STOPPING") == "1", "STOPPING=1")
        assert stopping["STOPPING"] == "1"
        assert sup.wait() == 0, sup.log()
        listener.drain()
        # Only the master speaks to systemd, never a child.
        assert len(listener.senders) == len(listener.messages)
        assert set(listener.senders) == {sup.pid}
    finally:
        listener.close()
