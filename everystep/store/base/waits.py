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

from ... import serde, wait_kinds
from ...errors import RunNotFound, SendRefused
from ...models import ACTIVE_STATUSES, CONTINUED, STEP_WAITING, Claim, Run, StepRecord, row_fields
from ...wait_kinds import EVENT, MESSAGE
from . import statements
from .core import Row
from .debounce import Debounces
from .execution import Execution
from .values import LOST, Marker, NewStep, StepWrite, checked_run_id, utcnow


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
class Sent:
    """What a send did: the message's id, and whether this send stored it
    (False: a message of the same idempotency key was there already, and
    this one's payload was dropped)."""

    id: int
    stored: bool


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
    parent_id: str | None = None
    #: Where a ``continued`` child went on (``continue_as_new``).
    continued_as: str | None = None


class _NothingWritten(Exception):
    """Rolls back a transaction of which one write was refused."""


class Waits(Execution, Debounces):
    """Messages, events, child runs and the releases that wait for them
    (over the step records of ``Execution`` and the scheduling of ``Runs``, debounced or not)."""

    # -- sending -----------------------------------------------------------

    def send(self, run_id: str, topic: str, payload_json: str, idempotency_key: str | None = None) -> int:
        """Store a message for ``run_id`` on ``topic`` and wake the run if it
        waits for it, in one transaction; returns the message's id (the first
        one's, for a repeated ``idempotency_key``). ``SendRefused`` for a run
        that is unknown or finished (nothing stored)."""
        return self.deliver(run_id, topic, payload_json, idempotency_key).id

    def deliver(self, run_id: str, topic: str, payload_json: str, idempotency_key: str | None = None) -> Sent:
        """``send``, saying also whether this message was stored or a repeat
        of its idempotency key (an operator is told the difference)."""
        with self.connection() as conn, self._transaction(conn):
            return self._send_through(conn, self.sql, run_id, topic, payload_json, idempotency_key)

    @classmethod
    def send_on(cls, conn: Any, run_id: str, topic: str, payload_json: str,
                idempotency_key: str | None = None) -> int:
        """``send`` in a caller's open transaction: the message exists, and
        wakes the run, only once the caller commits."""
        with cls._caller_cursor(conn) as cursor:
            return cls._send_through(cursor, cls.statements(), run_id, topic, payload_json, idempotency_key).id

    @classmethod
    def _send_through(cls, conn: Any, sql: dict[str, str], run_id: str, topic: str, payload_json: str,
                      idempotency_key: str | None) -> Sent:
        return statements.run(conn, cls._send_statements(sql, run_id, topic, payload_json, idempotency_key))

    @classmethod
    def _send_statements(cls, sql: dict[str, str], run_id: str, topic: str, payload_json: str,
                         idempotency_key: str | None) -> statements.Statements[Sent]:
        """A send's statements, on any cursor: lock the run, refuse a
        finished one, find a message of the same key, insert, wake."""
        try:
            target = checked_run_id(run_id)
        except RunNotFound:
            raise SendRefused(f"no run with id {run_id!r}: the message was not stored") from None
        params = cls._params(run_id=target, topic=topic, payload=payload_json,
                             key=idempotency_key, wait_key=MESSAGE.key(topic))
        run = yield statements.Statement(sql["lock_run_wait"], params)
        while run is not None and run["status"] == CONTINUED and run["continued_as"]:
            # A run that continued as new: its newest successor takes the message.
            params["run_id"] = str(run["continued_as"])
            run = yield statements.Statement(sql["lock_run_wait"], params)
        if run is None:
            raise SendRefused(f"no run with id {run_id}: the message was not stored")
        if run["status"] not in ACTIVE_STATUSES:
            raise SendRefused(f"run {run_id} is {run['status']}: it receives no more messages "
                              "(the message was not stored)")
        if idempotency_key is not None:
            found = yield statements.Statement(sql["message_by_key"], params)
            if found is not None:
                return Sent(int(found["id"]), stored=False)
        row = yield statements.Statement(sql["insert_message"], params)
        if run["status"] == "scheduled" and run["wait_key"] in (params["wait_key"], wait_kinds.SEVERAL):
            yield statements.Statement(sql["wake_waiter"], params, all=True)
        return Sent(int(row["id"]), stored=True)

    # -- the waiting run's side ----------------------------------------------

    def take_message(self, claim: Claim, topic: str, done: NewStep, waiting: NewStep | None,
                     decoded: StepRecord, markers: Sequence[Marker] = ()) -> StepWrite | None:
        """The ``recv`` step ``done.step_id``: consume the oldest message on
        ``topic`` and record the step ``done`` with its payload, in one
        transaction under the run's row lock, fenced by ``claim``. Without a
        message, record ``waiting`` instead (if given) and return a record
        of that status.
        ``LOST`` if the claim moved on; a record someone else wrote first
        comes back with ``ours=False``. Patch ``markers`` are written first,
        in the same transaction."""
        if "take_message" in self.sql and not markers:  # PostgreSQL: the resumed recv in one statement
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
                self._record_markers(conn, self._step_params(claim, done), markers)
                message = conn.execute(self.sql["next_message"], params).fetchone()
                if message is None:
                    if waiting is not None and self._record_in(conn, claim, waiting) is None:
                        raise _NothingWritten
                    return StepWrite(dataclasses.replace(decoded, status=STEP_WAITING), ours=True)
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

    def record_with_event(self, claim: Claim, step: NewStep, key: str, value_json: str,
                          markers: Sequence[Marker] = ()) -> StepWrite | None:
        """The ``set_event`` step: publish ``key``, wake the runs waiting for
        it (``get_event`` with a timeout in their body) and record the step,
        in one transaction fenced by ``claim`` (returns like ``record_step``)."""
        def publish(conn: Any) -> str | None:
            params = self._params(run_id=checked_run_id(claim.run_id), key=key, value=value_json,
                                  wait_key=EVENT.key(f"{checked_run_id(claim.run_id)}:{key}"))
            conn.execute(self.sql["put_event"], params)
            conn.execute(self.sql["wake_watchers"], params).fetchall()
            return None

        # Locked: a run releasing itself to wait for this event reads it
        # after taking this row (``_ready``), so it sees it or is woken.
        return self._record_with(claim, step, lambda conn, owned: publish(conn), markers, locked=True)

    def start_child(self, claim: Claim, step: NewStep, name: str, args_json: str, idempotency_key: str | None,
                    placement: Any, deadline: dt.datetime | None, app_version: str | None,
                    markers: Sequence[Marker] = ()) -> StepWrite | None:
        """The ``start`` step: schedule the child run (its parent recorded,
        its deadline the earlier of ``deadline`` and the parent's, its code
        version ``app_version``, else the parent's) and record the step with
        the child's id as its result, in one transaction fenced by
        ``claim``; a replay finds the step and never schedules again."""
        def schedule_child(conn: Any, owned: Row) -> str:
            inherited = self._time(owned["deadline"])
            ends = inherited if inherited is not None and (deadline is None or inherited < deadline) else deadline
            version = app_version if app_version is not None else owned["app_version"]
            child = self._schedule_through(conn, name, args_json, idempotency_key, None, placement,
                                           version, parent_id=claim.run_id, deadline=ends)
            return serde.dumps(child.id, "child run id")

        return self._record_with(claim, step, schedule_child, markers, locked=True)

    def record_send(self, claim: Claim, step: NewStep, run_id: str, topic: str, payload_json: str,
                    idempotency_key: str | None, markers: Sequence[Marker] = ()) -> StepWrite | None:
        """A body's ``send``: the message stored (and its run woken, as
        ``send``) and the step recorded with the message's id, in one
        transaction fenced by ``claim``: a crash before its commit sends
        nothing, and a replay returns the recorded id. ``SendRefused`` (no
        step written) for a run that takes no messages."""
        def send(conn: Any) -> str:
            sent = self._send_through(conn, self.sql, run_id, topic, payload_json, idempotency_key)
            return serde.dumps(sent.id, "message id")

        return self._record_with(claim, step, send, markers)

    def record_schedule(self, claim: Claim, step: NewStep, name: str, args_json: str, idempotency_key: str | None,
                        not_before: dt.datetime | None, placement: Any, app_version: str | None,
                        deadline: dt.datetime | None, markers: Sequence[Marker] = (), *,
                        debounce: tuple[str, float, float] | None = None) -> StepWrite | None:
        """A body's ``schedule``: a detached run (no parent: not cancelled
        with this one) inserted and the step recorded with that run as its
        result, in one transaction fenced by ``claim``; ``debounce`` (key,
        period, max_wait): folded into the key's window instead
        (``store/base/debounce.py``), in the same transaction."""
        def schedule(conn: Any) -> str:
            if debounce is not None:
                key, period, max_wait = debounce
                run = statements.run(conn, self._debounce_statements(
                    name, args_json, key, period, max_wait, placement, app_version, deadline))
            else:
                run = self._schedule_through(conn, name, args_json, idempotency_key, not_before, placement,
                                             app_version, deadline=deadline)
            return serde.dumps(row_fields(run), "scheduled run")

        return self._record_with(claim, step, schedule, markers)

    def _record_with(self, claim: Claim, step: NewStep, effect: Any, markers: Sequence[Marker],
                     locked: bool = False) -> StepWrite | None:
        """Make ``effect`` (on the connection, in the transaction; it returns
        the step's result as JSON, or None to keep ``step``'s) and record
        ``step`` done with that result, after the patch ``markers``, in one
        transaction fenced by ``claim``: all or nothing. ``locked``: the
        run's row is locked under the claim first and handed to ``effect``,
        which then runs only if the claim holds. Returns like
        ``record_step``; an exception of ``effect`` rolls everything back
        and propagates."""
        try:
            with self.connection() as conn, self._transaction(conn):
                self._record_markers(conn, self._step_params(claim, step), markers)
                if locked:
                    owned = conn.execute(self.sql["lock_claimed"],
                                         self._params(**self._claim_params(claim))).fetchone()
                    if owned is None:
                        raise _NothingWritten
                    result_json = effect(conn, owned)
                else:
                    result_json = effect(conn)
                if result_json is not None:
                    step = dataclasses.replace(step, result_json=result_json)
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
        wait_key: str | None = keys[0] if len(keys) == 1 else wait_kinds.SEVERAL
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
        """Whether what ``key`` waits for is there now: its kind's ready
        statements (``everystep.wait_kinds``), in this transaction."""
        parsed = wait_kinds.parse(key)
        if parsed is None:
            return True  # an unknown kind: the wait ends, and the body says why
        kind, target = parsed
        params = kind.params(run_id, target)
        if "run_id" in params:
            params["run_id"] = checked_run_id(params["run_id"])
        row = None
        for name in kind.ready:
            row = conn.execute(self.sql[name], params).fetchone()
        return row is not None

    def child_outcome(self, child_id: str) -> ChildOutcome | None:
        row = self._fetchone("child_outcome", {"run_id": checked_run_id(child_id)})
        if row is None:
            return None
        parent, successor = row["parent_id"], row["continued_as"]
        return ChildOutcome(row["status"], self._json(row["result"]), self._json(row["error"]),
                            str(parent) if parent is not None else None,
                            str(successor) if successor is not None else None)

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


__all__ = ["LOST", "ChildOutcome", "Event", "Links", "Message", "SendRefused", "Sent", "Waits"]
