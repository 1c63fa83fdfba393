"""Runner leases and owned runner names.

Each runner (a threaded worker, a supervisor parent) registers a row in
``everystep_runner`` and refreshes its heartbeat every quarter of its lease.
Every half lease it also asks the database to forget runners silent for
longer than their lease and to requeue what they held; the database does it
in one statement, so however many runners sweep at once, each dead runner's
runs are requeued once. This is what lets plain Deployments and autoscaled
runners with throwaway names recover each other's runs; a restart under the
same name still resumes its own runs at once (catchup).

A name is owned by its live holder. A runner starting under a name whose
row shows a live holder (a fresh heartbeat, and on this host a process that
still exists) refuses to start with ``NameInUse``. The normal restart path
needs no flag: the holder's heartbeat is older than its lease, or it ran on
this host and its pid is gone. ``takeover=True`` is the operator's explicit
act for a holder that cannot be seen dead (a frozen VM): the name is taken
and the runs still claimed under it are fenced (their epochs bumped), so the
old holder can write nothing more if it ever wakes up; at its next heartbeat
it sees that the name is gone (``lost_name``) and stops.

A runner that comes back after losing its lease finds its heartbeat refused.
Its runs were requeued, so its in-flight writes are refused too; it
registers again and carries on.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid

import psutil

from .errors import EverystepError, NameInUse
from .outage import OutageLog
from .store import RunnerInfo, Store

logger = logging.getLogger("everystep")

DEFAULT_LEASE = 60.0

#: A holder's process must predate its own last heartbeat; this much clock
#: slack is allowed when comparing a process's start time with it.
PID_REUSE_SLACK = 1.0


def holder_alive(holder: RunnerInfo, host: str | None = None) -> bool:
    """Whether the runner row ``holder`` belongs to a live process.

    A heartbeat older than the lease means dead. On another host a fresh
    heartbeat is all we can know, so it means alive. On this host the pid
    decides: gone, a zombie, our own (a container restarted with the same
    pid), or reused by a process started after the holder's last heartbeat,
    all mean dead.
    """
    if holder.silent_seconds > holder.lease_seconds:
        return False
    if holder.host != (host or socket.gethostname()):
        return True
    if holder.pid == os.getpid():
        return False
    try:
        process = psutil.Process(holder.pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        last_heard = time.time() - holder.silent_seconds
        return process.create_time() <= last_heard + PID_REUSE_SLACK
    except psutil.Error:
        return False


def describe_holder(holder: RunnerInfo) -> str:
    return (f"a live {holder.kind} (pid {holder.pid} on {holder.host}, "
            f"heartbeat {holder.silent_seconds:.1f}s ago)")


class Lease:
    def __init__(
        self, store: Store, name: str, kind: str, lease: float = DEFAULT_LEASE, takeover: bool = False,
        outage: OutageLog | None = None,
    ) -> None:
        if not lease > 0:
            raise EverystepError("--lease must be a positive number of seconds")
        self.store = store
        self.name = name
        self.kind = kind
        self.lease = float(lease)
        self.takeover = takeover
        self.instance = uuid.uuid4().hex
        self.beat_every = self.lease / 4
        self.sweep_every = self.lease / 2
        self.lost_name = False
        self.recovered = 0
        self._next_beat = 0.0
        self._next_sweep = 0.0
        self._registered = False
        self._outage = outage or OutageLog(logger, f"everystep {kind} {name}")

    def register(self) -> None:
        """Take our name, or raise ``NameInUse`` if a live runner holds it."""
        takeover = self.takeover
        self.takeover = False  # an explicit act for this start only, never for re-registrations

        def vet(holder: RunnerInfo) -> None:
            if not holder_alive(holder):
                return
            if not takeover:
                raise NameInUse(
                    f"runner name {self.name!r} is held by {describe_holder(holder)}; give this "
                    f"{self.kind} its own --name, or pass --takeover if that process is gone for good"
                )
            logger.warning("everystep %s %s: taking over the runner name from %s; its runs are fenced",
                           self.kind, self.name, describe_holder(holder))

        holder, fenced = self.store.register_runner(
            self.name, self.instance, self.kind, socket.gethostname(), os.getpid(), self.lease, vet
        )
        self._registered = True
        if fenced:
            logger.info("everystep %s %s: fenced %d run(s) the previous holder of this name left claimed",
                        self.kind, self.name, len(fenced))
        now = time.monotonic()
        self._next_beat = now + self.beat_every
        self._next_sweep = now

    @property
    def registered(self) -> bool:
        return self._registered

    def next_due(self) -> float:
        return min(self._next_beat, self._next_sweep)

    def tick(self, now: float) -> int:
        """Heartbeat and sweep when due; returns runs recovered from dead
        runners (0 most of the time). Never raises on database trouble."""
        recovered = 0
        touched = False  # only a real round trip may end an outage
        try:
            if not self._registered:
                touched = True
                self.register()
            if now >= self._next_beat:
                self._next_beat = now + self.beat_every
                touched = True
                self._beat()
            if now >= self._next_sweep:
                self._next_sweep = now + self.sweep_every
                touched = True
                recovered = self._sweep()
        except NameInUse as exc:
            self._lose_name(str(exc))
        except EverystepError as exc:
            self._outage.failed(exc, "heartbeat")
            self._next_beat = min(self._next_beat, now + min(self.beat_every, 2.0))
        else:
            if touched:
                self._outage.ok()
        return recovered

    def _lose_name(self, why: str) -> None:
        self.lost_name = True
        logger.error("everystep %s %s: %s; stopping", self.kind, self.name, why)

    def _beat(self) -> None:
        if self.store.heartbeat(self.name, self.instance):
            return
        holder = self.store.get_runner(self.name)
        if holder is not None:
            self._lose_name(f"another instance ({describe_holder(holder)}) now runs under this name")
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

    def still_ours(self) -> bool:
        """Whether we still hold our name (a heartbeat that succeeds)."""
        if not self._registered or self.lost_name:
            return False
        try:
            return self.store.heartbeat(self.name, self.instance)
        except EverystepError:
            return False

    def release(self) -> None:
        """Clean stop: forget our row (nothing is left claimed by then)."""
        if not self._registered or self.lost_name:
            return
        try:
            self.store.unregister_runner(self.name, self.instance)
        except EverystepError as exc:
            logger.warning("everystep %s %s: could not unregister: %s", self.kind, self.name, exc)
