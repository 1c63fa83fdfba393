"""The supervisor's vocabulary, said once: what a child is doing, why it was
killed, why it left, why it was replaced, how the supervisor is stopping.

Run statuses, step statuses and what one execution of a run came to are the
engine's (``everystep.models.RunStatus``, ``StepStatus``,
``everystep.runner.Outcome``).
"""

from __future__ import annotations

from enum import StrEnum


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


class RestartReason(StrEnum):
    """Label of ``everystep_supervisor_child_restarts_total``."""

    EXIT = "exit"
    CRASH = "crash"
    RECYCLE = "recycle"
    TIMEOUT = "timeout"
    KILL = "kill"
    FENCED = "fenced"
    CANCELLED = "cancelled"
    RESOURCE = "resource"  # a step went over its budget, or the kernel ran out of memory for it


class StopMode(StrEnum):
    DRAIN = "drain"  # TERM/INT: finish steps in flight, requeue at the boundary
    QUIT = "quit"    # QUIT (or a second INT): kill and requeue now


__all__ = ["ByeReason", "ChildState", "KillReason", "RestartReason", "StopMode"]
