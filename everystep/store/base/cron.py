"""Periodic workflows: a tick's run, enqueued once however many runners try.

The tick's idempotency key names it, so runners that race for one tick
insert one run between them; the tick is remembered as the workflow's last
in the same transaction, so a runner that dies after the insert leaves a
run and its tick, or neither.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from ...models import Run
from ...queues import Placement
from .core import StoreCore
from .values import checked_run_id, new_run_id


class Cron(StoreCore):
    """The last tick of each periodic workflow, and enqueuing the next."""

    def cron_ticks(self, names: Sequence[str]) -> dict[str, tuple[dt.datetime, str | None, str | None]]:
        """``{workflow: (last tick enqueued, its run id, that run's status)}``
        for the periodic workflows that ever ticked."""
        if not names:
            return {}
        found = {}
        for row in self._fetchall("cron_ticks", {"names": self._names(names)}):
            tick = self._time(row["last_tick"])
            assert tick is not None
            found[row["name"]] = (tick, str(row["last_run"]) if row["last_run"] else None, row["last_status"])
        return found

    def schedule_tick(self, name: str, args_json: str, tick: dt.datetime, key: str,
                      placement: Placement | None = None, app_version: str | None = None) -> tuple[Run, bool]:
        """Enqueue the run of periodic workflow ``name`` for ``tick``, once
        however many runners try: the idempotency ``key`` names the tick.
        Returns the run and whether this call created it; the tick is
        remembered as the workflow's last either way."""
        with self.connection() as conn, self._transaction(conn):
            place = placement or Placement()
            params = self._params(id=new_run_id(), name=name, args=args_json, idempotency_key=key,
                                  not_before=None, queue=place.queue, priority=place.priority,
                                  concurrency_key=place.concurrency_key, app_version=app_version)
            row = conn.execute(self.sql["schedule"], params).fetchone()
            created = row is not None
            if row is None:
                row = conn.execute(self.sql["get_run_by_key"], params).fetchone()
            run = self._run(row)
            conn.execute(self.sql["record_cron_tick"], {"name": name, "tick": self._time_param(tick),
                                                        "run_id": checked_run_id(run.id)})
        return run, created
