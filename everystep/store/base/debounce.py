"""Debounced scheduling: many schedules of one key, one run after the burst.

A debounced run is an ordinary scheduled run: its not-before time is the
end of its key's quiet window, its ``wait_key`` is ``debounce:<key>`` (the
``DEBOUNCE`` wait kind) and ``debounce_calls`` counts the schedules folded
into it. The claim knows nothing of debouncing: it takes the run once that
time has come, like any delayed run.

``everystep_debounce`` holds one row per (workflow name, key): the run of
the window last opened, when that window began, and the calls ever made on
the key (the upsert's write: on MariaDB a row left as it was would count
as untouched on a caller's connection without ``CLIENT_FOUND_ROWS``). A schedule, in one
transaction (everystep's own, or the caller's with ``conn=``):

1. ``debounce_take``: an upsert of the key's row, which takes its row lock
   to the commit (SQLite: the database's write lock). Concurrent schedulers
   of one key queue here, on every backend, whatever host they run on. If
   the key had no row, the row now names this call's new run: go to 3.
2. ``debounce_fold``: a conditional update of the row's run, only while it
   is still ``scheduled`` and was never claimed. It replaces the arguments
   (the last call wins), counts the call and pushes the start back to
   ``now + period``, never past ``first_at + max_wait``. A claim that holds
   the run's row makes this update wait, and then match nothing; a fold
   that holds it first makes the claim skip the row (``SKIP LOCKED``), and
   after its commit the run is not due yet (or, past ``max_wait``, due and
   claimed with these arguments). If it matched, the call is done.
3. Otherwise the window's run has started (or was cancelled, or pruned):
   ``debounce_move`` points the row at a new run whose window begins now,
   and ``debounce_open`` inserts that run (``schedule``'s insert with the
   window's columns), not due for ``period``.

So each call lands in exactly one run: the one that has not started yet,
or a new one; two runs of one key are never both waiting for a window, and
a call at a window's edge is either in the run the claim takes or in the
next. Crash windows: none of our own; everything is one transaction, a
rollback (the caller's, with ``conn=``) leaves the window as it was.

Times (``now``, a window's ``first_at``, the not-before time) are the
scheduler's clock, as ``schedule(delay=)``'s are: schedulers on several
hosts need their clocks in step for ``max_wait`` to hold to the second.

Key rows are not deleted when their run ends: one small row per key ever
used; the next call for the key replaces its run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Sequence
from typing import Any

from ... import wait_kinds
from ...errors import EverystepError
from ...models import Run
from ...queues import Placement
from . import statements
from .runs import Runs
from .values import checked_run_id, utcnow


@dataclasses.dataclass(frozen=True)
class DebounceWindow:
    """What a debounced run says of its window: its key, and the
    schedules folded into it (the first included)."""

    key: str
    calls: int


class Debounces(Runs):
    """Debounced schedules (the module docstring) and what a run's window says."""

    def schedule_debounced(self, name: str, args_json: str, key: str, period: float, max_wait: float,
                           placement: Placement | None = None, app_version: str | None = None, *,
                           deadline: dt.datetime | None = None) -> Run:
        """Fold a schedule of workflow ``name`` into the run waiting for
        ``key``'s window, or open the next window (``period`` and
        ``max_wait`` in seconds, ``math.inf``: no bound); committed at once."""
        with self.connection() as conn, self._transaction(conn):
            return statements.run(conn, self._debounce_statements(
                name, args_json, key, period, max_wait, placement, app_version, deadline))

    @classmethod
    def schedule_debounced_on(cls, conn: Any, name: str, args_json: str, key: str, period: float,
                              max_wait: float, placement: Placement | None = None, app_version: str | None = None,
                              *, deadline: dt.datetime | None = None) -> Run:
        """``schedule_debounced`` in a caller's open transaction: the fold
        or the new window exists once the caller commits, and the key's row
        stays locked until then."""
        with cls._caller_cursor(conn) as cursor:
            return statements.run(cursor, cls._debounce_statements(
                name, args_json, key, period, max_wait, placement, app_version, deadline))

    @classmethod
    def _debounce_statements(cls, name: str, args_json: str, key: str, period: float, max_wait: float,
                             placement: Placement | None, app_version: str | None,
                             deadline: dt.datetime | None) -> statements.Statements[Run]:
        """The three steps of the module docstring, on any cursor."""
        sql = cls.statements()
        schedule = cls._schedule_params(name, args_json, None, None, placement, app_version, deadline=deadline)
        now = utcnow()
        window = {"name": name, "debounce_key": key, "id": schedule["id"], "now": cls._time_param(now)}
        taken = yield statements.Statement(sql["debounce_take"], window)
        if taken is None:
            raise EverystepError(f"the debounce window {key!r} of workflow {name} could not be taken")
        if str(taken["run_id"]) != schedule["id"]:
            first_at = cls._time(taken["first_at"])
            assert first_at is not None
            not_before = now + dt.timedelta(seconds=period)
            if math.isfinite(max_wait):  # never past max_wait after the window's first call
                not_before = min(not_before, first_at + dt.timedelta(seconds=max_wait))
            folded = yield statements.Statement(sql["debounce_fold"], {
                "run_id": checked_run_id(str(taken["run_id"])), "args": args_json,
                "not_before": cls._time_param(not_before)})
            if folded is not None:
                return cls._run(folded)
            yield statements.Statement(sql["debounce_move"], window)
        schedule.update(not_before=cls._time_param(now + dt.timedelta(seconds=period)),
                        wait_key=wait_kinds.DEBOUNCE.key(key))
        opened = yield statements.Statement(sql["debounce_open"], schedule)
        return cls._run(opened)

    def debounce_windows(self, run_ids: Sequence[str]) -> dict[str, DebounceWindow]:
        """The debounced runs among ``run_ids``: their key and calls folded
        in, read in one query (``show``, ``runs``, the console)."""
        if not run_ids:
            return {}
        found: dict[str, DebounceWindow] = {}
        prefix = wait_kinds.DEBOUNCE.key("")
        for row in self._fetchall("debounce_windows", {"ids": self._names([checked_run_id(i) for i in run_ids])}):
            wait_key = row["wait_key"] or ""
            key = wait_key[len(prefix):] if wait_key.startswith(prefix) else ""
            found[str(row["id"])] = DebounceWindow(key, int(row["debounce_calls"]))
        return found


__all__ = ["DebounceWindow", "Debounces"]
