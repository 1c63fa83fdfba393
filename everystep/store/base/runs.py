"""Runs: scheduling them, reading them, and the row locks operator actions take.

``schedule`` commits its run at once; ``schedule_on`` writes it in the
caller's open transaction, so it exists (and a runner may claim it) only
once the caller commits, and a rollback leaves nothing behind. With an
idempotency key the unique index decides between concurrent schedulers:
the loser reads the winner's run. ``locked_run`` holds the run's row lock
for an admin command's whole transaction, so a claim or an executor's
write waits for it or sees its result, never half of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import Iterator
from typing import Any

from ...errors import EverystepError, RunNotFound
from ...models import SCHEDULED, WAITING, Attempt, Run, StepRecord
from ...queues import Placement
from . import statements
from .core import Row, StoreCore
from .values import checked_run_id, new_run_id, utcnow


class Runs(StoreCore):
    """Scheduling, reading runs and their steps, and the admin commands' locked transactions."""

    def schedule(self, name: str, args_json: str, idempotency_key: str | None = None,
                 not_before: dt.datetime | None = None, placement: Placement | None = None,
                 app_version: str | None = None, *, deadline: dt.datetime | None = None) -> Run:
        """Insert a scheduled run and commit it (claimable from ``not_before``
        on, if given), in ``placement``'s queue (default: the default queue).

        With an idempotency key, an existing run of the same workflow and key
        is returned instead of inserting a second one.
        """
        with self.connection() as conn:
            return self._schedule_through(conn, name, args_json, idempotency_key, not_before, placement, app_version,
                                          deadline=deadline)

    @classmethod
    def schedule_on(cls, conn: Any, name: str, args_json: str, idempotency_key: str | None,
                    not_before: dt.datetime | None = None, placement: Placement | None = None,
                    app_version: str | None = None, *, deadline: dt.datetime | None = None) -> Run:
        """Insert a run through a caller's own connection of this backend,
        inside whatever transaction it has open."""
        with cls._caller_cursor(conn) as cursor:
            return cls._schedule_through(cursor, name, args_json, idempotency_key, not_before, placement, app_version,
                                         deadline=deadline)

    @classmethod
    def _schedule_through(cls, conn: Any, name: str, args_json: str, idempotency_key: str | None,
                          not_before: dt.datetime | None = None, placement: Placement | None = None,
                          app_version: str | None = None, *,
                          parent_id: str | None = None, deadline: dt.datetime | None = None) -> Run:
        """The insert; ``parent_id``: the run that starts this one as its
        child; ``deadline``: when it is cancelled if still unfinished."""
        params = cls._schedule_params(name, args_json, idempotency_key, not_before, placement, app_version,
                                      parent_id=parent_id, deadline=deadline)
        return statements.run(conn, cls._schedule_statements(params))

    @classmethod
    def _schedule_params(cls, name: str, args_json: str, idempotency_key: str | None,
                         not_before: dt.datetime | None = None, placement: Placement | None = None,
                         app_version: str | None = None, *,
                         parent_id: str | None = None, deadline: dt.datetime | None = None) -> dict[str, Any]:
        place = placement or Placement()
        return cls._params(id=new_run_id(), name=name, args=args_json, idempotency_key=idempotency_key,
                           not_before=cls._time_param(not_before) if not_before is not None else None,
                           queue=place.queue, priority=place.priority, concurrency_key=place.concurrency_key,
                           app_version=app_version,
                           parent_id=checked_run_id(parent_id) if parent_id is not None else None,
                           deadline=cls._time_param(deadline) if deadline is not None else None)

    @classmethod
    def _schedule_statements(cls, params: dict[str, Any]) -> statements.Statements[Run]:
        """The insert of a run (``_schedule_params``), or the existing run
        of the same workflow and idempotency key, on any cursor."""
        sql = cls.statements()
        row = yield statements.Statement(sql["schedule"], params)
        if row is None:
            row = yield statements.Statement(sql["get_run_by_key"], params)
            if row is None:
                raise EverystepError(
                    f"run with idempotency key {params['idempotency_key']!r} conflicts but is not visible "
                    "in this transaction; retry outside a REPEATABLE READ transaction"
                )
        return cls._run(row)

    def get_run(self, run_id: str) -> Run:
        row = self._fetchone("get_run", {"id": checked_run_id(run_id)})
        if row is None:
            raise RunNotFound(f"no run with id {run_id}")
        return self._run(row)

    def list_runs(self, status: str | None = None, name: str | None = None, limit: int = 100,
                  version: str | None = None) -> list[Run]:
        """Runs newest first; ``status`` is a status or ``waiting`` (``models.RUN_FILTERS``)."""
        rows = self._fetchall("list_runs", {**self._status_filter(status), "name": name, "limit": limit,
                                            "version": version})
        return [self._run(row) for row in rows]

    def count_runs(self, status: str | None = None, name: str | None = None, cap: int = 100_000,
                   version: str | None = None) -> int:
        """Runs matching the filters of ``list_runs``, counted exactly up to
        ``cap`` (the cost is bounded by it)."""
        row = self._fetchone("count_runs_upto", {**self._status_filter(status), "name": name, "cap": int(cap),
                                                 "version": version})
        assert row is not None
        return int(row["total"])

    def _status_filter(self, status: str | None) -> dict[str, Any]:
        """The ``status`` and ``waiting_at`` parameters of a list filtered by
        ``status``: ``waiting`` is a scheduled run not due before now."""
        if status == WAITING:
            return {"status": str(SCHEDULED), "waiting_at": self._time_param(utcnow())}
        return {"status": status, "waiting_at": None}

    def get_steps(self, run_id: str) -> list[StepRecord]:
        """A run's recorded steps, each with its retried attempts."""
        rows = self._fetchall("get_steps", {"id": checked_run_id(run_id)})
        steps = [self._step(row) for row in rows]
        if steps:
            steps = self._with_attempts(run_id, steps)
        return steps

    def attempts(self, run_id: str) -> dict[str, list[Attempt]]:
        """The failed attempts of a run's retried steps, by step id, oldest first."""
        found: dict[str, list[Attempt]] = {}
        for row in self._fetchall("get_attempts", {"id": checked_run_id(run_id)}):
            found.setdefault(row["step_id"], []).append(self._attempt(row))
        return found

    @classmethod
    def _attempt(cls, row: Row) -> Attempt:
        return Attempt(
            attempt=int(row["attempt"]), error=cls._json(row["error"]),
            started_at=cls._time(row["started_at"]), failed_at=cls._time(row["failed_at"]),
            retry_at=cls._time(row["retry_at"]),
        )

    def _with_attempts(self, run_id: str, steps: list[StepRecord]) -> list[StepRecord]:
        if not any(step.attempt > 1 or step.status == "retrying" for step in steps):
            return steps
        history = self.attempts(run_id)
        return [dataclasses.replace(step, attempts=history.get(step.step_id, [])) for step in steps]

    @contextlib.contextmanager
    def locked_run(self, run_id: str) -> Iterator[tuple[Any, Run]]:
        """A write transaction holding the run's row lock (admin commands)."""
        with self.connection() as conn, self._transaction(conn):
            row = conn.execute(self.sql["lock_run"], {"id": checked_run_id(run_id)}).fetchone()
            if row is None:
                raise RunNotFound(f"no run with id {run_id}")
            yield conn, self._run(row)

    def locked_step(self, conn: Any, run_id: str, step_id: str) -> StepRecord | None:
        row = conn.execute(self.sql["lock_step"], {"run_id": checked_run_id(run_id), "step_id": step_id}).fetchone()
        return self._step(row) if row is not None else None

    def notify_fenced(self, conn: Any, runner: str, run_id: str) -> None:
        """Tell ``runner`` (in ``conn``'s transaction, delivered on commit)
        that a run it holds was taken from it; backends without
        notifications leave it to the runner's next heartbeat."""
        if self.notifies:
            conn.execute(self.sql["notify_fenced"], {"runner": runner, "run_id": checked_run_id(run_id)})

    def forks_of(self, run_id: str) -> list[Run]:
        """The runs forked from ``run_id`` (``everystep fork``), oldest first."""
        return [self._run(row) for row in self._fetchall("forks_of", {"id": checked_run_id(run_id)})]

    def steps_in(self, conn: Any, run_id: str) -> list[StepRecord]:
        """A run's steps, read in ``conn``'s transaction (``locked_run``)."""
        rows = conn.execute(self.sql["steps_for_update"], {"run_id": checked_run_id(run_id)}).fetchall()
        return [self._step(row) for row in rows]

    def fork_run(self, conn: Any, source: Run, cut: StepRecord, args_json: str, placement: Placement,
                 app_version: str | None, deadline: dt.datetime | None, marker_name: str) -> tuple[Run, int]:
        """In ``conn``'s transaction (``locked_run`` of ``source``): a new
        scheduled run of ``source``'s workflow, ``forked_from`` it, holding
        a copy of every step ``source`` recorded before ``cut`` was recorded
        (and the patch markers written with ``cut``, named ``marker_name``).
        Returns the new run and how many steps were copied."""
        assert cut.completed_at is not None
        params = self._params(
            id=new_run_id(), name=source.name, args=args_json, queue=placement.queue, priority=placement.priority,
            concurrency_key=placement.concurrency_key, app_version=app_version,
            deadline=self._time_param(deadline) if deadline is not None else None,
            run_id=checked_run_id(source.id), step_id=cut.step_id, cut=self._time_param(cut.completed_at),
            patch_name=marker_name,
        )
        row = conn.execute(self.sql["insert_fork"], params).fetchone()
        copied = conn.execute(self.sql["fork_steps"], params).rowcount
        return self._run(row), int(copied)

    def execute_named(self, conn: Any, name: str, **params: Any) -> int:
        """Run a named admin statement in ``conn``'s transaction; returns rows touched."""
        if "run_id" in params:
            params["run_id"] = checked_run_id(params["run_id"])
        cursor = conn.execute(self.sql[name], self._params(**params))
        if cursor.description is not None:
            return len(cursor.fetchall())
        return int(cursor.rowcount)
