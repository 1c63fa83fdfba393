"""An app with a big heap, built at import (``HEAP_MB`` MiB of rows: dicts,
tuples and strings, as model tables and caches are), and a GC-heavy
workflow: the supervisor-memory test (``tests/test_supervisor_memory.py``).

``HEAP_BYTES`` is what building the tables added to the process's
resident memory.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import psutil

from everystep import step, workflow

HEAP_MB = 80
ROWS_PER_CHUNK = 10_000


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _build(megabytes: int) -> tuple[list[list[dict[str, Any]]], int]:
    """The tables, and how much they grew the process (measured before a
    reload drops the tables they replace)."""
    start, target = _rss(), megabytes * 1024 * 1024
    tables: list[list[dict[str, Any]]] = []
    serial = 0
    while _rss() - start < target:
        chunk = []
        for _ in range(ROWS_PER_CHUNK):
            serial += 1
            chunk.append({"id": serial, "name": f"item-{serial}", "tags": (f"t{serial % 97}", f"g{serial}"),
                          "attrs": {"rank": serial % 1000}})
        tables.append(chunk)
    return tables, _rss() - start


TABLES, HEAP_BYTES = _build(HEAP_MB)


@step
def collect_hard(rounds: int) -> dict[str, Any]:
    """Cyclic garbage, then full collections, as a long-lived worker sees them."""
    collected = 0
    for _ in range(rounds):
        for _ in range(10_000):
            a: dict[str, Any] = {}
            a["self"] = a
        collected += gc.collect()
    return {"pid": os.getpid(), "heap": HEAP_BYTES, "collected": collected, "gc_enabled": gc.isenabled()}


@workflow
def gc_heavy(rounds: int) -> dict[str, Any]:
    return collect_hard(rounds)
