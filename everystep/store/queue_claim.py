"""A claim with queue limits, step by step, for the backends whose claim is
not one database function (SQLite, MariaDB): PostgreSQL's ``everystep_claim``
(migration 0007; 0009 added a fast path for queues without limits, the same
steps minus the limits) in Python, each step a named statement of the backend.

It runs inside the claim's transaction. The steps: the served queues minus
the paused ones (and those limited to 0), in a random order; a fair share of
the batch for each, then what is left for those that filled their share;
within a queue, one priority at a time along the claim index, each scan
bounded by the due time. A queue with limits is claimed from only once
``lock`` has it: what makes the counts read after it (running runs, recent
claims) hold until the commit, so two claimers can never pass a limit
together. How a backend locks, and how it sends a list, is its subclass's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..queues import QueueSettings

Row = Mapping[str, Any]

#: How many candidates a key-limited queue reads per run it may still take:
#: runs of keys at their limit are skipped by the scan itself, but several
#: runs of one key may head the queue.
KEY_WINDOW = 8
_ABOVE_EVERY_PRIORITY = 2**40


class QueueClaim:
    """One claim: ``run()`` returns the claimed rows."""

    def __init__(self, conn: Any, sql: Mapping[str, str], params: dict[str, Any],
                 settings_of: Callable[[Row], QueueSettings]) -> None:
        self.conn = conn
        self.sql = sql
        self.params = params
        self.settings_of = settings_of

    # -- what each backend says its own way ------------------------------------

    def listed(self, values: Sequence[str]) -> Any:
        """A list parameter as the backend's statements take it."""
        raise NotImplementedError

    def given_queues(self) -> list[str] | None:
        """The ``queues`` parameter back as a list (None: every queue)."""
        raise NotImplementedError

    def lock(self, queue: QueueSettings) -> QueueSettings | None:
        """Hold a limited queue until the commit: its settings as they are
        now, or None to skip it (paused meanwhile, or busy with another
        claimer)."""
        raise NotImplementedError

    def prune_rate(self, queue: QueueSettings) -> None:
        """Forget the claims older than the queue's rate window."""
        raise NotImplementedError

    # -- the claim -------------------------------------------------------------

    def _rows(self, name: str, **extra: Any) -> list[Row]:
        return self.conn.execute(self.sql[name], {**self.params, **extra}).fetchall()  # type: ignore[no-any-return]

    def served(self) -> list[QueueSettings]:
        """The queues to claim from with their settings, paused ones and
        those limited to 0 left out, shuffled."""
        found = [queue for queue in self.candidates() if not queue.paused and queue.concurrency != 0]
        random.shuffle(found)
        return found

    def candidates(self) -> list[QueueSettings]:
        """The queues given, or every queue holding scheduled runs, with
        their settings."""
        names = self.given_queues()
        if names is None:
            names = self.all_queues()
        settings = self.settings(names)
        return [settings.get(name, QueueSettings(name)) for name in names]

    def all_queues(self) -> list[str]:
        """Every queue holding scheduled runs."""
        return [row["queue"] for row in self._rows("claim_all_queues")]

    def settings(self, queues: list[str]) -> dict[str, QueueSettings]:
        if not queues:
            return {}
        rows = self._rows("claim_queue_settings", queues=self.listed(queues))
        return {row["name"]: self.settings_of(row) for row in rows}

    def run(self) -> list[Row]:
        queues = self.served()
        left = int(self.params["limit"])
        claimed: list[Row] = []
        for first_round in (True, False):
            full = []
            for index, queue in enumerate(queues):
                if left <= 0:
                    break
                share = math.ceil(left / (len(queues) - index)) if first_round else left
                rows = self.from_queue(queue, share)
                claimed += rows
                left -= len(rows)
                if len(rows) == share:
                    full.append(queue)
            if left <= 0 or not full or len(queues) == 1:
                break
            queues = full
        return claimed

    def running(self, queue: QueueSettings) -> int:
        return int(self._rows("queue_running", queue=queue.name)[0]["n"])

    def allowed(self, queue: QueueSettings, most: int) -> int:
        """How many runs ``queue``'s limits let this claim take now (under
        its lock)."""
        if queue.concurrency is not None:
            most = min(most, queue.concurrency - self.running(queue))
        if queue.rate_limit is not None and queue.rate_period is not None:
            self.prune_rate(queue)
            used = int(self._rows("queue_rate_used", queue=queue.name)[0]["n"])
            most = min(most, queue.rate_limit - used)
        return most

    def from_queue(self, queue: QueueSettings, most: int) -> list[Row]:
        if queue.limited:
            locked = self.lock(queue)
            if locked is None:
                return []
            queue = locked
            most = self.allowed(queue, most)
        claimed: list[Row] = []
        below = _ABOVE_EVERY_PRIORITY
        while len(claimed) < most:
            found = self._rows("next_priority", queue=queue.name, below=below)
            if not found:
                break
            below = int(found[0]["priority"])
            want = most - len(claimed)
            if queue.key_concurrency is None:
                claimed += self._rows("claim", queue=queue.name, priority=below, limit=want)
            else:
                claimed += self._by_key(queue, below, want, queue.key_concurrency)
        if claimed and queue.rate_limit is not None:
            self.conn.execute(self.sql["queue_rate_log"], {
                **self.params, "queue": queue.name, "ids": self.listed([str(row["id"]) for row in claimed])})
        return claimed

    def _by_key(self, queue: QueueSettings, priority: int, want: int, per_key: int) -> list[Row]:
        running = {row["key"]: int(row["n"]) for row in self._rows("queue_busy_keys", queue=queue.name)}
        busy = [key for key, count in running.items() if count >= per_key]
        candidates = self._rows("claim_candidates", queue=queue.name, priority=priority,
                                busy=self.listed(busy), limit=want * KEY_WINDOW + 32)
        chosen: list[str] = []
        for row in candidates:
            key = row["key"]
            if key is not None:
                if running.get(key, 0) >= per_key:
                    continue
                running[key] = running.get(key, 0) + 1
            chosen.append(str(row["id"]))
            if len(chosen) == want:
                break
        if not chosen:
            return []
        return self._rows("claim_ids", ids=self.listed(chosen))

    def next_due(self) -> float | None:
        """Seconds until the next waiting run of a served queue is due: one
        probe per queue, as PostgreSQL's everystep_next_due."""
        waits = [float(row["wait"]) for queue in self.served()
                 for row in self._rows("next_due", queue=queue.name) if row["wait"] is not None]
        return min(waits) if waits else None
