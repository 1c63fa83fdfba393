"""Named queues and their flow control: the vocabulary and its validation.

Every run belongs to one queue (``default`` unless its workflow or its
``schedule()`` names another), carries a priority (a larger number is
claimed first within its queue, then the oldest due run) and may carry a
concurrency key (a customer, an account: whatever must not run twice at
once). A queue may be limited, and the limits live in the database, so every
supervisor and worker on every host respects them together:

- ``concurrency``: at most this many of its runs ``running`` at any moment;
- ``key_concurrency``: at most this many per concurrency key;
- a rate: at most ``rate_limit`` claims in any window of ``rate_period``
  seconds;
- ``paused``: nothing is claimed from it (running runs go on).

Sleeping and retry-waiting runs are ``scheduled``, so they count against no
limit. The claim statement itself enforces all of it, atomically (see the
claim in ``store/queries/<backend>.sql`` and migration 0007): on PostgreSQL
and MariaDB under the queue row's lock, taken ``SKIP LOCKED`` so a claimer
never waits on a busy queue but serves the others; on SQLite under the write
lock every claim takes. Queues are served fairly: each claim gives every served queue
a share of its batch, in a random order, so a full queue or one at its limit
never stalls the others.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from .errors import EverystepError

DEFAULT_QUEUE = "default"
MAX_QUEUE_NAME = 100
MAX_KEY = 300
#: Priorities are 32-bit integers in the database.
PRIORITY_RANGE = (-(2**31), 2**31 - 1)

_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def queue_name(value: Any, what: str = "queue") -> str:
    """A valid queue name, or ``EverystepError`` saying why not."""
    if not isinstance(value, str):
        raise EverystepError(f"{what} must be a string, not {value!r}")
    if not value:
        raise EverystepError(f"{what} name must not be empty")
    if len(value) > MAX_QUEUE_NAME or not _NAME.fullmatch(value):
        raise EverystepError(f"bad {what} name {value[:40]!r}: use up to {MAX_QUEUE_NAME} letters, digits "
                             "and _ . : -")
    return value


def parse_queue_list(text: str, option: str = "--queues") -> list[str]:
    """``a,b`` → ``["a", "b"]``; empty names and bad characters refused."""
    names = [part.strip() for part in text.split(",")]
    if any(not name for name in names):
        raise EverystepError(f"{option} {text!r} has an empty queue name (give NAME[,NAME])")
    for name in names:
        queue_name(name, f"{option} queue")
    return list(dict.fromkeys(names))


def priority_value(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not PRIORITY_RANGE[0] <= value <= PRIORITY_RANGE[1]:
        raise EverystepError(f"priority must be an integer between {PRIORITY_RANGE[0]} and {PRIORITY_RANGE[1]}, "
                             f"not {value!r}")
    return value


def concurrency_key_value(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_KEY:
        raise EverystepError(f"concurrency_key must be a non-empty string of up to {MAX_KEY} characters, "
                             f"not {value!r}")
    return value


def parse_rate(text: str) -> tuple[int, float]:
    """``100/60s`` → (100, 60.0); ``10/s``, ``5/2m``, ``1/500ms`` too."""
    match = _RATE.match(text)
    if not match:
        raise EverystepError(f"--rate {text!r} is not COUNT/PERIOD (e.g. 100/60s, 10/s, 5/2m)")
    count = int(match[1])
    period = float(match[2] or 1) * _UNIT_SECONDS[match[3] or "s"]
    if count < 1 or not math.isfinite(period) or period <= 0:
        raise EverystepError(f"--rate {text!r}: the count must be 1 or more and the period more than 0")
    return count, period


def format_rate(limit: int | None, period: float | None) -> str:
    if limit is None or period is None:
        return ""
    return f"{limit}/{period:g}s"


@dataclass(frozen=True)
class Placement:
    """Where a new run goes: its queue, priority and concurrency key."""

    queue: str = DEFAULT_QUEUE
    priority: int = 0
    concurrency_key: str | None = None

    @classmethod
    def of(cls, queue: Any = None, priority: Any = None, concurrency_key: Any = None,
           defaults: Placement | None = None) -> Placement:
        """Validated; ``None`` takes the value from ``defaults`` (the
        workflow's own), else the default."""
        base = defaults or cls()
        return cls(
            queue=queue_name(queue) if queue is not None else base.queue,
            priority=priority_value(priority) if priority is not None else base.priority,
            concurrency_key=concurrency_key_value(concurrency_key),
        )


@dataclass(frozen=True)
class QueueSettings:
    """A queue's row of ``everystep_queue`` (``None``: no such limit)."""

    name: str
    concurrency: int | None = None
    key_concurrency: int | None = None
    rate_limit: int | None = None
    rate_period: float | None = None
    paused: bool = False

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.key_concurrency is not None or self.rate_limit is not None


@dataclass(frozen=True)
class QueueInfo:
    """One line of ``everystep queues``: settings and counts."""

    settings: QueueSettings
    pending: int = 0
    waiting: int = 0
    running: int = 0
    blocked: int = 0
    oldest_pending_age_seconds: float = 0.0

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def scheduled(self) -> int:
        return self.pending + self.waiting

    def to_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            "queue": s.name, "scheduled": self.scheduled, "pending": self.pending, "waiting": self.waiting,
            "running": self.running, "blocked": self.blocked, "concurrency": s.concurrency,
            "key_concurrency": s.key_concurrency, "rate_limit": s.rate_limit, "rate_period": s.rate_period,
            "paused": s.paused, "oldest_pending_age_seconds": round(self.oldest_pending_age_seconds, 3),
        }


__all__ = [
    "DEFAULT_QUEUE", "Placement", "QueueInfo", "QueueSettings", "concurrency_key_value", "format_rate",
    "parse_queue_list", "parse_rate", "priority_value", "queue_name",
]
