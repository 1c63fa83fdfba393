"""The supervisor's vocabulary, said once: what a child is doing, why it was
killed, why it left, how the supervisor is stopping, and what a step in
flight is.

Run statuses, step statuses and what one execution of a run came to are the
engine's (``everystep.models.RunStatus``, ``StepStatus``, ``Outcome``); the
words the library speaks about the supervisor too (its commands, why it
replaces a child) are in ``everystep.vocabulary``, re-exported here.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from enum import StrEnum

from everystep.store import utcnow

from everystep.vocabulary import Command, RestartReason


class ChildState(StrEnum):
    """A child process as ``ctl status`` shows it."""

    BOOTING = "booting"      # forked, not yet ready
    IDLE = "idle"            # waiting for a run
    BUSY = "busy"            # executing a run
    FINISHING = "finishing"  # its run's terminal write is under way: can take the next run
    RETIRING = "retiring"    # exits when its run ends (scale down, asked to leave)
    STOPPING = "stopping"    # SIGTERM sent: drains at the next step boundary
    KILLED = "killed"        # SIGKILL sent, waiting to be reaped

    @property
    def active(self) -> bool:
        """Counts toward ``--procs`` (not on its way out)."""
        return self in (ChildState.BOOTING, ChildState.IDLE, ChildState.BUSY, ChildState.FINISHING)

    @property
    def available(self) -> bool:
        """Can be handed a run now (a finishing child reads it once its
        terminal write is done)."""
        return self in (ChildState.IDLE, ChildState.FINISHING)


class KillReason(StrEnum):
    """Why the parent SIGKILLed a child: what its death means for its run."""

    TIMEOUT = "timeout"              # a step ran past its deadline
    KILL = "kill"                    # ctl kill: the step in flight fails with StepKilled
    KILL_REQUEUE = "kill-requeue"    # ctl kill --requeue
    FENCED = "fenced"                # its run was taken from it (a newer claim)
    CANCELLED = "cancelled"          # an operator cancelled its run: the step in flight fails with Cancelled
    DRAIN_DEADLINE = "drain-deadline"
    QUIT = "quit"                    # SIGQUIT: fast stop
    SHUTDOWN = "shutdown"            # whatever is left when the loop ends
    UNRESPONSIVE = "unresponsive"    # stopped reading its channel
    RESOURCE = "resource"            # a step went over its memory or CPU budget

    def describe(self) -> str:
        return _KILL_DESCRIPTIONS[self]


_KILL_DESCRIPTIONS = {
    KillReason.TIMEOUT: "a step ran past its timeout",
    KillReason.KILL: "ctl kill",
    KillReason.KILL_REQUEUE: "ctl kill --requeue",
    KillReason.FENCED: "its run was taken from it",
    KillReason.CANCELLED: "its run was cancelled",
    KillReason.DRAIN_DEADLINE: "the drain deadline passed",
    KillReason.QUIT: "fast stop (SIGQUIT)",
    KillReason.SHUTDOWN: "supervisor shutdown",
    KillReason.UNRESPONSIVE: "it stopped reading its channel",
    KillReason.RESOURCE: "a step went over its resource budget",
}


class ByeReason(StrEnum):
    """Why a child said it is leaving on its own."""

    DRAIN = "drain"            # SIGTERM, or its parent died
    RELOAD = "reload"          # replaced with freshly imported code
    SCALE = "scale"            # one child fewer
    MAX_RUNS = "max-runs"      # --max-runs-per-child
    MAX_MEMORY = "max-memory"  # --max-memory-per-child
    EXIT = "exit"              # asked to, for no more specific reason

    @property
    def recycles(self) -> bool:
        return self in (ByeReason.RELOAD, ByeReason.MAX_RUNS, ByeReason.MAX_MEMORY)

    @classmethod
    def parse(cls, text: str) -> ByeReason:
        """The reason a message gives; one this side does not know (a child
        or parent of another version) reads as a plain ``EXIT``."""
        try:
            return cls(text)
        except ValueError:
            return cls.EXIT


class StopMode(StrEnum):
    DRAIN = "drain"  # TERM/INT: finish steps in flight, requeue at the boundary
    QUIT = "quit"    # QUIT (or a second INT): kill and requeue now




@dataclass(frozen=True)
class StepInFlight:
    """A step a child is executing: on its step board (every step) and in a
    ``StepStarted`` message (steps with a deadline). ``started`` is
    ``time.monotonic()`` in the child; the clock is system-wide on Linux, so
    the parent compares it with its own. Here, not in ``protocol``, because
    it is what the supervisor knows of a step, which ``fate`` decides on,
    whatever carried it."""

    run: str
    step: str
    name: str
    started: float
    timeout: float | None = None
    unsafe: bool = False
    #: Which attempt of the step this is, and what a timeout of it leads to:
    #: the next attempt ``retry_in`` seconds later, or (None) a final failure.
    attempt: int = 1
    retry_in: float | None = None
    #: A bounded step's budget (``supervisor.meter.Budget``): bytes it may
    #: add to its process and CPU seconds it may use, and the process's CPU
    #: seconds and memory bytes as it started (cgroup figures where the
    #: child has a cgroup that counts them, else the process's own).
    memory_limit: int | None = None
    cpu_limit: float | None = None
    cpu_start: float | None = None
    memory_start: int | None = None

    def overdue(self, now: float) -> bool:
        return self.timeout is not None and now - self.started >= self.timeout

    @property
    def bounded(self) -> bool:
        return self.memory_limit is not None or self.cpu_limit is not None

    def started_at(self, now: float | None = None) -> dt.datetime:
        """When the step started, by the wall clock (``started`` read
        against ``time.monotonic()``): what a record written for it from
        outside (killed, timed out, cancelled) gives as its start."""
        elapsed = max((time.monotonic() if now is None else now) - self.started, 0.0)
        return utcnow() - dt.timedelta(seconds=elapsed)


__all__ = ["ByeReason", "ChildState", "Command", "KillReason", "RestartReason", "StepInFlight", "StopMode"]
