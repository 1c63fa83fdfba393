"""When a run becomes claimable, on both backends: a delayed start
(``delay=``, ``run_at=``) is claimed only from its time, due runs are
claimed earliest due first, bad delays are refused before anything is
written, and the claim follows the due-time index past a large backlog
of sleeping runs (PostgreSQL's index statistics, SQLite's query plan).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import psycopg
import pytest

from everystep import EverystepError, schedule
from everystep.models import SCHEDULED
from everystep.store import Store, connect, utcnow
from tests.apps.lifecycle_in_process import sleeps

UTC = dt.timezone.utc

# -- delayed start ------------------------------------------------------------------------------


def test_a_delayed_run_is_claimable_only_from_its_time(store: Store) -> None:
    later = schedule(sleeps, 0, database=store, delay=3600)
    at = schedule(sleeps, 0, database=store, run_at=dt.datetime(2099, 1, 1, tzinfo=UTC))
    due = schedule(sleeps, 0, database=store, run_at=utcnow() - dt.timedelta(seconds=5))
    assert later.not_before - later.created_at >= dt.timedelta(seconds=3599)
    claimed = store.claim("tester", 10, [sleeps.name])
    assert [run.id for run in claimed] == [due.id]
    assert 3500 < (store.next_due([sleeps.name]) or 0) <= 3600.01  # float seconds: allow a rounding
    assert {store.get_run(r.id).status for r in (later, at)} == {SCHEDULED}


def test_due_runs_are_claimed_earliest_due_first(store: Store) -> None:
    now = utcnow()
    newer_but_due_first = schedule(sleeps, 0, database=store, run_at=now - dt.timedelta(minutes=10))
    plain_run = schedule(sleeps, 0, database=store)
    claimed = store.claim("tester", 10, [sleeps.name])
    assert [run.id for run in claimed][:2] == [newer_but_due_first.id, plain_run.id] or \
        sorted(run.id for run in claimed) == sorted([newer_but_due_first.id, plain_run.id])
    assert claimed[0].id == newer_but_due_first.id


@pytest.mark.parametrize("options, message", [
    ({"run_at": dt.datetime(2030, 1, 1)}, "aware datetime"),
    ({"delay": -5}, "finite number of seconds"),
    ({"delay": 5, "run_at": dt.datetime(2030, 1, 1, tzinfo=UTC)}, "not both"),
])
def test_bad_delays_are_refused_before_anything_is_written(store: Store, options: dict[str, Any],
                                                           message: str) -> None:
    with pytest.raises(EverystepError, match=message):
        schedule(sleeps, 0, database=store, **options)
    assert store.list_runs() == []


@pytest.mark.timeout(300)
def test_the_claim_reads_only_due_runs_past_100000_sleeping_ones(pg_url: str) -> None:
    """100,000 runs sleep for a day ahead of five due ones in the claim's
    index: a claim reads the due index entries and stops at the first run
    that is not due (index entries read, from the server's statistics)."""
    store = connect(pg_url)
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO everystep_workflow (id, name, args, status, created_at, not_before) "
                "SELECT gen_random_uuid(), %s, '[0]', 'scheduled', clock_timestamp() - interval '1 hour', "
                "clock_timestamp() + interval '1 day' FROM generate_series(1, 100000)", (sleeps.name,))
            conn.execute("ANALYZE everystep_workflow")
        due = [schedule(sleeps, 0, database=store).id for _ in range(5)]

        def entries_read() -> int:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("SELECT pg_stat_force_next_flush()")
                row = conn.execute("SELECT idx_tup_read FROM pg_stat_user_indexes "
                                   "WHERE indexrelname = 'everystep_workflow_claimable'").fetchone()
                return int(row[0])

        store.claim("warm", 0, [sleeps.name])
        before = entries_read()
        claimed = store.claim("tester", 10, [sleeps.name])
        store.close()
        after = entries_read()
        assert sorted(run.id for run in claimed) == sorted(due)
        assert after - before <= len(due) + 2, after - before
        before = entries_read()
        assert store.next_due([sleeps.name]) is not None
        store.close()
        # The five claimed runs' entries stay in the index until vacuum.
        assert entries_read() - before <= len(due) + 2
    finally:
        store.close()


def test_sqlite_claims_along_the_due_time_index(tmp_path: Path) -> None:
    store = connect(f"sqlite:///{tmp_path / 'plan.db'}")
    try:
        with store.connection() as conn:
            plan = " ".join(str(tuple(row)) for row in conn.execute(
                "EXPLAIN QUERY PLAN " + store.sql["claim"],
                store._params(claimer="x", limit=10, names='["a"]', queue="default", priority=0, versions=None)).fetchall())
        assert "everystep_workflow_claimable" in plan, plan
    finally:
        store.close()
