"""A big application, as the supervisor meets it in production: at import
it builds ``EVERYSTEP_BENCH_HEAP_MB`` MiB of Python objects (default 270:
model tables and caches, as a Django or data app holds), and its one task
allocates and drops garbage the way request-sized work does.

Imported by every system case 17 compares (``--app bench.bigapp`` for
everystep, ``bench.peer_celery`` for Celery, ``bench.mp_pool`` for a bare
``multiprocessing`` pool), so each forks its workers from a parent holding
the same heap and runs the same function in them.

``HEAP_BYTES`` is what the import added to the process's resident memory:
the app's heap, the yardstick of case 17's targets.
"""

from __future__ import annotations

import collections
import os

import psutil

from everystep import step, workflow

HEAP_MB_ENV = "EVERYSTEP_BENCH_HEAP_MB"
DEFAULT_HEAP_MB = 270
#: Per run: cyclic garbage made and dropped (pairs of dicts), and objects
#: kept in a bounded per-process cache (they survive to the oldest
#: generation, so full collections come as they do in a long-lived worker).
GARBAGE_PAIRS = 20_000
KEPT_PER_RUN = 10_000
CACHE_SIZE = 100_000
ROWS_PER_CHUNK = 10_000


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _build(megabytes: float) -> list[list[dict[str, object]]]:
    """Tables of rows, one chunk at a time, until the process grew by ``megabytes``."""
    start, target = _rss(), int(megabytes * 1024 * 1024)
    tables: list[list[dict[str, object]]] = []
    serial = 0
    while _rss() - start < target:
        chunk = []
        for _ in range(ROWS_PER_CHUNK):
            serial += 1
            chunk.append({"id": serial, "name": f"item-{serial}", "price": serial * 0.01,
                          "tags": (f"t{serial % 97}", f"g{serial % 13}"), "attrs": {"rank": serial % 1000}})
        tables.append(chunk)
    return tables


_before = _rss()
TABLES = _build(float(os.environ.get(HEAP_MB_ENV, DEFAULT_HEAP_MB)))
ROWS = sum(len(chunk) for chunk in TABLES)
HEAP_BYTES = _rss() - _before
_cache: collections.deque[list[int]] = collections.deque(maxlen=CACHE_SIZE)


def churn(seed: int) -> dict[str, int]:
    """The task: read a few rows, make and drop cyclic garbage, keep some
    objects in the cache; returns who ran it and the app's heap."""
    total = 0
    for offset in range(100):
        row = TABLES[(seed + offset) % len(TABLES)][offset]
        total += int(row["id"])  # type: ignore[call-overload]
    for _ in range(GARBAGE_PAIRS):
        a: dict[str, object] = {}
        b: dict[str, object] = {"a": a}
        a["b"] = b
    for index in range(KEPT_PER_RUN):
        _cache.append([seed, index])
    return {"pid": os.getpid(), "heap": HEAP_BYTES, "total": total}


@step
def churn_step(seed: int) -> dict[str, int]:
    return churn(seed)


@workflow(name="bench.bigapp.churn_flow")
def churn_flow(seed: int) -> dict[str, int]:
    return churn_step(seed)
