"""The values the store takes and returns, and the helpers every concern shares.

Plain data and pure functions: no connection, no SQL. ``LOST`` and
``StepWrite`` are what a fenced write answers; ``ClaimState`` is where a run
stands for the holder of a claim; run ids are UUIDv7 and checked once
before any statement names one.
"""

from __future__ import annotations

import abc
import datetime as dt
import functools
import os
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple

from ...errors import RunNotFound
from ...models import STEP_STARTED, Claim, RunStatus, StepRecord

LOST = None
"""Returned by step writes when this claim is no longer the run's current one."""

MIN_UUID = "00000000-0000-0000-0000-000000000000"
MAX_UUID = "ffffffff-ffff-ffff-ffff-ffffffffffff"


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


class Marker(NamedTuple):
    """A patch marker as an executor writes it (``everystep.patches``): a
    ``done`` step row whose result says which branch the run took. Written
    only with another write of the execution, in its transaction."""

    step_id: str
    name: str
    args_json: str
    result_json: str


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


_ID_PREFIX = re.compile(r"[0-9a-f-]{1,36}")


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


def checked_run_id(run_id: str) -> str:
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


def float_or_none(value: Any) -> float | None:
    return float(value) if value is not None else None


def int_or_none(value: Any) -> int | None:
    return int(value) if value is not None else None
