"""The execution hot path: claims, step records, and a run's last write.

Every write here but the claims carries the executor's ``Claim`` (claimer
and epoch) and is conditional on it, so a stale execution writes nothing:
the methods return ``False`` or ``LOST`` and the caller stops. Crash
windows: a claim commits before its runs are handed out, so a runner that
dies after it leaves them ``running`` under its name (its own catch-up,
``claim_own``, or the lease sweep takes them back); a step whose effect
ran but whose record never committed runs again on the next claim
(at-least-once; an unsafe step's ``started`` row makes that ``blocked``
instead); ``finish_run_with_step`` writes the last record and the run's
status together or not at all.

Patch markers (``everystep.patched``) never take a transaction of their
own: the runner hands the ones it holds to its next write (``markers=``),
and they are written in that write's transaction, fenced by the same
claim, before its own statement. So a step recorded after a patch point is
never durable without the marker before it; a marker with nothing after it
that is lost in a crash is decided again, the same way, on the next claim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import gc
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ... import serde
from ...models import STEP_STARTED, Claim, Outcomes, ReplayRow, Run, StepRecord
from ...resources import StepCost
from ...wait_kinds import CHILD
from .core import Row, StoreCore
from .values import LOST, ClaimState, Marker, NewStep, StepWrite, checked_run_id, utcnow


class Execution(StoreCore):
    """What a runner does for every run: claim it, record its steps, end it."""

    def claim(self, claimer: str, limit: int, names: Sequence[str],
              queues: Sequence[str] | None = None, versions: Sequence[str] | None = None) -> list[Run]:
        """Claim up to ``limit`` due runs of the given workflows from
        ``queues`` (None: every queue), bumping each one's claim epoch.
        Paused queues are skipped and each queue's limits are enforced by the
        claim itself (see ``everystep.queues``); within a queue the highest
        priority goes first, then the earliest due. Concurrent claimers get
        disjoint sets. ``versions``: only runs started under one of these
        code versions, or under none recorded (None: every version; see
        ``everystep.versions``). Returned highest priority first, then oldest."""
        if limit <= 0 or not names or (queues is not None and not queues):
            return []
        params = self._params(claimer=claimer, limit=limit, names=self._names(names),
                              queues=self._names(queues) if queues is not None else None,
                              versions=self._names(versions) if versions is not None else None,
                              serve_all=int(versions is None), version_list=self._names(versions or ()))
        with self.connection() as conn, self._claim_transaction(conn):
            rows = self._claim_rows(conn, params)
        runs = [self._run(row) for row in rows]
        runs.sort(key=lambda run: (-run.priority, run.created_at or utcnow(), run.id))
        return runs

    def _claim_rows(self, conn: Any, params: dict[str, Any]) -> list[Row]:
        """The claim, inside ``_claim_transaction``: one statement where the
        backend enforces the queue limits in it (PostgreSQL's function)."""
        return self._fetchall("claim", params, conn)

    def claim_own(
        self, claimer: str, limit: int, names: Sequence[str], exclude: Sequence[str] = ()
    ) -> list[Run]:
        """Re-claim runs left ``running`` under ``claimer`` by a process that
        died (or that nothing of ours executes any more): each one's epoch is
        bumped, so a stale execution of it is fenced."""
        if limit <= 0 or not names:
            return []
        params = {
            "claimer": claimer,
            "limit": limit,
            "names": self._names(names),
            "exclude": self._names([checked_run_id(run_id) for run_id in exclude]),
        }
        with self.connection() as conn, self._claim_transaction(conn):
            rows = conn.execute(self.sql["claim_own"], params).fetchall()
        return sorted((self._run(row) for row in rows), key=lambda run: (run.created_at or utcnow(), run.id))

    def requeue(self, claim: Claim) -> bool:
        """Give a run back to the queue, if ``claim`` is still its current one."""
        return self._fetchone("requeue", self._claim_params(claim)) is not None

    def requeue_all(self, claimer: str) -> list[str]:
        """Requeue everything still claimed under ``claimer`` (its owner's
        last act at exit, once nothing of it executes any more)."""
        return [str(row["id"]) for row in self._fetchall("requeue_all", {"claimer": claimer})]

    def claim_states(self, run_ids: Sequence[str]) -> dict[str, ClaimState]:
        """Where the given runs stand now (missing ids are left out)."""
        if not run_ids:
            return {}
        rows = self._fetchall("claim_states", {"ids": self._names([checked_run_id(run_id) for run_id in run_ids])})
        return {str(row["id"]): ClaimState(row["status"], row["claimed_by"], int(row["claim_epoch"]))
                for row in rows}

    def next_due(self, names: Sequence[str], queues: Sequence[str] | None = None) -> float | None:
        """Seconds until the next scheduled run of ``queues`` (None: every
        queue; paused ones left out) that is not due yet becomes due; None
        when there is none. One index probe per queue, by the database's
        clock. (``names`` only says whether there is anything to time: a
        timer that fires for a run of a workflow this runner does not know
        costs one empty claim.)"""
        if not names or (queues is not None and not queues):
            return None
        row = self._next_due_row(self._params(queues=self._names(queues) if queues is not None else None))
        if row is None or row["wait"] is None:
            return None
        return float(row["wait"])

    def _next_due_row(self, params: dict[str, Any]) -> Row | None:
        return self._fetchone("next_due", params)

    def load_outcomes(self, run_id: str) -> Outcomes:
        """What a replay needs, in one statement: each step's outcome (its
        id, function, status, result or error, attempt, start and wake
        times), not its arguments or costs, kept as read; a record is built
        only when the replay asks for it (``models.Outcomes``). The history
        of retried attempts is not read: a step row says its attempt and
        when the next one is due."""
        run = checked_run_id(run_id)
        with self.connection() as conn, _collector.paused():
            rows = {values[0]: values for values in self._replay_rows(conn, {"id": run})}
        return Outcomes(run, rows, self._replay_json, self._time)

    def _replay_rows(self, conn: Any, params: dict[str, Any]) -> Iterable[ReplayRow]:
        """``replay_steps``'s rows as tuples, one at a time (a backend whose
        driver loads rows faster all at once overrides it)."""
        for row in conn.execute(self.sql["replay_steps"], params):
            yield tuple(row.values()) if isinstance(row, Mapping) else tuple(row)

    @classmethod
    def _replay_json(cls, value: Any) -> Any:
        """A result or error of ``replay_steps``, decoded when the replay
        reaches its step (the backend's ``_json`` unless its statement
        reads them as text where its other statements do not)."""
        return cls._json(value)

    def record_step(self, claim: Claim, step: NewStep, decoded: StepRecord | None = None,
                    markers: Sequence[Marker] = ()) -> StepWrite | None:
        """Record a finished step. Returns ``LOST`` if ``claim`` is no longer
        current, or the record someone else wrote first (``ours=False``).
        ``decoded`` is the caller's own Python view of the same step, so the
        store need not parse back what it was just given. ``markers``: patch
        markers to write first, in the same transaction (see the module)."""
        params = self._step_params(claim, step)
        if not markers:  # the usual case, on every step: one statement
            with self.connection() as conn:
                row = self._fetchone("record_step", params, conn)
                if row is None:
                    return self._conflict(conn, params)
            return StepWrite(self._written(claim, step, decoded, row), ours=True)
        if len(markers) == 1 and "record_step_marked" in self.sql:  # a patch point's: still one statement
            with self.connection() as conn:
                row = self._record_step_marked(conn, params, step, markers[0])
                if row is None:
                    return self._conflict(conn, params)
            return StepWrite(self._written(claim, step, decoded, row), ours=True)
        with self._marked(params, markers) as conn:
            row = self._fetchone("record_step", params, conn)
            if row is None:
                return self._conflict(conn, params)
        return StepWrite(self._written(claim, step, decoded, row), ours=True)

    def _record_step_with(self, conn: Any, params: dict[str, Any], step: NewStep,
                          markers: Sequence[Marker]) -> Row | None:
        """``record_step`` on ``conn``; one marker goes in the same statement
        where the backend has it (``record_step_marked``), more before it."""
        if len(markers) == 1 and "record_step_marked" in self.sql:
            return self._record_step_marked(conn, params, step, markers[0])
        self._record_markers(conn, params, markers)
        return self._fetchone("record_step", params, conn)

    def _record_step_marked(self, conn: Any, params: dict[str, Any], step: NewStep, marker: Marker) -> Row | None:
        """``record_step`` and ``marker`` in one statement: the step's row,
        or None (the marker's row may come back beside it)."""
        for row in self._fetchall("record_step_marked", self._with_marker(params, marker), conn):
            if row["step_id"] == step.step_id:
                return row
        return None

    @staticmethod
    def _with_marker(params: dict[str, Any], marker: Marker) -> dict[str, Any]:
        """``params`` of a write (the caller's own: added to, not copied),
        with those of the one marker it carries."""
        params["marker_id"], params["marker_name"], params["marker_args"], params["marker_result"] = marker
        return params

    @contextlib.contextmanager
    def _marked(self, params: Mapping[str, Any], markers: Sequence[Marker]) -> Iterator[Any]:
        """A connection for one write; with ``markers``, a write transaction
        whose first statements record them (fenced like any step record: a
        lost claim writes none of them, and the write after them learns why)."""
        with self.connection() as conn:
            if not markers:
                yield conn
                return
            with self._transaction(conn):
                self._record_markers(conn, params, markers)
                yield conn

    def _record_markers(self, conn: Any, params: Mapping[str, Any], markers: Sequence[Marker]) -> None:
        """Write ``markers`` on ``conn``, inside the caller's transaction.
        ``params``: those of the write they go with (its claim and time)."""
        for marker in markers:
            conn.execute(self.sql["record_marker"], {**params, "step_id": marker.step_id, "name": marker.name,
                                                     "args": marker.args_json, "result": marker.result_json})

    def _step_params(self, claim: Claim, step: NewStep) -> dict[str, Any]:
        return self._params(
            **self._claim_params(claim), step_id=step.step_id, name=step.name,
            args=step.args_json, kwargs=step.kwargs_json, status=step.status, result=step.result_json,
            error=step.error_json, started_at=self._time_param(step.started_at), attempt=step.attempt,
            wake_at=self._time_param(step.wake_at) if step.wake_at is not None else None,
            cpu_seconds=step.cpu_seconds, peak_rss_bytes=step.peak_rss_bytes,
        )

    def _written(self, claim: Claim, step: NewStep, decoded: StepRecord | None, row: Row) -> StepRecord:
        if decoded is None:
            decoded = StepRecord(
                workflow_id=str(claim.run_id), step_id=step.step_id, name=step.name, status=step.status,
                result=serde.loads(step.result_json), error=serde.loads(step.error_json),
                args=serde.loads(step.args_json) or [], kwargs=serde.loads(step.kwargs_json) or {},
                started_at=step.started_at, attempt=step.attempt, wake_at=step.wake_at,
                cpu_seconds=step.cpu_seconds, peak_rss_bytes=step.peak_rss_bytes,
            )
        return decoded.completed(self._time(row["completed_at"]))

    def start_step(self, claim: Claim, step: NewStep, markers: Sequence[Marker] = ()) -> StepWrite | None:
        """Insert the ``started`` row of an unsafe step: the atomic claim on its
        effect, itself fenced by ``claim``. A conflicting row is returned
        with ``ours=False``; ``LOST`` if the claim is no longer current."""
        params = self._params(
            **self._claim_params(claim), step_id=step.step_id, name=step.name,
            args=step.args_json, kwargs=step.kwargs_json, started_at=self._time_param(step.started_at),
        )
        with self._marked(params, markers) as conn:
            row = conn.execute(self.sql["start_step"], params).fetchone()
            if row is None:
                return self._conflict(conn, params)
        return StepWrite(
            StepRecord(
                workflow_id=str(claim.run_id), step_id=step.step_id, name=step.name, status=STEP_STARTED,
                args=serde.loads(step.args_json), kwargs=serde.loads(step.kwargs_json),
                started_at=step.started_at,
            ),
            ours=True,
        )

    def finish_step(
        self, claim: Claim, started: StepRecord, status: str,
        result_json: str | None, error_json: str | None,
        decoded: StepRecord | None = None,
        cost: StepCost | None = None,
        markers: Sequence[Marker] = (),
    ) -> StepWrite | None:
        """Turn our ``started`` row into its outcome (``decoded``: as in
        ``record_step``; ``cost``: what the step used, where it was measured)."""
        params = self._params(
            **self._claim_params(claim), step_id=started.step_id,
            status=status, result=result_json, error=error_json,
            cpu_seconds=cost.cpu_seconds if cost is not None else None,
            peak_rss_bytes=cost.peak_rss_bytes if cost is not None else None,
        )
        with self._marked(params, markers) as conn:
            row = conn.execute(self.sql["finish_step"], params).fetchone()
            if row is None:
                return self._conflict(conn, params)
        if decoded is None:
            decoded = dataclasses.replace(
                started, status=status, result=serde.loads(result_json), error=serde.loads(error_json),
                cpu_seconds=params["cpu_seconds"], peak_rss_bytes=params["peak_rss_bytes"],
            )
        return StepWrite(decoded.completed(self._time(row["completed_at"])), ours=True)

    def _conflict(self, conn: Any, params: Mapping[str, Any]) -> StepWrite | None:
        row = conn.execute(self.sql["step_conflict"], params).fetchone()
        if not row["owned"] or row["step_id"] is None:
            # Not our claim any more; or ours, yet the write changed nothing
            # and no row exists (it vanished in between): either way the run
            # is replayed from what is recorded.
            return LOST
        return StepWrite(self._step(row), ours=False)

    def record_attempt(self, claim: Claim, step: NewStep, decoded: StepRecord | None = None,
                       markers: Sequence[Marker] = ()) -> StepWrite | None:
        """Record a failed attempt that will be retried: the step row becomes
        ``retrying`` (attempt ``step.attempt``, next one at ``step.wake_at``)
        and the attempt joins the step's history, in one transaction fenced
        by ``claim``. Returns like ``record_step``."""
        params = self._step_params(claim, step)
        with self.connection() as conn, self._transaction(conn):
            self._record_markers(conn, params, markers)
            row = conn.execute(self.sql["record_step"], params).fetchone()
            if row is None:
                return self._conflict(conn, params)
            conn.execute(self.sql["insert_attempt"], {**params, "failed_at": row["completed_at"]})
        return StepWrite(self._written(claim, step, decoded, row), ours=True)

    def record_cancelled_step(self, claim: Claim, step: NewStep) -> bool:
        """Record the step a cancel cut off, as the holder of the cancelled
        ``claim`` (the run is ``cancelled`` and was held by it): the only
        write a cancelled execution may still make. False otherwise, or if
        the step already has an outcome."""
        return self._fetchone("record_cancelled_step", self._step_params(claim, step)) is not None

    def release(self, claim: Claim, not_before: dt.datetime) -> bool:
        """Give the run back to the queue, not claimable before
        ``not_before`` (a retry's backoff, a durable sleep), if ``claim`` is
        still current. Nothing can claim it earlier: claims take due runs
        only."""
        params = self._params(**self._claim_params(claim), not_before=self._time_param(not_before))
        return self._fetchone("release", params) is not None

    def defer(self, claim: Claim, not_before: dt.datetime, error_json: str) -> bool:
        """Give the run back to the queue until ``not_before`` after one of
        the engine's statements failed, with that error (``error_json``) as
        its error meanwhile, if ``claim`` is still current
        (``everystep.engine_errors``)."""
        params = self._params(**self._claim_params(claim), not_before=self._time_param(not_before),
                              error=error_json)
        return self._fetchone("defer", params) is not None

    def finish_run(
        self,
        claim: Claim,
        status: str,
        result_json: str | None = None,
        error_json: str | None = None,
        markers: Sequence[Marker] = (),
    ) -> bool:
        """Move a running run to a terminal status, if ``claim`` is still
        current (with ``markers``, written first in the same transaction)."""
        params = self._params(**self._claim_params(claim), status=status, result=result_json, error=error_json)
        if not markers:
            row = self._fetchone("finish_run", params)
        else:
            with self._marked(params, markers) as conn:
                row = self._fetchone("finish_run", params, conn)
        if row is None:
            return False
        self._wake_parent(claim.run_id, row["wake_parent"])
        return True

    def _wake_parent(self, run_id: str, parent_id: Any) -> None:
        """A child run ended: end its parent's wait for it, if the parent
        waits (``waits.py``). Where the finishing statement did it already
        (PostgreSQL), ``parent_id`` is None."""
        if parent_id is not None:
            self.wake_waiter(str(parent_id), CHILD.key(str(run_id)))

    def wake_waiter(self, run_id: str, wait_key: str, conn: Any = None) -> None:
        """End ``run_id``'s wait for ``wait_key`` (``message:<topic>``,
        ``child:<run id>``) if it waits for it, in ``conn``'s transaction or
        one of its own (see ``waits.py`` for the locking)."""
        params = self._params(run_id=checked_run_id(run_id), wait_key=wait_key)
        if conn is not None:
            conn.execute(self.sql["wake_waiter"], params).fetchall()
            return
        with self.connection() as own:
            own.execute(self.sql["wake_waiter"], params).fetchall()

    def finish_run_with_step(
        self,
        claim: Claim,
        step: NewStep,
        status: str,
        result_json: str | None = None,
        error_json: str | None = None,
        decoded: StepRecord | None = None,
        markers: Sequence[Marker] = (),
    ) -> StepWrite | None:
        """Record the run's last step and move the run to its terminal
        status, both or neither, in one transaction with one durable commit
        (it holds a step record), if ``claim`` is still current. ``LOST``
        when nothing was written: the claim moved on, or the step already
        has an outcome; the caller then writes the step alone to learn which.
        Here: ``record_step`` and ``finish_run`` in one write transaction."""
        params = self._step_params(claim, step)
        finish = {**params, "status": status, "result": result_json, "error": error_json}
        try:
            with self.connection() as conn, self._transaction(conn):
                row = self._record_step_with(conn, params, step, markers)
                finished = conn.execute(self.sql["finish_run"], finish).fetchone() if row is not None else None
                if row is None or finished is None:
                    raise _NothingWritten
        except _NothingWritten:
            return LOST
        self._wake_parent(claim.run_id, finished["wake_parent"])
        return StepWrite(self._written(claim, step, decoded, row), ours=True)


class _Collector:
    """The cyclic garbage collector, paused while long histories are read.

    Process-wide, as the collector is: the first reader to pause it turns it
    off (if it was on), the last to finish turns it back on, so threads
    reading at once leave it as they found it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readers = 0
        self._was_enabled = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            if self._readers == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._readers += 1
        try:
            yield
        finally:
            with self._lock:
                self._readers -= 1
                if self._readers == 0 and self._was_enabled:
                    gc.enable()


#: Paused while a replay reads a run's history: the collector would walk the
#: records being built again and again as they pile up (at 100,000 steps,
#: twice the cost of reading them).
_collector = _Collector()


class _NothingWritten(Exception):
    """Rolls back a transaction of which one write was refused."""
