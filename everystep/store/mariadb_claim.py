"""The MariaDB claim with queue limits (``queue_claim.QueueClaim``).

It runs in the claim's transaction at READ COMMITTED. A limited queue is
claimed from only under its ``everystep_queue`` row's lock, taken ``FOR
UPDATE SKIP LOCKED`` and held to the commit: each statement after it reads
what is committed, so the running count and the rate window include every
claim made before, and no other claimer can claim from that queue until
this one commits (it skips the queue and serves the others meanwhile). Runs
are taken ``FOR UPDATE SKIP LOCKED`` too, so claimers never wait on each
other. List parameters are tuples (``IN %(names)s``); times are the
database's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..queues import QueueSettings
from .queue_claim import QueueClaim, Row


class MariaDBClaim(QueueClaim):
    """One claim: ``run()`` returns the claimed rows."""

    def listed(self, values: Sequence[str]) -> Any:
        # An empty IN list is a syntax error; no queue, key or id is "".
        return tuple(values) or ("",)

    def given_queues(self) -> list[str] | None:
        queues = self.params["queues"]
        return None if queues is None else [name for name in queues if name]

    def given_names(self) -> list[str]:
        return [name for name in self.params["names"] if name]

    def take(self, queue: QueueSettings, priority: int, want: int) -> list[Row]:
        names = list(dict.fromkeys(self.given_names()))
        if len(names) != 1:
            return super().take(queue, priority, want)
        # One served name: one round trip, its runs locked by the scan itself.
        return self._rows("claim", queue=queue.name, priority=priority, name=names[0], limit=want)

    def all_queues(self) -> list[str]:
        # One index probe per queue, each a round trip: a DISTINCT is a
        # loose index scan only when the server's statistics say so, and
        # otherwise reads every scheduled run.
        names: list[str] = []
        while (row := self.conn.execute(self.sql["claim_next_queue"], {"after": names[-1] if names else ""})
               .fetchone()) is not None:
            names.append(row["queue"])
        return names

    def lock(self, queue: QueueSettings) -> QueueSettings | None:
        row = self.conn.execute(self.sql["claim_lock_queue"], {
            "queue": queue.name, "concurrency": queue.concurrency}).fetchone()
        if row is None:
            return None  # at its limit, or another claimer holds it
        locked = self.settings_of(row)
        return None if locked.paused or locked.concurrency == 0 else locked

    def prune_rate(self, queue: QueueSettings) -> None:
        assert queue.rate_period is not None
        self.conn.execute(self.sql["queue_rate_prune"], {
            "queue": queue.name, "period_us": int(round(queue.rate_period * 1_000_000))})
