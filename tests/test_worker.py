"""The threaded Worker embedded in this process, on both backends.

Each worker runs ``Worker.run()`` on a thread of the test process (where no
signal handlers are installed: an embedding host owns its signals) and is
stopped with ``stop()``. Steps of ``tests.apps.workers`` block on gate files
so a test can act while a step is in flight; everything is synchronised by
polling the database or the effects file, never by sleeping.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from everystep import EverystepError, SimulatedCrash, admin, runner, schedule
from everystep.models import COMPLETED, RUNNING, SCHEDULED, STEP_DONE
from everystep.store import Store
from everystep.worker import Worker
from tests.apps import workers
from tests.apps.workers import effects, open_gate
from tests.support.waiting import wait_until
from tests.support.runs import claim_run, crash_at, execute_run

pytestmark = pytest.mark.timeout(120)

GATES = ("release", "body")


class EmbeddedWorker:
    """A Worker running on a thread of this process."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.leftovers: list[str] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"host-{worker.name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.leftovers = self.worker.run()
        except BaseException as exc:  # reported by stop_and_join
            self.error = exc

    def stop_and_join(self, timeout: float = 30.0) -> list[str]:
        """``stop()``, then wait for ``run()`` to return; its leftovers."""
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"worker {self.worker.name} did not return within {timeout}s"
        if self.error is not None:
            raise self.error
        assert self.leftovers is not None
        return self.leftovers


def pool_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name.startswith("everystep-worker")}


@pytest.fixture
def wait_for_idle_pools() -> Callable[..., None]:
    """Wait until the executor threads of this test's workers are gone (a
    thread stuck past a drain deadline finishes once its gate opens);
    threads other tests left behind are not ours to wait for."""
    before = pool_threads()

    def wait(timeout: float = 30.0) -> None:
        wait_until(lambda: not (pool_threads() - before), "worker pool threads to finish", timeout=timeout)

    return wait


@pytest.fixture
def start_worker(
    store: Store, tmp_path: Path, wait_for_idle_pools: Callable[..., None]
) -> Iterator[Callable[..., EmbeddedWorker]]:
    started: list[EmbeddedWorker] = []

    def start(name: str = "embedded", **options: Any) -> EmbeddedWorker:
        options = {"pool_size": 4, "poll": 0.05, "drain": 30.0, **options}
        embedded = EmbeddedWorker(Worker(name=name, database=store, **options))
        started.append(embedded)
        return embedded

    try:
        yield start
    finally:
        for embedded in started:
            if embedded.thread.is_alive():
                embedded.worker.stop()
        for gate in GATES:
            open_gate(tmp_path, gate)
        for embedded in started:
            embedded.thread.join(60)
        wait_for_idle_pools(60)


def status_of(store: Store, run_id: str) -> tuple[str, str | None]:
    run = store.get_run(run_id)
    return run.status, run.claimed_by


def recorded(store: Store, run_id: str) -> list[tuple[str, str]]:
    return [(record.step_id, record.status) for record in store.get_steps(run_id)]


def wait_for_status(store: Store, run_id: str, status: str, timeout: float = 30.0) -> None:
    wait_until(lambda: store.get_run(run_id).status == status, f"run {run_id} to be {status}", timeout=timeout)


def wait_for_event(directory: Path, run_id: str, event: str, count: int = 1) -> None:
    wait_until(
        lambda: effects(directory, run_id).count(event) >= count,
        f"{count}x {event!r} in the effects of run {run_id}",
    )


# -- the basics -------------------------------------------------------------------


def test_worker_completes_scheduled_runs_and_stop_returns(store, start_worker):
    runs = [schedule(workers.add_one, n, database=store) for n in range(8)]
    embedded = start_worker(name="basic", pool_size=4)
    for run in runs:
        wait_for_status(store, run.id, COMPLETED)
    assert embedded.stop_and_join() == []
    for n, run in enumerate(runs):
        done = store.get_run(run.id)
        assert (done.result, done.claimed_by) == (n + 1, "basic")
        assert recorded(store, run.id) == [("1", STEP_DONE)]
    assert embedded.worker.claimed == 8


def test_worker_claims_no_more_than_its_pool_size(store, tmp_path, start_worker):
    spec = {"dir": str(tmp_path), "gate": "release"}
    runs = [schedule(workers.three_steps, spec, database=store) for _ in range(4)]
    start_worker(name="small", pool_size=2)
    wait_until(lambda: effects(tmp_path).count("middle:start") == 2, "two runs in their middle step")
    statuses = sorted(status_of(store, run.id) for run in runs)
    assert statuses == [(RUNNING, "small")] * 2 + [(SCHEDULED, None)] * 2
    open_gate(tmp_path, "release")
    for run in runs:
        wait_for_status(store, run.id, COMPLETED)
        assert effects(tmp_path, run.id) == ["first", "middle:start", "middle:end", "last"]


def test_invalid_pool_or_poll_is_refused(store):
    with pytest.raises(EverystepError, match="pool_size"):
        Worker(pool_size=0, database=store)
    with pytest.raises(EverystepError, match="poll"):
        Worker(poll=0, database=store)


# -- catchup ----------------------------------------------------------------------


def test_catchup_resumes_runs_left_running_under_its_own_name(store, tmp_path, start_worker):
    """A process named W died with runs claimed: more of them than the new
    W's pool, one of them after a step's effect but before its record."""
    crashed = schedule(workers.three_steps, {"dir": str(tmp_path)}, database=store)
    crash_at("2")
    with pytest.raises(SimulatedCrash):
        execute_run(store, crashed.id, claimer="W")
    runner.fault = None
    parked = [schedule(workers.add_one, n, database=store) for n in range(4)]
    for run in parked:
        claim_run(store, run.id, claimer="W")
    foreign = schedule(workers.add_one, 100, database=store)
    claim_run(store, foreign.id, claimer="someone-else")
    assert recorded(store, crashed.id) == [("1", STEP_DONE)]
    assert status_of(store, crashed.id) == (RUNNING, "W")

    start_worker(name="W", pool_size=2)
    for run in [crashed, *parked]:
        wait_for_status(store, run.id, COMPLETED)
    assert [store.get_run(run.id).result for run in parked] == [1, 2, 3, 4]
    # The step whose record was lost ran again: at-least-once.
    assert effects(tmp_path, crashed.id) == [
        "first", "middle:start", "middle:end", "middle:start", "middle:end", "last",
    ]

    # Catchup takes only this worker's own runs. Once a run scheduled now
    # has been claimed and completed, the worker has been through its loop
    # many times, and the foreign run is still where its owner left it.
    probe = schedule(workers.add_one, 7, database=store)
    wait_for_status(store, probe.id, COMPLETED)
    assert status_of(store, foreign.id) == (RUNNING, "someone-else")


# -- draining -----------------------------------------------------------------------


def test_stop_requeues_a_run_at_its_next_step_boundary(store, tmp_path, start_worker):
    run = schedule(workers.three_steps, {"dir": str(tmp_path), "gate": "release"}, database=store)
    embedded = start_worker(name="drainer")
    wait_for_event(tmp_path, run.id, "middle:start")
    embedded.worker.stop()
    open_gate(tmp_path, "release")
    assert embedded.stop_and_join() == []

    assert status_of(store, run.id) == (SCHEDULED, None)
    assert recorded(store, run.id) == [("1", STEP_DONE), ("2", STEP_DONE)]
    assert effects(tmp_path, run.id) == ["first", "middle:start", "middle:end"]
    assert embedded.worker.requeued == 1

    start_worker(name="successor")
    wait_for_status(store, run.id, COMPLETED)
    assert store.get_run(run.id).result == ["one", "two", "three"]
    assert store.get_run(run.id).claimed_by == "successor"
    assert effects(tmp_path, run.id) == ["first", "middle:start", "middle:end", "last"]


def test_drain_deadline_requeues_a_run_stuck_mid_step(
    store, tmp_path, start_worker, wait_for_idle_pools
):
    run = schedule(workers.three_steps, {"dir": str(tmp_path), "gate": "release"}, database=store)
    embedded = start_worker(name="stuck", drain=0.5)
    wait_for_event(tmp_path, run.id, "middle:start")
    assert embedded.stop_and_join() == [run.id]

    assert status_of(store, run.id) == (SCHEDULED, None)
    assert recorded(store, run.id) == [("1", STEP_DONE)]

    # The stuck step ends later; its record is refused, the claim is gone.
    open_gate(tmp_path, "release")
    wait_for_event(tmp_path, run.id, "middle:end")
    wait_for_idle_pools()
    assert status_of(store, run.id) == (SCHEDULED, None)
    assert recorded(store, run.id) == [("1", STEP_DONE)]

    start_worker(name="successor")
    wait_for_status(store, run.id, COMPLETED)
    assert effects(tmp_path, run.id).count("middle:start") == 2
    assert effects(tmp_path, run.id).count("last") == 1


# -- every write is guarded by status and claimer -------------------------------------


def take_over(store: Store, run_id: str, new_owner: str = "B") -> None:
    """What an operator and another runner do to a run they believe orphaned."""
    admin.requeue_run(store, run_id, force=True)
    claim_run(store, run_id, claimer=new_owner)


def wait_until_worker_moved_on(store: Store) -> None:
    """A pool of one claims a fresh run only once its previous execution has
    ended: when the probe completes, the old execution wrote all it ever will."""
    probe = schedule(workers.add_one, 0, database=store)
    wait_for_status(store, probe.id, COMPLETED)


def test_a_step_record_after_losing_the_claim_is_refused(store, tmp_path, start_worker):
    run = schedule(workers.three_steps, {"dir": str(tmp_path), "gate": "release"}, database=store)
    start_worker(name="A", pool_size=1)
    wait_for_event(tmp_path, run.id, "middle:start")
    take_over(store, run.id)
    open_gate(tmp_path, "release")
    wait_until_worker_moved_on(store)

    assert status_of(store, run.id) == (RUNNING, "B")
    assert recorded(store, run.id) == [("1", STEP_DONE)]
    # B, the owner now, carries on from the records.
    assert runner.execute(store, store.get_run(run.id), claimer="B") == COMPLETED
    assert effects(tmp_path, run.id).count("middle:start") == 2


def test_a_terminal_write_after_losing_the_claim_is_refused(store, tmp_path, start_worker):
    run = schedule(workers.pause_in_body, {"dir": str(tmp_path), "body_gate": "body"}, database=store)
    start_worker(name="A", pool_size=1)
    wait_for_event(tmp_path, run.id, "body:waiting")
    take_over(store, run.id)
    open_gate(tmp_path, "body")
    wait_until_worker_moved_on(store)

    stale = store.get_run(run.id)
    assert (stale.status, stale.claimed_by, stale.result, stale.completed_at) == (RUNNING, "B", None, None)
    assert recorded(store, run.id) == [("1", STEP_DONE)]


def test_a_drain_requeue_after_losing_the_claim_is_refused(store, tmp_path, start_worker):
    spec = {"dir": str(tmp_path), "body_gate": "body", "then_step": True}
    run = schedule(workers.pause_in_body, spec, database=store)
    embedded = start_worker(name="A", pool_size=1)
    wait_for_event(tmp_path, run.id, "body:waiting")
    take_over(store, run.id)
    embedded.worker.stop()
    open_gate(tmp_path, "body")
    assert embedded.stop_and_join() == []

    assert status_of(store, run.id) == (RUNNING, "B")
    assert recorded(store, run.id) == [("1", STEP_DONE)]
    assert embedded.worker.requeued == 0
    assert "last" not in effects(tmp_path, run.id)


def test_a_deadline_requeue_after_losing_the_claim_is_refused(
    store, tmp_path, start_worker, wait_for_idle_pools
):
    run = schedule(workers.three_steps, {"dir": str(tmp_path), "gate": "release"}, database=store)
    embedded = start_worker(name="A", pool_size=1, drain=0.5)
    wait_for_event(tmp_path, run.id, "middle:start")
    take_over(store, run.id)
    leftovers = embedded.stop_and_join()

    # Its thread is still busy in the step: run() says so, so that a
    # standalone process knows to exit without joining it ...
    assert leftovers == [run.id]
    # ... but the run is B's now and stays B's.
    assert status_of(store, run.id) == (RUNNING, "B")
    open_gate(tmp_path, "release")
    wait_for_idle_pools()
    assert status_of(store, run.id) == (RUNNING, "B")
    assert recorded(store, run.id) == [("1", STEP_DONE)]


# -- the wake-up pipe ---------------------------------------------------------------


def grab_fd(number: int, path: Path) -> list[int]:
    """Open ``path`` until the kernel hands out descriptor ``number`` (the
    lowest free one comes first); returns every descriptor opened."""
    opened = []
    for _ in range(256):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        opened.append(fd)
        if fd == number:
            return opened
    for fd in opened:
        os.close(fd)
    raise AssertionError(f"descriptor {number} was not handed out again")


def test_stop_after_run_returned_writes_nowhere(store, tmp_path, start_worker):
    """An embedding host may call ``stop()`` twice (a signal and atexit).
    The worker's wake-up pipe is closed by then and its descriptor number
    may belong to one of the host's files: nothing must be written there."""
    embedded = start_worker(name="twice")
    wake_fd = embedded.worker._wake_w
    assert embedded.stop_and_join() == []
    victim = tmp_path / "host-file"
    opened = grab_fd(wake_fd, victim)
    try:
        embedded.worker.stop()
    finally:
        for fd in opened:
            os.close(fd)
    assert victim.read_bytes() == b""


def test_a_step_ending_after_the_drain_deadline_writes_nowhere(
    store, tmp_path, start_worker, wait_for_idle_pools
):
    """The thread stuck past the deadline finishes after ``run()`` returned;
    its completion must not poke the closed wake-up pipe either."""
    run = schedule(workers.three_steps, {"dir": str(tmp_path), "gate": "release"}, database=store)
    embedded = start_worker(name="late", drain=0.2)
    wait_for_event(tmp_path, run.id, "middle:start")
    wake_fd = embedded.worker._wake_w
    assert embedded.stop_and_join() == [run.id]
    victim = tmp_path / "host-file"
    opened = grab_fd(wake_fd, victim)
    try:
        open_gate(tmp_path, "release")
        wait_for_event(tmp_path, run.id, "middle:end")
        wait_for_idle_pools()
    finally:
        for fd in opened:
            os.close(fd)
    assert victim.read_bytes() == b""
