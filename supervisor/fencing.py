"""Finding the children whose run was taken from them, so the arbiter kills them.

Every write an execution makes carries its claim (claimer and epoch), so a
stale child can write nothing; but it may be in the middle of a long step,
or about to start an unsafe one whose ``started`` insert will be refused.
The supervisor stops it at once instead: when it re-claims a run an older
child still executes (``older_executions``), and whenever the database says
a held run moved on (``FenceWatch.check``): every heartbeat period, and at
once on a fence notification (PostgreSQL). A run that reached a terminal
status is left alone: its child is merely reporting late.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from everystep.errors import EverystepError
from everystep.models import Run
from everystep.store import Store

from .children import Child

logger = logging.getLogger("everystep.supervisor")

Execution = tuple[Child, Run]


def older_executions(executing: Sequence[Execution], run: Run) -> list[Execution]:
    """Children executing ``run`` under a claim older than the one just made."""
    return [(kid, held) for kid, held in executing if held.id == run.id and held.claim_epoch < run.claim_epoch]


class FenceWatch:
    def __init__(self, store: Store, name: str, every: float) -> None:
        self.store = store
        self.name = name
        self.every = every
        self.next_at = 0.0

    def wake(self) -> None:
        """Check at the next tick (a fence notification, a reconnection)."""
        self.next_at = 0.0

    def check(self, now: float, executing: Sequence[Execution], ready: Sequence[Run]) -> tuple[
            list[Execution], list[Run]]:
        """The executions to kill and the claimed-but-undispatched runs to
        drop, because their claim moved on. Database trouble: nothing (the
        next heartbeat period tries again)."""
        self.next_at = now + self.every
        ids = [run.id for _, run in executing] + [run.id for run in ready]
        if not ids:
            return [], []
        try:
            states = self.store.claim_states(ids)
        except EverystepError as exc:
            logger.debug("everystep-supervisor %s: fence check failed: %s", self.name, exc)
            return [], []

        def taken(run: Run) -> bool:
            state = states.get(run.id)
            return state is not None and state.moved_on_from(run.claim_as(self.name))

        return [(kid, run) for kid, run in executing if taken(run)], [run for run in ready if taken(run)]
