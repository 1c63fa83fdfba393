"""Waiting on the world: messages into a run, events out of it, child runs.

A run that waits for a message or a child's end is released like a
durable sleep: its step row says ``waiting`` (what for in its args, until
when in ``wake_at``), the run goes back to ``scheduled`` with that time as
its not-before time (``WAIT_FOREVER`` without one) and ``wait_key`` says
what ends the wait early (``message:<topic>``, ``child:<run id>``, ``*``
when scopes of one run wait on different things).

Locking protocol. Whoever ends a wait (a send, a child's end) writes the
waiting run's row whatever it holds (``wake_waiter``: a CASE, not a WHERE
on the status), so it waits for the row lock of a run releasing itself at
that moment; the run releasing itself (``release_waiting``) first locks its
own row, then, in a later statement, looks for what it waits for. Either
the waker's commit comes first, and the releaser sees its message or its
child's end and stays due; or the releaser's does, and the waker then sees
the run scheduled with that ``wait_key`` and makes it due. No wake is lost
in between (READ COMMITTED on PostgreSQL and MariaDB; one writer at a time
on SQLite). Every waker takes the waiting run's row after its own (a child
its parent's, a send only the target's), and the releaser reads a child's
row without locking it, so no two of them deadlock.

Exactly once. A message is consumed in the transaction that records the
consuming ``recv`` step (``take_message``), under the run's row lock and
fenced by the claim: a crash before that commit leaves both as they were
(the message is delivered again), one after it leaves both written (the
replay returns the recorded payload). A child is scheduled in the
transaction that records the ``start`` step (``start_child``), so a replay
finds the recorded child id and never schedules a second one.

Crash windows. On SQLite and MariaDB a child's end and its parent's wake
are two writes; a runner that dies between them leaves the parent waiting
for a child that has ended: ``stale_child_waits`` finds those (the claim
loop's sweep wakes them). On PostgreSQL they are one statement.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from ... import serde
from ...errors import RunNotFound, SendRefused
from ...models import ACTIVE_STATUSES, STEP_AWAITING, Claim, Run, StepRecord
from . import statements
from .core import Row
from .execution import Execution
from .runs import Runs
from .values import LOST, NewStep, StepWrite, checked_run_id, utcnow


@dataclasses.dataclass(frozen=True)
class Message:
    """A row of ``everystep_message``."""

    id: int
    topic: str
    payload: Any
    idempotency_key: str | None
    created_at: dt.datetime | None
    consumed_step: str | None
    consumed_at: dt.datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "topic": self.topic, "payload": serde.to_jsonable(self.payload),
                "idempotency_key": self.idempotency_key,
                "created_at": self.created_at.isoformat() if self.created_at else None,
                "consumed_step": self.consumed_step,
                "consumed_at": self.consumed_at.isoformat() if self.consumed_at else None}


@dataclasses.dataclass(frozen=True)
class Event:
    """A row of ``everystep_event``: the last value a run published under ``key``."""

    key: str
    value: Any
    updated_at: dt.datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": serde.to_jsonable(self.value),
                "updated_at": self.updated_at.isoformat() if self.updated_at else None}


@dataclasses.dataclass(frozen=True)
class Links:
    """What a run's row says of its family and its waits."""

    parent_id: str | None
    deadline: dt.datetime | None
    wait_key: str | None


@dataclasses.dataclass(frozen=True)
class ChildOutcome:
    """A child run as its parent's wait reads it."""

    status: str
    result: Any
    error: dict[str, Any] | None


def message_key(topic: str) -> str:
    return f"message:{topic}"


def child_key(run_id: str) -> str:
    return f"child:{run_id}"


#: ``wait_key`` of a run whose scopes wait for different things: any wake ends its wait.
SEVERAL = "*"


class _NothingWritten(Exception):
    """Rolls back a transaction of which one write was refused."""


class Waits(Execution, Runs):
    """Messages, events, child runs and the releases that wait for them
    (over the step records of ``Execution`` and the scheduling of ``Runs``)."""

    # -- sending -----------------------------------------------------------

    def send(self, run_id: str, topic: str, payload_json: str, idempotency_key: str | None = None) -> int:
        """Store a message for ``run_id`` on ``topic`` and wake the run if it
        waits for it, in one transaction; returns the message's id (the first
        one's, for a repeated ``idempotency_key``). ``SendRefused`` for a run
        that is unknown or finished (nothing stored)."""
        with self.connection() as conn, self._transaction(conn):
            return self._send_through(conn, self.sql, run_id, topic, payload_json, idempotency_key)

    @classmethod
    def send_on(cls, conn: Any, run_id: str, topic: str, payload_json: str,
                idempotency_key: str | None = None) -> int:
        """``send`` in a caller's open transaction: the message exists, and
        wakes the run, only once the caller commits."""
        with cls._caller_cursor(conn) as cursor:
            return cls._send_through(cursor, cls.statements(), run_id, topic, payload_json, idempotency_key)

    @classmethod
    def _send_through(cls, conn: Any, sql: dict[str, str], run_id: str, topic: str, payload_json: str,
                      idempotency_key: str | None) -> int:
        return statements.run(conn, cls._send_statements(sql, run_id, topic, payload_json, idempotency_key))

    @classmethod
    def _send_statements(cls, sql: dict[str, str], run_id: str, topic: str, payload_json: str,
                         idempotency_key: str | None) -> statements.Statements[int]:
        """A send's statements, on any cursor: lock the run, refuse a
        finished one, find a message of the same key, insert, wake."""
        params = cls._params(run_id=checked_run_id(run_id), topic=topic, payload=payload_json,
                             key=idempotency_key, wait_key=message_key(topic))
        run = yield statements.Statement(sql["lock_run_wait"], params)
        if run is None:
            raise SendRefused(f"no run with id {run_id}: the message was not stored")
        if run["status"] not in ACTIVE_STATUSES:
            raise SendRefused(f"run {run_id} is {run['status']}: it receives no more messages "
                              "(the message was not stored)")
        if idempotency_key is not None:
            found = yield statements.Statement(sql["message_by_key"], params)
            if found is not None:
                return int(found["id"])
        row = yield statements.Statement(sql["insert_message"], params)
        if run["status"] == "scheduled" and run["wait_key"] in (params["wait_key"], SEVERAL):
            yield statements.Statement(sql["wake_waiter"], params, all=True)
        return int(row["id"])

    # -- the waiting run's side ----------------------------------------------

    def take_message(self, claim: Claim, topic: str, done: NewStep, waiting: NewStep | None,
                     decoded: StepRecord) -> StepWrite | None:
        """The ``recv`` step ``done.step_id``: consume the oldest message on
        ``topic`` and record the step ``done`` with its payload, in one
        transaction under the run's row lock, fenced by ``claim``. Without a
        message, record ``waiting`` instead (if given) and return a record
        of that status.
        ``LOST`` if the claim moved on; a record someone else wrote first
        comes back with ``ours=False``."""
        if "take_message" in self.sql:  # PostgreSQL: the resumed recv in one statement
            taken = self._fetchone("take_message", {**self._step_params(claim, done), "topic": topic})
            if taken is not None:
                record = dataclasses.replace(decoded, result=self._json(taken["payload"]))
                return StepWrite(record.completed(self._time(taken["completed_at"])), ours=True)
        params = self._params(**self._claim_params(claim), topic=topic)
        try:
            with self.connection() as conn, self._transaction(conn):
                if "async_commit" in self.sql:  # PostgreSQL: see the statement
                    conn.execute(self.sql["async_commit"], {}).fetchall()
                if conn.execute(self.sql["lock_claimed"], params).fetchone() is None:
                    raise _NothingWritten
                message = conn.execute(self.sql["next_message"], params).fetchone()
                if message is None:
                    if waiting is not None and self._record_in(conn, claim, waiting) is None:
                        raise _NothingWritten
                    return StepWrite(dataclasses.replace(decoded, status=STEP_AWAITING), ours=True)
                payload_json = serde.dumps(self._json(message["payload"]), "message payload")
                step = dataclasses.replace(done, result_json=payload_json)
                consumed = conn.execute(self.sql["consume_message"], {
                    **params, "step_id": step.step_id, "message_id": message["id"]}).fetchall()
                if not consumed:
                    raise _NothingWritten
                row = self._record_in(conn, claim, step)
                if row is None:
                    raise _NothingWritten
        except _NothingWritten:
            return self._refusal(claim, done)
        record = dataclasses.replace(decoded, result=serde.loads(payload_json))
        return StepWrite(record.completed(self._time(row["completed_at"])), ours=True)

    def record_with_event(self, claim: Claim, step: NewStep, key: str, value_json: str) -> StepWrite | None:
        """The ``set_event`` step: publish ``key`` and record the step in one
        transaction, fenced by ``claim`` (returns like ``record_step``)."""
        params = self._params(**self._claim_params(claim), key=key, value=value_json)
        try:
            with self.connection() as conn, self._transaction(conn):
                row = self._record_in(conn, claim, step)
                if row is None:
                    raise _NothingWritten
                conn.execute(self.sql["put_event"], params)
        except _NothingWritten:
            return self._refusal(claim, step)
        return StepWrite(self._written(claim, step, None, row), ours=True)

    def start_child(self, claim: Claim, step: NewStep, name: str, args_json: str, idempotency_key: str | None,
                    placement: Any, deadline: dt.datetime | None, app_version: str | None) -> StepWrite | None:
        """The ``start`` step: schedule the child run (its parent recorded,
        its deadline the earlier of ``deadline`` and the parent's, its code
        version ``app_version``, else the parent's) and record the step with
        the child's id as its result, in one transaction fenced by
        ``claim``; a replay finds the step and never schedules again."""
        params = self._params(**self._claim_params(claim))
        try:
            with self.connection() as conn, self._transaction(conn):
                owned = conn.execute(self.sql["lock_claimed"], params).fetchone()
                if owned is None:
                    raise _NothingWritten
                inherited = self._time(owned["deadline"])
                if inherited is not None and (deadline is None or inherited < deadline):
                    deadline = inherited
                if app_version is None:
                    app_version = owned["app_version"]
                child = self._schedule_through(conn, name, args_json, idempotency_key, None, placement,
                                               app_version, parent_id=claim.run_id, deadline=deadline)
                step = dataclasses.replace(step, result_json=serde.dumps(child.id, "child run id"))
                row = self._record_in(conn, claim, step)
                if row is None:
                    raise _NothingWritten
        except _NothingWritten:
            return self._refusal(claim, step)
        return StepWrite(self._written(claim, step, None, row), ours=True)

    def release_waiting(self, claim: Claim, not_before: dt.datetime, waits: Sequence[str]) -> bool:
        """Give the run back to the queue until ``not_before``, waiting for
        ``waits`` (``wait_key`` values): under the run's row lock, if what
        it waits for is there already it is due at once instead (see the
        module docstring). False if ``claim`` is no longer current."""
        keys = sorted(set(waits))
        wait_key: str | None = keys[0] if len(keys) == 1 else SEVERAL
        params = self._params(**self._claim_params(claim))
        with self.connection() as conn, self._transaction(conn):
            if conn.execute(self.sql["lock_claimed"], params).fetchone() is None:
                return False
            if any(self._ready(conn, claim.run_id, key) for key in keys):
                not_before, wait_key = utcnow(), None  # what it waits for came: due now
            released = conn.execute(self.sql["release_wait"], self._params(
                **params, not_before=self._time_param(not_before), wait_key=wait_key)).fetchall()
            return bool(released)

    def _ready(self, conn: Any, run_id: str, key: str) -> bool:
        kind, _, target = key.partition(":")
        if kind == "message":
            params = {"run_id": checked_run_id(run_id), "topic": target}
            return conn.execute(self.sql["next_message"], params).fetchone() is not None
        if kind == "child":
            row = conn.execute(self.sql["child_outcome"], {"run_id": checked_run_id(target)}).fetchone()
            return row is None or row["status"] not in ACTIVE_STATUSES
        return True

    def child_outcome(self, child_id: str) -> ChildOutcome | None:
        row = self._fetchone("child_outcome", {"run_id": checked_run_id(child_id)})
        if row is None:
            return None
        return ChildOutcome(row["status"], self._json(row["result"]), self._json(row["error"]))

    # -- reading -------------------------------------------------------------

    def get_event(self, run_id: str, key: str) -> Event | None:
        row = self._fetchone("get_event", {"run_id": checked_run_id(run_id), "key": key})
        return self._event(row) if row is not None else None

    def events(self, run_id: str) -> list[Event]:
        return [self._event(row) for row in self._fetchall("list_events", {"run_id": checked_run_id(run_id)})]

    def messages(self, run_id: str) -> list[Message]:
        return [
            Message(int(row["id"]), row["topic"], self._json(row["payload"]), row["idempotency_key"],
                    self._time(row["created_at"]), row["consumed_step"], self._time(row["consumed_at"]))
            for row in self._fetchall("list_messages", {"run_id": checked_run_id(run_id)})
        ]

    def links(self, run_id: str) -> Links:
        row = self._fetchone("run_links", {"run_id": checked_run_id(run_id)})
        if row is None:
            raise RunNotFound(f"no run with id {run_id}")
        parent = row["parent_id"]
        return Links(str(parent) if parent is not None else None, self._time(row["deadline"]), row["wait_key"])

    def children(self, run_id: str, limit: int = 1000) -> list[Run]:
        rows = self._fetchall("list_children", {"run_id": checked_run_id(run_id), "limit": int(limit)})
        return [self._run(row) for row in rows]

    def active_children(self, run_id: str) -> list[str]:
        return [str(row["id"]) for row in self._fetchall("active_children", {"run_id": checked_run_id(run_id)})]

    def expired_deadlines(self, limit: int = 100) -> list[str]:
        """Active runs whose deadline has passed, earliest first."""
        return [str(row["id"]) for row in self._fetchall("expired_deadlines", self._params(limit=int(limit)))]

    def stale_child_waits(self) -> list[tuple[str, str]]:
        """Parents still waiting for a child that has ended (a wake lost in a crash)."""
        return [(str(row["id"]), row["wait_key"]) for row in self._fetchall("stale_child_waits", self._params())]

    def waiting_counts(self) -> dict[str, int]:
        """Scheduled runs not due yet, by what they wait for (message, child, several, time)."""
        return {row["kind"]: int(row["runs"]) for row in self._fetchall("waiting_counts", self._params())}

    # -- helpers -------------------------------------------------------------

    def _record_in(self, conn: Any, claim: Claim, step: NewStep) -> Row | None:
        """``record_step``'s statement in ``conn``'s transaction: the row, or
        None if the claim moved on or the step has an outcome already."""
        row: Row | None = conn.execute(self.sql["record_step"], self._step_params(claim, step)).fetchone()
        return row

    def _refusal(self, claim: Claim, step: NewStep) -> StepWrite | None:
        """Why a transaction of the waits wrote nothing: ``LOST`` (the claim
        moved on), or the step's record written first by someone else."""
        with self.connection() as conn:
            return self._conflict(conn, self._step_params(claim, step))

    @classmethod
    def _event(cls, row: Row) -> Event:
        return Event(row["key"], cls._json(row["value"]), cls._time(row["updated_at"]))


__all__ = ["LOST", "ChildOutcome", "Event", "Links", "Message", "SEVERAL", "SendRefused", "Waits", "child_key",
           "message_key"]
