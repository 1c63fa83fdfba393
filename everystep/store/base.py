"""The Store: every database operation everystep performs, backend-neutral.

A ``Store`` owns a small pool of connections to one database. A connection
is used by one thread at a time and never crosses ``fork()``: the pool
remembers the pid that opened it and refuses to hand out inherited
connections, and ``close()`` before forking leaves nothing for a child to
finalise. Backends supply the SQL (``queries/<backend>.sql``), how to open a
connection, how to run a write transaction and how to read their column
types; the logic of each operation lives here once.

Every state change a runner makes is conditional on the run still being
``running`` and claimed by that runner, so a stale writer can never clobber a
run that moved on: the methods return ``False``/``LOST`` instead.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import threading
import dataclasses
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .. import serde
from ..errors import EverystepError, RunNotFound, StoreUnavailable
from ..models import STEP_STARTED, Run, StepRecord
from . import migrations, queries

LOST = None
"""Returned by step writes when this claimer no longer owns the run."""

MAX_IDLE_CONNECTIONS = 8


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_run_id() -> str:
    """A UUIDv7: time-ordered, so ids sort like creation times."""
    millis = int(utcnow().timestamp() * 1000)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= (rand >> 68) << 64 & (0xFFF << 64)  # 12 random bits
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


@dataclass(frozen=True)
class RunnerInfo:
    """A row of ``everystep_runner`` plus what it holds."""

    name: str
    kind: str
    host: str
    pid: int
    lease_seconds: float
    started_at: dt.datetime | None
    heartbeat_at: dt.datetime | None
    silent_seconds: float
    running: int

    @property
    def expired(self) -> bool:
        return self.silent_seconds > self.lease_seconds


class StepWrite:
    """The outcome of recording a step: ours, or one someone else recorded."""

    __slots__ = ("record", "ours")

    def __init__(self, record: StepRecord, ours: bool) -> None:
        self.record = record
        self.ours = ours


class Store:
    """Base class; see ``postgres.PostgresStore`` and ``sqlite.SQLiteStore``."""

    backend: str = ""
    #: Exceptions of the driver that mean "the database is unreachable".
    _unavailable: tuple[type[BaseException], ...] = ()
    _driver_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, url: str) -> None:
        self.url = url
        self.sql = self.statements()
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @classmethod
    def statements(cls) -> dict[str, str]:
        return queries.load(cls.backend)

    # -- backend hooks -------------------------------------------------------

    def _open(self) -> Any:
        raise NotImplementedError

    def _transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """A write transaction that takes its locks up front."""
        raise NotImplementedError

    def _claim_transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """Around the claim statement: nothing where that one statement is
        atomic and disjoint on its own (PostgreSQL's SKIP LOCKED)."""
        return contextlib.nullcontext(conn)

    @classmethod
    def _names(cls, names: Sequence[str]) -> Any:
        return list(names)

    @classmethod
    def _time(cls, value: Any) -> dt.datetime | None:
        return value

    @classmethod
    def _json(cls, value: Any) -> Any:
        return value

    @classmethod
    def _time_param(cls, value: dt.datetime) -> Any:
        return value

    def _migrate_locked(self, conn: Any) -> list[str]:
        raise NotImplementedError

    def describe(self) -> str:
        """The URL without its password, for logs and errors."""
        return _redact(self.url)

    # -- connections ---------------------------------------------------------

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        """Check out a connection for this thread; broken ones are discarded.

        Driver errors come out as ``StoreUnavailable`` (connection trouble)
        or ``EverystepError`` (anything else the database refused), with the
        driver's exception chained.
        """
        if os.getpid() != self._pid:
            raise EverystepError("a Store cannot be used across fork(); open a new one in the child")
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        try:
            if conn is None:
                conn = self._open()
            yield conn
        except self._unavailable as exc:
            self._discard(conn)
            raise StoreUnavailable(f"database {self.describe()} unavailable: {_first_line(exc)}") from exc
        except self._driver_errors as exc:
            self._release_after_error(conn)
            raise EverystepError(f"database error: {_first_line(exc)}") from exc
        except BaseException:
            self._release_after_error(conn)
            raise
        else:
            self._release(conn)

    def _release(self, conn: Any) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        _close_quietly(conn)

    def _release_after_error(self, conn: Any) -> None:
        if conn is None:
            return
        if self._healthy(conn):
            self._release(conn)
        else:
            self._discard(conn)

    def _healthy(self, conn: Any) -> bool:
        return True

    def _discard(self, conn: Any) -> None:
        if conn is not None:
            _close_quietly(conn)

    def close(self) -> None:
        """Close every idle connection (call before ``fork()``)."""
        with self._lock:
            idle, self._idle = self._idle, []
        if os.getpid() == self._pid:
            for conn in idle:
                _close_quietly(conn)

    def _fetchall(self, name: str, params: dict[str, Any], conn: Any = None) -> list[Any]:
        if conn is not None:
            return conn.execute(self.sql[name], params).fetchall()
        with self.connection() as own:
            return own.execute(self.sql[name], params).fetchall()

    def _fetchone(self, name: str, params: dict[str, Any], conn: Any = None) -> Any:
        rows = self._fetchall(name, params, conn)
        return rows[0] if rows else None

    @classmethod
    def _params(cls, **params: Any) -> dict[str, Any]:
        now = utcnow()
        params["now"] = cls._time_param(now)
        params["epoch"] = now.timestamp()
        return params

    # -- row mapping ---------------------------------------------------------

    @classmethod
    def _run(cls, row: Sequence[Any]) -> Run:
        return Run(
            id=str(row[0]),
            name=row[1],
            args=cls._json(row[2]),
            status=row[3],
            idempotency_key=row[4],
            claimed_by=row[5],
            claimed_at=cls._time(row[6]),
            result=cls._json(row[7]),
            error=cls._json(row[8]),
            created_at=cls._time(row[9]),
            completed_at=cls._time(row[10]),
            has_steps=bool(row[11]) if len(row) > 11 else None,
        )

    @classmethod
    def _step(cls, row: Sequence[Any]) -> StepRecord:
        return StepRecord(
            workflow_id=str(row[0]),
            step_id=row[1],
            name=row[2],
            status=row[3],
            result=cls._json(row[4]),
            error=cls._json(row[5]),
            args=cls._json(row[6]) or [],
            kwargs=cls._json(row[7]) or {},
            started_at=cls._time(row[8]),
            completed_at=cls._time(row[9]),
        )

    # -- schema --------------------------------------------------------------

    def migrate(self) -> list[str]:
        """Apply pending migrations; returns the names applied (idempotent)."""
        with self.connection() as conn:
            return self._migrate_locked(conn)

    def _apply_pending(self, conn: Any, applied: set[int]) -> list[str]:
        done = []
        for migration in migrations.available(self.backend):
            if migration.version in applied:
                continue
            for statement in migration.statements():
                conn.execute(statement)
            conn.execute(
                self._insert_migration_sql,
                {"version": migration.version, "name": migration.name, "now": self._time_param(utcnow())},
            )
            done.append(f"{migration.version:04d}_{migration.name}")
        return done

    _insert_migration_sql = ""

    # -- scheduling and reading ----------------------------------------------

    def schedule(
        self, name: str, args_json: str, idempotency_key: str | None = None, conn: Any = None
    ) -> Run:
        """Insert a scheduled run (in ``conn``'s open transaction when given).

        With an idempotency key, an existing run of the same workflow and key
        is returned instead of inserting a second one.
        """
        if conn is not None:
            return self.schedule_on(conn, name, args_json, idempotency_key)
        with self.connection() as own:
            return self.schedule_on(own, name, args_json, idempotency_key)

    @classmethod
    def schedule_on(cls, conn: Any, name: str, args_json: str, idempotency_key: str | None) -> Run:
        """Insert a run through ``conn`` (a connection or cursor of this
        backend) inside whatever transaction it has open."""
        params = cls._params(id=new_run_id(), name=name, args=args_json, idempotency_key=idempotency_key)
        sql = cls.statements()
        row = conn.execute(sql["schedule"], params).fetchone()
        if row is None:
            row = conn.execute(sql["get_run_by_key"], params).fetchone()
            if row is None:
                raise EverystepError(
                    f"run with idempotency key {params['idempotency_key']!r} conflicts but is not visible "
                    "in this transaction; retry outside a REPEATABLE READ transaction"
                )
        return cls._run(row)

    def get_run(self, run_id: str) -> Run:
        row = self._fetchone("get_run", {"id": _run_id(run_id)})
        if row is None:
            raise RunNotFound(f"no run with id {run_id}")
        return self._run(row)

    def list_runs(self, status: str | None = None, name: str | None = None, limit: int = 100) -> list[Run]:
        rows = self._fetchall("list_runs", {"status": status, "name": name, "limit": limit})
        return [self._run(row) for row in rows]

    def get_steps(self, run_id: str) -> list[StepRecord]:
        rows = self._fetchall("get_steps", {"id": _run_id(run_id)})
        return [self._step(row) for row in rows]

    def queue_stats(self) -> dict[str, float]:
        """Counts of scheduled, running and blocked runs and the age in seconds
        of the oldest scheduled one (0 when the queue is empty)."""
        row = self._fetchone("queue_stats", {})
        oldest = row[3]
        if isinstance(oldest, str):
            oldest = (utcnow() - dt.datetime.fromisoformat(oldest)).total_seconds()
        return {
            "pending": int(row[0]),
            "running": int(row[1]),
            "blocked": int(row[2]),
            "oldest_pending_age_seconds": max(float(oldest or 0.0), 0.0),
        }

    def ping(self) -> None:
        """Round-trip to the database (health checks); raises if unreachable."""
        with self.connection() as conn:
            conn.execute("SELECT 1").fetchone()

    def count_scheduled(self, names: Sequence[str]) -> int:
        return int(self._fetchone("count_scheduled", {"names": self._names(names)})[0])

    # -- claiming ------------------------------------------------------------

    def claim(self, claimer: str, limit: int, names: Sequence[str]) -> list[Run]:
        """Claim up to ``limit`` scheduled runs of the given workflows, oldest
        first. Concurrent claimers get disjoint sets."""
        if limit <= 0 or not names:
            return []
        params = self._params(claimer=claimer, limit=limit, names=self._names(names))
        with self.connection() as conn, self._claim_transaction(conn):
            rows = conn.execute(self.sql["claim"], params).fetchall()
        runs = [self._run(row) for row in rows]
        runs.sort(key=lambda run: (run.created_at or utcnow(), run.id))
        return runs

    def claim_own(
        self, claimer: str, limit: int, names: Sequence[str], exclude: Sequence[str] = ()
    ) -> list[Run]:
        """Runs left ``running`` under ``claimer`` by a process that died."""
        if limit <= 0 or not names:
            return []
        params = {
            "claimer": claimer,
            "limit": limit,
            "names": self._names(names),
            "exclude": self._names([_run_id(run_id) for run_id in exclude]),
        }
        return [self._run(row) for row in self._fetchall("claim_own", params)]

    def requeue(self, run_id: str, claimer: str) -> bool:
        """Give a run back to the queue, if ``claimer`` still holds it."""
        return self._fetchone("requeue", {"run_id": _run_id(run_id), "claimer": claimer}) is not None

    def requeue_all(self, claimer: str) -> list[str]:
        return [str(row[0]) for row in self._fetchall("requeue_all", {"claimer": claimer})]

    def finish_run(
        self,
        run_id: str,
        claimer: str,
        status: str,
        result_json: str | None = None,
        error_json: str | None = None,
    ) -> bool:
        """Move a running run to a terminal status, if ``claimer`` still holds it."""
        params = self._params(run_id=run_id, claimer=claimer, status=status, result=result_json, error=error_json)
        return self._fetchone("finish_run", params) is not None

    # -- steps ---------------------------------------------------------------

    def load_outcomes(self, run_id: str) -> dict[str, StepRecord]:
        return {record.step_id: record for record in self.get_steps(run_id)}

    def record_step(
        self,
        run_id: str,
        claimer: str,
        step_id: str,
        name: str,
        args_json: str,
        kwargs_json: str,
        status: str,
        result_json: str | None,
        error_json: str | None,
        started_at: dt.datetime,
        decoded: StepRecord | None = None,
    ) -> StepWrite | None:
        """Record a finished step. Returns ``LOST`` if the claim is gone, or the
        record someone else wrote first (``ours=False``). ``decoded`` is the
        caller's own Python view of the same step, so the store need not parse
        back what it was just given."""
        params = self._params(
            run_id=run_id, claimer=claimer, step_id=step_id, name=name,
            args=args_json, kwargs=kwargs_json, status=status, result=result_json,
            error=error_json, started_at=self._time_param(started_at),
        )
        with self.connection() as conn:
            row = conn.execute(self.sql["record_step"], params).fetchone()
            if row is None:
                return self._conflict(conn, params)
        if decoded is None:
            decoded = StepRecord(
                workflow_id=str(run_id), step_id=step_id, name=name, status=status,
                result=serde.loads(result_json), error=serde.loads(error_json),
                args=serde.loads(args_json) or [], kwargs=serde.loads(kwargs_json) or {},
                started_at=started_at,
            )
        return StepWrite(dataclasses.replace(decoded, completed_at=self._time(row[0])), ours=True)

    def start_step(
        self, run_id: str, claimer: str, step_id: str, name: str, args_json: str,
        kwargs_json: str, started_at: dt.datetime,
    ) -> StepWrite | None:
        """Insert the ``started`` row of an unsafe step: the atomic claim on its
        effect. A conflicting row is returned with ``ours=False``."""
        params = self._params(
            run_id=run_id, claimer=claimer, step_id=step_id, name=name,
            args=args_json, kwargs=kwargs_json, started_at=self._time_param(started_at),
        )
        with self.connection() as conn:
            row = conn.execute(self.sql["start_step"], params).fetchone()
            if row is None:
                return self._conflict(conn, params)
        return StepWrite(
            StepRecord(
                workflow_id=str(run_id), step_id=step_id, name=name, status=STEP_STARTED,
                args=serde.loads(args_json), kwargs=serde.loads(kwargs_json), started_at=started_at,
            ),
            ours=True,
        )

    def finish_step(
        self, started: StepRecord, claimer: str, status: str,
        result_json: str | None, error_json: str | None,
        decoded: StepRecord | None = None,
    ) -> StepWrite | None:
        """Turn our ``started`` row into its outcome (``decoded``: as in
        ``record_step``)."""
        params = self._params(
            run_id=started.workflow_id, claimer=claimer, step_id=started.step_id,
            status=status, result=result_json, error=error_json,
        )
        with self.connection() as conn:
            row = conn.execute(self.sql["finish_step"], params).fetchone()
            if row is None:
                return self._conflict(conn, params)
        if decoded is None:
            decoded = dataclasses.replace(
                started, status=status, result=serde.loads(result_json), error=serde.loads(error_json)
            )
        return StepWrite(dataclasses.replace(decoded, completed_at=self._time(row[0])), ours=True)

    def _conflict(self, conn: Any, params: dict[str, Any]) -> StepWrite | None:
        row = conn.execute(self.sql["step_conflict"], params).fetchone()
        if not row[0]:
            return LOST
        if row[2] is None:
            # We own the run, yet the write changed nothing and no row exists:
            # only possible if the row vanished in between. Treat as lost so
            # the run is replayed from what is recorded.
            return LOST
        return StepWrite(self._step(row[1:]), ours=False)

    # -- runners and leases ----------------------------------------------------

    def register_runner(
        self, name: str, instance: str, kind: str, host: str, pid: int, lease: float
    ) -> tuple[str | None, float | None]:
        """Announce a live runner under ``name`` (replacing a previous holder).
        Returns the previous holder's instance id and how long it had been
        silent, or (None, None)."""
        params = self._params(name=name, instance=instance, kind=kind, host=host, pid=pid, lease=lease)
        with self.connection() as conn, self._transaction(conn):
            return self._register_locked(conn, params)

    def _register_locked(self, conn: Any, params: dict[str, Any]) -> tuple[str | None, float | None]:
        row = conn.execute(self.sql["register_runner"], params).fetchone()
        return (row[0], float(row[1]) if row[1] is not None else None) if row else (None, None)

    def heartbeat(self, name: str, instance: str) -> bool:
        """Refresh our lease; False if the row is gone (expired and recovered
        by another runner) or taken over by another instance."""
        return self._fetchone("heartbeat", self._params(name=name, instance=instance)) is not None

    def unregister_runner(self, name: str, instance: str) -> None:
        with self.connection() as conn:
            conn.execute(self.sql["unregister_runner"], {"name": name, "instance": instance})

    def recover_expired(self, me: str) -> dict[str, list[str]]:
        """Forget runners silent past their lease and requeue their runs,
        atomically: each dead runner's runs are requeued exactly once.
        Returns ``{dead runner: [requeued run ids]}`` (runs only)."""
        with self.connection() as conn, self._transaction(conn):
            pairs = self._recover_locked(conn, self._params(me=me))
        recovered: dict[str, list[str]] = {}
        for run_id, runner in pairs:
            recovered.setdefault(runner, []).append(run_id)
        return recovered

    def _recover_locked(self, conn: Any, params: dict[str, Any]) -> list[tuple[str, str]]:
        return [(str(row[0]), row[1]) for row in conn.execute(self.sql["recover_expired"], params).fetchall()]

    def list_runners(self) -> list[RunnerInfo]:
        rows = self._fetchall("list_runners", self._params())
        return [
            RunnerInfo(
                name=row[0], kind=row[1], host=row[2], pid=int(row[3]), lease_seconds=float(row[4]),
                started_at=self._time(row[5]), heartbeat_at=self._time(row[6]),
                silent_seconds=max(float(row[7]), 0.0), running=int(row[8]),
            )
            for row in rows
        ]

    # -- administration ------------------------------------------------------

    @contextlib.contextmanager
    def locked_run(self, run_id: str) -> Iterator[tuple[Any, Run]]:
        """A write transaction holding the run's row lock (admin commands)."""
        with self.connection() as conn, self._transaction(conn):
            row = conn.execute(self.sql["lock_run"], {"id": _run_id(run_id)}).fetchone()
            if row is None:
                raise RunNotFound(f"no run with id {run_id}")
            yield conn, self._run(row)

    def locked_step(self, conn: Any, run_id: str, step_id: str) -> StepRecord | None:
        row = conn.execute(self.sql["lock_step"], {"run_id": _run_id(run_id), "step_id": step_id}).fetchone()
        return self._step(row) if row is not None else None

    def execute_named(self, conn: Any, name: str, **params: Any) -> int:
        """Run a named admin statement in ``conn``'s transaction; returns rows touched."""
        if "run_id" in params:
            params["run_id"] = _run_id(params["run_id"])
        cursor = conn.execute(self.sql[name], self._params(**params))
        if cursor.description is not None:
            return len(cursor.fetchall())
        return cursor.rowcount

    # -- retention -------------------------------------------------------------

    def count_prunable(self, cutoff: dt.datetime, statuses: Sequence[str]) -> tuple[int, int]:
        """How many runs (and their steps) ``prune_batch`` would delete:
        finished before ``cutoff`` in one of ``statuses``."""
        params = {"cutoff": self._time_param(cutoff), "statuses": self._names(statuses)}
        row = self._fetchone("prune_count", params)
        return int(row[0]), int(row[1] or 0)

    def prune_batch(self, cutoff: dt.datetime, statuses: Sequence[str], limit: int) -> tuple[int, int]:
        """Delete up to ``limit`` runs finished before ``cutoff`` in one of
        ``statuses``, and their steps, in one short transaction; returns
        (runs, steps) deleted. The statements themselves refuse scheduled,
        running and blocked runs whatever ``statuses`` says; on PostgreSQL
        the runs are locked ``SKIP LOCKED``, so an operator command holding
        one is never waited for."""
        params = {"cutoff": self._time_param(cutoff), "statuses": self._names(statuses), "limit": limit}
        with self.connection() as conn, self._transaction(conn):
            ids = [str(row[0]) for row in conn.execute(self.sql["prune_pick"], params).fetchall()]
            if not ids:
                return 0, 0
            chosen = {"ids": self._names(ids)}
            steps = conn.execute(self.sql["prune_steps"], chosen).rowcount
            runs = conn.execute(self.sql["prune_runs"], chosen).rowcount
        return int(runs), int(steps)


def _run_id(run_id: str) -> str:
    """Normalise a run id, refusing anything that is not a UUID."""
    try:
        return str(uuid.UUID(str(run_id)))
    except ValueError:
        raise RunNotFound(f"no run with id {run_id!r} (run ids are UUIDs)") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _redact(url: str) -> str:
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    credentials, host = rest.rsplit("@", 1)
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        pass


__all__ = ["LOST", "RunnerInfo", "Store", "StepWrite", "new_run_id", "utcnow"]
