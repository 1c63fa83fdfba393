"""Retention: deleting finished runs and their steps (``everystep prune``).

Each batch is one short transaction that deletes a run's steps with the
run, so a crash between batches leaves whole runs, never a run without its
steps. The statements refuse active runs (``models.ACTIVE_STATUSES``)
whatever they are asked for, and on PostgreSQL skip the rows an operator
command holds locked.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from .core import StoreCore


class Retention(StoreCore):
    """Counting and deleting finished runs in bounded batches."""

    def count_prunable(self, cutoff: dt.datetime, statuses: Sequence[str]) -> tuple[int, int]:
        """How many runs (and their steps) ``prune_batch`` would delete:
        finished before ``cutoff`` in one of ``statuses``."""
        params = {"cutoff": self._time_param(cutoff), "statuses": self._names(statuses)}
        row = self._fetchone("prune_count", params)
        assert row is not None
        return int(row["runs"]), int(row["steps"] or 0)

    def prune_batch(self, cutoff: dt.datetime, statuses: Sequence[str], limit: int) -> tuple[int, int]:
        """Delete up to ``limit`` runs finished before ``cutoff`` in one of
        ``statuses``, and their steps, in one short transaction; returns
        (runs, steps) deleted. The statements themselves refuse scheduled,
        running and blocked runs whatever ``statuses`` says; on PostgreSQL
        the runs are locked ``SKIP LOCKED``, so an operator command holding
        one is never waited for."""
        params = {"cutoff": self._time_param(cutoff), "statuses": self._names(statuses), "limit": limit}
        with self.connection() as conn, self._transaction(conn):
            ids = [str(row["id"]) for row in conn.execute(self.sql["prune_pick"], params).fetchall()]
            if not ids:
                return 0, 0
            chosen = {"ids": self._names(ids)}
            steps = conn.execute(self.sql["prune_steps"], chosen).rowcount
            runs = conn.execute(self.sql["prune_runs"], chosen).rowcount
        return int(runs), int(steps)
