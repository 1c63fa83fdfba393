"""Execution state of a run: step identities, recorded outcomes, interrupts.

One ``Execution`` is shared by every scope of a run being executed (its body
and each parallel branch); each scope has its own ``Context`` that hands out
step ids. ``current()`` returns the running ``Context`` of this thread, or
``None`` outside a workflow, which is how steps know whether to record.

Step ids are dotpaths. Unnamed steps take the next position in their scope
("1", "2"); a named step takes its name as the segment but still consumes a
position, so naming one step never shifts the others. A branch of the fork
at id F, index i, prefixes its steps with "F.i.".

An *interrupt* is an exception that ends the whole run whatever the body does
with it: a ``Terminal`` stop, an ``EffectUncertain`` block, a drain, a lost
claim, a cancel, a code error, a simulated crash. The first one raised is remembered
(the more severe wins when branches race) and every later step call in any
scope re-raises it, so no new step starts once the run is ending.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import itertools
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from .errors import (
    Cancelled,
    ClaimLost,
    DrainOrphan,
    EffectUncertain,
    EverystepError,
    SimulatedCrash,
    StoreError,
    StoreUnavailable,
    Terminal,
)
from .models import Claim, Outcomes, StepRecord

if TYPE_CHECKING:
    from types import CodeType

    from .models import Outcome, Run
    from .registry import DeclaredStep
    from .resources import StepCost
    from .store import Marker, Store

MAX_STEP_ID_LENGTH = 300
# fullmatch, not match with "$": "$" also matches before a trailing newline.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_:@+-]*")

# Lower ranks win when several interrupts race (parallel branches).
_INTERRUPT_RANKS: tuple[type[BaseException], ...] = (
    SimulatedCrash,
    StoreUnavailable,
    ClaimLost,
    Cancelled,
    StoreError,
    Terminal,
    EffectUncertain,
    DrainOrphan,
)


NOT_AN_INTERRUPT = len(_INTERRUPT_RANKS)


def interrupt_rank(exc: BaseException) -> int:
    """Severity of ``exc`` as a run interrupt (lower wins);
    ``NOT_AN_INTERRUPT`` for any other exception."""
    for rank, kind in enumerate(_INTERRUPT_RANKS):
        if isinstance(exc, kind):
            return rank
    return NOT_AN_INTERRUPT


class Flag(Protocol):
    """Anything with ``is_set()``: a ``threading.Event`` or a signal-safe flag."""

    def is_set(self) -> bool: ...


class ReplayLog(Protocol):
    """Told of each step a dry replay meets (``everystep replay``): before
    it (``reaching``), then how it matched its record."""

    def reaching(self, step_id: str, name: str) -> None: ...

    def matched(self, step_id: str, name: str, record: StepRecord) -> None: ...

    def diverged(self, step_id: str, recorded: str, called: str) -> None: ...

    def unrecorded(self, step_id: str, name: str) -> None: ...


# -- what a runner plugs into an execution ---------------------------------------


class Observer:
    """No-op base class; override what you need."""

    def run_started(self, run: Run, ctx: Context) -> Any:
        return None

    def run_settling(self, run: Run, status: str) -> None:
        """The body is done; the runner is about to write ``status`` (a run
        status, or ``requeued``). Runs no more workflow code after this."""

    def run_finished(self, run: Run, ctx: Context, status: str, error: BaseException | None, token: Any) -> None:
        """``status`` is a run status, or ``requeued``/``lost``/``crashed``."""

    def step_started(self, ctx: Context, step_id: str, name: str, timeout: float | None, unsafe: bool) -> Any:
        return None

    def step_finished(
        self, ctx: Context, step_id: str, name: str, status: str, error: BaseException | None, token: Any
    ) -> None:
        """``status`` is ``done`` or ``failed`` (or ``crashed`` when the fault
        hook simulated a process death before the record)."""

    def fork_started(self, ctx: Context, fork_id: str, branches: int) -> Any:
        return None

    def fork_finished(self, ctx: Context, fork_id: str, error: BaseException | None, token: Any) -> None:
        pass


class StepGauge:
    """One step's measurement, from ``StepMeter.begin`` to ``end``.

    ``call`` runs the step's function (a meter may arm an interrupt only for
    that long, and turn what its limit caused into ``StepResourceExceeded``);
    ``end`` lifts whatever bounded the step and returns its cost. The runner
    calls ``end`` exactly once, whatever the step did.
    """

    __slots__ = ()

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return fn(*args, **kwargs)

    def end(self) -> StepCost | None:
        return None

    def failed(self, exc: MemoryError) -> Exception:
        """What an async step's ``MemoryError`` is its failure as (an async
        step's coroutine is awaited, not run by ``call``)."""
        return exc


class StepMeter:
    """Measures, and may bound, every step a runner executes.

    The runner calls ``begin`` right before a step's function runs (after
    its arguments were stored, before the observers hear of it), then
    ``gauge.call`` and ``gauge.end``. ``begin`` runs on the thread that runs
    the step (a parallel branch's, for a branch step): meters must be
    thread-safe. This base class measures nothing.
    """

    def begin(self, ctx: Context, step_id: str, step: DeclaredStep) -> StepGauge:
        return _NOTHING


_NOTHING = StepGauge()


class HeldStep(Protocol):
    """The body's last step, its record held back to go with the run's
    status (``everystep.last_step.HeldRecord``)."""

    def flush(self, ex: Execution) -> Any: ...

    def commit(self, ex: Execution, status: Outcome, result_json: str | None) -> bool: ...


class FaultHooks(Protocol):
    """Where the test hook ``fault`` is read from, live, at each crash
    point (``everystep.runner``, whose ``fault`` tests set)."""

    fault: Callable[[Context, str], None] | None


class SignalFlag:
    """A flag a signal handler may set: no lock, unlike ``threading.Event``,
    so setting it from a handler can never deadlock the thread it interrupts."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


@dataclass(eq=False)
class Execution:
    """State shared by every scope of one execution of one run."""

    run: Run
    store: Store
    claimer: str
    outcomes: Outcomes
    observer: Observer
    draining: Flag | None = None
    #: check-deploy: replay recorded steps only, stop before the first unrecorded one.
    dry_run: bool = False
    #: Measures (and may bound) each step executed (``everystep.resources``);
    #: None: nothing measured.
    meter: StepMeter | None = None
    interrupt: BaseException | None = None
    #: Set once a scope waits (a durable sleep, a retry's backoff): the
    #: earliest time any of them wakes. The run is released until then once
    #: every scope has settled or waits too.
    wake_at: dt.datetime | None = None
    #: What the waiting scopes wait for besides the clock (``message:<topic>``,
    #: ``child:<run id>``): the release records it, and a send or a child's
    #: end makes the run due at once.
    wait_keys: set[str] = field(default_factory=set)
    #: Steps being started now, with their attempt (read by observers in
    #: ``step_started``: the supervisor's child tells its parent what a
    #: timeout of that attempt leads to).
    starting: dict[str, StepAttempt] = field(default_factory=dict)
    #: The code of the workflow body, once it runs: a step called from it
    #: in tail position is the run's last act (``runner.HeldRecord``).
    body_code: CodeType | None = None
    #: The frame code that calls the body (the runner's ``execute``): a step
    #: whose caller's caller is it is called from the body's own top level.
    body_caller: CodeType | None = None
    #: The record of the body's last step, held back to be written with the
    #: run's terminal status in one transaction.
    held: HeldStep | None = None
    #: Where the ``fault`` test hook is read (None: no crash points, as in
    #: a dry replay).
    hooks: FaultHooks | None = None
    #: Patch markers decided and not yet written: they go with the next
    #: write of this execution, in its transaction (``everystep.patches``).
    markers: list[Marker] = field(default_factory=list)
    #: A dry replay only: the patches the body asked about, and how
    #: (``patched`` or ``deprecated``), for ``check-deploy``'s advice.
    patch_calls: dict[str, str] = field(default_factory=dict)
    #: A dry replay only: told of each step as it is matched (``everystep replay``).
    replay_log: ReplayLog | None = None
    #: Steps whose code wrote to a stream in this execution: the first such
    #: write withdrew what earlier executions of that step wrote
    #: (``everystep.streams``).
    streamed: set[str] = field(default_factory=set)
    #: This execution's id on the stream rows its steps' code writes: when
    #: it began, in nanoseconds (a claim epoch would not do: a supervisor
    #: hands a run whose child died to the next child under the same claim).
    attempt_id: int = field(default_factory=time.time_ns)
    #: The queue of values its steps' code wrote, and the thread committing
    #: them in batches (``everystep.stream_batches``); None until the first.
    stream_batches: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        #: Whether the run had records when this execution began: without
        #: any, every record is this execution's own, so none can lie past
        #: the point a scope has reached (``patches.went_past``).
        self.replaying = bool(self.outcomes)

    @property
    def claim(self) -> Claim:
        """This execution's fencing token: every write it makes carries it."""
        return self.run.claim_as(self.claimer)

    def interrupt_with(self, exc: BaseException) -> BaseException:
        """Remember ``exc`` as the run's interrupt unless a more severe one is
        already set; returns the interrupt now in force."""
        with self._lock:
            if self.interrupt is None or interrupt_rank(exc) < interrupt_rank(self.interrupt):
                self.interrupt = exc
            return self.interrupt

    def check_interrupt(self) -> None:
        if self.interrupt is not None:
            raise self.interrupt

    def take_markers(self) -> tuple[Marker, ...]:
        """The patch markers not yet written, handed to the write about to
        be made (and no longer held here)."""
        if not self.markers:
            return ()
        with self._lock:
            taken, self.markers = tuple(self.markers), []
        return taken

    def decide_marker(self, record: StepRecord, marker: Marker) -> StepRecord:
        """Keep ``record`` as the run's answer at its patch, and hold its
        ``marker`` for the next write (none in a dry run), unless a scope
        decided that patch first: then that answer, which stands."""
        with self._lock:
            first = self.outcomes.setdefault(record.step_id, record)
            if first is record and not self.dry_run:
                self.markers.append(marker)
        return first

    def give_back_markers(self, markers: tuple[Marker, ...]) -> None:
        """Markers a write did not take after all: the next write carries them."""
        if markers:
            with self._lock:
                self.markers[:0] = markers

    def wait_until(self, wake_at: dt.datetime, wait_key: str | None = None) -> None:
        """A scope waits until ``wake_at``: keep the earliest wake time;
        and for ``wait_key`` (a message's topic, a child's end), which may
        end the wait earlier (``everystep.waits``)."""
        with self._lock:
            if self.wake_at is None or wake_at < self.wake_at:
                self.wake_at = wake_at
            if wait_key is not None:
                self.wait_keys.add(wait_key)

    def fault_hook(self) -> Callable[[Context, str], None] | None:
        """The ``fault`` test hook in force now, if any."""
        return self.hooks.fault if self.hooks is not None else None

    def attempt_of(self, step_id: str) -> StepAttempt | None:
        """The attempt of step ``step_id``, while it is being started."""
        return self.starting.get(step_id)


@dataclass(frozen=True)
class StepAttempt:
    """Which attempt of a step is starting, and what a timeout of it means:
    ``retry_in`` seconds until the next attempt, or None (a timeout is final)."""

    attempt: int = 1
    retry_in: float | None = None


class Context:
    """The running scope: the whole body, or one branch of a parallel fork."""

    def __init__(self, execution: Execution, prefix: str = "") -> None:
        self.execution = execution
        self.prefix = prefix
        self._counter = itertools.count(1)
        self._used: set[str] = set()

    @property
    def workflow_id(self) -> str:
        return self.execution.run.id

    @property
    def workflow_name(self) -> str:
        return self.execution.run.name

    @property
    def run(self) -> Run:
        return self.execution.run

    @property
    def outcomes(self) -> Mapping[str, StepRecord]:
        """Read-only view of recorded outcomes by step id, updated as steps
        complete (a parallel sibling's results appear as they land)."""
        return MappingProxyType(self.execution.outcomes)

    def next_id(self, name: str | None = None) -> str:
        """Allocate the id of the next step (or fork) in this scope."""
        position = next(self._counter)
        segment = str(position) if name is None else validate_name(name)
        step_id = f"{self.prefix}{segment}"
        if len(step_id) > MAX_STEP_ID_LENGTH:
            raise EverystepError(
                f"step id {step_id[:60]!r}… would be {len(step_id)} characters long; "
                f"the limit is {MAX_STEP_ID_LENGTH}"
            )
        if step_id in self._used:
            raise EverystepError(
                f"everystep_id {segment!r} is already used in this scope (step id {step_id!r}); "
                "names must be unique per body or branch"
            )
        self._used.add(step_id)
        return step_id

    def allocated(self, step_id: str) -> bool:
        """Whether this scope has handed out ``step_id`` in this execution."""
        return step_id in self._used

    def branch(self, fork_id: str, index: int) -> Context:
        return Context(self.execution, prefix=f"{fork_id}.{index}.")


def step_sort_key(step_id: str) -> tuple[tuple[int, int, str], ...]:
    """Natural order of step ids: "2.0.1" before "2.1.1" before "10",
    positions by number, names after positions in their scope."""
    return tuple((0, int(segment), "") if segment.isdigit() else (1, 0, segment)
                 for segment in step_id.split("."))


def validate_name(name: Any) -> str:
    """A step or fork name: letters, digits and ``_:@+-``, not all digits
    (an all-digit name would collide with positional ids), no dots."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name.isdigit():
        raise EverystepError(
            f"invalid everystep_id {name!r}: use letters, digits and _ : @ + - "
            "(no dots, not only digits)"
        )
    return name


#: The running scope of this thread or task (``current()``): set by whatever
#: runs a body or a branch of it, reset when it ends.
SCOPE: contextvars.ContextVar[Context | None] = contextvars.ContextVar("everystep_context", default=None)
#: The id of the step whose own function runs now (None outside one): step
#: calls made there are plain calls, and a stream write made there is part
#: of that step's attempt (``everystep.streams``).
IN_STEP: contextvars.ContextVar[str | None] = contextvars.ContextVar("everystep_in_step", default=None)


def current() -> Context | None:
    """The running workflow's Context, or ``None`` outside a workflow.

    Inside a step's own code it is the context of the step's scope, so the
    step can read ``outcomes``; step calls made from there are plain calls.
    """
    return SCOPE.get()


def recording_context() -> Context | None:
    """The Context a step call should record in: none outside a workflow or
    inside another step."""
    if IN_STEP.get():
        return None
    return SCOPE.get()
