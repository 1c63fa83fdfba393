"""Claims: oldest first, only registered workflows, disjoint sets across
concurrent connections, and catchup of runs parked under my name."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from everystep import registry, schedule, workflow
from everystep.models import COMPLETED, RUNNING, SCHEDULED
from everystep.store import connect
from tests.support.runs import claim_run, execute_run

# The engine's own statements: also through PgBouncer in transaction mode.
pytestmark = pytest.mark.pooled


@workflow
def job(index: int) -> int:
    return index


@workflow
def other_job(index: int) -> int:
    return -index


def test_claim_marks_runs_running_under_the_claimer(store: Any) -> None:
    run = schedule(job, 1, database=store)
    (claimed,) = store.claim("worker-a", 5, [job.name])
    assert claimed.id == run.id
    assert claimed.status == RUNNING and claimed.claimed_by == "worker-a" and claimed.claimed_at is not None
    stored = store.get_run(run.id)
    assert stored.status == RUNNING and stored.claimed_by == "worker-a"
    assert store.claim("worker-b", 5, [job.name]) == []


def test_claims_take_the_oldest_first_and_respect_the_limit(store: Any) -> None:
    runs = [schedule(job, index, database=store) for index in range(6)]
    first = store.claim("w", 2, [job.name])
    assert [run.id for run in first] == [runs[0].id, runs[1].id]
    second = store.claim("w", 3, [job.name])
    assert [run.id for run in second] == [runs[2].id, runs[3].id, runs[4].id]
    assert [run.id for run in store.claim("w", 10, [job.name])] == [runs[5].id]


def test_requeued_runs_keep_their_place_in_line(store: Any) -> None:
    runs = [schedule(job, index, database=store) for index in range(3)]
    (oldest,) = store.claim("w", 1, [job.name])
    assert oldest.id == runs[0].id
    assert store.requeue(store.get_run(oldest.id).claim_as("w"))
    assert [run.id for run in store.claim("w", 1, [job.name])] == [runs[0].id]


def test_the_first_claim_is_kept_when_the_run_is_claimed_again(store: Any) -> None:
    run = schedule(job, 1, database=store)
    assert store.get_run(run.id).first_claimed_at is None
    store.claim("w", 1, [job.name])
    first = store.get_run(run.id)
    assert first.first_claimed_at is not None and first.first_claimed_at == first.claimed_at
    assert first.first_claimed_at >= first.created_at
    assert store.requeue(first.claim_as("w"))
    assert store.get_run(run.id).first_claimed_at == first.first_claimed_at
    store.claim("w", 1, [job.name])
    again = store.get_run(run.id)
    assert again.claim_epoch == first.claim_epoch + 1 and again.first_claimed_at == first.first_claimed_at
    assert again.to_dict()["first_claimed_at"] == first.first_claimed_at.isoformat()


def test_only_registered_workflow_names_are_claimed(store: Any) -> None:
    unknown = schedule("tests.test_claims.not_deployed_here", 1, database=store)
    mine = schedule(job, 2, database=store)
    names = registry.workflow_names()
    assert unknown.name not in names
    claimed = store.claim("w", 10, names)
    assert [run.id for run in claimed] == [mine.id]
    assert store.get_run(unknown.id).status == SCHEDULED
    assert store.claim("w", 10, []) == []
    assert store.claim("w", 0, names) == []


def test_claims_filter_by_the_names_given(store: Any) -> None:
    a = schedule(job, 1, database=store)
    b = schedule(other_job, 1, database=store)
    assert [run.id for run in store.claim("w", 10, [other_job.name])] == [b.id]
    assert [run.id for run in store.claim("w", 10, [job.name, other_job.name])] == [a.id]


def test_claims_ignore_runs_that_are_not_scheduled(store: Any) -> None:
    done = schedule(job, 1, database=store)
    assert execute_run(store, done.id) == COMPLETED
    running = schedule(job, 2, database=store)
    claim_run(store, running.id, "someone")
    assert store.claim("w", 10, [job.name]) == []


@pytest.mark.timeout(180)
def test_three_concurrent_connections_claim_disjoint_sets(db_url: str) -> None:
    setup = connect(db_url)
    expected = {schedule(job, index, database=setup).id for index in range(45)}
    stores = [connect(db_url) for _ in range(3)]
    barrier = threading.Barrier(3)
    taken: dict[str, list[str]] = {f"claimer-{index}": [] for index in range(3)}
    errors: list[BaseException] = []

    def claim_until_empty(index: int) -> None:
        name = f"claimer-{index}"
        try:
            barrier.wait(30)
            while True:
                batch = stores[index].claim(name, 2, [job.name])
                if not batch:
                    return
                taken[name].extend(run.id for run in batch)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=claim_until_empty, args=(index,)) for index in range(3)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        claimed = [run_id for ids in taken.values() for run_id in ids]
        assert len(claimed) == len(set(claimed)) == 45
        assert set(claimed) == expected
        for name, ids in taken.items():
            for run_id in ids:
                run = setup.get_run(run_id)
                assert run.status == RUNNING and run.claimed_by == name
    finally:
        for store in [setup, *stores]:
            store.close()


def test_claim_batches_are_disjoint_between_open_transactions(pg_url: str) -> None:
    """A claimer holding its batch's row locks (mid-transaction) does not
    block the next claimer, which skips the locked rows (SKIP LOCKED)."""
    first = connect(pg_url)
    second = connect(pg_url)
    try:
        runs = [schedule(job, index, database=first) for index in range(4)]
        with first.connection() as conn, conn.transaction():
            locked = conn.execute(
                "SELECT id FROM everystep_workflow WHERE status = 'scheduled' ORDER BY created_at LIMIT 2 FOR UPDATE"
            ).fetchall()
            assert [str(row["id"]) for row in locked] == [runs[0].id, runs[1].id]
            claimed = second.claim("other", 10, [job.name])
            assert [run.id for run in claimed] == [runs[2].id, runs[3].id]
    finally:
        first.close()
        second.close()


# -- catchup ------------------------------------------------------------------------


def test_claim_own_returns_runs_parked_under_my_name(store: Any) -> None:
    mine = [schedule(job, index, database=store) for index in range(3)]
    theirs = schedule(job, 9, database=store)
    unrelated = schedule(other_job, 9, database=store)
    for run in mine:
        claim_run(store, run.id, "worker-1")
    claim_run(store, theirs.id, "worker-2")
    claim_run(store, unrelated.id, "worker-1")
    found = store.claim_own("worker-1", 10, [job.name])
    assert [run.id for run in found] == [run.id for run in mine]
    assert all(run.status == RUNNING and run.claimed_by == "worker-1" for run in found)
    assert [run.id for run in store.claim_own("worker-1", 2, [job.name])] == [mine[0].id, mine[1].id]
    assert [run.id for run in store.claim_own("worker-1", 10, [job.name], exclude=[mine[1].id])] == [
        mine[0].id, mine[2].id,
    ]
    assert store.claim_own("worker-3", 10, [job.name]) == []
    assert store.claim_own("worker-1", 0, [job.name]) == []
    assert store.claim_own("worker-1", 10, []) == []


def test_claim_own_ignores_finished_and_requeued_runs(store: Any) -> None:
    finished = schedule(job, 1, database=store)
    assert execute_run(store, finished.id, claimer="worker-1") == COMPLETED
    requeued = schedule(job, 2, database=store)
    claim_run(store, requeued.id, "worker-1")
    assert store.requeue(store.get_run(requeued.id).claim_as("worker-1"))
    assert store.claim_own("worker-1", 10, [job.name]) == []


def test_catchup_resumes_a_run_under_the_same_name(store: Any) -> None:
    run = schedule(job, 7, database=store)
    claim_run(store, run.id, "worker-1")  # then the process died
    (parked,) = store.claim_own("worker-1", 10, [job.name])
    from everystep import runner

    assert runner.execute(store, parked, claimer="worker-1") == COMPLETED
    assert store.get_run(run.id).result == 7
    assert store.claim_own("worker-1", 10, [job.name]) == []


def test_queue_stats_and_counts(store: Any) -> None:
    for index in range(3):
        schedule(job, index, database=store)
    claim_run(store, store.list_runs(limit=10)[-1].id, "w")
    stats = store.queue_stats()
    assert stats["pending"] == 2 and stats["running"] == 1 and stats["blocked"] == 0
    assert stats["oldest_pending_age_seconds"] >= 0
    assert store.count_scheduled([job.name]) == 2
    assert store.count_scheduled([other_job.name]) == 0


def test_a_claim_says_whether_the_run_has_recorded_steps(store: Any) -> None:
    """The runner reads a run's steps only when it has some: most claims are
    of fresh runs, and their read would find nothing."""
    from everystep.models import STEP_DONE, Claim
    from everystep.store.base.values import NewStep, utcnow

    run = schedule(job, 1, database=store)
    (fresh,) = store.claim("w", 1, [job.name])
    assert fresh.has_steps is False
    claim = Claim(run_id=run.id, claimer="w", epoch=fresh.claim_epoch)
    step = NewStep("1", "tests.step", "[]", "{}", utcnow(), status=STEP_DONE, result_json="1")
    assert store.record_step(claim, step).ours
    assert store.requeue(claim)
    (again,) = store.claim("w", 1, [job.name])
    assert again.id == run.id and again.has_steps is True
