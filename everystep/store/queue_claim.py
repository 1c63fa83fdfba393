"""The claim: its contract, once, and its steps for SQLite, whose claim is
not stored in the database (MariaDB's procedure ports them step by step).

The contract
============
Every backend's claim obeys it: PostgreSQL's functions
(``store/functions/postgres/claim.sql``), MariaDB's procedures
(``store/functions/mariadb/claim.sql``) and this module's steps alike, and
``tests/test_claim_contract.py`` holds all three to it on random queues,
limits, pauses, priorities, served names and backlogs.

``claim(claimer, limit, names, queues)`` takes, in one transaction, runs
that are

1. **eligible**: status ``scheduled``; due (``not_before``, else
   ``created_at``, at or before the claim's clock); of a workflow in
   ``names`` (the served names: a run of any other name is left alone, and
   its presence costs the claim nothing: each served name's runs are read by
   name, one index range each); of a served queue (those given, or every
   queue holding scheduled runs) that is not paused and not limited to 0.
2. **free**: a run another open transaction has locked (another claimer's,
   an operator's cancel) is skipped, never waited for, and the claim looks
   past it; concurrent claimers take disjoint sets.
3. **within the limits**, counting the runs this claim takes: per queue,
   running plus taken at most ``concurrency``; per concurrency key of a
   queue, running plus taken of that key at most ``key_concurrency`` (runs
   without a key do not count); claims of the last ``rate_period`` seconds
   plus taken at most ``rate_limit`` (each claim is logged with its time).
   A limited queue is claimed from only under its lock, so claimers on any
   number of hosts respect the limits together; while another claimer holds
   it, this claim serves the other queues.
4. **in order within a queue**: highest priority first (a priority orders
   runs within their queue only), then earliest due; a run is taken only if
   every eligible run before it in that order is taken too, except runs
   whose key is at its limit, which are stepped over.
5. **fair across queues**: the served queues are visited in a random order;
   each gets ``ceil(left / queues left)`` of the batch, a queue with fewer
   runs leaving the rest to those after it, then the queues that filled
   their share take what is left. So each queue that can give runs gets at
   least ``min(what it can give, limit // served queues)``.
6. **a full batch**: ``limit`` is the runner's free capacity, and the claim
   comes back with fewer only when no served queue can give more. One
   bound: a key-limited queue reads a window of ``KEY_WINDOW`` candidates
   per run still wanted (plus 32) per priority, so more runs of keys at
   their limit than that, heading the queue, can leave the batch short.

7. **recorded**: each run taken becomes ``running`` under the claimer, its
   claim epoch bumped, and, on its first claim only, ``first_claimed_at``
   set to the claim's time (where its execution time starts; later claims
   keep it).

Which runs are taken is fixed by 1-6 when the order has no ties and either
one served queue can give runs or all of them together give at most
``limit``; otherwise only each queue's count depends on the random order.

The steps (SQLite; MariaDB's procedures follow them)
====================================================
PostgreSQL's claim is a function; here the same steps run in Python, inside
the claim's transaction, each one a named statement of the backend. The
served queues minus the paused ones (and those limited to 0), in a random
order; a fair share of the batch for each, then what is left for those
that filled their share; within a queue, one priority at a time along the
claimable index (queue, priority, name, due), each served name's due runs
read by one index range, and of those the oldest. A queue with limits is
claimed from only once ``lock`` has it: what makes the counts read after it
(running runs, recent claims) hold until the commit, so two claimers can
never pass a limit together. How a backend locks, takes runs and sends a
list is its subclass's.
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
#: Up to this many served names, each is probed at every priority; above it,
#: only the names holding runs there (as PostgreSQL's claim does).
FEW_NAMES = 4


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

    def given_names(self) -> list[str]:
        """The ``names`` parameter (the served workflows) back as a list."""
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

    def _rows(self, statement: str, /, **extra: Any) -> list[Row]:
        return self.conn.execute(self.sql[statement], {**self.params, **extra}).fetchall()  # type: ignore[no-any-return]

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
                claimed += self.take(queue, below, want)
            else:
                claimed += self._picking(queue, below, want, queue.key_concurrency)
        if claimed and queue.rate_limit is not None:
            self.conn.execute(self.sql["queue_rate_log"], {
                **self.params, "queue": queue.name, "ids": self.listed([str(row["id"]) for row in claimed])})
        return claimed

    def take(self, queue: QueueSettings, priority: int, want: int) -> list[Row]:
        """Claim up to ``want`` of the oldest due runs of the served names
        at one priority of a queue without a key limit."""
        return self._picking(queue, priority, want, None)

    def _picking(self, queue: QueueSettings, priority: int, want: int, per_key: int | None) -> list[Row]:
        """Read candidates, pick, claim them; when another claimer holds some
        of the picked runs, look again past them (the contract's rule 2)."""
        claimed: list[Row] = []
        skipped: list[str] = []
        while len(claimed) < want:
            left = want - len(claimed)
            running: dict[str, int] = {}
            if per_key is not None:
                running = {row["key"]: int(row["n"]) for row in self._rows("queue_busy_keys", queue=queue.name)}
            busy = [key for key, count in running.items() if per_key is not None and count >= per_key]
            window = left if per_key is None else left * KEY_WINDOW + 32
            picked = _pick(self.due(queue, priority, window, busy, skipped), left, running, per_key)
            if not picked:
                break
            rows = self._rows("claim_ids", ids=self.listed(picked))
            claimed += rows
            if len(rows) == len(picked):
                break  # nothing held by another claimer: this window is done
            taken = {str(row["id"]) for row in rows}
            skipped += [run_id for run_id in picked if run_id not in taken]
        return claimed

    def due(self, queue: QueueSettings, priority: int, most: int, busy: list[str], skipped: list[str]) -> list[Row]:
        """The ``most`` oldest due runs of the served names at one priority
        (id, key, due), keys in ``busy`` and runs in ``skipped`` left out:
        each name's oldest ones by one range of the claimable index, so runs
        nobody serves are never read."""
        found: list[Row] = []
        for name in self.names_at(queue, priority):
            found += self._rows("claim_name_due", queue=queue.name, priority=priority, name=name,
                                busy=self.listed(busy), skipped=self.listed(skipped), limit=most)
        found.sort(key=lambda row: (row["due"], str(row["id"])))
        return found[:most]

    def names_at(self, queue: QueueSettings, priority: int) -> list[str]:
        """The served names to read at one priority of a queue: all of them
        when they are few; else the names holding runs there (one probe per
        distinct name) that are served, so a large application pays for the
        names that have work, not for every workflow it registers."""
        served = list(dict.fromkeys(self.given_names()))
        if len(served) <= FEW_NAMES:
            return served
        wanted = set(served)
        present: list[str] = []
        after = ""
        while (row := self.conn.execute(self.sql["claim_next_name"], {
                "queue": queue.name, "priority": priority, "after": after}).fetchone()) is not None:
            after = row["name"]
            if after in wanted:
                present.append(after)
        return present

    def next_due(self) -> float | None:
        """Seconds until the next waiting run of a served queue is due: one
        probe per queue, as PostgreSQL's everystep_next_due."""
        waits = [float(row["wait"]) for queue in self.served()
                 for row in self._rows("next_due", queue=queue.name) if row["wait"] is not None]
        return min(waits) if waits else None


def _pick(candidates: list[Row], want: int, running: dict[str, int], per_key: int | None) -> list[str]:
    """The ids to claim among ``candidates`` (oldest first): the first
    ``want``, stepping over runs whose key has reached ``per_key``
    (``running`` counts each key's runs, and is updated with those picked)."""
    chosen: list[str] = []
    for row in candidates:
        if len(chosen) == want:
            break
        key = row["key"]
        if per_key is not None and key is not None:
            if running.get(key, 0) >= per_key:
                continue
            running[key] = running.get(key, 0) + 1
        chosen.append(str(row["id"]))
    return chosen
