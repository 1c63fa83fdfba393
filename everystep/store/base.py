"""The Store: every database operation everystep performs, backend-neutral.

A ``Store`` owns a small pool of connections to one database. A connection
is used by one thread at a time and never crosses ``fork()``: the pool
remembers the pid that opened it and refuses to hand out inherited
connections, and ``close()`` before forking leaves nothing for a child to
finalise. A backend is one subclass (how to open a connection, run a write
transaction, serialise migrations, read its column types, recognise a
caller's connection), one ``queries/<backend>.sql`` with every statement it
runs, by name, and one ``migrations/<backend>/`` folder; the logic of each
operation lives here once. Rows are read by column name.

Every state change an executor makes carries its ``Claim`` (claimer name
and claim epoch) and is conditional on it, so a stale writer can never
clobber a run that moved on: the methods return ``False``/``LOST`` instead.

Driver errors leave through one choke point (``connection()``):
``StoreUnavailable`` when the database cannot be reached, ``SchemaMissing``
when everystep's tables do not exist, ``EverystepError`` for anything else
it refused, each with the driver's exception chained.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import datetime as dt
import functools
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .. import serde
from ..errors import EverystepError, RunNotFound, SchemaMissing, StoreUnavailable
from ..models import STEP_STARTED, Attempt, Claim, Run, RunStatus, StepRecord
from ..queues import Placement, QueueInfo, QueueSettings
from ..resources import StepCost
from . import functions, migrations, queries

if TYPE_CHECKING:
    from ..relay import OperatorRequest

LOST = None
"""Returned by step writes when this claim is no longer the run's current one."""

MIN_UUID = "00000000-0000-0000-0000-000000000000"
MAX_UUID = "ffffffff-ffff-ffff-ffff-ffffffffffff"

MAX_IDLE_CONNECTIONS = 8

Row = Mapping[str, Any]
"""A result row, read by column name (``dict_row`` or ``sqlite3.Row``)."""


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_run_id() -> str:
    """A UUIDv7: time-ordered, so ids sort like creation times (to a
    fraction of a millisecond: its 12 bits after the version carry the
    sub-millisecond time, RFC 9562 section 6.2 method 3)."""
    millis, nanos = divmod(time.time_ns(), 1_000_000)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= (nanos * 4096 // 1_000_000) << 64  # sub-millisecond time
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
    instance: str = ""

    @property
    def expired(self) -> bool:
        return self.silent_seconds > self.lease_seconds


@dataclass(frozen=True)
class NewStep:
    """A step row as an executor writes it: what ran and, once it ended, how.

    ``args_json``/``kwargs_json``/``result_json``/``error_json`` are already
    serialized (the runner validates before the effect)."""

    step_id: str
    name: str
    args_json: str | None
    kwargs_json: str | None
    started_at: dt.datetime
    status: str = STEP_STARTED
    result_json: str | None = None
    error_json: str | None = None
    #: Which attempt of the step this is (see ``retry``).
    attempt: int = 1
    #: ``retrying``: when the next attempt may start; ``sleeping``: the wake time.
    wake_at: dt.datetime | None = None
    #: What the step cost, where its runner measured it (migration 0008).
    cpu_seconds: float | None = None
    peak_rss_bytes: int | None = None


@dataclass(frozen=True)
class ClaimState:
    """Where a run stands now, as far as the claim on it is concerned."""

    status: str
    claimed_by: str | None
    claim_epoch: int

    def held_by(self, claim: Claim) -> bool:
        return (self.status == RunStatus.RUNNING and self.claimed_by == claim.claimer
                and self.claim_epoch == claim.epoch)

    def moved_on_from(self, claim: Claim) -> bool:
        """The run was taken from ``claim`` (requeued, claimed again, or
        cancelled) rather than finished by it: an execution under ``claim``
        is stale and must stop."""
        return (self.status in (RunStatus.RUNNING, RunStatus.SCHEDULED, RunStatus.CANCELLED)
                and not self.held_by(claim))

    def cancelled_under(self, claim: Claim) -> bool:
        """An operator cancelled the run while ``claim`` held it: its holder
        may still record the step the cancel cut off (and nothing else)."""
        return (self.status == RunStatus.CANCELLED and self.claimed_by == claim.claimer
                and self.claim_epoch == claim.epoch)


class StepWrite:
    """The outcome of recording a step: ours, or one someone else recorded."""

    __slots__ = ("record", "ours")

    def __init__(self, record: StepRecord, ours: bool) -> None:
        self.record = record
        self.ours = ours


class Notifications(abc.ABC):
    """A dedicated connection on which the database pushes notifications:
    watch ``fileno()`` in a selector, then ``drain()`` what arrived."""

    @abc.abstractmethod
    def fileno(self) -> int: ...

    @abc.abstractmethod
    def drain(self) -> list[tuple[str, str]]:
        """(channel, payload) pairs received so far; raises when the
        connection is lost."""

    @abc.abstractmethod
    def close(self) -> None: ...


class Store(abc.ABC):
    """Base class; see ``postgres.PostgresStore`` and ``sqlite.SQLiteStore``."""

    backend: ClassVar[str] = ""
    #: The DB-API module whose connections ``schedule(conn=...)`` accepts.
    driver: ClassVar[str] = ""
    #: Whether ``listen()`` delivers notifications (LISTEN/NOTIFY); where it
    #: does not, runners poll.
    notifies: ClassVar[bool] = False
    #: Exceptions of the driver that mean "the database is unreachable".
    _unavailable: ClassVar[tuple[type[BaseException], ...]] = ()
    _driver_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    def __init__(self, url: str, statement_timeout: float | None = None) -> None:
        """``statement_timeout``: seconds any one statement may take, waits
        for locks included (None: the backend's default)."""
        self.url = url
        self.statement_timeout = statement_timeout
        self.sql = self.statements()
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @classmethod
    def statements(cls) -> dict[str, str]:
        return queries.load(cls.backend)

    # -- backend hooks -------------------------------------------------------

    @abc.abstractmethod
    def _open(self) -> Any:
        """A new connection in autocommit mode whose rows read by name."""

    @abc.abstractmethod
    def _transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """A write transaction that takes its locks up front."""

    def _claim_transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """Around the claim statement: nothing where that one statement is
        atomic and disjoint on its own (PostgreSQL's SKIP LOCKED)."""
        return contextlib.nullcontext(conn)

    def _migration_transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """A transaction that serialises concurrent migrators."""
        return self._transaction(conn)

    @classmethod
    @abc.abstractmethod
    def accepts(cls, conn: Any) -> bool:
        """Whether ``conn`` (a caller's own connection) belongs to this backend."""

    @classmethod
    @abc.abstractmethod
    def _caller_cursor(cls, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """A cursor on a caller's connection that reads rows by name and
        decodes like ours, whatever the caller configured on it."""

    @classmethod
    @abc.abstractmethod
    def _named_rows(cls, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """While inside, ``conn`` itself (a caller's connection) reads rows
        by name; its own row factory is restored afterwards."""

    def listen(self) -> Notifications | None:
        """A dedicated connection receiving notifications of newly scheduled
        runs and of runs taken from their holder; ``None`` where the backend
        has none (runners poll)."""
        return None

    def _healthy(self, conn: Any) -> bool:
        return True

    def _schema_missing(self, exc: BaseException) -> bool:
        """Whether a driver error says everystep's tables do not exist."""
        return False

    @classmethod
    def _names(cls, names: Sequence[str]) -> Any:
        return list(names)

    @classmethod
    def _time(cls, value: Any) -> dt.datetime | None:
        return value  # type: ignore[no-any-return]

    @classmethod
    def _json(cls, value: Any) -> Any:
        return value

    @classmethod
    def _time_param(cls, value: dt.datetime) -> Any:
        return value

    def describe(self) -> str:
        """The URL without its password, for logs and errors."""
        return _redact(self.url)

    # -- connections ---------------------------------------------------------

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        """Check out a connection for this thread; broken ones are discarded.

        Driver errors come out as ``StoreUnavailable`` (connection trouble),
        ``SchemaMissing`` (no everystep tables: ``everystep migrate``) or
        ``EverystepError`` (anything else the database refused), with the
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
            if self._schema_missing(exc):
                raise SchemaMissing(
                    f"database {self.describe()} has no everystep schema; run: everystep migrate --database URL"
                ) from exc
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

    def _fetchall(self, name: str, params: Mapping[str, Any], conn: Any = None) -> list[Row]:
        if conn is not None:
            return conn.execute(self.sql[name], params).fetchall()  # type: ignore[no-any-return]
        with self.connection() as own:
            return own.execute(self.sql[name], params).fetchall()  # type: ignore[no-any-return]

    def _fetchone(self, name: str, params: Mapping[str, Any], conn: Any = None) -> Row | None:
        rows = self._fetchall(name, params, conn)
        return rows[0] if rows else None

    @classmethod
    def _params(cls, **params: Any) -> dict[str, Any]:
        now = utcnow()
        params["now"] = cls._time_param(now)
        params["now_epoch"] = now.timestamp()
        return params

    @staticmethod
    def _claim_params(claim: Claim) -> dict[str, Any]:
        return {"run_id": _run_id(claim.run_id), "claimer": claim.claimer, "claim_epoch": claim.epoch}

    # -- row mapping ---------------------------------------------------------

    @classmethod
    def _run(cls, row: Row) -> Run:
        return Run(
            id=str(row["id"]),
            name=row["name"],
            args=cls._json(row["args"]),
            status=row["status"],
            idempotency_key=row["idempotency_key"],
            claimed_by=row["claimed_by"],
            claimed_at=cls._time(row["claimed_at"]),
            result=cls._json(row["result"]),
            error=cls._json(row["error"]),
            created_at=cls._time(row["created_at"]),
            completed_at=cls._time(row["completed_at"]),
            claim_epoch=int(row["claim_epoch"]),
            not_before=cls._time(row["not_before"]),
            queue=row["queue"],
            priority=int(row["priority"]),
            concurrency_key=row["concurrency_key"],
            has_steps=bool(row["has_steps"]) if "has_steps" in row.keys() else None,
        )

    @classmethod
    def _step(cls, row: Row) -> StepRecord:
        return StepRecord(
            workflow_id=str(row["workflow_id"]),
            step_id=row["step_id"],
            name=row["name"],
            status=row["status"],
            result=cls._json(row["result"]),
            error=cls._json(row["error"]),
            args=cls._json(row["args"]) or [],
            kwargs=cls._json(row["kwargs"]) or {},
            started_at=cls._time(row["started_at"]),
            completed_at=cls._time(row["completed_at"]),
            attempt=int(row["attempt"]) if row["attempt"] is not None else 1,
            wake_at=cls._time(row["wake_at"]),
            cpu_seconds=_float_or_none(row["cpu_seconds"]),
            peak_rss_bytes=_int_or_none(row["peak_rss_bytes"]),
        )

    def _runner_row(self, row: Row | None) -> RunnerInfo | None:
        if row is None:
            return None
        return RunnerInfo(
            name=row["name"], kind=row["kind"], host=row["host"], pid=int(row["pid"]),
            lease_seconds=float(row["lease_seconds"]), started_at=self._time(row["started_at"]),
            heartbeat_at=self._time(row["heartbeat_at"]), silent_seconds=max(float(row["silent"]), 0.0),
            running=int(row["running"]), instance=row["instance"],
        )

    # -- schema --------------------------------------------------------------

    def migrate(self) -> list[str]:
        """Apply pending migrations; returns the names applied (idempotent,
        safe to run concurrently: the backend serialises migrators)."""
        with self.connection() as conn:
            return self._migrate_through(conn)

    def _migrate_through(self, conn: Any) -> list[str]:
        with self._migration_transaction(conn):
            conn.execute(self.sql["create_migration_table"])
            applied = {int(row["version"]): row["name"]
                       for row in conn.execute(self.sql["applied_migrations"]).fetchall()}
            done = []
            for migration in migrations.available(self.backend):
                # A version recorded as the placeholder of a migration that
                # did not exist yet is applied now that it does.
                placeholder = applied.get(migration.version) == migrations.PLACEHOLDER != migration.name
                if migration.version in applied and not placeholder:
                    continue
                for statement in migration.statements():
                    conn.execute(statement)
                record = "rename_migration" if placeholder else "insert_migration"
                conn.execute(self.sql[record], self._params(version=migration.version, name=migration.name))
                done.append(f"{migration.version:04d}_{migration.name}")
            functions.apply(conn, self.backend, self.sql, self._params, everything=bool(done))
            return done

    def schema_version(self) -> int:
        """The highest migration applied (0 on a database without everystep)."""
        with self.connection() as conn:
            if not conn.execute(self.sql["migration_table_exists"]).fetchone()["present"]:
                return 0
            return int(conn.execute(self.sql["schema_version"]).fetchone()["version"])

    # -- scheduling and reading ----------------------------------------------

    def schedule(self, name: str, args_json: str, idempotency_key: str | None = None,
                 not_before: dt.datetime | None = None, placement: Placement | None = None) -> Run:
        """Insert a scheduled run and commit it (claimable from ``not_before``
        on, if given), in ``placement``'s queue (default: the default queue).

        With an idempotency key, an existing run of the same workflow and key
        is returned instead of inserting a second one.
        """
        with self.connection() as conn:
            return self._schedule_through(conn, name, args_json, idempotency_key, not_before, placement)

    @classmethod
    def schedule_on(cls, conn: Any, name: str, args_json: str, idempotency_key: str | None,
                    not_before: dt.datetime | None = None, placement: Placement | None = None) -> Run:
        """Insert a run through a caller's own connection of this backend,
        inside whatever transaction it has open."""
        with cls._caller_cursor(conn) as cursor:
            return cls._schedule_through(cursor, name, args_json, idempotency_key, not_before, placement)

    @classmethod
    def _schedule_through(cls, conn: Any, name: str, args_json: str, idempotency_key: str | None,
                          not_before: dt.datetime | None = None, placement: Placement | None = None) -> Run:
        place = placement or Placement()
        params = cls._params(id=new_run_id(), name=name, args=args_json, idempotency_key=idempotency_key,
                             not_before=cls._time_param(not_before) if not_before is not None else None,
                             queue=place.queue, priority=place.priority, concurrency_key=place.concurrency_key)
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

    def find_run(self, id_or_prefix: str) -> Run:
        """The run whose id is ``id_or_prefix`` or starts with it (a unique
        prefix, as git takes one). ``RunNotFound`` when none or several match."""
        try:
            return self.get_run(_run_id(id_or_prefix))
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

    def count_runs(self, status: str | None = None, name: str | None = None, cap: int = 100_000) -> int:
        """Runs matching the filters of ``list_runs``, counted exactly up to
        ``cap`` (the cost is bounded by it)."""
        row = self._fetchone("count_runs_upto", {"status": status, "name": name, "cap": int(cap)})
        assert row is not None
        return int(row["total"])

    def get_steps(self, run_id: str) -> list[StepRecord]:
        """A run's recorded steps, each with its retried attempts."""
        rows = self._fetchall("get_steps", {"id": _run_id(run_id)})
        steps = [self._step(row) for row in rows]
        if steps:
            steps = self._with_attempts(run_id, steps)
        return steps

    def queue_stats(self) -> dict[str, float]:
        """Counts of scheduled, running and blocked runs and the age in seconds
        of the oldest scheduled one (0 when the queue is empty)."""
        row = self._fetchone("queue_stats", self._params())
        assert row is not None
        return {
            "pending": int(row["pending"]),
            "waiting": int(row["waiting"]),
            "running": int(row["running"]),
            "blocked": int(row["blocked"]),
            "oldest_pending_age_seconds": max(float(row["oldest_age"] or 0.0), 0.0),
        }

    def ping(self) -> None:
        """Round-trip to the database (health checks); raises if unreachable."""
        self._fetchone("ping", {})

    # -- queues (migration 0007) -----------------------------------------------

    @classmethod
    def _queue_settings(cls, row: Row) -> QueueSettings:
        return QueueSettings(
            name=row["name"], concurrency=_int_or_none(row["concurrency"]),
            key_concurrency=_int_or_none(row["key_concurrency"]), rate_limit=_int_or_none(row["rate_limit"]),
            rate_period=_float_or_none(row["rate_period"]), paused=bool(row["paused"]),
        )

    def update_queue(self, name: str, change: Callable[[QueueSettings], QueueSettings]) -> QueueSettings:
        """Change a queue's settings under its row lock: ``change`` gets the
        current ones (defaults for a queue without a row) and returns the new."""
        with self.connection() as conn, self._transaction(conn):
            row = conn.execute(self.sql["lock_queue"], {"name": name}).fetchone()
            current = self._queue_settings(row) if row is not None else QueueSettings(name)
            new = change(current)
            conn.execute(self.sql["put_queue"], self._params(
                name=name, concurrency=new.concurrency, key_concurrency=new.key_concurrency,
                rate_limit=new.rate_limit, rate_period=new.rate_period, paused=new.paused))
        return new

    def queue_settings(self) -> dict[str, QueueSettings]:
        """The queues that have a row (limits or a pause flag), by name."""
        return {row["name"]: self._queue_settings(row) for row in self._fetchall("queue_settings", {})}

    def queues(self) -> list[QueueInfo]:
        """Every queue that has settings or runs scheduled, running or
        blocked, with its counts (a scan of those runs: for operators and
        metrics, not for claims)."""
        settings = self.queue_settings()
        found: dict[str, QueueInfo] = {}
        for row in self._fetchall("queue_counts", self._params()):
            name = row["queue"]
            found[name] = QueueInfo(
                settings=settings.get(name, QueueSettings(name)), pending=int(row["pending"] or 0),
                waiting=int(row["waiting"] or 0), running=int(row["running"] or 0),
                blocked=int(row["blocked"] or 0),
                oldest_pending_age_seconds=max(float(row["oldest_age"] or 0.0), 0.0),
            )
        for name, queue in settings.items():
            found.setdefault(name, QueueInfo(settings=queue))
        return [found[name] for name in sorted(found)]

    def count_scheduled(self, names: Sequence[str]) -> int:
        row = self._fetchone("count_scheduled", {"names": self._names(names)})
        assert row is not None
        return int(row["scheduled"])

    # -- claiming ------------------------------------------------------------

    def claim(self, claimer: str, limit: int, names: Sequence[str],
              queues: Sequence[str] | None = None) -> list[Run]:
        """Claim up to ``limit`` due runs of the given workflows from
        ``queues`` (None: every queue), bumping each one's claim epoch.
        Paused queues are skipped and each queue's limits are enforced by the
        claim itself (see ``everystep.queues``); within a queue the highest
        priority goes first, then the earliest due. Concurrent claimers get
        disjoint sets. Returned highest priority first, then oldest."""
        if limit <= 0 or not names or (queues is not None and not queues):
            return []
        params = self._params(claimer=claimer, limit=limit, names=self._names(names),
                              queues=self._names(queues) if queues is not None else None)
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
            "exclude": self._names([_run_id(run_id) for run_id in exclude]),
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

    def finish_run(
        self,
        claim: Claim,
        status: str,
        result_json: str | None = None,
        error_json: str | None = None,
    ) -> bool:
        """Move a running run to a terminal status, if ``claim`` is still current."""
        params = self._params(**self._claim_params(claim), status=status, result=result_json, error=error_json)
        return self._fetchone("finish_run", params) is not None

    def finish_run_with_step(
        self,
        claim: Claim,
        step: NewStep,
        status: str,
        result_json: str | None = None,
        error_json: str | None = None,
        decoded: StepRecord | None = None,
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
                row = conn.execute(self.sql["record_step"], params).fetchone()
                if row is None or conn.execute(self.sql["finish_run"], finish).fetchone() is None:
                    raise _NothingWritten
        except _NothingWritten:
            return LOST
        return StepWrite(self._written(claim, step, decoded, row), ours=True)

    def claim_states(self, run_ids: Sequence[str]) -> dict[str, ClaimState]:
        """Where the given runs stand now (missing ids are left out)."""
        if not run_ids:
            return {}
        rows = self._fetchall("claim_states", {"ids": self._names([_run_id(run_id) for run_id in run_ids])})
        return {str(row["id"]): ClaimState(row["status"], row["claimed_by"], int(row["claim_epoch"]))
                for row in rows}

    # -- steps ---------------------------------------------------------------

    def load_outcomes(self, run_id: str) -> dict[str, StepRecord]:
        """What a replay needs: every step row (the history of retried
        attempts is not read; a step row says its attempt and when the
        next one is due)."""
        rows = self._fetchall("get_steps", {"id": _run_id(run_id)})
        return {record.step_id: record for record in map(self._step, rows)}

    def record_step(self, claim: Claim, step: NewStep, decoded: StepRecord | None = None) -> StepWrite | None:
        """Record a finished step. Returns ``LOST`` if ``claim`` is no longer
        current, or the record someone else wrote first (``ours=False``).
        ``decoded`` is the caller's own Python view of the same step, so the
        store need not parse back what it was just given."""
        params = self._step_params(claim, step)
        with self.connection() as conn:
            row = self._fetchone("record_step", params, conn)
            if row is None:
                return self._conflict(conn, params)
        return StepWrite(self._written(claim, step, decoded, row), ours=True)

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

    def start_step(self, claim: Claim, step: NewStep) -> StepWrite | None:
        """Insert the ``started`` row of an unsafe step: the atomic claim on its
        effect, itself fenced by ``claim``. A conflicting row is returned
        with ``ours=False``; ``LOST`` if the claim is no longer current."""
        params = self._params(
            **self._claim_params(claim), step_id=step.step_id, name=step.name,
            args=step.args_json, kwargs=step.kwargs_json, started_at=self._time_param(step.started_at),
        )
        with self.connection() as conn:
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
    ) -> StepWrite | None:
        """Turn our ``started`` row into its outcome (``decoded``: as in
        ``record_step``; ``cost``: what the step used, where it was measured)."""
        params = self._params(
            **self._claim_params(claim), step_id=started.step_id,
            status=status, result=result_json, error=error_json,
            cpu_seconds=cost.cpu_seconds if cost is not None else None,
            peak_rss_bytes=cost.peak_rss_bytes if cost is not None else None,
        )
        with self.connection() as conn:
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

    # -- runners and leases ----------------------------------------------------

    def register_runner(
        self, name: str, instance: str, kind: str, host: str, pid: int, lease: float,
        vet: Callable[[RunnerInfo], None],
    ) -> tuple[RunnerInfo | None, list[str]]:
        """Take the runner name ``name`` for ``instance``.

        If another instance holds the row, ``vet(holder)`` decides inside the
        same transaction (the row is locked, so concurrent starters under one
        name serialise): it raises to refuse, or returns to take the name
        over, in which case the runs still claimed under the name are fenced
        (their epochs bumped). Returns the previous holder and the fenced
        run ids."""
        params = self._params(name=name, instance=instance, kind=kind, host=host, pid=pid, lease=lease)
        with self.connection() as conn, self._transaction(conn):
            holder = self._runner_row(conn.execute(self.sql["lock_runner"], params).fetchone())
            if holder is None:
                if conn.execute(self.sql["insert_runner"], params).fetchone() is not None:
                    return None, []
                # Someone inserted it between our read and our insert.
                holder = self._runner_row(conn.execute(self.sql["lock_runner"], params).fetchone())
                assert holder is not None
            if holder.instance != instance:
                vet(holder)
            conn.execute(self.sql["replace_runner"], params)
            fenced = [str(row["id"]) for row in conn.execute(self.sql["fence_runner_runs"], params).fetchall()]
        return holder, fenced

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
        """(run id, dead runner) pairs; one statement where the backend has
        one (``recover_expired``). Elsewhere (no DELETE … RETURNING inside a
        CTE) forget each expired runner, its lease checked again under the
        lock, and requeue what it held."""
        if "recover_expired" in self.sql:
            rows = conn.execute(self.sql["recover_expired"], params).fetchall()
            return [(str(row["id"]), row["runner"]) for row in rows]
        pairs = []
        for row in conn.execute(self.sql["expired_runners"], params).fetchall():
            name = row["name"]
            if conn.execute(self.sql["forget_runner"], {**params, "name": name}).fetchone() is None:
                continue
            for requeued in conn.execute(self.sql["requeue_dead_runners_runs"], {"claimer": name}).fetchall():
                pairs.append((str(requeued["id"]), name))
        return pairs

    def list_runners(self) -> list[RunnerInfo]:
        rows = self._fetchall("list_runners", self._params())
        return [info for info in map(self._runner_row, rows) if info is not None]

    def get_runner(self, name: str, conn: Any = None) -> RunnerInfo | None:
        """The runner row holding ``name``, if any (``conn``: inside the
        caller's transaction, where the row stays locked)."""
        return self._runner_row(self._fetchone("lock_runner", self._params(name=name), conn))

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

    def notify_fenced(self, conn: Any, runner: str, run_id: str) -> None:
        """Tell ``runner`` (in ``conn``'s transaction, delivered on commit)
        that a run it holds was taken from it; backends without
        notifications leave it to the runner's next heartbeat."""
        if self.notifies:
            conn.execute(self.sql["notify_fenced"], {"runner": runner, "run_id": _run_id(run_id)})

    def execute_named(self, conn: Any, name: str, **params: Any) -> int:
        """Run a named admin statement in ``conn``'s transaction; returns rows touched."""
        if "run_id" in params:
            params["run_id"] = _run_id(params["run_id"])
        cursor = conn.execute(self.sql[name], self._params(**params))
        if cursor.description is not None:
            return len(cursor.fetchall())
        return int(cursor.rowcount)

    # -- connections owned by a host framework -------------------------------

    @classmethod
    def migrate_on(cls, conn: Any) -> list[str]:
        """Apply pending migrations through ``conn``, a connection of this
        backend that a host framework owns (Django's ``manage.py migrate``
        runs this on its own connection, which may be a test database only
        that connection can see). Same files, same lock, same version table
        as ``migrate()``, so the two paths never disagree. ``conn`` must be
        in autocommit mode, outside any transaction; it is left open, with
        its own row factory."""
        # A bare instance: the migrator needs the backend's statements and
        # transaction hooks, not a pool or a URL of its own.
        migrator = cls.__new__(cls)
        Store.__init__(migrator, "")
        with cls._named_rows(conn):
            return migrator._migrate_through(conn)

    # -- operator requests and runner detail (the console, migration 0005) ----

    def submit_request(self, runner: str, command: str, args: dict[str, Any], requested_by: str) -> OperatorRequest:
        """Insert a pending request for ``runner`` (see ``everystep.relay``);
        on PostgreSQL its NOTIFY reaches the runner on commit. Requests older
        than ``relay.KEEP_SECONDS`` are pruned in the same transaction."""
        from ..relay import KEEP_SECONDS

        params = self._params(
            runner=runner, command=command, args=serde.dumps(args, "request arguments"),
            requested_by=requested_by, keep=KEEP_SECONDS,
            cutoff=self._time_param(utcnow() - dt.timedelta(seconds=KEEP_SECONDS)),
        )
        with self.connection() as conn, self._transaction(conn):
            conn.execute(self.sql["prune_requests"], params)
            row = conn.execute(self.sql["submit_request"], params).fetchone()
        return self._request(row)

    def take_requests(self, runner: str, limit: int = 10) -> list[OperatorRequest]:
        """Move ``runner``'s pending requests to ``taken`` and return them,
        oldest first; each request is taken once."""
        params = self._params(runner=runner, limit=limit)
        with self.connection() as conn, self._claim_transaction(conn):
            rows = conn.execute(self.sql["take_requests"], params).fetchall()
        return sorted((self._request(row) for row in rows), key=lambda request: request.id)

    def answer_request(self, request_id: int, reply: dict[str, Any]) -> bool:
        """Store the reply of a taken request; False if it was not ``taken``."""
        params = self._params(id=int(request_id), reply=serde.dumps(reply, "request reply"))
        return self._fetchone("answer_request", params) is not None

    def expire_request(self, request_id: int) -> bool:
        """Give up on a request nobody took yet; False if it was taken."""
        return self._fetchone("expire_request", self._params(id=int(request_id))) is not None

    def get_request(self, request_id: int) -> OperatorRequest | None:
        row = self._fetchone("get_request", {"id": int(request_id)})
        return self._request(row) if row is not None else None

    @classmethod
    def _request(cls, row: Row) -> OperatorRequest:
        from ..relay import OperatorRequest

        created_at = cls._time(row["created_at"])
        age = row["age"] if "age" in row.keys() else None
        if age is None and created_at is not None:
            age = (utcnow() - created_at).total_seconds()
        return OperatorRequest(
            id=int(row["id"]), runner=row["runner"], command=row["command"], args=cls._json(row["args"]) or {},
            status=row["status"], reply=cls._json(row["reply"]), requested_by=row["requested_by"],
            created_at=created_at, taken_at=cls._time(row["taken_at"]), answered_at=cls._time(row["answered_at"]),
            age_seconds=float(age) if age is not None else None,
        )

    def publish_runner_detail(self, name: str, instance: str, detail: dict[str, Any]) -> bool:
        """Store what a runner says about itself (a supervisor's children) on
        its row; False if ``instance`` no longer holds ``name``."""
        params = {"name": name, "instance": instance, "detail": serde.dumps(detail, "runner detail")}
        return self._fetchone("publish_runner_detail", params) is not None

    def runner_details(self) -> dict[str, dict[str, Any]]:
        """``{runner name: published detail}``, only detail published by the
        instance that holds the name now (a restart's predecessor's is stale)."""
        details = {}
        for row in self._fetchall("runner_details", {}):
            detail = self._json(row["detail"])
            if isinstance(detail, dict) and detail.get("instance") == row["instance"]:
                details[row["name"]] = detail
        return details

    # -- reads for the console and check-deploy --------------------------------

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
        order); with one, ``(created_at, id)`` along the status index. A
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
            cursor_id = _run_id(cursor[1])
            cursor_at = self._time_param(cursor[0]) if cursor[0] is not None else self._time_bound(newer)
        statement = ("page_runs_status_" if status else "page_runs_") + ("newer" if newer else "older")
        params = {
            "status": status, "name": name or None, "queue": queue or None, "lo": id_range[0], "hi": id_range[1],
            "cursor_id": cursor_id, "cursor_at": cursor_at, "limit": int(limit),
        }
        runs = [self._run(row) for row in self._fetchall(statement, params)]
        return runs[::-1] if newer else runs

    @classmethod
    def _time_bound(cls, low: bool) -> Any:
        """A timestamp parameter below (``low``) or above every stored one."""
        return "-infinity" if low else "infinity"

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

    def steps_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[StepRecord]]:
        """The recorded steps of several runs in one query, by run id."""
        found: dict[str, list[StepRecord]] = {_run_id(run_id): [] for run_id in run_ids}
        if not found:
            return found
        for row in self._fetchall("steps_of_runs", {"ids": self._names(list(found))}):
            record = self._step(row)
            found.setdefault(record.workflow_id, []).append(record)
        return found

    # -- retention -------------------------------------------------------------

    def count_prunable(self, cutoff: dt.datetime, statuses: Sequence[str]) -> tuple[int, int]:
        """How many runs (and their steps) ``prune_batch`` would delete:
        finished before ``cutoff`` in one of ``statuses``."""
        params = {"cutoff": self._time_param(cutoff), "statuses": self._names(statuses)}
        row = self._fetchone("prune_count", params)
        assert row is not None
        return int(row["runs"]), int(row["steps"] or 0)

    def prune_batch(self, cutoff: dt.datetime, statuses: Sequence[str], limit: int) -> tuple[int, int]:
        """Delete up to ``limit`` runs finished before ``cutoff`` in one of
        ``statuses``, and their steps, in one short transaction; returns
        (runs, steps) deleted. The statements themselves refuse scheduled,
        running and blocked runs whatever ``statuses`` says; on PostgreSQL
        the runs are locked ``SKIP LOCKED``, so an operator command holding
        one is never waited for."""
        params = {"cutoff": self._time_param(cutoff), "statuses": self._names(statuses), "limit": limit}
        with self.connection() as conn, self._transaction(conn):
            ids = [str(row["id"]) for row in conn.execute(self.sql["prune_pick"], params).fetchall()]
            if not ids:
                return 0, 0
            chosen = {"ids": self._names(ids)}
            steps = conn.execute(self.sql["prune_steps"], chosen).rowcount
            runs = conn.execute(self.sql["prune_runs"], chosen).rowcount
        return int(runs), int(steps)


    # -- the run lifecycle (migration 0006) --------------------------------------

    def release(self, claim: Claim, not_before: dt.datetime) -> bool:
        """Give the run back to the queue, not claimable before
        ``not_before`` (a retry's backoff, a durable sleep), if ``claim`` is
        still current. Nothing can claim it earlier: claims take due runs
        only."""
        params = self._params(**self._claim_params(claim), not_before=self._time_param(not_before))
        return self._fetchone("release", params) is not None

    def record_attempt(self, claim: Claim, step: NewStep, decoded: StepRecord | None = None) -> StepWrite | None:
        """Record a failed attempt that will be retried: the step row becomes
        ``retrying`` (attempt ``step.attempt``, next one at ``step.wake_at``)
        and the attempt joins the step's history, in one transaction fenced
        by ``claim``. Returns like ``record_step``."""
        params = self._step_params(claim, step)
        with self.connection() as conn, self._transaction(conn):
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

    def attempts(self, run_id: str) -> dict[str, list[Attempt]]:
        """The failed attempts of a run's retried steps, by step id, oldest first."""
        found: dict[str, list[Attempt]] = {}
        for row in self._fetchall("get_attempts", {"id": _run_id(run_id)}):
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
                      placement: Placement | None = None) -> tuple[Run, bool]:
        """Enqueue the run of periodic workflow ``name`` for ``tick``, once
        however many runners try: the idempotency ``key`` names the tick.
        Returns the run and whether this call created it; the tick is
        remembered as the workflow's last either way."""
        with self.connection() as conn, self._transaction(conn):
            place = placement or Placement()
            params = self._params(id=new_run_id(), name=name, args=args_json, idempotency_key=key,
                                  not_before=None, queue=place.queue, priority=place.priority,
                                  concurrency_key=place.concurrency_key)
            row = conn.execute(self.sql["schedule"], params).fetchone()
            created = row is not None
            if row is None:
                row = conn.execute(self.sql["get_run_by_key"], params).fetchone()
            run = self._run(row)
            conn.execute(self.sql["record_cron_tick"], {"name": name, "tick": self._time_param(tick),
                                                        "run_id": _run_id(run.id)})
        return run, created


_ID_PREFIX = re.compile(r"[0-9a-f-]{1,36}")


class _NothingWritten(Exception):
    """Rolls back a transaction of which one write was refused."""


def id_prefix_range(prefix: str) -> tuple[str, str]:
    """The run ids starting with ``prefix`` as an inclusive range, so the
    primary key answers a prefix search (``everystep show 01a2``, the
    console's search). ``RunNotFound`` for text no run id can start with."""
    prefix = prefix.strip().lower()
    if not _ID_PREFIX.fullmatch(prefix):
        raise RunNotFound(f"no run with id {prefix[:40]!r} (run ids are hexadecimal digits and dashes)")
    digits = prefix.replace("-", "")[:32]

    def dashed(hex32: str) -> str:
        return f"{hex32[:8]}-{hex32[8:12]}-{hex32[12:16]}-{hex32[16:20]}-{hex32[20:]}"

    return dashed(digits.ljust(32, "0")), dashed(digits.ljust(32, "f"))


def _run_id(run_id: str) -> str:
    """Normalise a run id, refusing anything that is not a UUID."""
    try:
        return _canonical_uuid(str(run_id))
    except ValueError:
        raise RunNotFound(f"no run with id {run_id!r} (run ids are UUIDs)") from None


@functools.lru_cache(maxsize=1024)
def _canonical_uuid(text: str) -> str:
    """Every write under a claim names its run: parse each id once, not on
    every step record."""
    return str(uuid.UUID(text))


def _float_or_none(value: Any) -> float | None:
    return float(value) if value is not None else None


def _int_or_none(value: Any) -> int | None:
    return int(value) if value is not None else None


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


__all__ = [
    "LOST", "ClaimState", "NewStep", "Notifications", "Row", "RunnerInfo", "Store",
    "StepWrite", "new_run_id", "utcnow",
]
