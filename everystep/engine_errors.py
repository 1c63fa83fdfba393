"""An engine statement the database refused: never a run's failure.

A run fails by its workflow's own doing only: a step's exception, a body
that raises, a transactional step's own SQL. When one of everystep's own
statements fails instead (a step's record, the run's status, reading its
steps) with an error of the database's (``StoreError``: a prepared
statement a connection pooler lost, a privilege revoked, a full disk
refusing one table, a bug), nothing is wrong with the run. So the runner
(the runner's settling and ``runner.guarded_failure``) gives it back:

- ``give_back`` writes the run back to ``scheduled``, not claimable for
  ``backoff(n)`` seconds (1 s, doubling up to 5 minutes), where ``n``
  counts its give-backs for such errors so far. The count travels with
  the run: its ``error`` column holds the last such error
  (``StoreError(message, kind, n)``) while it waits, read back at the next
  claim, so the backoff grows whichever runner claims it next; the run's
  end overwrites it. The write is fenced by the claim like every executor
  write; if the database refuses it too, the run stays claimed under the
  runner's name, where catch-up takes it again.
- The first give-back of a run is logged (WARNING, with the error); the
  next ones are not, however many processes meet them.
- Every such error is counted in ``everystep_engine_errors_total{kind}``
  (``kind``: the driver's name for it, ``UndefinedTable``…), where it
  is met: a run's give-back, or a runner's own activity (claiming,
  heartbeats), which ``OutageLog`` routes here rather than calling it an
  outage.
- ``EngineHealth`` keeps a runner's account: while ``FAILING_AFTER``
  errors or more happened in the last ``WINDOW`` seconds, ``/healthz``
  answers 503 and ``ctl status`` says so.

A database that cannot be reached is the other class (``StoreUnavailable``,
``recovery.py``): the run is requeued as soon as it is back, with no
backoff, since nothing is wrong with anyone.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import threading
import time

from . import metrics, serde
from .errors import EverystepError, StoreError, StoreUnavailable
from .models import Outcome, Run
from .store import Store, utcnow

logger = logging.getLogger("everystep")

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 300.0
#: A runner is unhealthy while this many engine errors happened in the last ``WINDOW`` seconds.
FAILING_AFTER = 3
WINDOW = 60.0


def backoff(given_back: int) -> float:
    """Seconds before a run given back for the ``given_back``-th time may run again."""
    return min(FIRST_BACKOFF * 2.0 ** max(given_back - 1, 0), MAX_BACKOFF)


def given_back_before(run: Run) -> int:
    """How many times ``run`` was given back for an engine error before this
    claim (its ``error`` holds the last one meanwhile)."""
    error = serde.decode_exception(run.error) if isinstance(run.error, dict) else None
    return error.given_back if isinstance(error, StoreError) else 0


def count(kind: str) -> None:
    metrics.record(lambda m: m.engine_errors.labels(kind or "unknown").inc())


def give_back(store: Store, run: Run, claimer: str, exc: StoreError) -> Outcome:
    """``run`` met ``exc`` in one of the engine's statements: back to the
    queue after its backoff (``deferred``); ``lost`` if the claim moved on;
    ``unfinished`` if the database became unreachable meanwhile."""
    count(exc.kind)
    times = given_back_before(run) + 1
    delay = backoff(times)
    if times == 1:
        logger.warning("everystep %s: run %s (%s): the database refused one of everystep's statements (%s); the "
                       "run goes back to the queue for %gs, then with a growing backoff while it recurs (logged "
                       "once per run, counted in everystep_engine_errors_total)", claimer, run.id, run.name, exc,
                       delay, extra={"run_id": run.id, "workflow": run.name, "event": "run_deferred"})
    error = serde.dumps(serde.encode_exception(StoreError(str(exc), exc.kind, times)), "run error")
    try:
        written = store.defer(run.claim_as(claimer), utcnow() + dt.timedelta(seconds=delay), error)
    except StoreUnavailable:
        return Outcome.UNFINISHED
    except EverystepError as refused:
        if isinstance(refused, StoreError):
            count(refused.kind)
        logger.error("everystep %s: run %s could not be given back either (%s); it stays claimed under this name, "
                     "where catch-up takes it again", claimer, run.id, refused,
                     extra={"run_id": run.id, "workflow": run.name, "event": "run_deferred"})
        return Outcome.DEFERRED
    return Outcome.DEFERRED if written else Outcome.LOST


class EngineHealth:
    """A runner's account of engine errors: its own statements' and its
    runs'. Thread-safe (the threaded worker's runs end on their threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._times: collections.deque[float] = collections.deque()
        self.total = 0
        self.last = ""

    def failed(self, what: str) -> bool:
        """Note one engine error (``what`` failed, in words); True if it is
        the first of a spell (none in the last ``WINDOW`` seconds)."""
        now = time.monotonic()
        with self._lock:
            self._forget(now)
            first = not self._times
            self._times.append(now)
            self.total += 1
            self.last = what
        return first

    def failing(self) -> str | None:
        """Why the runner is unhealthy, in one line; None while it is not."""
        now = time.monotonic()
        with self._lock:
            self._forget(now)
            if len(self._times) < FAILING_AFTER:
                return None
            return (f"everystep's statements keep failing: {len(self._times)} engine errors in the last "
                    f"{WINDOW:g} s (last: {self.last})")

    def _forget(self, now: float) -> None:
        while self._times and self._times[0] < now - WINDOW:
            self._times.popleft()


__all__ = ["EngineHealth", "FAILING_AFTER", "WINDOW", "backoff", "count", "give_back", "given_back_before"]
