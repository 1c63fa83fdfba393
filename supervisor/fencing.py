"""Finding the children whose run was taken from them or cancelled, and killing them.

Every write an execution makes carries its claim (claimer and epoch), so a
stale child can write nothing; but it may be in the middle of a long step,
or about to start an unsafe one whose ``started`` insert will be refused.
The supervisor kills it at once instead: when it re-claims a run an older
child still executes (``fence_older``), and whenever the database says
a held run moved on or was cancelled (``FenceWatch.enforce``): at once on a
fence notification (PostgreSQL), else every heartbeat period while
notifications arrive, every poll when they cannot (SQLite, or LISTEN down):
that is how a cancel reaches the child within a poll interval there. A run
that reached a terminal status is left alone: its child is merely
reporting late.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from everystep.errors import EverystepError
from everystep.models import Run
from everystep.store import Store

from .children import Child
from .states import ChildState, KillReason

logger = logging.getLogger("everystep.supervisor")

Execution = tuple[Child, Run]


def executing(children: Iterable[Child], settling: bool = False) -> list[Execution]:
    """Children and the run each is executing now; unless ``settling``,
    not one whose terminal write is under way."""
    return [(kid, kid.executing) for kid in children
            if kid.executing is not None and (settling or kid.state != ChildState.FINISHING)]


def older_executions(executing: Sequence[Execution], run: Run) -> list[Execution]:
    """Children executing ``run`` under a claim older than the one just made."""
    return [(kid, held) for kid, held in executing if held.id == run.id and held.claim_epoch < run.claim_epoch]


@dataclass(frozen=True)
class Verdict:
    """What a check found: executions to kill because their run was taken
    (``stale``) or cancelled (``cancelled``: the step cut off is recorded
    ``Cancelled``), and claimed runs not yet dispatched to drop."""

    stale: list[Execution] = field(default_factory=list)
    cancelled: list[Execution] = field(default_factory=list)
    dropped: list[Run] = field(default_factory=list)


class FenceWatch:
    def __init__(self, store: Store, name: str, every: float) -> None:
        self.store = store
        self.name = name
        self.every = every
        self.next_at = 0.0
        self.who = f"everystep-supervisor {name}"

    def wake(self) -> None:
        """Check at the next tick (a fence notification, a reconnection)."""
        self.next_at = 0.0

    def check(self, now: float, executing: Sequence[Execution], ready: Sequence[Run],
              every: float | None = None) -> Verdict:
        """Ask the database where the runs held here stand. ``every``
        overrides the period until the next check (a poll interval, where
        no notification can say a run was cancelled). Database trouble:
        nothing (the next check tries again)."""
        self.next_at = now + (self.every if every is None else every)
        ids = [run.id for _, run in executing] + [run.id for run in ready]
        if not ids:
            return Verdict()
        try:
            states = self.store.claim_states(ids)
        except EverystepError as exc:
            logger.debug("%s: fence check failed: %s", self.who, exc)
            return Verdict()

        def taken(run: Run) -> bool:
            state = states.get(run.id)
            return state is not None and state.moved_on_from(run.claim_as(self.name))

        def cancelled(run: Run) -> bool:
            state = states.get(run.id)
            return state is not None and state.cancelled_under(run.claim_as(self.name))

        return Verdict(
            stale=[(kid, run) for kid, run in executing if not cancelled(run) and taken(run)],
            cancelled=[(kid, run) for kid, run in executing if cancelled(run)],
            dropped=[run for run in ready if taken(run)],
        )

    def fence_older(self, children: Iterable[Child], run: Run) -> None:
        """``run`` was just claimed: kill any child still executing an older claim of it."""
        for kid, held in older_executions(executing(children), run):
            self._kill_fenced(kid, held, f"re-claimed at epoch {run.claim_epoch}")

    def enforce(self, now: float, children: Iterable[Child], ready: Sequence[Run],
                every: float | None = None) -> list[Run]:
        """``check``, then kill the children whose run was taken or
        cancelled; returns the claimed runs not yet dispatched to drop."""
        verdict = self.check(now, executing(children), ready, every)
        for kid, run in verdict.cancelled:
            logger.warning("%s: run %s was cancelled; killing child %d (pid %d)", self.who, run.id, kid.slot,
                           kid.pid, extra={"run_id": run.id, "child_pid": kid.pid, "event": "cancel_kill"})
            kid.kill(KillReason.CANCELLED)
        for kid, run in verdict.stale:
            self._kill_fenced(kid, run, "its claim moved on")
        return verdict.dropped

    def _kill_fenced(self, kid: Child, run: Run, why: str) -> None:
        logger.warning("%s: run %s was taken from this execution (%s); killing child %d (pid %d)",
                       self.who, run.id, why, kid.slot, kid.pid,
                       extra={"run_id": run.id, "child_pid": kid.pid, "event": "fenced"})
        kid.kill(KillReason.FENCED)
