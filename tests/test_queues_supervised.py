"""Queue limits held by real runners together: three supervisors with three
children each on one PostgreSQL database, three on one MariaDB database, two
threaded workers on one SQLite file. How many runs executed at once is computed from what each step
saw (its own start and end times), the rate from the claim times, so the
limits are checked where they matter, not in the claimers' bookkeeping."""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from everystep import schedule
from everystep.models import COMPLETED, SCHEDULED
from everystep.store import Store, connect
from tests.apps import queued
from tests.support.supervisor import Supervisor, supervisors  # noqa: F401
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

APP = "tests.apps.queued"
NAP = 0.1


def limit(store: Store, queue: str, **settings: Any) -> None:
    store.update_queue(queue, lambda current: dataclasses.replace(current, **settings))


def start_all(runners: Sequence[Supervisor]) -> None:
    """Spawn every supervisor first, then wait for each: they boot together."""
    for runner in runners:
        runner.spawn()
    for runner in runners:
        runner.wait_idle()


def finish(store: Store, ids: Sequence[str], timeout: float = 120.0, detail: Any = lambda: "") -> list[Any]:
    def done() -> list[Any] | None:
        runs = [store.get_run(run_id) for run_id in ids]
        return runs if all(run.status == COMPLETED for run in runs) else None

    return wait_until(done, f"{len(ids)} runs to complete", timeout=timeout, interval=0.2, detail=detail)


def most_at_once(intervals: Sequence[tuple[float, float]]) -> int:
    """The largest number of intervals open at one moment (an end at the
    very moment of a start is not an overlap)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    peak = current = 0
    for _, change in events:
        current += change
        peak = max(peak, current)
    return peak


def intervals(runs: Sequence[Any]) -> list[tuple[float, float]]:
    return [(run.result["start"], run.result["end"]) for run in runs]


def assert_limits_held(store: Store, detail: Any = lambda: "") -> None:
    """Queue ``reports`` at concurrency 2, then queue ``keyed`` at one run
    per key with three keys."""
    limit(store, "reports", concurrency=2)
    ids = [schedule(queued.timed, NAP, database=store).id for _ in range(60)]
    runs = finish(store, ids, detail=detail)
    assert most_at_once(intervals(runs)) == 2, sorted(intervals(runs))

    limit(store, "keyed", key_concurrency=1)
    keyed = [schedule(queued.timed, NAP, database=store, queue="keyed", concurrency_key=f"k{i % 3}").id
             for i in range(18)]
    runs = finish(store, keyed, detail=detail)
    for key in ("k0", "k1", "k2"):
        assert most_at_once(intervals([run for run in runs if run.concurrency_key == key])) == 1
    assert most_at_once(intervals(runs)) >= 2, "different keys ran side by side"


def assert_rate_held(store: Store) -> None:
    """Queue ``rated`` at 10 claims per 2 s: no closed 2 s window of claim
    times holds more than 10, and the 25 runs need more than two windows."""
    limit(store, "rated", rate_limit=10, rate_period=2.0)
    ids = [schedule(queued.timed, 0.01, database=store, queue="rated").id for _ in range(25)]
    runs = finish(store, ids)
    claims = sorted(run.claimed_at for run in runs)
    window = dt.timedelta(seconds=2)
    in_window = [sum(1 for other in claims if start <= other <= start + window) for start in claims]
    assert max(in_window) == 10, in_window
    assert claims[-1] - claims[0] > 2 * window, "25 claims at 10 per 2 s need more than two windows"


def assert_pause_and_priority_held(store: Store, detail: Any = lambda: "") -> None:
    """Queue ``reports`` is paused: its runs wait while a run of another
    queue, scheduled after them, completes; once resumed they are claimed
    by priority, the oldest first within one."""
    priorities = [1, 9, 0, 5, 9]
    held = [schedule(queued.timed, 0.0, database=store, priority=p).id for p in priorities]
    other = schedule(queued.urgent, database=store).id
    finish(store, [other], detail=detail)
    assert [store.get_run(run_id).status for run_id in held] == [SCHEDULED] * 5
    limit(store, "reports", paused=False)
    runs = finish(store, held, detail=detail)
    # Runs taken by one claim (a supervisor claiming a batch ahead) share
    # its time; one child, or one thread, runs them in the order the claim
    # gave them.
    claimed = sorted(runs, key=lambda run: (run.claimed_at, run.completed_at))
    assert [run.priority for run in claimed] == [9, 9, 5, 1, 0]
    nines = [run.id for run in claimed if run.priority == 9]
    assert nines == [held[1], held[4]], "the oldest first within one priority"


def test_three_supervisors_hold_a_queues_concurrency_and_its_keys(pg_url: str, supervisors: Any) -> None:
    store = connect(pg_url)
    runners = [supervisors(pg_url, procs=3, app=APP) for _ in range(3)]
    try:
        start_all(runners)
        assert_limits_held(store, detail=lambda: "\n".join(r.log()[-2000:] for r in runners))
    finally:
        store.close()


def test_a_rate_holds_across_two_supervisors(pg_url: str, supervisors: Any) -> None:
    store = connect(pg_url)
    runners = [supervisors(pg_url, procs=3, app=APP) for _ in range(2)]
    try:
        start_all(runners)
        assert_rate_held(store)
    finally:
        store.close()


def test_pause_holds_runs_resume_releases_them_and_priority_orders_them(pg_url: str, supervisors: Any) -> None:
    store = connect(pg_url)
    runner = supervisors(pg_url, procs=1, app=APP)
    try:
        limit(store, "reports", paused=True)
        runner.start()
        assert_pause_and_priority_held(store, detail=runner.log)
    finally:
        store.close()


def test_three_supervisors_on_mariadb_hold_a_queues_concurrency(mariadb_url: str, supervisors: Any) -> None:
    """One child each, the queue at 2: never more than two of its runs
    executing at once, and two side by side, which takes two supervisors."""
    store = connect(mariadb_url)
    runners = [supervisors(mariadb_url, procs=1, app=APP, args=["--poll", "0.05"]) for _ in range(3)]
    try:
        limit(store, "reports", concurrency=2)
        start_all(runners)
        ids = [schedule(queued.timed, NAP, database=store).id for _ in range(30)]
        runs = finish(store, ids, detail=lambda: "\n".join(r.log()[-2000:] for r in runners))
        assert most_at_once(intervals(runs)) == 2, sorted(intervals(runs))
    finally:
        store.close()


# -- SQLite: two threaded workers -----------------------------------------------------------


@pytest.fixture
def workers(subprocess_env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def start(url: str, pool: int = 3) -> None:
        name = f"worker-{uuid.uuid4().hex[:6]}"
        log = tmp_path / f"{name}.log"
        logs.append(log)
        with open(log, "wb") as out:
            started.append(subprocess.Popen(
                [sys.executable, "-m", "everystep.cli", "worker", "--app", APP, "--database", url, "--name", name,
                 "--pool", str(pool), "--poll", "0.05"],
                env=subprocess_env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT))

    start.logs = lambda: "\n".join(log.read_text(errors="replace")[-2000:] for log in logs)  # type: ignore[attr-defined]
    try:
        yield start
    finally:
        for proc in started:
            proc.terminate()
        for proc in started:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_two_sqlite_workers_hold_a_queues_concurrency_and_its_keys(tmp_path: Path, workers: Any) -> None:
    url = f"sqlite:///{tmp_path / 'queues.db'}"
    store = connect(url)
    try:
        workers(url)
        workers(url)
        wait_until(lambda: len(store.list_runners()) == 2, "both workers to take their names", detail=workers.logs)
        assert_limits_held(store, detail=workers.logs)
    finally:
        store.close()


def test_two_sqlite_workers_hold_a_rate_a_pause_and_priorities(tmp_path: Path, workers: Any) -> None:
    url = f"sqlite:///{tmp_path / 'queues.db'}"
    store = connect(url)
    try:
        limit(store, "reports", paused=True)
        # One thread each: every claim takes one run, so the claim order is
        # the priority order even with two claimers.
        workers(url, pool=1)
        workers(url, pool=1)
        wait_until(lambda: len(store.list_runners()) == 2, "both workers to take their names", detail=workers.logs)
        assert_pause_and_priority_held(store, detail=workers.logs)
        assert_rate_held(store)
    finally:
        store.close()
