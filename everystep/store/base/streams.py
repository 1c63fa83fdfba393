"""Streams: values a running run writes for readers outside, as rows.

A stream is the rows of ``everystep_stream`` of one run and key, ordered by
``seq`` (1, 2, 3 …; a seq is never reused, so a reader resumes after the
last one it saw). Two writers, one rule each (``everystep.streams`` says
why):

- a body's write is a recorded step: the row and the step's record commit
  in one transaction under the run's row lock, fenced by the claim
  (``record_stream_write``); a replay finds the step and writes nothing;
- values written from steps' code commit in batches (``append_batch``:
  one transaction fenced by the claim; ``everystep.stream_batches`` makes
  the batches), each tagged with its step's id and the id of the
  execution that wrote it (``attempt``). The first batch of an execution
  holding a step's values first withdraws the rows other executions wrote
  for that step (an attempt that was killed or failed before its record):
  their seqs stay taken, their values are dropped, readers skip them.

The seq is the tail's plus one, read in the writing transaction; a writer
that races another for the same seq inserts nothing and reads the tail
again (READ COMMITTED on PostgreSQL and MariaDB sees the other's commit;
SQLite has one writer at a time), so seqs commit in order and a reader
reading past its last seq misses none. On PostgreSQL each insert notifies
``everystep_stream`` with the run's id, delivered at the commit.

Crash windows: a crash before a write's commit writes nothing; a crash of
a step after some of its writes committed leaves those rows, tagged with
the dead execution's id, until the step's next execution writes (they
are withdrawn then) or the run is pruned (the rows go with it).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection, Sequence
from typing import Any

from ... import serde
from ...errors import StreamRefused
from ...models import Claim
from .core import Row
from .values import LOST, Marker, NewStep, Notifications, StepWrite, checked_run_id
from .waits import Waits

#: How many times a writer reads the tail again after losing a seq to a
#: concurrent writer of the same stream (parallel branches of one run).
_RACES = 50


@dataclasses.dataclass(frozen=True)
class StreamItem:
    """One row of a stream as a reader sees it: its ``seq``, its ``value``,
    the step that wrote it (``step_id``) and, for a write from a step's
    code, the ``attempt`` that wrote it: the id of the execution running
    that step (when it began, in nanoseconds; None: a body's write, a
    recorded step). The closing marker has ``closed`` and no value."""

    seq: int
    value: Any
    step_id: str
    attempt: int | None
    closed: bool
    written_at: dt.datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "value": serde.to_jsonable(self.value), "step_id": self.step_id,
                "attempt": self.attempt, "closed": self.closed,
                "written_at": self.written_at.isoformat() if self.written_at else None}


@dataclasses.dataclass(frozen=True)
class StreamSummary:
    """A run's stream as the console and ``show`` list it."""

    key: str
    last_seq: int
    closed: bool

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "last_seq": self.last_seq, "closed": self.closed}


@dataclasses.dataclass(frozen=True)
class StreamBounds:
    """The size bounds a write is held to: bytes of one value's JSON, and
    values (seqs) one stream may hold."""

    value_bytes: int
    values: int


class _Lost(Exception):
    """Rolls back a batch whose claim moved on."""


class Streams(Waits):
    """Writing and reading streams (over the step records and the run row
    locks of ``Waits``)."""

    def append_batch(self, claim: Claim, attempt: int, rows: Sequence[tuple[str, str, str | None]],
                     bounds: StreamBounds, withdraw: Collection[str] = ()) -> bool:
        """Values written from steps' code by execution ``attempt``, as
        (step id, key, value JSON; None: the closing marker), in order, in
        one transaction fenced by ``claim``; the rows of the steps in
        ``withdraw`` that other executions wrote are withdrawn first in it.
        False when the claim moved on (nothing written); ``StreamRefused``
        (nothing written) past a bound or on a closed stream. Closing a
        closed stream writes nothing."""
        base = self._params(**self._claim_params(claim), attempt=attempt)
        tails: dict[str, int] = {}
        closed: set[str] = set()
        try:
            with self.connection() as conn, self._transaction(conn):
                for step_id in sorted(withdraw):
                    conn.execute(self.sql["stream_withdraw"], {**base, "step_id": step_id})
                for step_id, key, value_json in rows:
                    if key in closed:
                        if value_json is None:
                            continue
                        raise StreamRefused(f"run {claim.run_id}: stream {key!r} is closed; nothing was written")
                    params = {**base, "key": key, "step_id": step_id}
                    seq = self._append(conn, params, value_json, bounds, live=True, tail=tails.get(key))
                    if seq is None:
                        raise _Lost
                    tails[key] = seq
                    if value_json is None:
                        closed.add(key)
        except _Lost:
            return False
        return True

    def record_stream_write(self, claim: Claim, step: NewStep, key: str, value_json: str | None,
                            bounds: StreamBounds, markers: tuple[Marker, ...] = ()) -> StepWrite | None:
        """A body's write as the step ``step``: the row and the step's record
        (its result the seq) in one transaction under the run's row lock,
        fenced by ``claim``. Returns like ``record_step``; ``StreamRefused``
        (nothing written) past a bound or on a closed stream."""
        def write(conn: Any, owned: Row) -> str:
            params = self._params(**self._claim_params(claim), key=key, step_id=step.step_id, attempt=None)
            seq = self._append(conn, params, value_json, bounds)
            return serde.dumps(seq, "stream seq")

        return self._record_with(claim, step, write, markers, locked=True)

    def _append(self, conn: Any, params: dict[str, Any], value_json: str | None, bounds: StreamBounds,
                live: bool = False, tail: int | None = None) -> int | None:
        """Insert at the tail's seq plus one, inside the caller's
        transaction, reading the tail again after a lost race. ``live``: a
        write from a step's code, whose commit need not wait for its flush
        on PostgreSQL (``stream_tail_live`` says why). ``tail``: the seq
        this transaction wrote last to the stream (its tail was read, and
        the claim checked, for its first value), so the next goes after it
        without reading the tail again, unless a concurrent writer took it."""
        key = params["key"]
        for _ in range(_RACES):
            if tail is not None:
                last, closed = tail, False  # the batch says whether it closed the stream
                tail = None
            else:
                found = conn.execute(self.sql["stream_tail_live" if live else "stream_tail"], params).fetchone()
                if found is None:
                    return LOST  # the claim moved on: nothing is written
                last, closed = int(found["seq"] or 0), bool(found["closed"])
            if closed:
                if value_json is None:
                    return last  # closing a closed stream: nothing more to say
                raise StreamRefused(f"run {params['run_id']}: stream {key!r} is closed; nothing was written")
            if last >= bounds.values:
                raise StreamRefused(
                    f"run {params['run_id']}: stream {key!r} holds its bound of {bounds.values} values "
                    "(EVERYSTEP_STREAM_MAX_VALUES); nothing was written")
            seq = last + 1
            added = conn.execute(self.sql["stream_append"],
                                 {**params, "seq": seq, "value": value_json, "closed": value_json is None})
            if added.rowcount:
                return seq
        raise StreamRefused(f"run {params['run_id']}: stream {key!r} lost the race for its next seq "
                            f"{_RACES} times; nothing was written")

    def stream_items(self, run_id: str, key: str, after: int = 0, limit: int = 1000) -> list[StreamItem]:
        """Run ``run_id``'s stream ``key`` after seq ``after``, oldest first,
        at most ``limit`` rows (withdrawn ones left out)."""
        rows = self._fetchall("stream_read", {"run_id": checked_run_id(run_id), "key": key, "after": after,
                                              "limit": limit})
        return [StreamItem(int(row["seq"]), self._json(row["value"]), str(row["step_id"]),
                           None if row["attempt"] is None else int(row["attempt"]), bool(row["closed"]),
                           self._time(row["written_at"])) for row in rows]

    def streams_of(self, run_id: str) -> list[StreamSummary]:
        """Run ``run_id``'s streams, by key."""
        rows = self._fetchall("stream_keys", {"run_id": checked_run_id(run_id)})
        return [StreamSummary(str(row["key"]), int(row["seq"]), bool(row["closed"])) for row in rows]

    def listen_streams(self) -> Notifications | None:
        """A dedicated connection woken by every stream write's commit (the
        caller's own), or None where there is none (readers poll)."""
        return None
