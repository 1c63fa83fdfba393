"""Runner leases: recovery of a dead runner's runs without stable names.

Each runner (a threaded worker, a supervisor parent) registers a row in
``everystep_runner`` and refreshes its heartbeat every quarter of its lease.
Every half lease it also asks the database to forget runners silent for
longer than their lease and to requeue what they held; the database does it
in one statement, so however many runners sweep at once, each dead runner's
runs are requeued once. This is what lets plain Deployments and autoscaled
runners with throwaway names recover each other's runs; a restart under the
same name still resumes its own runs at once (catchup).

A runner that comes back after losing its lease finds its heartbeat refused.
Its runs were requeued, so its in-flight writes are refused too (every write
is conditional on ``claimed_by``); it registers again and carries on. If
instead another live instance took over its *name*, two runners share a name,
which the design forbids: ``lost_name`` tells the owner to stop.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid

from .errors import EverystepError
from .outage import OutageLog
from .store import Store

logger = logging.getLogger("everystep")

DEFAULT_LEASE = 60.0


class Lease:
    def __init__(self, store: Store, name: str, kind: str, lease: float = DEFAULT_LEASE) -> None:
        if not lease > 0:
            raise EverystepError("--lease must be a positive number of seconds")
        self.store = store
        self.name = name
        self.kind = kind
        self.lease = float(lease)
        self.instance = uuid.uuid4().hex
        self.beat_every = self.lease / 4
        self.sweep_every = self.lease / 2
        self.lost_name = False
        self.recovered = 0
        self._next_beat = 0.0
        self._next_sweep = 0.0
        self._registered = False
        self._outage = OutageLog(logger, f"everystep {kind} {name}", "heartbeat")

    def register(self) -> None:
        previous, silent = self.store.register_runner(
            self.name, self.instance, self.kind, socket.gethostname(), os.getpid(), self.lease
        )
        self._registered = True
        if previous is not None and silent is not None and silent < self.lease:
            logger.warning(
                "everystep %s %s: took over the runner name from an instance last heard from %.1fs ago; "
                "if that runner is still alive, give each runner its own --name",
                self.kind, self.name, silent,
            )
        now = time.monotonic()
        self._next_beat = now + self.beat_every
        self._next_sweep = now

    def next_due(self) -> float:
        return min(self._next_beat, self._next_sweep)

    def tick(self, now: float) -> int:
        """Heartbeat and sweep when due; returns runs recovered from dead
        runners (0 most of the time). Never raises on database trouble."""
        recovered = 0
        try:
            if not self._registered:
                self.register()
            if now >= self._next_beat:
                self._next_beat = now + self.beat_every
                self._beat()
            if now >= self._next_sweep:
                self._next_sweep = now + self.sweep_every
                recovered = self._sweep()
        except EverystepError as exc:
            self._outage.failed(exc)
            self._next_beat = min(self._next_beat, now + min(self.beat_every, 2.0))
        else:
            self._outage.ok()
        return recovered

    def _beat(self) -> None:
        if self.store.heartbeat(self.name, self.instance):
            return
        holders = [runner for runner in self.store.list_runners() if runner.name == self.name]
        if holders:
            self.lost_name = True
            logger.error("everystep %s %s: another instance (pid %d on %s) now runs under this name; stopping",
                         self.kind, self.name, holders[0].pid, holders[0].host)
            return
        logger.warning("everystep %s %s: lease expired (silent past %.0fs); runs it held were requeued; "
                       "registering again", self.kind, self.name, self.lease)
        self.register()

    def _sweep(self) -> int:
        recovered = self.store.recover_expired(self.name)
        total = 0
        for runner, run_ids in recovered.items():
            total += len(run_ids)
            logger.warning("everystep %s %s: runner %s missed its lease; requeued %d run(s) it held: %s",
                           self.kind, self.name, runner, len(run_ids), ", ".join(run_ids[:10]))
        self.recovered += total
        return total

    def release(self) -> None:
        """Clean stop: forget our row (nothing is left claimed by then)."""
        if not self._registered or self.lost_name:
            return
        try:
            self.store.unregister_runner(self.name, self.instance)
        except EverystepError as exc:
            logger.warning("everystep %s %s: could not unregister: %s", self.kind, self.name, exc)
