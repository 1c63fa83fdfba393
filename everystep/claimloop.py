"""The claim side every runner shares: the threaded ``Worker`` and the
supervisor's arbiter are thin shells around one ``ClaimLoop``.

A runner asks ``take(now, capacity, held)`` whenever it has free capacity
(idle threads or idle children) and executes what comes back. The loop
decides where the runs come from, in this order:

1. **Catch-up.** Runs ``running`` under this runner's name that nothing in
   this process executes (``held`` lists what does). At startup they are
   what a crashed predecessor under the same name left; afterwards, every
   ``RECONCILE_EVERY`` seconds, they are runs whose terminal write was lost
   in a database crash (claims and terminal writes commit asynchronously on
   PostgreSQL). Re-claiming bumps each run's epoch, which fences any stale
   execution. At startup catch-up repeats, ahead of new claims, until a
   batch comes back short of the free capacity: a predecessor may have
   held more than one batch, and nobody else will ever take those runs.
2. **New claims**, when due: at once after ``wake()`` (a notification, a
   run that ended, recovered runs) or a full batch, at the **due timer**,
   else every ``poll`` seconds. Claims take only runs that are due (a
   delayed, sleeping or retry-waiting run is ``scheduled`` with a
   not-before time). After a claim that came back short, one indexed query
   (``Store.next_due``) says when the earliest run not yet due will be,
   and a timer is set for then: a delayed run starts on time without
   anyone polling faster. On PostgreSQL a newly scheduled or released run
   notifies, which wakes the loop: its claim re-reads that time.
   Claims take only from ``queues`` (None: all), within each queue's limits
   (``everystep.queues``): the claim statement itself enforces them.
3. **Periodic runs**: the ``cron.Ticker`` enqueues the ticks of the
   periodic workflows loaded here when they are due, whatever the free
   capacity (``keep_lease``).
4. **Deadlines**: every ``DEADLINE_EVERY`` seconds, runs past their
   deadline are cancelled (reason ``deadline``, as ``everystep cancel``
   does: a supervisor holding one kills its child), and every
   ``RECONCILE_EVERY`` seconds parents still waiting for a child that
   ended (a wake lost in a crash, ``store/base/waits.py``) are woken.

It also keeps the lease (heartbeat, sweep of dead runners, the owned name)
and logs a database outage once when it starts and once when it ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence

from . import admin, metrics, outcomes, registry
from .cron import Ticker
from .engine_errors import EngineHealth
from .errors import EverystepError
from .lease import Lease
from .models import Run
from .outage import OutageLog
from .store import Store

RECONCILE_EVERY = 5.0
#: Seconds between looks for runs past their deadline: a run is cancelled
#: (and a supervisor kills its child) within about this much of it.
DEADLINE_EVERY = 0.5
#: How soon to claim again when the earliest waiting run is due already but
#: was not claimed: it became due between the claim and the timing query,
#: another claimer holds it locked, or its queue is at its limit. Soon
#: enough for the first, slow enough never to spin on the others.
DUE_RETRY = 1.0
"""Seconds between checks for runs held under our name that nothing here
executes (see the module docstring)."""


class ClaimLoop:
    def __init__(
        self,
        store: Store,
        name: str,
        kind: str,
        *,
        lease: float,
        poll: float,
        takeover: bool = False,
        logger: logging.Logger | None = None,
        who: str | None = None,
        queues: Sequence[str] | None = None,
        versions: Sequence[str] | None = None,
    ) -> None:
        self.store = store
        #: The queues claimed from (None: every queue).
        self.queues = list(queues) if queues is not None else None
        #: The code versions served (None: every version; ``--serve-versions``).
        self.versions = list(versions) if versions is not None else None
        self.name = name
        self.kind = kind
        self.poll = poll
        self.logger = logger or logging.getLogger("everystep")
        self.who = who or f"everystep {kind} {name}"
        #: Engine errors met by this runner's activities and its runs
        #: (``/healthz``, ``ctl status``).
        self.engine = EngineHealth()
        #: Every activity of this runner reports database trouble here: one
        #: line when an outage starts, one when it ends.
        self.outage = OutageLog(self.logger, self.who, self.engine)
        self.lease = Lease(store, name, kind, lease, takeover=takeover, outage=self.outage)
        self.names: list[str] = registry.workflow_names()
        self.ticker = Ticker(store, registry.schedules(), self.logger, self.who, outage=self.outage)
        self.claimed = 0
        #: Claim statements answered (a batch is one), empty ones included.
        self.claims = 0
        self.empty_claims = 0
        self._starting = True
        self._resumed = 0  # runs caught up at startup, logged once when done
        self._next_reconcile = 0.0
        self._next_poll = 0.0
        self._due = True
        #: When the earliest scheduled run not yet due becomes due (monotonic).
        self._due_timer: float | None = None
        self._next_deadlines = 0.0
        self._next_stale_waits = 0.0

    # -- lifecycle --------------------------------------------------------------

    def start(self, pool_size: int) -> None:
        """Take the runner name (``NameInUse`` if a live runner holds it) and
        announce the runner; call before claiming anything."""
        if not self.lease.registered:
            self.lease.register()
        metrics.runner_started(self.name, pool_size, self.kind, self.names)
        if not self.names:
            self.logger.warning("%s: no workflows registered (did you pass --app?)", self.who)
        if self.queues is not None:
            self.logger.info("%s: claiming only from queue(s) %s", self.who, ", ".join(self.queues))

    def serve_versions(self, versions: Sequence[str] | None) -> None:
        """Claim only runs started under these code versions (None: every
        version); a reload with ``--serve-versions current`` serves the
        versions of the code loaded now."""
        self.versions = list(versions) if versions is not None else None
        self.wake()

    def refresh_names(self) -> None:
        """Workflows were (re)imported: claim what is registered now."""
        self.names = registry.workflow_names()
        self.ticker.refresh(registry.schedules())
        self.wake()

    def stop(self) -> None:
        """Forget our runner row (clean stop: nothing is left claimed)."""
        self.lease.release()

    # -- timing -----------------------------------------------------------------

    def wake(self) -> None:
        """Claim at the next ``take`` without waiting for the poll interval."""
        self._due = True

    @property
    def due(self) -> bool:
        """Claims are pending: catch-up is unfinished, or a claim is due now
        (woken, or the last batch came back full)."""
        return self._due or self._starting

    def next_due(self, now: float) -> float:
        """When ``take`` or ``keep_lease`` next has something to do (for a
        caller with free capacity)."""
        claim_at = now if self._due else min(self._next_poll, self._due_timer or self._next_poll)
        return min(claim_at, self._next_reconcile, self.housekeeping_due(now))

    def housekeeping_due(self, now: float) -> float:
        """When ``keep_lease`` next has something to do (for any caller,
        free capacity or not)."""
        return min(self.lease.next_due(), self.ticker.next_due(now), self._next_deadlines)

    def keep_lease(self, now: float) -> bool:
        """Heartbeat and sweep when due, enqueue the periodic runs due and
        cancel the runs past their deadline. Returns False once another
        instance holds our name: the runner must stop."""
        if self.lease.tick(now):
            self.wake()  # recovered runs are claimable now
        if self.ticker.tick(now):
            self.wake()  # a periodic run was enqueued
        if now >= self._next_deadlines:
            self._enforce_deadlines(now)
        return not self.lease.lost_name

    def _enforce_deadlines(self, now: float) -> None:
        """Cancel the runs past their deadline (any runner may: the cancel
        is one conditional write, and a run cancelled already is refused),
        and wake parents left waiting for a child that ended."""
        self._next_deadlines = now + DEADLINE_EVERY
        try:
            for run_id in self.store.expired_deadlines():
                try:
                    admin.cancel(self.store, run_id, "deadline")
                except admin.AdminError:
                    continue  # it ended meanwhile
                self.logger.info("%s: run %s cancelled: its deadline passed", self.who, run_id,
                                 extra={"run_id": run_id, "event": "run_deadline"})
            if now >= self._next_stale_waits:
                self._next_stale_waits = now + RECONCILE_EVERY
                for parent, wait_key in self.store.stale_child_waits():
                    self.store.wake_waiter(parent, wait_key)
                    self.wake()
        except EverystepError as exc:
            self.outage.failed(exc, "enforcing deadlines")

    # -- claiming ---------------------------------------------------------------

    def take(self, now: float, capacity: int, held: Collection[str] = ()) -> list[Run]:
        """Runs to execute now, at most ``capacity``; ``held`` are the ids of
        the runs this process already executes or has queued."""
        if capacity <= 0 or not self.names:
            return []
        runs: list[Run] = []
        if now >= self._next_reconcile:
            runs = self._catch_up(now, capacity, held)
        timer = self._due_timer is not None and now >= self._due_timer
        if len(runs) < capacity and not self._starting and (self._due or timer or now >= self._next_poll):
            runs += self._claim(now, capacity - len(runs))
        return runs

    def _catch_up(self, now: float, capacity: int, held: Collection[str]) -> list[Run]:
        try:
            runs = self.store.claim_own(self.name, capacity, self.names, exclude=list(held))
        except EverystepError as exc:
            self.outage.failed(exc, "catching up")
            self._next_reconcile = now + max(self.poll, 1.0)
            return []
        self.outage.ok()
        if self._starting:
            self._resumed += len(runs)
        elif runs:
            self.logger.warning("%s: resuming %d run(s) held under this name that nothing here was executing "
                                "(a write lost in a database crash?)", self.who, len(runs))
        if len(runs) < capacity:
            if self._starting and self._resumed:
                self.logger.info("%s: resuming %d run(s) left running under this name", self.who, self._resumed)
            self._starting = False
            self._next_reconcile = now + RECONCILE_EVERY
        else:
            self._next_reconcile = now  # a full batch: go on as capacity frees up
        self._count(runs)
        return runs

    def _claim(self, now: float, capacity: int) -> list[Run]:
        try:
            runs = self.store.claim(self.name, capacity, self.names, self.queues, self.versions)
        except EverystepError as exc:
            self.outage.failed(exc, "claiming")
            self._due = False
            self._next_poll = now + max(self.poll, 1.0)
            return []
        self.outage.ok()
        self.claims += 1
        self._due = len(runs) == capacity  # a full batch: more may be waiting
        self._next_poll = now + self.poll
        self._count(runs)
        if not runs:  # contention among runners shows here (ctl status, metrics)
            self.empty_claims += 1
            metrics.record(lambda m: m.empty_claims.labels(self.name).inc())
        if not self._due:
            self._set_due_timer(now)
        return runs

    def _set_due_timer(self, now: float) -> None:
        """Nothing more is due now: time the next claim by the earliest run
        that is not due yet, from the moment the database answered (``now``
        was read before the claim: a timer from it would fire early). A run
        due already but not claimed is tried again within ``DUE_RETRY``."""
        try:
            wait = self.store.next_due(self.names, self.queues)
        except EverystepError as exc:
            self.outage.failed(exc, "timing the next due run")
            self._due_timer = None
            return
        if wait is None:
            self._due_timer = None
            return
        answered = max(now, time.monotonic())
        self._due_timer = answered + (wait if wait > 0 else min(self.poll, DUE_RETRY))

    def _count(self, runs: list[Run]) -> None:
        if runs:
            self.claimed += len(runs)
            metrics.record(lambda m: m.claims.labels(self.name).inc(len(runs)))

    # -- giving back ------------------------------------------------------------

    def requeue(self, run: Run) -> bool:
        """Give a run this runner claimed back to the queue (counted). The
        database being away leaves it claimed under our name, where catch-up
        or another runner's lease sweep finds it."""
        try:
            return outcomes.requeue(self.store, run.claim_as(self.name))
        except EverystepError as exc:
            self.logger.warning("%s: could not requeue run %s: %s", self.who, run.id, exc)
            return False


__all__ = ["DEADLINE_EVERY", "DUE_RETRY", "RECONCILE_EVERY", "ClaimLoop"]
