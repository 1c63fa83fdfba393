"""What the supervisor parent knows about each child process, and the one
place that changes it.

A child's state, the run it executes, the run it is finishing and whether
that run reached it are changed only by the transitions below, each the
parent's reading of an event: an order it gave (``hand``, ``retire``,
``terminate``, ``kill``) or a message the child sent (``ready``,
``finishing``, ``done``, ``said_bye``)::

                 ready              hand(R)               finishing(R)
    BOOTING ──────────▶ IDLE ─────────────▶ BUSY ───────────────────▶ FINISHING
                          ▲                  │ ▲   hand(R2): R settles,  │
                          │     done(R)      │ └──── R2 waits behind it ─┘
                          └──────────────────┴──── done(R) ◀─────────────┘
    retire():     BOOTING, IDLE, BUSY, FINISHING ──▶ RETIRING (leaves after its run)
    said_bye():   an active child ──▶ RETIRING
    terminate():  any but KILLED ──▶ STOPPING (SIGTERM: drains at the next step boundary)
    kill():       any ──▶ KILLED (SIGKILL; the reaper says what became of its run)

An order the parent gives from a state where it makes no sense is a bug in
the parent and raises ``IllegalTransition``. A message may be stale (the
parent killed the child, or retired it, while the message was on its way),
so a message that does not fit the child's state changes nothing, and its
transition says so by its return value.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from everystep.models import Run

from .cgroups import ChildGroup
from .fate import Overrun
from .memory import Footprint, MemorySampler
from .protocol import Channel, ProtocolError, build
from .stepboard import StepBoard
from .states import ByeReason, ChildState, KillReason, StepInFlight


class IllegalTransition(AssertionError):
    """The parent ordered a child into a state it cannot reach from where
    it is: a bug in the parent, never a runtime condition."""


_CAN_BE_HANDED = (ChildState.IDLE, ChildState.FINISHING)
_CAN_RETIRE = (ChildState.BOOTING, ChildState.IDLE, ChildState.BUSY, ChildState.FINISHING, ChildState.RETIRING)


#: CPU% is measured over at least this long. Over a few milliseconds (two
#: status requests in a row) the answer is the kernel's tick granularity:
#: a child spinning in Python read 0 %, a single-threaded one 163 %.
CPU_WINDOW = 1.0


@dataclass
class CpuSampler:
    """A process's CPU% over a real interval: the CPU seconds it used
    between two samples at least ``window`` apart, over the wall time
    between them. Between such samples it answers the last value; before
    the first full window, None. The supervisor samples every child at
    least every 2 s (it publishes its status), so the value is recent."""

    window: float = CPU_WINDOW
    percent: float | None = None
    _mark: tuple[float, float] | None = None

    def sample(self, now: float, cpu_seconds: float) -> float | None:
        """``now``: ``time.monotonic()``; ``cpu_seconds``: user + system so far."""
        if self._mark is None:
            self._mark = (now, cpu_seconds)
        elif now - self._mark[0] >= self.window:
            then, used = self._mark
            self.percent = round(max(cpu_seconds - used, 0.0) / (now - then) * 100, 1)
            self._mark = (now, cpu_seconds)
        return self.percent


@dataclass(eq=False)
class Child:
    slot: int
    pid: int
    channel: Channel
    board: StepBoard | None = None
    #: Steps with a deadline or a budget, announced by message as they start;
    #: every step in flight, timed or not, is on ``board``.
    timed_steps: dict[str, StepInFlight] = field(default_factory=dict)
    runs_done: int = 0
    #: What it last said it owns: its USS as it booted, then after each run
    #: (with ``--max-memory-per-child``) its USS, or its RSS where that
    #: alone shows it under the limit.
    owned: int = 0
    kill_reason: KillReason | None = None
    overdue_steps: list[StepInFlight] = field(default_factory=list)
    bye_reason: ByeReason | None = None
    channel_open: bool = True
    #: Its own cgroup, if it has one (``budgets.py``).
    group: ChildGroup | None = None
    #: The budget one of its steps went over, when the parent killed it for that.
    overrun: Overrun | None = None
    #: The host's OOM-kill count when it was handed its run (without a cgroup).
    oom_baseline: int | None = None
    #: When it was handed the run it executes (``time.monotonic()``).
    run_started: float | None = None
    #: Seconds its last run took, from being handed to it to its body's end
    #: (``Finishing``) or, without one, to ``Done`` (``claim_ahead.py``).
    last_run_seconds: float | None = None
    _state: ChildState = field(default=ChildState.BOOTING, init=False)
    _run: Run | None = field(default=None, init=False)
    _finishing_run: Run | None = field(default=None, init=False)
    _delivered: bool = field(default=True, init=False)
    _process: psutil.Process | None = field(default=None, init=False)
    _cpu: CpuSampler = field(default_factory=CpuSampler, init=False)
    _memory: MemorySampler = field(default_factory=MemorySampler, init=False)

    # -- what it is doing (read-only: the transitions below write it) ------------------

    @property
    def state(self) -> ChildState:
        return self._state

    @property
    def run(self) -> Run | None:
        """The run handed to it last: executing, or waiting in its channel
        behind ``finishing_run``."""
        return self._run

    @property
    def finishing_run(self) -> Run | None:
        """The run whose terminal write is under way while ``run`` waits in
        the channel."""
        return self._finishing_run

    @property
    def delivered(self) -> bool:
        """The last run handed over has left the parent's buffer entirely
        (until then the child cannot have started it)."""
        return self._delivered

    @property
    def active(self) -> bool:
        return self._state.active

    @property
    def executing(self) -> Run | None:
        """The run this child executes now (not one merely queued in its
        channel behind a run it is finishing)."""
        if self._finishing_run is not None or self._state == ChildState.KILLED:
            return None
        return self._run

    # -- the parent's orders -----------------------------------------------------------

    def hand(self, run: Run, now: float) -> None:
        """Give it ``run``: an idle child starts it; a finishing one reads it
        once the run it is finishing is written."""
        if self._state not in _CAN_BE_HANDED or self._finishing_run is not None:
            raise IllegalTransition(f"child {self.slot} cannot be handed a run while {self._state}"
                                    f"{' and finishing another' if self._finishing_run else ''}")
        if self._state == ChildState.FINISHING:
            self._finishing_run = self._run
        self._state = ChildState.BUSY
        self._run = run
        self.run_started = now
        self.timed_steps.clear()
        self._delivered = False

    def flushed(self) -> None:
        """Its channel's buffer emptied: whatever was handed to it reached it."""
        self._delivered = True

    def retire(self) -> None:
        """It leaves: at once if idle (the parent sends ``Exit``), after its
        run if busy."""
        if self._state not in _CAN_RETIRE:
            raise IllegalTransition(f"child {self.slot} cannot retire while {self._state}")
        self._state = ChildState.RETIRING

    def terminate(self) -> None:
        """SIGTERM: drain at the next step boundary, then exit."""
        if self._state == ChildState.KILLED:
            return
        self._state = ChildState.STOPPING
        try:
            os.kill(self.pid, signal.SIGTERM)
        except OSError:
            pass

    def kill(self, reason: KillReason) -> None:
        """SIGKILL the child's whole process group (steps may have spawned
        grandchildren); the parent acts on the death when it reaps it. The
        first reason given is the one its death is read by."""
        if self.kill_reason is None:
            self.kill_reason = reason
        self._state = ChildState.KILLED
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass

    # -- what it said ----------------------------------------------------------------------

    def ready(self) -> bool:
        """It booted (``Ready``); False if it was retired or stopped meanwhile."""
        if self._state != ChildState.BOOTING:
            return False
        self._state = ChildState.IDLE
        return True

    def step_timed(self, step: StepInFlight) -> None:
        """A step with a deadline or a budget started (``StepStarted``)."""
        if self._run is not None and step.run == self._run.id:
            self.timed_steps[step.step] = step

    def step_ended(self, step_id: str) -> None:
        self.timed_steps.pop(step_id, None)

    def finishing(self, run_id: str) -> bool:
        """Its run's body is done and the terminal write under way
        (``Finishing``): it can be handed its next run."""
        if self._state != ChildState.BUSY or self._run is None or self._run.id != run_id:
            return False
        self._state = ChildState.FINISHING
        self.timed_steps.clear()
        self._timed_run()
        return True

    def done(self, run_id: str, owned: int) -> Run | None:
        """Its execution of ``run_id`` ended (``Done``); returns that run, or
        None if it is none of this child's (a stale message). A child that
        was finishing it stays busy with the run handed to it since."""
        finished_early = self._finishing_run is not None and self._finishing_run.id == run_id
        run = self._finishing_run if finished_early else self._run
        if run is None or run.id != run_id:
            return None
        self.owned = owned or self.owned
        self.runs_done += 1
        if finished_early:
            self._finishing_run = None  # ``run`` is its next run, already handed over
            return run
        if self._state == ChildState.BUSY:  # it ended without Finishing (a failure, a release)
            self._timed_run()
        self._run = None
        self.run_started = None
        self.timed_steps.clear()
        if self._state in (ChildState.BUSY, ChildState.FINISHING):
            self._state = ChildState.IDLE
        return run

    def _timed_run(self) -> None:
        if self.run_started is not None:
            self.last_run_seconds = time.monotonic() - self.run_started

    def said_bye(self, reason: ByeReason) -> None:
        """It is leaving on its own (``Bye``), after its run if it has one."""
        self.leaving(reason)
        if self.active:
            self._state = ChildState.RETIRING

    def leaving(self, reason: ByeReason) -> None:
        """Why it leaves, if nothing said so before (the first reason stands)."""
        self.bye_reason = self.bye_reason or reason

    def reaped(self) -> Run | None:
        """It exited. Returns the run handed to it that it never started (it
        was still in the channel, behind the one settling, or not even
        delivered), for another child to take; ``run`` is then the one it
        was settling, if any: the run its death is about."""
        if self._finishing_run is None and self._delivered:
            return None
        unstarted, self._run, self._finishing_run = self._run, self._finishing_run, None
        return unstarted

    def in_flight(self) -> list[StepInFlight]:
        """Every step the child is executing, oldest first (parallel branches
        may run several), from its step board."""
        if self.board is None or self._run is None:
            return []
        steps = []
        for entry in self.board.read():
            try:
                step = build(StepInFlight, entry)
            except ProtocolError:
                continue
            if step.run == self._run.id:
                steps.append(step)
        return steps

    def process(self) -> psutil.Process:
        if self._process is None:
            self._process = psutil.Process(self.pid)
        return self._process

    def usage(self) -> dict[str, Any]:
        """Its memory (``MemorySampler``: RSS now, USS and PSS at most
        ``memory.FULL_EVERY`` seconds old), and CPU% over the last window of
        at least ``CPU_WINDOW`` (``CpuSampler``), from psutil."""
        now = time.monotonic()
        try:
            process = self.process()
            with process.oneshot():
                memory = self._memory.sample(process, now)
                times = process.cpu_times()
            cpu = self._cpu.sample(now, times.user + times.system)
        except (psutil.Error, OSError):
            memory, cpu = self._memory.last or Footprint(rss=self.owned), self._cpu.percent
        return {"rss": memory.rss, "uss": memory.uss, "pss": memory.pss, "cpu_percent": cpu}


def describe_exit(status: int, kill_reason: KillReason | None = None) -> tuple[str, bool]:
    """How a child ended, from its wait status, and whether a signal killed
    it. A kill the supervisor made says why; only a SIGKILL nobody here sent
    gets the out-of-memory hint."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        if kill_reason is not None and sig == signal.SIGKILL:
            return f"killed by SIGKILL ({kill_reason.describe()})", True
        hint = " (out of memory?)" if sig == signal.SIGKILL else ""
        return f"killed by {name}{hint}", True
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}", False
    return f"wait status {status}", False
