"""The SQLite claim with queue limits (``queue_claim.QueueClaim``).

It runs inside the claim's ``BEGIN IMMEDIATE``: every claimer holds the
database's write lock from its first read to its commit, so the counts it
reads (running runs, recent claims) cannot change under it and two claimers
can never pass a limit together; a queue needs no lock of its own. List
parameters are JSON arrays (``json_each``); times are the claim's ``now``,
read under the write lock.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from ..queues import QueueSettings
from .queue_claim import QueueClaim, Row


class SQLiteClaim(QueueClaim):
    """One claim: ``run()`` returns the claimed rows."""

    def listed(self, values: Sequence[str]) -> Any:
        return json.dumps(list(values))

    def given_queues(self) -> list[str] | None:
        queues = self.params["queues"]
        return None if queues is None else list(json.loads(queues))

    def given_names(self) -> list[str]:
        return list(json.loads(self.params["names"]))

    def take(self, queue: QueueSettings, priority: int, want: int) -> list[Row]:
        # One statement: under the write lock no run is held by another
        # claimer, and SQLite probes each served name within it.
        return self._rows("claim", queue=queue.name, priority=priority, limit=want)

    def lock(self, queue: QueueSettings) -> QueueSettings | None:
        return queue  # the write lock is held already

    def prune_rate(self, queue: QueueSettings) -> None:
        assert queue.rate_period is not None
        since = dt.datetime.fromisoformat(self.params["now"]) - dt.timedelta(seconds=queue.rate_period)
        self.conn.execute(self.sql["queue_rate_prune"], {"queue": queue.name,
                                                         "since": since.isoformat(timespec="microseconds")})
