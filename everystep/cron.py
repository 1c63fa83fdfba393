"""Periodic workflows: ``@workflow(cron="*/5 * * * *", timezone="Europe/Paris")``.

A cron expression is parsed and evaluated by ``cronsim`` (a maintained
library, installed with the extra ``everystep[cron]``; everystep does not
parse cron by hand), in the schedule's time zone, so "at 02:30 every day"
follows daylight saving time as the local clock does. Five fields as in
crontab, or six with a leading seconds field.

Every runner (supervisor or threaded worker) with the workflow loaded
enqueues its ticks: ``Ticker`` sets a timer on the next tick and, when it is
due, schedules a run whose single argument is the tick time (an aware
datetime in UTC) under the idempotency key ``cron:<tick>``. Any number of
runners therefore yields exactly one run per tick. ``everystep_cron``
remembers each workflow's last tick.

After downtime only the most recent missed tick runs: at start, a runner
compares the last tick recorded with the ticks due since and enqueues just
the latest one; a runner that was stalled past several ticks does the same.
A workflow that never ticked starts with its first tick after a runner with
it loaded started.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import new_run
from .cron_schedule import UTC, CronSchedule
from .errors import EverystepError
from .outage import OutageLog

if TYPE_CHECKING:
    from .models import Run
    from .store import Store

KEY_PREFIX = "cron:"
#: After a failed enqueue (the database is away), try again this much later.
RETRY_SECONDS = 1.0


def tick_key(tick: dt.datetime) -> str:
    """The idempotency key of a tick's run: one run per (workflow, tick)."""
    return KEY_PREFIX + tick.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Ticker:
    """Enqueue the due ticks of every periodic workflow loaded here.

    ``tick(now)`` does what is due (cheap when nothing is: no query),
    ``next_due(now)`` says when to call it again; ``now`` is
    ``time.monotonic()``, tick times are wall-clock UTC. It never raises on
    database trouble: the outage is logged once and retried.
    """

    def __init__(self, store: Store, schedules: dict[str, CronSchedule], logger: logging.Logger, who: str,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(UTC),
                 outage: OutageLog | None = None) -> None:
        self.store = store
        self.schedules = dict(schedules)
        self.logger = logger
        self.who = who
        self.clock = clock
        self._next: dict[str, dt.datetime] = {}
        self._started = False
        self._retry_at = 0.0
        self._outage = outage or OutageLog(logger, who)

    def refresh(self, schedules: dict[str, CronSchedule]) -> None:
        """The app was reloaded: serve these schedules from now on."""
        changed = {name for name, schedule in schedules.items() if self.schedules.get(name) != schedule}
        self.schedules = dict(schedules)
        self._next = {name: tick for name, tick in self._next.items()
                      if name in schedules and name not in changed}
        self._started = self._started and not changed

    def next_due(self, now: float) -> float:
        """Monotonic time of the next tick to enqueue (``inf``: none)."""
        if not self.schedules:
            return float("inf")
        if not self._started:
            return max(now, self._retry_at)
        earliest = min(self._next.values(), default=None)
        if earliest is None:
            return float("inf")
        seconds = (earliest - self.clock()).total_seconds()
        return max(now + max(seconds, 0.0), self._retry_at)

    def tick(self, now: float) -> list[Run]:
        """Enqueue every tick due now; returns the runs this call created."""
        if not self.schedules or now < self._retry_at:
            return []
        created: list[Run] = []
        # Only a real round trip may end an outage: a call with no tick due
        # touches nothing, and reporting success from it would announce the
        # database back while it is still away (then the next failure of
        # another activity would start the outage again, once per retry).
        touched = False
        try:
            if not self._started:
                touched = True
                created += self._start()
            wall = self.clock()
            for name, due in sorted(self._next.items()):
                if due <= wall:
                    touched = True
                    created += self._enqueue(name, self.schedules[name].latest_at_or_before(wall))
        except EverystepError as exc:
            self._outage.failed(exc, "enqueueing periodic runs")
            self._retry_at = now + RETRY_SECONDS
            return created
        if touched:
            self._outage.ok()
        return created

    def _start(self) -> list[Run]:
        """Read each workflow's last tick: the latest tick missed since
        (downtime) is enqueued now, then ticks follow the schedule."""
        wall = self.clock()
        last = self.store.cron_ticks(sorted(self.schedules))
        created: list[Run] = []
        for name, schedule in sorted(self.schedules.items()):
            if name in self._next:
                continue
            previous = last.get(name)
            latest = schedule.latest_at_or_before(wall)
            if previous is not None and latest > previous[0]:
                self.logger.info("%s: %s missed its tick at %s (last enqueued %s); enqueueing it now",
                                 self.who, name, latest.isoformat(), previous[0].isoformat())
                created += self._enqueue(name, latest)
            else:
                self._next[name] = schedule.next_after(wall if previous is None else max(previous[0], latest))
        self._started = True
        return created

    def _enqueue(self, name: str, tick: dt.datetime) -> list[Run]:
        new = new_run.decide(name, [tick], what=f"tick of {name}")
        run, created = self.store.schedule_tick(name, new.args_json, tick, tick_key(tick), new.placement,
                                                new.deadline, new.app_version)
        self._next[name] = self.schedules[name].next_after(tick)
        if created:
            self.logger.info("%s: enqueued run %s of %s for its tick at %s", self.who, run.id, name,
                             tick.isoformat(), extra={"run_id": run.id, "workflow": name, "event": "cron_tick"})
            return [run]
        return []


__all__ = ["CronSchedule", "KEY_PREFIX", "Ticker", "tick_key"]
