"""The console's counts per status: exact and bounded for active runs,
cached (and, on a large PostgreSQL table, estimated) for finished ones.
The thresholds are lowered so a few runs cross them."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from everystep import schedule
from everystep.models import BLOCKED, COMPLETED, FAILED, RUNNING, SCHEDULED, STOPPED, RunStatus
from everystep.web import counts as counting
from everystep.web.counts import StatusCounts
from tests.apps import shapes
from tests.support.runs import execute_run


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def by_status(result: list[Any]) -> dict[str, Any]:
    return {count.status: count for count in result}


def test_active_counts_are_exact_up_to_the_cap_then_cached(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counting, "ACTIVE_CAP", 3)
    clock = Clock()
    counts = StatusCounts(store, clock)
    for _ in range(2):
        schedule(shapes.linear, "x", database=store)
    first = by_status(counts.counts())
    assert (first[SCHEDULED].count, first[SCHEDULED].exact) == (2, True)
    for _ in range(3):
        schedule(shapes.linear, "x", database=store)
    over = by_status(counts.counts())
    assert (over[SCHEDULED].count, over[SCHEDULED].exact) == (5, False)  # counted in full, once
    schedule(shapes.linear, "x", database=store)
    assert by_status(counts.counts())[SCHEDULED].count == 5  # cached
    clock.now += counting.SLOW_TTL
    assert by_status(counts.counts())[SCHEDULED].count == 6
    assert by_status(counts.counts())[RUNNING].count == 0 and by_status(counts.counts())[BLOCKED].exact


def test_finished_counts_of_a_small_table_are_always_exact(store: Any) -> None:
    counts = StatusCounts(store, Clock())
    for label in ("x", "y"):
        run = schedule(shapes.linear, label, database=store)
        execute_run(store, run.id)
        assert by_status(counts.counts())[COMPLETED].count == (1 if label == "x" else 2)


def test_finished_counts_of_a_larger_table_are_cached(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counting, "SMALL_TABLE", 1)
    clock = Clock()
    counts = StatusCounts(store, clock)
    run = schedule(shapes.linear, "x", database=store)
    execute_run(store, run.id)
    assert by_status(counts.counts())[COMPLETED].count == 1
    again = schedule(shapes.linear, "y", database=store)
    execute_run(store, again.id)
    cached = by_status(counts.counts())[COMPLETED]
    assert cached.count == 1 and cached.exact  # exact as of its age
    clock.now += 5
    assert by_status(counts.counts())[COMPLETED].age == 5
    counts.invalidate()
    assert by_status(counts.counts())[COMPLETED].count == 2
    assert {c.status for c in counts.counts()} == set(RunStatus)  # every status, counted or not


def test_large_postgres_tables_use_the_planner_statistics(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from everystep.store import connect

    store = connect(pg_url)
    try:
        counts = StatusCounts(store, Clock())
        for index in range(6):
            run = schedule(shapes.fanout if index % 3 == 0 else shapes.linear,
                           {"fail_on": ["right"]} if index % 3 == 0 else "x", database=store)
            execute_run(store, run.id)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("ANALYZE everystep_workflow")
        assert store.estimate_statuses() is not None
        monkeypatch.setattr(counting, "EXACT_BELOW", 5)
        estimated = by_status(counts.counts())
        assert (estimated[COMPLETED].count, estimated[COMPLETED].exact) == (4, False)
        assert (estimated[FAILED].count, estimated[FAILED].exact) == (2, False)
        assert estimated[STOPPED].count == 0
        monkeypatch.setattr(counting, "EXACT_BELOW", 10**9)
        counts.invalidate()
        assert by_status(counts.counts())[COMPLETED].exact
    finally:
        store.close()


def test_sqlite_has_no_estimate(tmp_path: Any) -> None:
    from everystep.store import connect

    store = connect(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        assert store.estimate_statuses() is None
    finally:
        store.close()
