"""Async workflows and steps, in-process, on every backend: an async body
records the same rows under the same ids as its sync twin; replay, unsafe
steps, retries and waits follow the sync rules; ``gather`` has the ids and
error rules of ``parallel`` and runs its branches concurrently (50 HTTP
calls in one run, seen at once by a local server)."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import everystep
from everystep import EverystepError, schedule
from everystep.context import step_sort_key
from everystep.models import COMPLETED, STEP_DONE, STEP_FAILED, STEP_SLEEPING, STEP_STARTED
from everystep.runner import Outcome
from everystep.store import Store
from tests.apps import async_steps as app
from tests.support.runs import crash_at, execute_run, expire_wait, resume, run_until_settled, worker_running


pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _reset() -> None:
    app.CALLS.clear()
    app.ATTEMPTS.clear()


def _rows(store: Store, run_id: str) -> list[tuple[Any, ...]]:
    """A run's step rows in step-id order (concurrent branches record in any order)."""
    return sorted([(s.step_id, s.name, s.status, s.args, s.kwargs, s.result, s.error, s.attempt)
                   for s in store.get_steps(run_id)], key=lambda row: step_sort_key(row[0]))


def test_an_async_body_records_what_its_sync_twin_records(store: Store) -> None:
    sync_run = schedule(app.mixed_sync, 1, database=store)
    async_run = schedule(app.mixed_async, 1, database=store)
    assert execute_run(store, sync_run.id) == COMPLETED
    assert execute_run(store, async_run.id) == COMPLETED
    assert store.get_run(async_run.id).result == store.get_run(sync_run.id).result == [
        "fetched a1", "computed b1", ["fetched c1", ("computed d1", "fetched e1")], "computed f1"]
    rows = _rows(store, async_run.id)
    assert rows == _rows(store, sync_run.id)
    assert [row[:3] for row in rows] == [
        ("1", app.fetch.name, STEP_DONE), ("2", app.compute.name, STEP_DONE),
        ("3.0.1", app.fetch.name, STEP_DONE), ("3.1.1", app.compute.name, STEP_DONE),
        ("3.1.2", app.fetch.name, STEP_DONE), ("named", app.compute.name, STEP_DONE)]


def test_an_async_run_replays_recorded_steps_without_running_them(store: Store) -> None:
    run = schedule(app.mixed_async, 2, database=store)
    crash_at("3.1.2")
    with pytest.raises(everystep.SimulatedCrash):
        execute_run(store, run.id)
    assert app.CALLS["a2"] == app.CALLS["b2"] == 1
    assert resume(store, run.id) == COMPLETED
    # Recorded steps replayed; the one whose record the crash lost ran again.
    assert app.CALLS["a2"] == app.CALLS["b2"] == app.CALLS["c2"] == app.CALLS["d2"] == 1
    assert app.CALLS["e2"] == 2
    assert store.get_run(run.id).result[2] == ["fetched c2", ("computed d2", "fetched e2")]


def test_gather_one_failure_reraises_as_is_and_healthy_branches_are_recorded(store: Store) -> None:
    run = schedule(app.one_branch_fails, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == "caught only one"
    assert [(row[0], row[2]) for row in _rows(store, run.id)] == [
        ("1.0.1", STEP_DONE), ("1.1.1", STEP_FAILED), ("1.2.1", STEP_DONE), ("1.2.2", STEP_DONE)]


def test_gather_several_failures_raise_a_group(store: Store) -> None:
    run = schedule(app.two_branches_fail, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == ["one", "two"]
    assert [(row[0], row[2]) for row in _rows(store, run.id)] == [
        ("1.0.1", STEP_FAILED), ("1.1.1", STEP_DONE), ("1.2.1", STEP_FAILED)]


def test_an_unsafe_async_step_claims_its_effect_and_a_crash_blocks_the_run(store: Store) -> None:
    run = schedule(app.unsafe_and_retried, database=store)
    crash_at("1")
    with pytest.raises(everystep.SimulatedCrash):
        execute_run(store, run.id)
    assert [(s.step_id, s.status) for s in store.get_steps(run.id)] == [("1", STEP_STARTED)]
    assert resume(store, run.id) == Outcome.BLOCKED
    assert app.CALLS["charge:5"] == 1


def test_an_async_step_is_retried_by_its_policy(store: Store) -> None:
    run = schedule(app.unsafe_and_retried, database=store)
    run_until_settled(store, run.id)
    assert store.get_run(run.id).result == ["charged 5", "x after 2"]
    flaky_row = store.get_steps(run.id)[1]
    assert (flaky_row.status, flaky_row.attempt) == (STEP_DONE, 2)


def test_sleep_async_records_the_sleep_and_releases_the_run(store: Store) -> None:
    run = schedule(app.sleeps_then_fetches, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    assert [(s.step_id, s.name, s.status) for s in store.get_steps(run.id)] == [
        ("1", "everystep.sleep", STEP_SLEEPING)]
    expire_wait(store, run.id, "1")
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == "fetched after sleep"


def test_recv_async_waits_for_a_send(store: Store) -> None:
    run = schedule(app.receives, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    everystep.send(run.id, "greeting", "hello", database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == "fetched got hello"


def test_outside_a_workflow_an_async_step_is_a_plain_coroutine() -> None:
    assert asyncio.run(app.fetch("plain")) == "fetched plain"
    assert asyncio.run(everystep.gather(app.fetch("x"), lambda: app.compute("y"))) == ("fetched x", "computed y")
    with pytest.raises(EverystepError, match="gather branch 0"):
        asyncio.run(everystep.gather(42))


def test_check_deploy_replays_an_async_body(store: Store) -> None:
    from everystep import dryrun

    run = schedule(app.mixed_async, 3, database=store)
    assert execute_run(store, run.id) == COMPLETED
    verdict = dryrun.replay(store.get_run(run.id), store.get_steps(run.id))
    assert verdict.outcome == dryrun.Prediction.COMPLETES, verdict


# -- 50 HTTP calls at once ------------------------------------------------------


class _Counting(http.server.ThreadingHTTPServer):
    """Counts the requests it holds at once. A request waits (up to a
    second) for ``hold`` requests to be in at the same time, so requests
    made concurrently are seen together whatever the machine's load."""

    daemon_threads = True
    #: The listen backlog. socketserver's default of 5 cannot queue fifty
    #: connects made at once: on a loaded machine the kernel then drops some
    #: handshakes and their retransmits (seconds apart, growing) outlast the
    #: test's timeout while the client waits on a read.
    request_queue_size = 128

    def __init__(self, hold: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hold = hold
        self.inside = 0
        self.most = 0
        self.changed = threading.Condition()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Counting

    def do_GET(self) -> None:
        server = self.server
        with server.changed:
            server.inside += 1
            server.most = max(server.most, server.inside)
            server.changed.notify_all()
            server.changed.wait_for(lambda: server.most >= server.hold, timeout=1)
            server.inside -= 1
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serving(hold: int) -> Iterator[_Counting]:
    server = _Counting(hold)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def counting_server() -> Iterator[_Counting]:
    with serving(hold=10) as server:
        yield server


def test_gather_makes_fifty_http_calls_at_once_in_one_run(store: Store, counting_server: _Counting) -> None:
    run = schedule(app.fetch_many, counting_server.server_address[1], 50, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == [f"/{index}" for index in range(50)]
    assert len(store.get_steps(run.id)) == 50
    assert counting_server.most >= 10


# -- the threaded worker ----------------------------------------------------------


def test_the_threaded_worker_runs_async_runs_beside_sync_ones(store: Store, counting_server: _Counting) -> None:
    from everystep.worker import Worker
    from tests.support.waiting import wait_until

    runs = [schedule(app.mixed_async, 5, database=store), schedule(app.mixed_sync, 5, database=store),
            schedule(app.fetch_many, counting_server.server_address[1], 20, database=store)]
    worker = Worker(pool_size=2, poll=0.05, name=f"async-{store.backend}", database=store, drain=30)
    with worker_running(worker):
        wait_until(lambda: all(store.get_run(run.id).status == COMPLETED for run in runs),
                   "the worker to complete every run", timeout=90)
    assert store.get_run(runs[0].id).result == store.get_run(runs[1].id).result
    assert _rows(store, runs[0].id) == _rows(store, runs[1].id)
    assert counting_server.most >= 10


def test_a_worker_with_one_thread_holds_many_async_runs_on_one_loop(store: Store) -> None:
    """Six runs each awaiting one HTTP call reach the server together
    through a worker with a pool of one thread: they share its loop."""
    from everystep.worker import Worker
    from tests.support.waiting import wait_until

    with serving(hold=6) as server:
        port = server.server_address[1]
        runs = [schedule(app.one_request, port, f"/{index}", database=store) for index in range(6)]
        worker = Worker(pool_size=1, poll=0.05, name=f"shared-{store.backend}", database=store, drain=30)
        with worker_running(worker):
            wait_until(lambda: all(store.get_run(run.id).status == COMPLETED for run in runs),
                       "the worker to complete every run", timeout=90)
        assert server.most >= 6
    assert [store.get_run(run.id).result for run in runs] == [f"/{index}" for index in range(6)]


def test_a_worker_gives_back_an_async_run_still_awaiting_at_its_drain_deadline(store: Store, tmp_path: Any) -> None:
    from everystep.models import RUNNING, SCHEDULED
    from everystep.worker import Worker
    from tests.support.waiting import wait_until

    before, marker, release = tmp_path / "before", tmp_path / "marker", tmp_path / "release"
    run = schedule(app.awaits_a_file, str(before), str(marker), str(release), database=store)
    worker = Worker(pool_size=1, poll=0.05, name=f"drain-{store.backend}", database=store, drain=1)
    leftovers: list[list[str]] = []
    thread = threading.Thread(target=lambda: leftovers.append(worker.run()), daemon=True)
    thread.start()
    try:
        wait_until(marker.exists, "the async step to be awaiting")
        assert store.get_run(run.id).status == RUNNING
        worker.stop()
        thread.join(60)
        assert not thread.is_alive()
    finally:
        release.write_text("go")
        worker.stop()
        thread.join(60)
    assert leftovers == [[run.id]]
    assert store.get_run(run.id).status == SCHEDULED  # given back; its first step stays recorded
    assert [(s.step_id, s.status) for s in store.get_steps(run.id)] == [("1", STEP_DONE)]


def test_a_sync_body_on_a_thread_where_another_loop_runs_calls_its_steps_now(store: Store) -> None:
    """Someone else's event loop running on the thread (a test driving a
    browser, a notebook) does not make a sync body async: its sync steps
    run there and then, and its async steps on a loop of their own."""
    from tests.apps import shapes

    plain = schedule(shapes.linear, 3, database=store)
    mixed = schedule(app.mixed_sync, 1, database=store)

    async def host() -> list[str]:
        return [execute_run(store, plain.id), execute_run(store, mixed.id)]

    assert asyncio.run(host()) == [COMPLETED, COMPLETED]
    assert store.get_run(mixed.id).result == [
        "fetched a1", "computed b1", ["fetched c1", ("computed d1", "fetched e1")], "computed f1"]
