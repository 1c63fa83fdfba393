"""A supervisor child: execute the runs the parent hands over, one at a time.

A child is forked from the parent after the app was imported (so workflow
code is shared copy-on-write), opens its own database connection, and
reports every step start and end to the parent, which enforces timeouts and
answers ``ctl status`` from those reports.

It leaves only through ``os._exit``, so the parent's atexit handlers and
inherited finalizers never run twice. SIGTERM (from the parent's drain, or
from the kernel when the parent dies: PR_SET_PDEATHSIG) sets the drain flag:
the step in flight finishes and is recorded, the run is requeued at the
next step boundary and the child exits.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import psutil

from everystep import runner, serde, traces
from everystep.context import Context, SignalFlag
from everystep.models import RUNNING, Run
from everystep.observer import Observer, Observers
from everystep.store import connect

from . import titles
from .protocol import Channel, ChannelClosed
from .stepboard import StepBoard

logger = logging.getLogger("everystep.supervisor")

BOOT_ERROR = 3
"""Exit code of a child that could not start; the parent stops respawning."""

PR_SET_PDEATHSIG = 1
PARENT_WATCH_INTERVAL = 0.5
IDLE_WAKEUP = 0.5


@dataclass(frozen=True)
class ChildSpec:
    slot: int
    name: str
    database: str
    parent_pid: int
    max_runs: int = 0
    max_memory_mb: int = 0
    drain: float = 30.0
    step_timeout: float | None = None
    board: StepBoard | None = None
    observers: tuple[Observer, ...] = ()


def main(spec: ChildSpec, channel: Channel, inherited: list[int]) -> NoReturn:
    """Entry point right after ``fork()``; never returns."""
    code = 1
    try:
        code = _serve(spec, channel, inherited)
    except BaseException:
        logger.exception("everystep-supervisor child %d crashed", spec.slot)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _detach(spec: ChildSpec, inherited: list[int], draining: SignalFlag) -> None:
    """Own process group (so the parent can kill our grandchildren too),
    die-with-parent, our own signal dispositions, none of the parent's fds."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    for fd in inherited:
        try:
            os.close(fd)
        except OSError:
            pass
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGTERM, lambda signum, frame: draining.set())
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    for sig in (signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    _set_pdeathsig(signal.SIGTERM)
    threading.Thread(target=_watch_parent, args=(spec, draining), name="everystep-parent-watch",
                     daemon=True).start()


def _watch_parent(spec: ChildSpec, draining: SignalFlag) -> None:
    """Orphaned, nobody enforces our drain deadline any more: do it here.

    The drain flag stops the run at its next step boundary; if the step in
    flight never ends, a kernel timer (SIGALRM, default action: terminate)
    ends the process after ``drain`` seconds whatever it is doing, even
    inside C code holding the GIL. The run stays claimed under the runner's
    name, where a restart (catchup) or another runner (lease) recovers it.
    """
    while os.getppid() == spec.parent_pid:
        time.sleep(PARENT_WATCH_INTERVAL)
    draining.set()
    if spec.drain > 0:
        signal.setitimer(signal.ITIMER_REAL, spec.drain)


def _set_pdeathsig(sig: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except OSError:
        pass


class Reporter(Observer):
    """Tells the parent what this child is doing (from any branch thread).

    When a run's body is done and only its terminal write is left, the
    reporter says so ("finishing"), so the parent can claim this child's next
    run while that write commits; or it says goodbye, if this child is to be
    replaced after the run, so the parent hands it nothing more.
    """

    def __init__(self, channel: Channel, spec: ChildSpec, leaving: Callable[[], str | None]) -> None:
        self.channel = channel
        self.slot = spec.slot
        self.board = spec.board
        self.default_timeout = spec.step_timeout
        self.leaving = leaving
        self.announced: str | None = None  # at settling: the reason we leave, or "" to stay
        self._inflight: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            try:
                self.channel.send(message)
            except ChannelClosed:
                pass  # the parent is gone; PDEATHSIG drains us

    def _publish(self) -> None:
        if self.board is not None:
            self.board.publish(sorted(self._inflight.values(), key=lambda step: step["since"]))

    def step_started(self, ctx: Context, step_id: str, name: str, timeout: float | None, unsafe: bool) -> Any:
        """Every step goes on the board; only a step with a deadline is also
        announced, so the parent can enforce it."""
        titles.child_busy(self.slot, ctx.workflow_name, ctx.workflow_id, step_id)
        timeout = timeout or self.default_timeout
        with self._lock:
            self._inflight[step_id] = {"run": ctx.workflow_id, "step": step_id, "name": name,
                                       "since": time.time(), "unsafe": unsafe}
            self._publish()
        if timeout:
            self.send({"ev": "step", "run": ctx.workflow_id, "step": step_id, "name": name,
                       "timeout": timeout, "unsafe": unsafe})
        return timeout

    def step_finished(self, ctx: Context, step_id: str, name: str, status: str,
                      error: BaseException | None, token: Any) -> None:
        with self._lock:
            self._inflight.pop(step_id, None)
            self._publish()
        if token:
            self.send({"ev": "step_end", "run": ctx.workflow_id, "step": step_id, "status": status})

    def run_ended(self) -> None:
        with self._lock:
            self._inflight.clear()
            self._publish()

    def run_settling(self, run: Run, status: str) -> None:
        reason = self.leaving()
        self.announced = reason or ""
        if reason:
            self.send({"ev": "bye", "reason": reason})
        else:
            self.send({"ev": "finishing", "run": run.id})


def run_from_message(message: dict[str, Any], claimer: str) -> Run:
    import datetime as dt

    def when(value: str | None) -> dt.datetime | None:
        return dt.datetime.fromisoformat(value) if value else None

    return Run(
        id=message["id"], name=message["name"], args=serde.from_jsonable(message["args"]),
        status=RUNNING, claimed_by=claimer, claimed_at=when(message.get("claimed_at")),
        created_at=when(message.get("created_at")), has_steps=message.get("has_steps"),
        claim_epoch=int(message["claim_epoch"]),
    )


def run_to_message(run: Run) -> dict[str, Any]:
    return {
        "id": run.id, "name": run.name, "args": serde.to_jsonable(run.args),
        "claimed_at": run.claimed_at.isoformat() if run.claimed_at else None,
        "created_at": run.created_at.isoformat() if run.created_at else None,
        "has_steps": run.has_steps,
        "claim_epoch": run.claim_epoch,
    }


def _serve(spec: ChildSpec, channel: Channel, inherited: list[int]) -> int:
    draining = SignalFlag()
    _detach(spec, inherited, draining)
    titles.child_idle(spec.slot)
    try:
        store = connect(spec.database)
    except Exception as exc:
        logger.error("everystep-supervisor child %d cannot open the database: %s", spec.slot, exc)
        return BOOT_ERROR
    process = psutil.Process()
    runs_done = 0

    def rss() -> int:
        return process.memory_info().rss if spec.max_memory_mb else 0

    def leaving_after_this_run() -> str | None:
        if draining.is_set():
            return "drain"
        return _recycle_reason(spec, runs_done + 1, rss())

    reporter = Reporter(channel, spec, leaving_after_this_run)
    observer = Observers([reporter, *spec.observers])
    reporter.send({"ev": "ready", "pid": os.getpid()})
    while True:
        if draining.is_set() or os.getppid() != spec.parent_pid:
            reporter.send({"ev": "bye", "reason": "drain"})
            return 0
        try:
            message = channel.receive(IDLE_WAKEUP)
        except (ChannelClosed, OSError):
            return 0
        if message is None:
            continue
        if message.get("op") == "exit":
            reporter.send({"ev": "bye", "reason": message.get("reason", "exit")})
            return 0
        if message.get("op") != "run":
            continue
        run = run_from_message(message["run"], spec.name)
        titles.child_busy(spec.slot, run.name, run.id)
        trace_token = traces.attach_remote(message.get("trace"))
        try:
            status = runner.execute_guarded(store, run, claimer=spec.name, draining=draining, observer=observer)
        finally:
            traces.detach(trace_token)
        announced, reporter.announced = reporter.announced, None
        if announced:
            leaving: str | None = announced  # the parent already knows
        else:
            # No terminal write (crash, lost claim, outage), or we said we
            # would stay and a drain came since. "bye" goes before "done": a
            # parent that read "done" first would take us for idle. If it
            # already sent our next run, we do not start it; the parent gives
            # it to another child.
            leaving = leaving_after_this_run() if announced is None else (
                "drain" if draining.is_set() else None)
            if leaving:
                reporter.send({"ev": "bye", "reason": leaving})
        runs_done += 1
        reporter.run_ended()
        reporter.send({"ev": "done", "run": run.id, "status": status, "rss": rss()})
        titles.child_idle(spec.slot)
        if leaving:
            return 0


def _recycle_reason(spec: ChildSpec, runs_done: int, rss: int) -> str | None:
    """Why this child should be replaced now, between runs (or None)."""
    if spec.max_runs and runs_done >= spec.max_runs:
        return "max-runs"
    if spec.max_memory_mb and rss > spec.max_memory_mb * 1024 * 1024:
        return "max-memory"
    return None
