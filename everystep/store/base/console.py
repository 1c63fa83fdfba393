"""Reads for the console, the CLI and check-deploy: pages, counts, lookups.

Nothing here writes. Each read's cost is bounded whatever the size of the
history: pages are keyset-paginated along an index, counts stop at a cap
or come from the planner's statistics, and an id prefix is a range of the
primary key. (Built on ``runs``: a lookup by prefix ends in ``get_run``.)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from ...errors import EverystepError, RunNotFound
from ...models import Run, StepRecord
from .runs import Runs
from .values import MAX_UUID, MIN_UUID, checked_run_id, id_prefix_range


class ConsoleReads(Runs):
    """Pages of runs, bounded counts, and finding a run by an id prefix."""

    def page_runs(
        self,
        *,
        status: str | None = None,
        name: str | None = None,
        queue: str | None = None,
        id_range: tuple[str, str] = (MIN_UUID, MAX_UUID),
        older_than: tuple[dt.datetime | None, str] | None = None,
        newer_than: tuple[dt.datetime | None, str] | None = None,
        limit: int = 50,
    ) -> list[Run]:
        """One page of runs, newest first, keyset-paginated.

        Without a status the order is the primary key (UUIDv7: creation
        order); with one (or ``waiting``: the scheduled runs not due yet),
        ``(created_at, id)`` along the status index. A
        cursor is the ``(created_at, id)`` of the last row seen: rows older
        than it (``older_than``) or newer (``newer_than``, fetched oldest
        first and returned newest first).
        """
        if older_than is not None and newer_than is not None:
            raise EverystepError("page_runs takes one cursor, not two")
        newer = newer_than is not None
        cursor = newer_than if newer else older_than
        cursor_at: Any
        if cursor is None:
            cursor_id = MIN_UUID if newer else MAX_UUID
            cursor_at = self._time_bound(newer)
        else:
            cursor_id = checked_run_id(cursor[1])
            cursor_at = self._time_param(cursor[0]) if cursor[0] is not None else self._time_bound(newer)
        statement = ("page_runs_status_" if status else "page_runs_") + ("newer" if newer else "older")
        params = {
            **self._status_filter(status), "name": name or None, "queue": queue or None, "lo": id_range[0],
            "hi": id_range[1], "cursor_id": cursor_id, "cursor_at": cursor_at, "limit": int(limit),
        }
        runs = [self._run(row) for row in self._fetchall(statement, params)]
        return runs[::-1] if newer else runs

    @classmethod
    def _time_bound(cls, low: bool) -> Any:
        """A timestamp parameter below (``low``) or above every stored one."""
        return "-infinity" if low else "infinity"

    def find_run(self, id_or_prefix: str) -> Run:
        """The run whose id is ``id_or_prefix`` or starts with it (a unique
        prefix, as git takes one). ``RunNotFound`` when none or several match."""
        try:
            return self.get_run(checked_run_id(id_or_prefix))
        except RunNotFound:
            pass
        matches = self.page_runs(id_range=id_prefix_range(id_or_prefix), limit=3)
        if not matches:
            raise RunNotFound(f"no run with id {id_or_prefix} (nor starting with it)")
        if len(matches) > 1:
            shown = ", ".join(run.id for run in matches[:2])
            raise RunNotFound(f"run id prefix {id_or_prefix!r} is ambiguous: it matches {shown}"
                              f"{' and more' if len(matches) > 2 else ''}; give more characters")
        return matches[0]

    def count_status_upto(self, status: str, cap: int) -> int:
        """Runs in ``status``, counted exactly up to ``cap`` (cost bounded by it)."""
        row = self._fetchone("count_status_upto", {"status": status, "cap": int(cap)})
        assert row is not None
        return int(row["total"])

    def count_statuses(self) -> dict[str, int]:
        """Exact runs per status: a scan of the whole table (see the console's counts)."""
        return {row["status"]: int(row["total"]) for row in self._fetchall("count_statuses", {})}

    def estimate_statuses(self) -> tuple[float, dict[str, float]] | None:
        """The database's own estimate: (rows in the table, {status: share of
        rows}), or None when it has none (SQLite; a table never analysed)."""
        row = self._fetchone("estimate_statuses", {})
        if row is None or row["estimated_rows"] is None or float(row["estimated_rows"]) < 0:
            return None
        values, freqs = row["status_values"] or [], row["status_shares"] or []
        return float(row["estimated_rows"]), {str(value): float(freq) for value, freq in zip(values, freqs)}

    def steps_of_runs(self, run_ids: Sequence[str], waiting_only: bool = False) -> dict[str, list[StepRecord]]:
        """The recorded steps of several runs in one query, by run id;
        ``waiting_only``: only the rows still waiting (``models.STEP_WAITING_STATUSES``),
        which say what a waiting run waits for."""
        found: dict[str, list[StepRecord]] = {checked_run_id(run_id): [] for run_id in run_ids}
        if not found:
            return found
        statement = "waiting_steps_of_runs" if waiting_only else "steps_of_runs"
        for row in self._fetchall(statement, {"ids": self._names(list(found))}):
            record = self._step(row)
            found.setdefault(record.workflow_id, []).append(record)
        return found
