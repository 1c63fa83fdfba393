"""What the supervisor parent knows about each child process."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any

import psutil

from everystep.models import Run

from .protocol import Channel
from .stepboard import StepBoard

# Child states, as shown by ``ctl status``.
BOOTING = "booting"      # forked, not yet ready
IDLE = "idle"            # waiting for a run
BUSY = "busy"            # executing a run
FINISHING = "finishing"  # its run's terminal write is under way: can take the next run
RETIRING = "retiring"    # exits when its run ends (scale down)
STOPPING = "stopping"    # SIGTERM sent: drains at the next step boundary
KILLED = "killed"        # SIGKILL sent, waiting to be reaped


@dataclass
class StepInFlight:
    step_id: str
    name: str
    started: float
    timeout: float | None
    unsafe: bool

    def overdue(self, now: float) -> bool:
        return self.timeout is not None and now - self.started >= self.timeout


@dataclass(eq=False)
class Child:
    slot: int
    pid: int
    channel: Channel
    spawned: float
    state: str = BOOTING
    run: Run | None = None
    finishing_run: Run | None = None  # settling while ``run`` waits in the channel
    run_started: float | None = None
    board: StepBoard | None = None
    #: Steps with a deadline, announced by message as they start; every step
    #: in flight, timed or not, is on ``board``.
    steps: dict[str, StepInFlight] = field(default_factory=dict)
    runs_done: int = 0
    rss: int = 0
    kill_reason: str | None = None
    overdue_steps: list[StepInFlight] = field(default_factory=list)
    bye_reason: str | None = None
    channel_open: bool = True
    _process: psutil.Process | None = None

    @property
    def active(self) -> bool:
        """Counts toward ``--procs`` (not on its way out)."""
        return self.state in (BOOTING, IDLE, BUSY, FINISHING)

    def in_flight(self) -> list[dict[str, Any]]:
        """Every step the child is executing, oldest first (parallel branches
        may run several): ``run``, ``step``, ``name``, ``since`` (epoch
        seconds), ``unsafe``."""
        if self.board is None or self.run is None:
            return []
        return [step for step in self.board.read() if step.get("run") == self.run.id]

    def kill(self, reason: str) -> None:
        """SIGKILL the child's whole process group (steps may have spawned
        grandchildren); the parent acts on the death when it reaps it."""
        if self.kill_reason is None:
            self.kill_reason = reason
        self.state = KILLED
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass

    def terminate(self) -> None:
        """SIGTERM: drain at the next step boundary, then exit."""
        if self.state == KILLED:
            return
        self.state = STOPPING
        try:
            os.kill(self.pid, signal.SIGTERM)
        except OSError:
            pass

    def usage(self) -> dict[str, Any]:
        """RSS and CPU% (since the previous call) from psutil."""
        try:
            if self._process is None:
                self._process = psutil.Process(self.pid)
            with self._process.oneshot():
                return {"rss": self._process.memory_info().rss, "cpu_percent": self._process.cpu_percent(None)}
        except (psutil.Error, OSError):
            return {"rss": self.rss, "cpu_percent": None}


def describe_exit(status: int) -> tuple[str, bool]:
    """Human description of a wait status, and whether it was a signal death."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        hint = " (out of memory?)" if sig == signal.SIGKILL else ""
        return f"killed by {name}{hint}", True
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}", False
    return f"wait status {status}", False
