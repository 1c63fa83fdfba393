"""Retry policy of a step: whether a failed attempt is retried, and after
how long.

``@step(retries=3, backoff=1.0, backoff_max=300.0, jitter=True,
retry_on=(Exception,))``: after attempt k fails with an exception in
``retry_on``, attempt k+1 may start ``min(backoff_max, backoff * 2**(k-1))``
seconds later (with jitter, a uniformly drawn 50 % to 100 % of that), up to
``retries`` retries. The wait is not spent in a process or a thread: the
runner records the attempt, releases the run until the next attempt time and
any runner picks it up then (see ``runner``).

Some failures are never retried whatever ``retry_on`` says: a deliberate
stop (``Terminal``), an uncertain effect, a drain, an operator's kill or
cancel, a lost claim and the engine's own errors. A ``StepTimeout`` is
retried like any exception in ``retry_on``; the supervisor, which records
it, asks the policy at the step's start (``delay_after``).

Pure: the jitter's random source is a parameter, so every rule here is a
line in a table test.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import durations
from .errors import (
    Cancelled,
    ClaimLost,
    DrainOrphan,
    EffectUncertain,
    EverystepError,
    SimulatedCrash,
    StepKilled,
    StoreUnavailable,
    Terminal,
    WorkflowCodeError,
)

#: Never retried, whatever ``retry_on`` says.
NEVER_RETRIED: tuple[type[BaseException], ...] = (
    Terminal, EffectUncertain, DrainOrphan, StepKilled, Cancelled, ClaimLost, SimulatedCrash,
    StoreUnavailable, WorkflowCodeError,
)

#: The exponent is capped so a huge attempt number cannot overflow a float.
_MAX_DOUBLINGS = 60


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 0
    backoff: float = 1.0
    backoff_max: float = 300.0
    jitter: bool = True
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    @classmethod
    def build(cls, retries: Any, backoff: Any, backoff_max: Any, jitter: Any, retry_on: Any) -> RetryPolicy | None:
        """A validated policy (``EverystepError`` with one line for a bad
        argument), or None when ``retries`` is 0."""
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise EverystepError(f"retries must be a whole number of retries, 0 or more, not {retries!r}")
        backoff, backoff_max = durations.seconds(backoff, "backoff"), durations.seconds(backoff_max, "backoff_max")
        if isinstance(retry_on, type):
            retry_on = (retry_on,)
        if not isinstance(retry_on, tuple) or not retry_on or not all(
                isinstance(kind, type) and issubclass(kind, BaseException) for kind in retry_on):
            raise EverystepError(f"retry_on must be an exception class or a tuple of them, not {retry_on!r}")
        if retries == 0:
            return None
        return cls(retries, backoff, backoff_max, bool(jitter), retry_on)

    def retries_after(self, attempt: int, error: BaseException) -> bool:
        """Whether attempt ``attempt`` (1 for the first), failed with ``error``,
        is followed by another."""
        return (attempt <= self.retries and isinstance(error, self.retry_on)
                and not isinstance(error, NEVER_RETRIED))

    def wait(self, attempt: int, draw: Callable[[], float] = random.random) -> float:
        """Seconds between the failure of attempt ``attempt`` and the start
        of the next one."""
        base = min(self.backoff_max, self.backoff * 2.0 ** min(attempt - 1, _MAX_DOUBLINGS))
        return base * (0.5 + 0.5 * draw()) if self.jitter else base

    def delay_after(self, attempt: int, error: BaseException,
                    draw: Callable[[], float] = random.random) -> float | None:
        """``wait(attempt)`` if the failure is retried, else None."""
        return self.wait(attempt, draw) if self.retries_after(attempt, error) else None


__all__ = ["NEVER_RETRIED", "RetryPolicy"]
