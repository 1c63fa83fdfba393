"""A supervisor child: execute the runs the parent hands over, one at a time.

A child is forked from the parent after the app was imported (so workflow
code is shared copy-on-write), opens its own database connection, and
reports every step start and end to the parent, which enforces timeouts and
answers ``ctl status`` from those reports. It joins the cgroup the parent
made for it, if any, and runs every step inside its ``ChildMeter``
(``meter.py``), which measures each step and bounds those with a budget.

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

from everystep import history_bound, runner, serde, traces
from everystep.history_bound import HistoryBound
from everystep.context import Context, SignalFlag
from everystep.models import RUNNING, Run
from everystep.context import Observer
from everystep.observer import Observers
from everystep.store import connect

from . import heap, titles
from .cgroups import ChildGroup, OpenGroup
from .memory import MemorySampler
from .meter import ChildMeter
from .protocol import (
    Bye,
    Channel,
    ChannelClosed,
    Dispatch,
    Done,
    Exit,
    Finishing,
    Message,
    Ready,
    StepEnded,
    StepStarted,
)
from .states import ByeReason, StepInFlight
from .stepboard import StepBoard, encode_step

logger = logging.getLogger("everystep.supervisor")

BOOT_ERROR = 3
"""Exit code of a child that could not start; the parent stops respawning."""

PR_SET_PDEATHSIG = 1
PARENT_WATCH_INTERVAL = 0.5
IDLE_WAKEUP = 0.5
#: With ``--max-memory-per-child``, seconds between two USS readings (each
#: walks the page tables: about 2 ms for a 350 MB process).
MEMORY_CHECK_EVERY = 1.0


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
    #: Defaults for steps that declare no budget (bytes, CPU seconds).
    step_memory_limit: int | None = None
    step_cpu_limit: float | None = None
    #: The cgroup made for this child, which it joins at boot (None: rlimits only).
    cgroup: ChildGroup | None = None
    #: A run whose history passes this many records is said once (``everystep.history_bound``; 0: never).
    history_warning: int = history_bound.DEFAULT


def main(spec: ChildSpec, channel: Channel, inherited: list[int]) -> NoReturn:
    """Entry point right after ``fork()``; never returns."""
    heap.in_child()
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

    Every step goes on the step board; a step with a deadline is also
    announced by message, so the parent can enforce it. When a run's body
    is done and only its terminal write is left, the reporter says so
    (``Finishing``), so the parent can hand this child its next run while
    that write commits; or it says goodbye (``Bye``), if this child is to be
    replaced after the run, so the parent hands it nothing more.
    """

    def __init__(self, channel: Channel, spec: ChildSpec, leaving: Callable[[], ByeReason | None],
                 meter: ChildMeter | None = None) -> None:
        self.channel = channel
        self.slot = spec.slot
        self.board = spec.board
        self.default_timeout = spec.step_timeout
        self.leaving = leaving
        self.meter = meter
        #: Set at settling: whether the run reached it, and the reason we
        #: announced for leaving after it (None: we said we stay).
        self.settled = False
        self.announced: ByeReason | None = None
        #: Steps in flight, each with its board entry (encoded once).
        self._inflight: dict[str, tuple[StepInFlight, bytes]] = {}
        self._lock = threading.Lock()

    def send(self, message: Message) -> None:
        with self._lock:
            try:
                self.channel.send_blocking(message)
            except ChannelClosed:
                pass  # the parent is gone; PDEATHSIG drains us

    def _publish(self) -> None:
        if self.board is not None:
            steps = sorted(self._inflight.values(), key=lambda entry: entry[0].started)
            self.board.publish([encoded for _, encoded in steps])

    def step_started(self, ctx: Context, step_id: str, name: str, timeout: float | None, unsafe: bool) -> Any:
        titles.child_busy(self.slot, ctx.workflow_name, ctx.workflow_id, step_id)
        attempt = ctx.execution.attempt_of(step_id)
        budget = self.meter.budget(ctx.workflow_id, step_id) if self.meter is not None else None
        step = StepInFlight(run=ctx.workflow_id, step=step_id, name=name, started=time.monotonic(),
                            timeout=timeout or self.default_timeout, unsafe=unsafe,
                            attempt=attempt.attempt if attempt else 1,
                            retry_in=attempt.retry_in if attempt else None,
                            memory_limit=budget.memory_limit if budget else None,
                            cpu_limit=budget.cpu_limit if budget else None,
                            cpu_start=budget.cpu_start if budget else None,
                            memory_start=budget.memory_start if budget else None)
        with self._lock:
            # vars(): the entry's fields are all scalars, so no need for plain()'s walk.
            self._inflight[step_id] = (step, encode_step(vars(step)) if self.board is not None else b"")
            self._publish()
        announced = bool(step.timeout) or budget is not None
        if announced:
            self.send(StepStarted(step))  # the parent enforces its deadline or budget
        return announced

    def step_finished(self, ctx: Context, step_id: str, name: str, status: str,
                      error: BaseException | None, token: Any) -> None:
        with self._lock:
            self._inflight.pop(step_id, None)
            self._publish()
        if token:
            self.send(StepEnded(run=ctx.workflow_id, step=step_id, status=status))

    def run_ended(self) -> None:
        with self._lock:
            if self._inflight:  # else the board says so already
                self._inflight.clear()
                self._publish()

    def run_settling(self, run: Run, status: str) -> None:
        reason = self.leaving()
        self.settled, self.announced = True, reason
        if reason:
            self.send(Bye(reason))
        else:
            self.send(Finishing(run.id))


def run_from_message(message: dict[str, Any], claimer: str) -> Run:
    import datetime as dt

    def when(value: str | None) -> dt.datetime | None:
        return dt.datetime.fromisoformat(value) if value else None

    return Run(
        id=message["id"], name=message["name"], args=serde.from_jsonable(message["args"]),
        status=RUNNING, claimed_by=claimer, claimed_at=when(message.get("claimed_at")),
        created_at=when(message.get("created_at")), has_steps=message.get("has_steps"),
        claim_epoch=int(message["claim_epoch"]), error=message.get("error"),
    )


def run_to_message(run: Run) -> dict[str, Any]:
    return {
        "id": run.id, "name": run.name, "args": serde.to_jsonable(run.args),
        "claimed_at": run.claimed_at.isoformat() if run.claimed_at else None,
        "created_at": run.created_at.isoformat() if run.created_at else None,
        "has_steps": run.has_steps,
        "claim_epoch": run.claim_epoch,
        # A run given back after engine errors carries the last one: its
        # count sets the next backoff (``everystep.engine_errors``).
        "error": run.error,
    }


def _serve(spec: ChildSpec, channel: Channel, inherited: list[int]) -> int:
    draining = SignalFlag()
    _detach(spec, inherited, draining)
    group = _join_cgroup(spec)
    titles.child_idle(spec.slot)
    try:
        store = connect(spec.database)
    except Exception as exc:
        logger.error("everystep-supervisor child %d cannot open the database: %s", spec.slot, exc)
        return BOOT_ERROR
    meter = ChildMeter(spec.step_memory_limit, spec.step_cpu_limit, group)
    meter.install()
    process = psutil.Process()
    memory = MemorySampler(every=MEMORY_CHECK_EVERY)
    runs_done = 0

    def owned() -> int:
        """What this child owns (USS) if a limit needs it; its RSS when that
        alone shows it under the limit."""
        if not spec.max_memory_mb:
            return 0
        rss = process.memory_info().rss
        if rss <= spec.max_memory_mb * 1024 * 1024:
            return rss  # USS <= RSS: under the limit without reading smaps
        return memory.sample(process).owned

    def leaving_after_this_run() -> ByeReason | None:
        if draining.is_set():
            return ByeReason.DRAIN
        return _recycle_reason(spec, runs_done + 1, owned())

    reporter = Reporter(channel, spec, leaving_after_this_run, meter)
    observer = Observers([reporter, HistoryBound(spec.history_warning), *spec.observers])
    reporter.send(Ready(os.getpid(), cgroup=group is not None, owned=memory.sample(process).owned))
    while True:
        if draining.is_set() or os.getppid() != spec.parent_pid:
            reporter.send(Bye(ByeReason.DRAIN))
            return 0
        try:
            message = channel.receive(IDLE_WAKEUP)
        except (ChannelClosed, OSError):
            return 0
        if isinstance(message, Exit):
            reporter.send(Bye(ByeReason.parse(message.reason)))
            return 0
        if not isinstance(message, Dispatch):
            continue
        run = run_from_message(message.run, spec.name)
        titles.child_busy(spec.slot, run.name, run.id)
        trace_token = traces.attach_remote(message.trace)
        try:
            outcome = runner.execute_guarded(store, run, claimer=spec.name, draining=draining, observer=observer,
                                             meter=meter)
        finally:
            traces.detach(trace_token)
        settled, announced = reporter.settled, reporter.announced
        reporter.settled, reporter.announced = False, None
        leaving: ByeReason | None = announced  # if announced, the parent already knows
        if announced is None:
            # No terminal write (crash, lost claim, outage), or we said we
            # would stay and a drain came since. Bye goes before Done: a
            # parent that read Done first would take us for idle. If it
            # already sent our next run, we do not start it; the parent gives
            # it to another child.
            if not settled:
                leaving = leaving_after_this_run()
            elif draining.is_set():
                leaving = ByeReason.DRAIN
            if leaving:
                reporter.send(Bye(leaving))
        runs_done += 1
        reporter.run_ended()
        reporter.send(Done(run=run.id, outcome=outcome, owned=owned()))
        titles.child_idle(spec.slot)
        if leaving:
            return 0


def _join_cgroup(spec: ChildSpec) -> OpenGroup | None:
    """Move into the cgroup the parent made for this child; without it the
    child bounds memory with rlimits (the parent hears so in ``Ready``)."""
    if spec.cgroup is None:
        return None
    try:
        spec.cgroup.join()
        return OpenGroup(spec.cgroup)
    except OSError as exc:
        logger.warning("everystep-supervisor child %d: %s; bounding step memory with RLIMIT_DATA instead",
                       spec.slot, exc)
        return None


def _recycle_reason(spec: ChildSpec, runs_done: int, owned: int) -> ByeReason | None:
    """Why this child should be replaced now, between runs (or None).
    ``owned``: what it owns (``supervisor.memory``), in bytes."""
    if spec.max_runs and runs_done >= spec.max_runs:
        return ByeReason.MAX_RUNS
    if spec.max_memory_mb and owned > spec.max_memory_mb * 1024 * 1024:
        return ByeReason.MAX_MEMORY
    return None
