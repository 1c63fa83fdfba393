"""Runner leases: heartbeats, recovery of a silent runner's runs (once), and a
stale runner that comes back unable to overwrite the new claimant's work."""

from __future__ import annotations

import json
import threading
import time

import pytest

from everystep import schedule, step, workflow
from everystep.errors import EverystepError
from everystep.lease import Lease
from everystep.models import COMPLETED, RUNNING, SCHEDULED, Outcome
from everystep.store import connect
from tests.support.cli import run_in_process
from tests.support.runs import execute_run, worker_running


@step
def lease_step(x):
    return x + 1


@workflow
def lease_flow(x):
    return lease_step(lease_step(x))


def _age(store, name, seconds):
    """Pretend ``name`` has been silent for ``seconds``."""
    with store.connection() as conn:
        if store.backend == "postgres":
            conn.execute(
                "UPDATE everystep_runner SET heartbeat_at = clock_timestamp() - %s * interval '1 second' "
                "WHERE name = %s", (seconds, name))
        elif store.backend == "mariadb":
            conn.execute("UPDATE everystep_runner SET heartbeat_at = heartbeat_at - INTERVAL %s SECOND "
                         "WHERE name = %s", (seconds, name))
        else:
            conn.execute("UPDATE everystep_runner SET heartbeat_epoch = heartbeat_epoch - ? WHERE name = ?",
                         (seconds, name))


def _claim_as(store, name, run_id):
    claimed = store.claim(name, 100, [lease_flow.name])
    assert [run.id for run in claimed] == [run_id]
    return claimed[0]


def test_register_heartbeat_and_list(store):
    lease = Lease(store, "alpha", "worker", lease=30)
    lease.register()
    assert store.heartbeat("alpha", lease.instance)
    [info] = store.list_runners()
    assert (info.name, info.kind, info.lease_seconds, info.expired) == ("alpha", "worker", 30.0, False)
    assert info.silent_seconds < 5
    lease.release()
    assert store.list_runners() == []


def test_silent_runner_runs_are_requeued_once(store):
    run = schedule(lease_flow, 1, database=store)
    dead = Lease(store, "dead", "supervisor", lease=5)
    dead.register()
    _claim_as(store, "dead", run.id)
    assert store.recover_expired("alive") == {}  # still within its lease
    _age(store, "dead", 60)
    assert store.recover_expired("alive") == {"dead": [run.id]}
    after = store.get_run(run.id)
    assert (after.status, after.claimed_by) == (SCHEDULED, None)
    assert store.recover_expired("alive") == {}
    assert [runner.name for runner in store.list_runners()] == []


def test_concurrent_sweepers_requeue_each_run_once(db_url):
    setup = connect(db_url)
    runs = [schedule(lease_flow, index, database=setup).id for index in range(5)]
    Lease(setup, "dead", "worker", lease=5).register()
    assert len(setup.claim("dead", 100, [lease_flow.name])) == 5
    _age(setup, "dead", 60)
    results: list[dict[str, list[str]]] = []
    barrier = threading.Barrier(6)

    def sweep(index: int) -> None:
        own = connect(db_url)
        barrier.wait()
        results.append(own.recover_expired(f"sweeper-{index}"))
        own.close()

    threads = [threading.Thread(target=sweep, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    recovered = [run_id for result in results for ids in result.values() for run_id in ids]
    assert sorted(recovered) == sorted(runs)
    assert all(setup.get_run(run_id).status == SCHEDULED for run_id in runs)
    setup.close()


def test_runner_that_lost_its_lease_cannot_overwrite_new_claimant(store):
    run = schedule(lease_flow, 10, database=store)
    stale = Lease(store, "stale", "worker", lease=5)
    stale.register()
    stale_run = _claim_as(store, "stale", run.id)
    _age(store, "stale", 60)
    assert store.recover_expired("fresh") == {"stale": [run.id]}
    _claim_as(store, "fresh", run.id)
    # The stale runner wakes up: its heartbeat is refused, so it knows.
    assert not store.heartbeat("stale", stale.instance)
    from everystep import runner

    assert runner.execute(store, stale_run, claimer="stale") == Outcome.LOST
    assert store.get_steps(run.id) == []
    assert store.get_run(run.id).claimed_by == "fresh"
    # Its tick re-registers it (lease lost, name not taken).
    stale.tick(time.monotonic() + 3600)
    assert not stale.lost_name
    assert store.heartbeat("stale", stale.instance)


def test_name_taken_over_by_another_instance_is_detected(store):
    first = Lease(store, "shared", "worker", lease=30)
    first.register()
    second = Lease(store, "shared", "worker", lease=30)
    second.register()
    first.tick(time.monotonic() + 3600)
    assert first.lost_name
    assert not second.lost_name
    first.release()  # must not delete the new holder's row
    assert [runner.name for runner in store.list_runners()] == ["shared"]


def test_lease_must_be_positive(store):
    with pytest.raises(EverystepError):
        Lease(store, "x", "worker", lease=0)


def test_worker_recovers_runs_of_a_dead_runner(store):
    from everystep.worker import Worker

    run = schedule(lease_flow, 5, database=store)
    Lease(store, "crashed", "worker", lease=1).register()
    _claim_as(store, "crashed", run.id)
    worker = Worker(pool_size=1, poll=0.05, name="survivor", database=store, lease=2)
    with worker_running(worker, join=30):
        deadline = time.monotonic() + 30
        while store.get_run(run.id).status != COMPLETED and time.monotonic() < deadline:
            time.sleep(0.05)
    done = store.get_run(run.id)
    assert (done.status, done.claimed_by, done.result) == (COMPLETED, "survivor", 7)


def test_runners_cli(db_url, subprocess_env, tmp_path):
    store = connect(db_url)
    # A lease far longer than the test: what is listed is alive, however slow the machine.
    Lease(store, "cli-a", "supervisor", lease=600).register()
    run = schedule(lease_flow, 1, database=store)
    _claim_as(store, "cli-a", run.id)
    out = run_in_process(["runners", "--database", db_url, "--json"], env=subprocess_env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)
    assert (row["name"], row["kind"], row["running"], row["expired"]) == ("cli-a", "supervisor", 1, False)
    table = run_in_process(["runners", "--database", db_url], env=subprocess_env, cwd=tmp_path)
    assert "cli-a" in table.stdout and "alive" in table.stdout
    assert store.get_run(run.id).status == RUNNING
    store.close()


def test_execute_after_recovery_completes(store):
    run = schedule(lease_flow, 3, database=store)
    assert execute_run(store, run.id, claimer="any") == COMPLETED
