"""What a child costs in memory: the pages it owns, not the pages it maps.

A child is forked from a parent that imported the app, so most of its
resident pages are the app's, shared with the parent and every sibling
(``heap.py`` keeps them shared). RSS counts every resident page, shared or
not: each child of a 270 MB app shows 270 MB of RSS and the sum says the
machine holds ``procs`` copies. Two measures say what a child really costs,
both from the kernel's ``/proc/PID/smaps_rollup`` (``psutil``'s
``memory_full_info()``):

- **USS**, unique set size: the pages only this child holds; what is given
  back when it exits. ``--max-memory-per-child`` compares it, and it is
  what ``ctl status`` and the gauges show first.
- **PSS**, proportional set size: its own pages plus its share of each
  shared page (a page shared by 5 processes counts 1/5 in each). The PSS of
  every process of the tree adds up to what the tree holds.

RSS stays beside them. Where smaps cannot be read (no ``/proc``, another
user's process) USS and PSS are None and limits fall back to RSS.

Reading smaps walks the process's page tables (about 2 ms for a 350 MB
process), so ``MemorySampler`` reads it at most every ``every`` seconds per
process unless RSS, read fresh each time (``statm``), moved by more than
``RSS_SLACK`` since: an allocation shows at once, while the slow drift of
shared pages becoming private (a refcount written on a shared page) waits
for the next reading.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

#: Seconds between two smaps readings of one process whose RSS holds still.
FULL_EVERY = 5.0
#: An RSS this far from the last smaps reading's makes it stale at once.
RSS_SLACK = 4 << 20


@dataclass(frozen=True)
class Footprint:
    """A process's memory, in bytes."""

    rss: int
    uss: int | None = None
    pss: int | None = None

    @property
    def owned(self) -> int:
        """What the process owns: its USS where known, else its RSS."""
        return self.uss if self.uss is not None else self.rss


def measure(process: psutil.Process) -> Footprint:
    """RSS, USS and PSS now (raises ``psutil.Error`` if the process is gone)."""
    try:
        full = process.memory_full_info()
    except psutil.AccessDenied:
        return Footprint(rss=process.memory_info().rss)
    return Footprint(rss=full.rss, uss=full.uss, pss=getattr(full, "pss", None))


@dataclass
class MemorySampler:
    """A process's footprint: RSS every time, USS and PSS read again when
    ``every`` seconds passed or RSS moved by more than ``RSS_SLACK``."""

    every: float = FULL_EVERY
    last: Footprint | None = None
    _at: float | None = None

    def sample(self, process: psutil.Process, now: float | None = None) -> Footprint:
        """Raises ``psutil.Error`` if the process is gone."""
        now = time.monotonic() if now is None else now
        if self.last is not None and self._at is not None and now - self._at < self.every:
            rss = process.memory_info().rss
            if abs(rss - self.last.rss) <= RSS_SLACK:
                return Footprint(rss=rss, uss=self.last.uss, pss=self.last.pss)
        self.last, self._at = measure(process), now
        return self.last


__all__ = ["FULL_EVERY", "RSS_SLACK", "Footprint", "MemorySampler", "measure"]
