"""What the supervisor parent knows about each child process."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any

import psutil

from everystep.models import Run

from .cgroups import ChildGroup
from .fate import Overrun
from .protocol import Channel, ProtocolError, StepInFlight, build
from .stepboard import StepBoard
from .states import ByeReason, ChildState, KillReason


@dataclass(eq=False)
class Child:
    slot: int
    pid: int
    channel: Channel
    spawned: float
    state: ChildState = ChildState.BOOTING
    run: Run | None = None
    finishing_run: Run | None = None  # settling while ``run`` waits in the channel
    run_started: float | None = None
    board: StepBoard | None = None
    #: Steps with a deadline or a budget, announced by message as they start;
    #: every step in flight, timed or not, is on ``board``.
    timed_steps: dict[str, StepInFlight] = field(default_factory=dict)
    runs_done: int = 0
    rss: int = 0
    kill_reason: KillReason | None = None
    overdue_steps: list[StepInFlight] = field(default_factory=list)
    bye_reason: ByeReason | None = None
    channel_open: bool = True
    #: The last run handed over has left the parent's buffer entirely (until
    #: then the child cannot have started it).
    delivered: bool = True
    #: Its own cgroup, if it has one (``budgets.py``).
    group: ChildGroup | None = None
    #: The budget one of its steps went over, when the parent killed it for that.
    overrun: Overrun | None = None
    #: The host's OOM-kill count when it was handed its run (without a cgroup).
    oom_baseline: int | None = None
    _process: psutil.Process | None = None

    @property
    def active(self) -> bool:
        return self.state.active

    @property
    def executing(self) -> Run | None:
        """The run this child executes now (not one merely queued in its
        channel behind a run it is finishing)."""
        if self.finishing_run is not None or self.state == ChildState.KILLED:
            return None
        return self.run

    def in_flight(self) -> list[StepInFlight]:
        """Every step the child is executing, oldest first (parallel branches
        may run several), from its step board."""
        if self.board is None or self.run is None:
            return []
        steps = []
        for entry in self.board.read():
            try:
                step = build(StepInFlight, entry)
            except ProtocolError:
                continue
            if step.run == self.run.id:
                steps.append(step)
        return steps

    def kill(self, reason: KillReason) -> None:
        """SIGKILL the child's whole process group (steps may have spawned
        grandchildren); the parent acts on the death when it reaps it."""
        if self.kill_reason is None:
            self.kill_reason = reason
        self.state = ChildState.KILLED
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass

    def terminate(self) -> None:
        """SIGTERM: drain at the next step boundary, then exit."""
        if self.state == ChildState.KILLED:
            return
        self.state = ChildState.STOPPING
        try:
            os.kill(self.pid, signal.SIGTERM)
        except OSError:
            pass

    def process(self) -> psutil.Process:
        if self._process is None:
            self._process = psutil.Process(self.pid)
        return self._process

    def usage(self) -> dict[str, Any]:
        """RSS and CPU% (since the previous call) from psutil."""
        try:
            process = self.process()
            with process.oneshot():
                return {"rss": process.memory_info().rss, "cpu_percent": process.cpu_percent(None)}
        except (psutil.Error, OSError):
            return {"rss": self.rss, "cpu_percent": None}


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
