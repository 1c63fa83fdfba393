"""Row types: what a run and a recorded step look like to Python code, and
the vocabularies of their status columns (each status declared once, with
its meaning), with where one execution left a run (``Outcome``)."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, Self, TypeVar

from . import serde
from .body_rules import BodyRule, declare


class Status(StrEnum):
    """A status column's vocabulary, each member declared with what it means.

    A member is its exact stored string (``RunStatus.FAILED == "failed"``).
    Everything that lists a vocabulary reads it from its enum: the SQL sets
    (``store/queries``), the database's own check of what a column may hold
    (``store/functions/<backend>/statuses.sql``, rendered from the enum and
    re-applied by the migrator when it changes), the statuses reference
    (``docgen``), the CLI's and the console's choices. So a new status is a
    member here, and the places that give it its meaning.
    """

    meaning: str

    def __new__(cls, value: str, meaning: str, *details: object) -> Self:
        """A member from its declaration ``value, meaning, *details``
        (``details``: what a vocabulary's own ``__init__`` declares)."""
        member = str.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        return member


class RunStatus(Status):
    """Statuses of a run, stored as these exact strings in ``everystep_workflow.status``.

    ``log_level``: how loudly a runner logs an execution that ends the run
    in this status (``Outcome.log_level``; the rest is DEBUG).
    """

    log_level: int

    def __init__(self, value: str, meaning: str, log_level: int = logging.DEBUG) -> None:
        self.log_level = log_level

    SCHEDULED = ("scheduled", "waiting to be claimed, now or at its not-before time (a delayed start, a sleep, "
                              "a retry's backoff, a wait for a message or a child)")
    RUNNING = "running", "claimed by a runner, which is executing it"
    COMPLETED = "completed", "its body returned; the result is recorded"
    FAILED = "failed", "its body raised (a step out of retries, or code between steps)", logging.WARNING
    STOPPED = "stopped", "its body raised `Terminal`: a deliberate stop, never retried", logging.INFO
    BLOCKED = ("blocked", "an unsafe step was interrupted mid-effect; an operator resolves it "
                          "(`everystep resolve-step`)", logging.WARNING)
    CANCELLED = "cancelled", "an operator cancelled it (`everystep cancel`); final", logging.INFO
    CONTINUED = ("continued", "its body called `continue_as_new`: a new run of the workflow took over "
                              "(its id in `continued_as`), with its unconsumed messages; final", logging.INFO)


class StepStatus(Status):
    """Statuses of a recorded step (``everystep_step.status``)."""

    STARTED = "started", "an unsafe step's effect may be under way (its mark before the call)"
    DONE = "done", "the step returned; its result is replayed from now on"
    FAILED = "failed", "the step raised and will not be retried; the error is replayed"
    RETRYING = "retrying", "an attempt failed; the next one is due at `wake_at`"
    SLEEPING = "sleeping", "a durable sleep (`everystep.sleep`) that ends at `wake_at`"
    WAITING = "waiting", "waits for a message or a child run (what for: its args), at most until `wake_at`"


SCHEDULED = RunStatus.SCHEDULED
RUNNING = RunStatus.RUNNING
COMPLETED = RunStatus.COMPLETED
FAILED = RunStatus.FAILED
STOPPED = RunStatus.STOPPED
BLOCKED = RunStatus.BLOCKED
CANCELLED = RunStatus.CANCELLED
CONTINUED = RunStatus.CONTINUED
RUN_STATUSES = tuple(RunStatus)
#: Where an execution ends a run (``blocked`` waits for an operator).
EXECUTION_ENDS = (COMPLETED, FAILED, STOPPED, BLOCKED, CONTINUED)
#: Where a run rests until an operator acts, if ever: ``wait()`` returns on these.
TERMINAL_STATUSES = (*EXECUTION_ENDS, CANCELLED)
#: Where a run is not final yet: it may still be claimed, executed or resolved.
#: The SQL reads this set as ``{active_statuses}`` (``store/queries``): queue
#: counts take these runs, retention never deletes them. Every status is
#: either active or prunable (``tests/test_status_sql.py`` holds it).
ACTIVE_STATUSES = (SCHEDULED, RUNNING, BLOCKED)
# Statuses a run never leaves, so retention (`everystep prune`) may delete
# such runs; blocked is terminal for a supervisor but waits for an operator.
# The one list of what may be pruned: a new final status goes here. (Its
# order is the order ``everystep prune --status`` shows by default.)
PRUNABLE_STATUSES = (COMPLETED, STOPPED, FAILED, CANCELLED, CONTINUED)
#: What ``everystep cancel`` accepts: everything not yet final.
CANCELLABLE_STATUSES = ACTIVE_STATUSES
#: Not a status of its own: the ``scheduled`` runs whose not-before time is
#: ahead, waiting for a message, a child, a sleep, a retry's backoff or a
#: delayed start (what the gauge of waiting runs counts). Lists of runs
#: (``everystep runs --status``, the console) filter by it as by a status.
WAITING = "waiting"
#: What a list of runs may be filtered by: every status, ``waiting`` beside ``scheduled``.
RUN_FILTERS = (SCHEDULED, WAITING, *(status for status in RUN_STATUSES if status != SCHEDULED))

STEP_STARTED = StepStatus.STARTED
STEP_DONE = StepStatus.DONE
STEP_FAILED = StepStatus.FAILED
STEP_RETRYING = StepStatus.RETRYING
STEP_SLEEPING = StepStatus.SLEEPING
STEP_WAITING = StepStatus.WAITING
#: A step row with one of these statuses is waiting (for ``wake_at``, a message or a
#: child run); its outcome is not final.
STEP_WAITING_STATUSES = (STEP_RETRYING, STEP_SLEEPING, STEP_WAITING)
#: A step row with one of these has no final outcome yet, so the step's next
#: record may overwrite it (``{step_open_statuses}`` in the SQL): an unsafe
#: step's ``started`` mark, or a wait that ended.
STEP_OPEN_STATUSES = (STEP_STARTED, *STEP_WAITING_STATUSES)


#: The not-before time of a run that waits with no timeout (a ``recv`` or a
#: child's result without one): never due by the clock, only woken by a
#: send or a child's end (``everystep.waits``). Far from ``datetime.max``
#: so that date arithmetic on it never overflows.
WAIT_FOREVER = dt.datetime(9000, 1, 1, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class Claim:
    """The right to write for one run: its claimer's name and the claim epoch.

    Every claim of a run bumps its epoch (the fencing token), and every write
    an executor makes is conditional on both values, so an execution that
    was superseded (requeued by an operator, re-claimed by its own runner,
    taken over with its runner's name) can write nothing more.
    """

    run_id: str
    claimer: str
    epoch: int


@declare(BodyRule.PLAIN, "A row type: building or reading one reaches nothing.")
@dataclass(frozen=True)
class Run:
    """One workflow run: a row of ``everystep_workflow``."""

    id: str
    name: str
    args: list[Any]
    status: str
    idempotency_key: str | None = None
    claimed_by: str | None = None
    claimed_at: dt.datetime | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    created_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None
    #: Bumped by every claim: the fencing token of the current execution.
    claim_epoch: int = 0
    #: A scheduled run is not claimable before this time (a delayed start,
    #: a durable sleep, a retry's backoff); ``None``: at once.
    not_before: dt.datetime | None = None
    #: The queue it is claimed from, its priority there (larger first) and
    #: its concurrency key (see ``everystep.queues``).
    queue: str = "default"
    priority: int = 0
    concurrency_key: str | None = None
    #: Whether the run had recorded steps when it was claimed (``None``:
    #: unknown). A run with none is on its first execution, so the runner
    #: skips reading its steps.
    has_steps: bool | None = field(default=None, compare=False)
    #: When the run was first claimed: its execution time runs from here to
    #: ``completed_at``; before it, the run waited in its queue (``None``:
    #: never claimed, or claimed before runs recorded it).
    #: (Not compared: PostgreSQL's claim function does not return it.)
    first_claimed_at: dt.datetime | None = field(default=None, compare=False)
    #: The code version the run was started under (``--app-version``, or a
    #: hash of its workflow's code: ``everystep.versions``); None before
    #: versions were recorded.
    app_version: str | None = None
    #: The run this one was forked from (``everystep fork``).
    forked_from: str | None = None
    #: Its place in a chain of runs (``continue_as_new``): the run it
    #: continues, and the run that continued it (a ``continued`` run's).
    continued_from: str | None = None
    continued_as: str | None = None
    #: A debounced run's schedules folded into it so far (the first one
    #: included), as of the read that returned it: ``schedule(...,
    #: debounce=)`` returns it; None where not read (or not debounced).
    debounce_calls: int | None = field(default=None, compare=False)

    @property
    def exception(self) -> BaseException | None:
        """The stored error rebuilt as an exception (``None`` if there is none)."""
        return serde.decode_exception(self.error)

    def claim_as(self, claimer: str) -> Claim:
        """The claim ``claimer`` holds on this run as it was read (its epoch)."""
        return Claim(self.id, claimer, self.claim_epoch)

    @property
    def claim(self) -> Claim:
        """The current claim, for a ``running`` run."""
        if self.claimed_by is None:
            raise ValueError(f"run {self.id} is {self.status}: nobody holds it")
        return Claim(self.id, self.claimed_by, self.claim_epoch)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "args": serde.to_jsonable(self.args),
            "status": self.status,
            "idempotency_key": self.idempotency_key,
            "claimed_by": self.claimed_by,
            "claimed_at": _iso(self.claimed_at),
            "result": serde.to_jsonable(self.result),
            "error": serde.to_jsonable(self.error),
            "created_at": _iso(self.created_at),
            "completed_at": _iso(self.completed_at),
            "claim_epoch": self.claim_epoch,
            "not_before": _iso(self.not_before),
            "queue": self.queue,
            "priority": self.priority,
            "concurrency_key": self.concurrency_key,
            "first_claimed_at": _iso(self.first_claimed_at),
            "app_version": self.app_version,
            "forked_from": self.forked_from,
            "continued_from": self.continued_from,
            "continued_as": self.continued_as,
        }


Row = TypeVar("Row", "Run", "StepRecord")


def row_fields(row: Run | StepRecord) -> dict[str, Any]:
    """A run's or a step's fields, as a step records them (a body's
    ``schedule``, ``get_run``, ``get_steps``): ``row_from_fields`` rebuilds
    the row on a replay."""
    values = {name: getattr(row, name) for name in type(row).__dataclass_fields__}
    if isinstance(row, StepRecord):
        values["attempts"] = [{name: getattr(attempt, name) for name in Attempt.__dataclass_fields__}
                              for attempt in row.attempts]
    return values


def row_from_fields(kind: type[Row], values: dict[str, Any]) -> Row:
    """The ``kind`` row of recorded fields (a field this version does not
    know is left out; one it added keeps its default)."""
    known = kind.__dataclass_fields__
    kept = {name: value for name, value in values.items() if name in known}
    if "attempts" in kept:
        kept["attempts"] = [Attempt(**attempt) for attempt in kept["attempts"]]
    return kind(**kept)


#: A step's row as a replay reads it (``Store.load_outcomes``): step id,
#: function name, status, result and error as stored, attempt, start and wake
#: times as stored.
ReplayRow = tuple[str, str, str, Any, Any, int, Any, Any]


class Outcomes(MutableMapping[str, "StepRecord"]):
    """A run's recorded outcomes by step id, as its execution knows them.

    A resume reads the run's whole history and then meets each step once,
    in order. So the rows are kept as they were read, and a step's record
    is built when something asks for it (``decode`` turns a stored value
    into Python, ``time`` a stored time); the common case, a step recorded
    ``done`` met again by the same function, only decodes its result
    (``done_result``): what makes a resume cost a lookup per step. Records
    written by the execution itself are kept as they are. Safe for the
    threads of a ``parallel`` fork."""

    def __init__(self, run_id: str = "", rows: dict[str, ReplayRow] | None = None,
                 decode: Callable[[Any], Any] = lambda value: value,
                 time: Callable[[Any], dt.datetime | None] = lambda value: value) -> None:
        self._run_id = run_id
        self._rows: dict[str, ReplayRow] = rows if rows is not None else {}
        self._records: dict[str, StepRecord] = {}
        self._decode = decode
        self._time = time
        self._added = 0  # records whose step id no row has
        self._lock = threading.Lock()

    @classmethod
    def of(cls, records: Iterable[StepRecord]) -> Outcomes:
        """Outcomes holding these records (a dry replay's, a test's)."""
        outcomes = cls()
        for record in records:
            outcomes[record.step_id] = record
        return outcomes

    def done_result(self, step_id: str, name: str) -> tuple[bool, Any]:
        """``(True, result)`` if step ``step_id`` is recorded ``done`` by
        function ``name``; ``(False, None)`` for anything else (no record,
        another status or function: the caller's slow path decides)."""
        record = self._records.get(step_id)
        if record is not None:
            return (True, record.result) if record.status == STEP_DONE and record.name == name else (False, None)
        row = self._rows.get(step_id)
        if row is None or row[2] != STEP_DONE or row[1] != name:
            return False, None
        return True, self._decode(row[3])

    def names(self) -> Iterator[tuple[str, str]]:
        """``(step id, function name)`` of every outcome, with no record
        built (``patches.went_past`` looks over them all)."""
        for step_id, row in list(self._rows.items()):
            if step_id not in self._records:
                yield step_id, row[1]
        for step_id, record in list(self._records.items()):
            yield step_id, record.name

    def __getitem__(self, step_id: str) -> StepRecord:
        record = self._records.get(step_id)
        if record is not None:
            return record
        row = self._rows[step_id]
        decode, time = self._decode, self._time
        built = StepRecord.replayed(self._run_id, row[0], row[1], row[2], decode(row[3]),
                                    decode(row[4]) if row[4] is not None else None, row[5] or 1, time(row[6]),
                                    time(row[7]) if row[7] is not None else None)
        with self._lock:
            return self._records.setdefault(step_id, built)

    def __setitem__(self, step_id: str, record: StepRecord) -> None:
        with self._lock:
            if step_id not in self._rows and step_id not in self._records:
                self._added += 1
            self._records[step_id] = record

    def __delitem__(self, step_id: str) -> None:
        raise TypeError("a recorded outcome is never forgotten by its execution")

    def __contains__(self, step_id: object) -> bool:
        return step_id in self._records or step_id in self._rows

    def __iter__(self) -> Iterator[str]:
        return (step_id for step_id, _ in self.names())

    def __len__(self) -> int:
        return len(self._rows) + self._added


@dataclass(frozen=True)
class Attempt:
    """One failed attempt of a step that was retried (``everystep_attempt``)."""

    attempt: int
    error: dict[str, Any] | None
    started_at: dt.datetime | None
    failed_at: dt.datetime | None
    #: When the next attempt was allowed to start.
    retry_at: dt.datetime | None

    @property
    def exception(self) -> BaseException | None:
        return serde.decode_exception(self.error)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "error": serde.to_jsonable(self.error),
            "started_at": _iso(self.started_at),
            "failed_at": _iso(self.failed_at),
            "retry_at": _iso(self.retry_at),
        }


@declare(BodyRule.PLAIN, "A row type: building or reading one reaches nothing.")
@dataclass(frozen=True)
class StepRecord:
    """One recorded step: a row of ``everystep_step``.

    ``status`` is ``done`` (``result`` holds the value), ``failed`` (``error``
    holds the encoded exception), ``started`` (an unsafe-to-repeat step
    whose effect may be under way, with no outcome yet), ``retrying`` (attempt
    ``attempt`` failed with ``error``; the next one may start at
    ``wake_at``) or ``sleeping`` (a durable sleep until ``wake_at``).
    ``attempts`` lists the failed attempts that were retried, oldest first
    (filled by ``get_steps``; the runner does not read them).
    """

    workflow_id: str
    step_id: str
    name: str
    status: str
    result: Any = None
    error: dict[str, Any] | None = None
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    started_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None
    #: Which attempt this outcome belongs to (1 unless the step was retried).
    attempt: int = 1
    wake_at: dt.datetime | None = None
    attempts: list[Attempt] = field(default_factory=list, compare=False)
    #: What the step cost where a supervisor measured it (None elsewhere):
    #: CPU seconds, and its process's peak RSS growth in bytes
    #: (``everystep.resources.StepCost``).
    cpu_seconds: float | None = None
    peak_rss_bytes: int | None = None

    @property
    def exception(self) -> BaseException | None:
        return serde.decode_exception(self.error)

    def completed(self, at: dt.datetime | None) -> StepRecord:
        """This record with ``completed_at`` set to ``at``. A copy of the
        field values as ``dataclasses.replace`` makes, without its walk
        through every field and the frozen ``__init__``: the store stamps
        each record it writes, so that walk was in every step's cost."""
        stamped = object.__new__(type(self))
        stamped.__dict__.update(self.__dict__)
        stamped.__dict__["completed_at"] = at
        return stamped

    @classmethod
    def replayed(cls, workflow_id: str, step_id: str, name: str, status: str, result: Any,
                 error: dict[str, Any] | None, attempt: int, started_at: dt.datetime | None,
                 wake_at: dt.datetime | None) -> StepRecord:
        """A record as a replay reads it (``Store.load_outcomes``): its
        outcome, not its arguments or costs. Built without ``__init__``,
        which sets each field of a frozen dataclass through
        ``object.__setattr__``: a resume builds one per recorded step."""
        record = object.__new__(cls)
        record.__dict__.update(
            workflow_id=workflow_id, step_id=step_id, name=name, status=status, result=result, error=error,
            args=[], kwargs={}, started_at=started_at, completed_at=None, attempt=attempt, wake_at=wake_at,
            attempts=[], cpu_seconds=None, peak_rss_bytes=None)
        return record

    def to_dict(self) -> dict[str, Any]:
        return {
            "workflow_id": self.workflow_id,
            "step_id": self.step_id,
            "name": self.name,
            "status": self.status,
            "result": serde.to_jsonable(self.result),
            "error": serde.to_jsonable(self.error),
            "args": serde.to_jsonable(self.args),
            "kwargs": serde.to_jsonable(self.kwargs),
            "started_at": _iso(self.started_at),
            "completed_at": _iso(self.completed_at),
            "attempt": self.attempt,
            "wake_at": _iso(self.wake_at),
            "attempts": [attempt.to_dict() for attempt in self.attempts],
            "cpu_seconds": self.cpu_seconds,
            "peak_rss_bytes": self.peak_rss_bytes,
        }


class StepOutline(NamedTuple):
    """A line of a run's history: a step without its arguments, result,
    error and times (``Store.step_outline``), but the result of a patch
    marker, its answer. What the step graph is drawn from: a history of
    100,000 steps is 100,000 of these, made in a fraction of the time whole
    records take."""

    workflow_id: str
    step_id: str
    name: str
    status: str
    result: Any = None


class RequestStatus(Status):
    """Statuses of an operator request (``everystep_request.status``; see
    ``everystep.relay``): each transition is a compare-and-set on it."""

    PENDING = "pending", "submitted, not yet taken by its runner"
    TAKEN = "taken", "its runner is acting on it"
    ANSWERED = "answered", "its runner replied (`reply`)"
    EXPIRED = "expired", "nobody took it in time"


#: Requests older than this (seconds) are deleted when the next one is submitted.
REQUEST_KEEP_SECONDS = 7 * 24 * 3600.0


@dataclass(frozen=True)
class OperatorRequest:
    """A row of ``everystep_request``: a command for a runner, relayed
    through the database (``everystep.relay``)."""

    id: int
    runner: str
    command: str
    args: dict[str, Any]
    status: str
    reply: dict[str, Any] | None
    requested_by: str
    created_at: dt.datetime | None
    taken_at: dt.datetime | None
    answered_at: dt.datetime | None
    #: Seconds since it was submitted, by the database's clock when known.
    age_seconds: float | None = None

    @property
    def done(self) -> bool:
        return self.status in (RequestStatus.ANSWERED, RequestStatus.EXPIRED)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "runner": self.runner,
            "command": self.command,
            "args": self.args,
            "status": self.status,
            "reply": self.reply,
            "requested_by": self.requested_by,
            "created_at": _iso(self.created_at),
            "taken_at": _iso(self.taken_at),
            "answered_at": _iso(self.answered_at),
        }


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


class Outcome(StrEnum):
    """Where one execution of a run left it: a run status it wrote (or found
    written: a cancel), or one of the ways an execution ends without
    writing one. The runner returns it; runners (the worker, the
    supervisor's parent) count and log it.

    The members named after a run status are that status, as declared in
    ``RunStatus``: their value and their log level come from it
    (``Outcome.FAILED == RunStatus.FAILED``), and they are exactly the
    statuses an execution ends a run in (``EXECUTION_ENDS``) and the cancel
    it may find (``tests/test_status_sql.py`` holds the two to each other).
    The others declare their own log level.
    """

    log_level: int

    def __new__(cls, declared: str | RunStatus, log_level: int = logging.DEBUG) -> Self:
        member = str.__new__(cls, declared)
        member._value_ = str(declared)
        member.log_level = declared.log_level if isinstance(declared, RunStatus) else log_level
        return member

    COMPLETED = RunStatus.COMPLETED
    FAILED = RunStatus.FAILED
    STOPPED = RunStatus.STOPPED
    BLOCKED = RunStatus.BLOCKED
    CANCELLED = RunStatus.CANCELLED  # an operator cancelled it mid-run: nothing more was written
    CONTINUED = RunStatus.CONTINUED  # continue_as_new: a new run took over
    REQUEUED = "requeued", logging.INFO  # drained at a step boundary, back in the queue
    RELEASED = "released"  # waits (sleep, retry backoff): back in the queue until its wake time
    LOST = "lost", logging.WARNING  # the claim moved on: nothing more was written
    UNFINISHED = "unfinished", logging.WARNING  # the database failed mid-run; still claimed, to be retried
    DEFERRED = "deferred", logging.WARNING  # an engine statement failed (StoreError): back in the queue after a backoff

    @property
    def status(self) -> RunStatus | None:
        """The run status this outcome is (``None``: it wrote none)."""
        return next((status for status in RunStatus if status.value == self.value), None)

    @property
    def settled(self) -> bool:
        """The run reached a resting point (a status, or back in the queue)."""
        return self not in (Outcome.LOST, Outcome.UNFINISHED)
