"""Queues: their settings and what they hold (migration 0007).

Settings change in one transaction under the queue row's lock
(``update_queue``): concurrent operators serialise, none loses another's
change, and a crash mid-change leaves the settings as they were. The
counts here are scans for operators and metrics; the limits themselves are
enforced by the claim (``execution``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ...queues import QueueInfo, QueueSettings
from .core import Row, StoreCore
from .values import float_or_none, int_or_none


class Queues(StoreCore):
    """Queue settings, and counts of the runs they hold."""

    @classmethod
    def _queue_settings(cls, row: Row) -> QueueSettings:
        return QueueSettings(
            name=row["name"], concurrency=int_or_none(row["concurrency"]),
            key_concurrency=int_or_none(row["key_concurrency"]), rate_limit=int_or_none(row["rate_limit"]),
            rate_period=float_or_none(row["rate_period"]), paused=bool(row["paused"]),
        )

    def update_queue(self, name: str, change: Callable[[QueueSettings], QueueSettings]) -> QueueSettings:
        """Change a queue's settings under its row lock: ``change`` gets the
        current ones (defaults for a queue without a row) and returns the new."""
        with self.connection() as conn, self._transaction(conn):
            row = conn.execute(self.sql["lock_queue"], {"name": name}).fetchone()
            current = self._queue_settings(row) if row is not None else QueueSettings(name)
            new = change(current)
            conn.execute(self.sql["put_queue"], self._params(
                name=name, concurrency=new.concurrency, key_concurrency=new.key_concurrency,
                rate_limit=new.rate_limit, rate_period=new.rate_period, paused=new.paused))
        return new

    def queue_settings(self) -> dict[str, QueueSettings]:
        """The queues that have a row (limits or a pause flag), by name."""
        return {row["name"]: self._queue_settings(row) for row in self._fetchall("queue_settings", {})}

    def queue_has_runs(self, name: str) -> bool:
        """Whether any run, in any status, is in queue ``name``."""
        return self._fetchone("queue_has_runs", {"name": name}) is not None

    def queues(self) -> list[QueueInfo]:
        """Every queue that has settings or runs scheduled, running or
        blocked, with its counts (a scan of those runs: for operators and
        metrics, not for claims)."""
        settings = self.queue_settings()
        found: dict[str, QueueInfo] = {}
        for row in self._fetchall("queue_counts", self._params()):
            name = row["queue"]
            found[name] = QueueInfo(
                settings=settings.get(name, QueueSettings(name)), pending=int(row["pending"] or 0),
                waiting=int(row["waiting"] or 0), running=int(row["running"] or 0),
                blocked=int(row["blocked"] or 0),
                oldest_pending_age_seconds=max(float(row["oldest_age"] or 0.0), 0.0),
            )
        for name, queue in settings.items():
            found.setdefault(name, QueueInfo(settings=queue))
        return [found[name] for name in sorted(found)]

    def count_scheduled(self, names: Sequence[str]) -> int:
        row = self._fetchone("count_scheduled", {"names": self._names(names)})
        assert row is not None
        return int(row["scheduled"])

    def queue_stats(self) -> dict[str, float]:
        """Counts of scheduled, running and blocked runs and the age in seconds
        of the oldest scheduled one (0 when the queue is empty)."""
        row = self._fetchone("queue_stats", self._params())
        assert row is not None
        return {
            "pending": int(row["pending"]),
            "waiting": int(row["waiting"]),
            "running": int(row["running"]),
            "blocked": int(row["blocked"]),
            "oldest_pending_age_seconds": max(float(row["oldest_age"] or 0.0), 0.0),
        }
