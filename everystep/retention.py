"""Retention: delete finished runs, and their steps, older than a cutoff.

Users keep millions of finished runs; claims never read them (they walk a
partial index of scheduled runs), but tables, indexes, backups and vacuum
grow with them. ``prune`` deletes them in bounded batches, each its own
short transaction, so it can run beside busy supervisors: a batch holds the
row locks of at most ``batch`` finished runs, which no runner is writing,
for a fraction of a second, and skips any run an operator command holds.

What may be deleted is ``models.PRUNABLE_STATUSES``; scheduled, running and
blocked runs are never touched, which the statements themselves enforce.
Crash window: none that matters. A batch is atomic (a run and its steps go
together); stopping between batches leaves fewer runs to prune next time.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .errors import EverystepError
from .models import PRUNABLE_STATUSES, RUN_STATUSES
from .store import Store, utcnow

DEFAULT_BATCH = 10_000
MAX_BATCH = 1_000_000
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")


def parse_duration(text: str) -> dt.timedelta:
    """``90s``, ``10m``, ``2h``, ``30d`` → a timedelta (a unit is required,
    so ``30`` cannot be read as seconds by one operator and days by another)."""
    match = _DURATION.match(text or "")
    if not match:
        raise EverystepError(f"bad duration {text!r}: use a whole number and a unit, e.g. 90s, 10m, 2h, 30d")
    return dt.timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def parse_statuses(text: str) -> tuple[str, ...]:
    """A comma-separated list of prunable statuses, validated."""
    statuses = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not statuses:
        raise EverystepError("--status needs at least one status")
    for status in statuses:
        if status in PRUNABLE_STATUSES:
            continue
        allowed = ", ".join(PRUNABLE_STATUSES)
        if status in RUN_STATUSES:
            raise EverystepError(f"{status} runs are never pruned (only finished runs are: {allowed})")
        raise EverystepError(f"unknown status {status!r}; prunable statuses: {allowed}")
    return statuses


@dataclass
class PruneReport:
    runs: int = 0
    steps: int = 0
    batches: int = 0
    seconds: float = 0.0


def prune(
    store: Store,
    older_than: dt.timedelta,
    statuses: Sequence[str] = PRUNABLE_STATUSES,
    batch: int = DEFAULT_BATCH,
    progress: Callable[[PruneReport], None] | None = None,
) -> PruneReport:
    """Delete runs finished more than ``older_than`` ago, ``batch`` at a time,
    until none is left; ``progress`` is called after every batch."""
    statuses = parse_statuses(",".join(statuses))
    if not 1 <= batch <= MAX_BATCH:
        raise EverystepError(f"--batch must be between 1 and {MAX_BATCH:,}")
    cutoff = utcnow() - older_than
    report = PruneReport()
    started = time.monotonic()
    while True:
        runs, steps = store.prune_batch(cutoff, statuses, batch)
        if runs == 0:
            break
        report.runs += runs
        report.steps += steps
        report.batches += 1
        report.seconds = time.monotonic() - started
        if progress is not None:
            progress(report)
    report.seconds = time.monotonic() - started
    return report


def count(store: Store, older_than: dt.timedelta, statuses: Sequence[str] = PRUNABLE_STATUSES) -> tuple[int, int]:
    """(runs, steps) that ``prune`` would delete now."""
    return store.count_prunable(utcnow() - older_than, parse_statuses(",".join(statuses)))
