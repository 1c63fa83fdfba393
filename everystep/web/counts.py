"""Runs per status for the console, at a cost that does not grow with history.

An open runs page refreshes its counts twice a second. ``count(*)`` over a
table of millions of finished runs would cost a full scan each time, so:

- **Active statuses** (``models.ACTIVE_STATUSES``: scheduled, running, blocked): exact, on
  every refresh, counting along their indexes (the partial indexes of
  scheduled and running runs, the status index for blocked) and stopping at
  ``ACTIVE_CAP`` rows. Above the cap the count comes from one full count of
  that status, repeated at most every ``SLOW_TTL`` seconds (``exact`` is
  then false: it may be that old).
- **Finished statuses** (everything else), by the size of the table (the
  planner's estimate on PostgreSQL, else the last exact total): under
  ``SMALL_TABLE`` rows an exact ``GROUP BY`` on every refresh (a few
  milliseconds); under ``EXACT_BELOW`` the same, at most every
  ``FINISHED_TTL`` seconds; above that, on PostgreSQL, the planner's own
  statistics (the table's estimated rows times each status's frequency,
  kept current by autovacuum's ANALYZE), read at most every
  ``FINISHED_TTL`` seconds and marked estimated. SQLite keeps no such
  statistics: above ``SMALL_TABLE`` its finished counts are exact
  ``GROUP BY`` results at most ``FINISHED_TTL`` seconds old.

Every count says whether it is exact and how old it is, and the console
shows estimated ones with "≈".
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from ..models import ACTIVE_STATUSES, RUN_STATUSES
from ..store import Store

ACTIVE = ACTIVE_STATUSES
ACTIVE_CAP = 10_000
SMALL_TABLE = 20_000
EXACT_BELOW = 200_000
FINISHED_TTL = 30.0
SLOW_TTL = 30.0


@dataclass(frozen=True)
class Count:
    status: str
    count: int
    exact: bool
    #: Seconds since the figure was taken from the database.
    age: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "count": self.count, "exact": self.exact, "age": round(self.age, 1)}


class StatusCounts:
    """The policy above, with its caches; safe to share between threads."""

    def __init__(self, store: Store, clock: Any = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self._lock = threading.Lock()
        # (taken at, counts, exact, rows in the table then)
        self._finished: tuple[float, dict[str, int], bool, float] | None = None
        self._slow: dict[str, tuple[float, int]] = {}

    def counts(self) -> list[Count]:
        now = self.clock()
        out = [self._active(status, now) for status in ACTIVE]
        finished_at, finished, exact, _ = self._finished_counts(now)
        for status in RUN_STATUSES:
            if status not in ACTIVE:
                out.append(Count(status, finished.get(status, 0), exact, now - finished_at))
        return out

    def _active(self, status: str, now: float) -> Count:
        counted = self.store.count_status_upto(status, ACTIVE_CAP + 1)
        if counted <= ACTIVE_CAP:
            return Count(status, counted, True)
        with self._lock:
            cached = self._slow.get(status)
        if cached is None or now - cached[0] >= SLOW_TTL:
            total = self.store.count_status_upto(status, 2**62)
            cached = (now, total)
            with self._lock:
                self._slow[status] = cached
        return Count(status, max(cached[1], ACTIVE_CAP + 1), False, now - cached[0])

    def _finished_counts(self, now: float) -> tuple[float, dict[str, int], bool, float]:
        with self._lock:
            cached = self._finished
        if cached is not None and cached[3] >= SMALL_TABLE and now - cached[0] < FINISHED_TTL:
            return cached
        estimate = self.store.estimate_statuses()
        if estimate is not None and estimate[0] >= EXACT_BELOW:
            rows, shares = estimate
            counts = {status: int(round(rows * share)) for status, share in shares.items()}
            cached = (now, counts, False, rows)
        else:
            counts = self.store.count_statuses()
            cached = (now, counts, True, max(float(sum(counts.values())), estimate[0] if estimate else 0.0))
        with self._lock:
            self._finished = cached
        return cached

    def invalidate(self) -> None:
        """Forget cached figures (after an action changed a run's status)."""
        with self._lock:
            self._finished = None
            self._slow.clear()


__all__ = ["ACTIVE_CAP", "Count", "EXACT_BELOW", "SMALL_TABLE", "StatusCounts"]
