"""Debounced scheduling (``schedule(..., debounce=Debounce(key, period,
max_wait))``): calls within a window fold into one run that is not due
until the key is quiet (the last arguments win, the start pushed back, never
past ``max_wait``); a call after that run was claimed opens the next window;
with ``conn=`` the fold is the caller's transaction's. Concurrent schedulers,
threads and real processes, hammering one key while a claimer takes runs at
every window's edge: every call lands in exactly one run, the runs' windows
never overlap, and each run holds its last call's arguments."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import subprocess
import threading
import time
from collections import defaultdict
from typing import Any

import psycopg
import pytest

from everystep import Debounce, schedule, workflow
from everystep.errors import EverystepError
from everystep.models import RUNNING, SCHEDULED, Run
from everystep.store import Store, connect, utcnow
from everystep.waiting import waiting_for, waits_of
from tests.support.debounce_hammer import NAME, debounced, hammer
from tests.support.runs import claim_run


@workflow
def other(worker: str, call: int) -> None:
    return None


@pytest.fixture
def store(db_url: str) -> Any:
    s = connect(db_url)
    s.migrate()
    yield s
    s.close()


def runs_of(store: Store, name: str = NAME) -> list[Run]:
    return sorted(store.list_runs(name=name, limit=10_000), key=lambda run: (run.created_at, run.id))


def test_calls_in_one_window_fold_into_one_run_with_the_last_arguments(store: Store) -> None:
    first = schedule(debounced, "a", 1, database=store, debounce=Debounce("k", 30, 120))
    assert first.status == SCHEDULED and first.debounce_calls == 1 and first.not_before is not None
    second = schedule(debounced, "a", 2, database=store, debounce=Debounce("k", 30, 120))
    third = debounced.schedule("a", 3, database=store, debounce=Debounce("k", 30, 120))
    assert first.id == second.id == third.id
    assert (third.args, third.debounce_calls) == (["a", 3], 3)
    assert third.not_before is not None and third.not_before >= first.not_before
    [run] = runs_of(store)
    assert run.args == ["a", 3] and run.not_before == third.not_before
    # Keys are per workflow: the same key of another workflow is a window of its own.
    elsewhere = schedule(other, "b", 1, database=store, debounce=Debounce("k", 30))
    assert elsewhere.id != run.id
    # Seen as waiting for its window, with the calls folded in.
    window = store.debounce_windows([run.id, elsewhere.id])
    assert window[run.id].key == "k" and window[run.id].calls == 3
    said = waiting_for(run, [], debounce=window[run.id])
    assert said is not None and 'debounce window "k"' in said and "3 calls folded in" in said
    assert 'debounce window "k"' in waits_of(store, [run])[run.id]
    assert store.waiting_counts().get("debounce") == 2


def test_the_start_is_never_pushed_past_max_wait(store: Store) -> None:
    started = utcnow()
    first = schedule(debounced, "a", 0, database=store, debounce=Debounce("k", 0.4, 0.6))
    time.sleep(0.3)
    schedule(debounced, "a", 1, database=store, debounce=Debounce("k", 0.4, 0.6))
    time.sleep(0.3)
    last = schedule(debounced, "a", 2, database=store, debounce=Debounce("k", 0.4, 0.6))
    assert last.id == first.id and last.not_before is not None
    # Pushed 0.4 s past each call, but held at 0.6 s after the first.
    assert last.not_before <= started + dt.timedelta(seconds=0.65)
    assert last.not_before < utcnow() + dt.timedelta(seconds=0.4)


def test_a_call_after_the_run_started_opens_the_next_window(store: Store) -> None:
    first = schedule(debounced, "a", 1, database=store, debounce=Debounce("k", 0.05))
    time.sleep(0.1)
    claimed = claim_run(store, first.id)
    assert claimed.args == ["a", 1]
    nxt = schedule(debounced, "a", 2, database=store, debounce=Debounce("k", 0.05))
    assert nxt.id != first.id and nxt.debounce_calls == 1
    assert [(run.id, run.status) for run in runs_of(store)] == [(first.id, RUNNING), (nxt.id, SCHEDULED)]
    # A cancelled window's run is not folded into either.
    from everystep import admin
    admin.cancel(store, nxt.id)
    after = schedule(debounced, "a", 3, database=store, debounce=Debounce("k", 0.05))
    assert after.id not in (first.id, nxt.id)


@pytest.mark.parametrize(("options", "message"), [
    ({"debounce": Debounce("k", 0)}, "debounce period must be a positive number"),
    ({"debounce": Debounce("k", -1)}, "debounce period must be a positive number"),
    ({"debounce": Debounce("k", 5, 2)}, r"debounce max_wait \(2 s\) must not be shorter than its period \(5 s\)"),
    ({"debounce": Debounce("", 5)}, "debounce key must be a non-empty string"),
    ({"debounce": Debounce("k" * 256, 5)}, "debounce key is longer than 255"),
    ({"debounce": Debounce("k", 5), "idempotency_key": "x"}, "give idempotency_key= or debounce=, not both"),
    ({"debounce": Debounce("k", 5), "delay": 3}, "give run_at=/delay= or debounce=, not both"),
    ({"debounce": ("k", 5)}, "debounce must be a Debounce"),
])
def test_bad_input_is_refused_and_nothing_is_written(store: Store, options: dict[str, Any], message: str) -> None:
    with pytest.raises(EverystepError, match=message):
        schedule(debounced, "a", 1, database=store, **options)
    assert runs_of(store) == []


def test_in_the_callers_transaction(db_url: str, store: Store) -> None:
    """With ``conn=``: a rollback leaves no run and no window; a commit folds."""
    conn: Any
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url[len("sqlite:///"):], timeout=30)
    elif db_url.startswith("postgres"):
        conn = psycopg.connect(db_url)
    else:
        import pymysql

        from everystep.store.mariadb import connect_args
        conn = pymysql.connect(**connect_args(db_url))
        conn.begin()
    try:
        schedule(debounced, "tx", 1, conn=conn, debounce=Debounce("k", 30))
        conn.rollback()
        assert runs_of(store) == []
        if db_url.startswith("mariadb"):
            conn.begin()
        first = schedule(debounced, "tx", 2, conn=conn, debounce=Debounce("k", 30))
        folded = schedule(debounced, "tx", 3, conn=conn, debounce=Debounce("k", 30))
        conn.commit()
    finally:
        conn.close()
    assert folded.id == first.id and folded.debounce_calls == 2
    [run] = runs_of(store)
    assert run.args == ["tx", 3]
    assert schedule(debounced, "own", 4, database=store, debounce=Debounce("k", 30)).id == run.id


def test_schedule_async_on_a_callers_async_connection(pg_url: str) -> None:
    import asyncio

    from everystep import schedule_async

    async def client() -> tuple[Run, Run]:
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    await schedule_async(debounced, "a", 0, conn=conn, debounce=Debounce("k", 30))
                    raise RuntimeError("the handler failed")
            async with conn.transaction():
                first = await schedule_async(debounced, "a", 1, conn=conn, debounce=Debounce("k", 30))
                folded = await schedule_async(debounced, "a", 2, conn=conn, debounce=Debounce("k", 30))
            return first, folded

    first, folded = asyncio.run(client())
    assert first.id == folded.id and folded.debounce_calls == 2
    store = connect(pg_url)
    try:
        [run] = runs_of(store)
        assert run.args == ["a", 2]
    finally:
        store.close()


def test_a_callers_open_transaction_holds_the_window_until_it_commits(pg_url: str) -> None:
    """Another scheduler of the key waits for the caller's commit, then
    folds into the run that commit made (never a second window)."""
    store = connect(pg_url)
    folded: list[Run] = []
    try:
        with psycopg.connect(pg_url) as conn:
            first = schedule(debounced, "tx", 1, conn=conn, debounce=Debounce("k", 30))
            other = threading.Thread(target=lambda: folded.append(
                schedule(debounced, "other", 2, database=store, debounce=Debounce("k", 30))))
            other.start()
            other.join(timeout=0.5)
            assert other.is_alive() and folded == []  # waiting for the key's row
            conn.commit()
        other.join(timeout=30)
        assert [run.id for run in folded] == [first.id] and folded[0].debounce_calls == 2
        assert store.get_run(first.id).args == ["other", 2]
    finally:
        store.close()


def test_a_body_schedules_debounced_as_a_recorded_step(store: Store) -> None:
    from tests.support.runs import execute_run
    from tests.support import debounce_bodies
    parent = schedule(debounce_bodies.twice, database=store)
    assert execute_run(store, parent.id) == "completed"
    done = store.get_run(parent.id)
    [window] = runs_of(store, debounced.name)
    assert done.result == [window.id, window.id] and window.args == ["body", 2]
    assert store.debounce_windows([window.id])[window.id].calls == 2


# -- concurrent schedulers ------------------------------------------------------------------------

PERIOD, MAX_WAIT = 0.03, 0.1


def claimer(store: Store, stop: threading.Event) -> None:
    """Claim every due run of the hammered workflow as it comes due, so
    windows close (and new ones open) in the middle of the storm."""
    while not stop.is_set():
        store.claim("claimer", 1000, [NAME])
        time.sleep(0.002)


@pytest.mark.pooled
@pytest.mark.timeout(300)
def test_concurrent_schedulers_threads_and_processes_lose_no_call(
        db_url: str, store: Store, python: str, subprocess_env: dict[str, str]) -> None:
    threads, processes, calls = 3, 3, 60
    stop = threading.Event()
    taker = threading.Thread(target=claimer, args=(store, stop))
    taker.start()
    seen: dict[str, list[tuple[str, int, list[Any]]]] = {}
    try:
        procs = [subprocess.Popen([python, "-m", "tests.support.debounce_hammer", db_url, "k", f"p{n}", str(calls),
                                   str(PERIOD), str(MAX_WAIT)], env=subprocess_env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for n in range(processes)]

        def in_thread(n: int) -> None:
            own = connect(db_url)
            try:
                seen[f"t{n}"] = hammer(own, "k", f"t{n}", calls, PERIOD, MAX_WAIT)
            finally:
                own.close()

        workers = [threading.Thread(target=in_thread, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for n, proc in enumerate(procs):
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err[-3000:]
            seen[f"p{n}"] = [tuple(item) for item in json.loads(out.splitlines()[-1])]  # type: ignore[misc]
        for worker in workers:
            worker.join(timeout=240)
        assert len(seen) == threads + processes
        time.sleep(MAX_WAIT + 0.1)  # the last window comes due and is claimed
    finally:
        stop.set()
        taker.join(timeout=30)
    store.claim("claimer", 1000, [NAME])

    runs = runs_of(store)
    by_id = {run.id: run for run in runs}
    calls_of = store.debounce_windows(list(by_id))
    total = (threads + processes) * calls
    # No call lost, none counted twice: each run's calls numbered 1..n by
    # the calls themselves, and the numbers add up to every call made.
    returned: dict[str, list[tuple[int, list[Any]]]] = defaultdict(list)
    for worker_calls in seen.values():
        for run_id, count, args in worker_calls:
            returned[run_id].append((count, args))
    assert set(returned) == set(by_id), [store.get_run(i) for i in set(returned) ^ set(by_id)]
    assert sum(window.calls for window in calls_of.values()) == total
    for run_id, folded in returned.items():
        counts = sorted(count for count, _ in folded)
        assert counts == list(range(1, calls_of[run_id].calls + 1)), run_id
        # The last call folded in is the run's arguments.
        [last] = [args for count, args in folded if count == calls_of[run_id].calls]
        assert by_id[run_id].args == last
    # One run per window: every run was claimed, and the next one was
    # created only after it was (never two runs waiting on one key).
    assert len(runs) > 1, "the claimer never closed a window mid-storm"
    for before, after in zip(runs, runs[1:]):
        assert before.first_claimed_at is not None and before.created_at is not None
        assert after.created_at is not None and before.first_claimed_at <= after.created_at
    assert all(run.status == RUNNING for run in runs)


# -- the command line -----------------------------------------------------------------------------


def everystep(db_url: str, tmp_path: Any, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    from tests.support.cli import run_in_process
    return run_in_process(("--database", db_url, "--app", "tests.support.debounce_hammer", *args), env=env,
                          cwd=tmp_path)


def test_the_cli_folds_calls_and_shows_the_window(db_url: str, store: Store, tmp_path: Any,
                                                  subprocess_env: dict[str, str]) -> None:
    outputs = [everystep(db_url, tmp_path, subprocess_env, "schedule", NAME, json.dumps(["cli", n]),
                         "--debounce", "user:42:30:60") for n in range(3)]
    assert [out.returncode for out in outputs] == [0, 0, 0], outputs[0].stderr
    ids = {out.stdout.split()[0] for out in outputs}
    assert len(ids) == 1
    assert 'waiting for its debounce window "user:42" to be quiet (3 calls folded in)' in outputs[-1].stdout
    [run_id] = ids
    assert store.get_run(run_id).args == ["cli", 2]
    shown = everystep(db_url, tmp_path, subprocess_env, "show", run_id)
    assert "debounce   key 'user:42': 3 calls folded in" in shown.stdout
    assert 'waiting for its debounce window "user:42"' in shown.stdout
    listed = everystep(db_url, tmp_path, subprocess_env, "runs", "--status", "waiting", "--json")
    assert "(3 calls folded in)" in json.loads(listed.stdout)[0]["waiting"]


@pytest.mark.parametrize(("value", "message"), [
    ("k:0", "debounce period must be a positive number of seconds"),
    ("k:-1", "debounce period must be a positive number of seconds"),
    ("k:5:2", "debounce max_wait (2 s) must not be shorter than its period (5 s)"),
    ("k", "give KEY:PERIOD[:MAX]"),
    ("k:soon", "give KEY:PERIOD[:MAX]"),
    (":5", "debounce key must be a non-empty string"),
    ("k:5 --in 10s", "it cannot be combined with --at or --in"),
    ("k:5 --idempotency-key x", "--debounce cannot be combined with --idempotency-key"),
    ("k:5 --count 2", "it cannot be combined with --count"),
])
def test_the_cli_refuses_bad_windows_in_one_line_writing_nothing(
        db_url: str, store: Store, tmp_path: Any, subprocess_env: dict[str, str], value: str, message: str) -> None:
    out = everystep(db_url, tmp_path, subprocess_env, "schedule", NAME, '["cli", 1]', "--debounce", *value.split())
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and out.stdout == "" and len(lines) == 1, out
    assert lines[0].startswith("everystep: error: ") and message in lines[0]
    assert runs_of(store) == []


# -- the console ----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_the_console_shows_a_run_waiting_for_its_window(db_url: str, store: Store) -> None:
    from tests.support.console import serve
    for n in range(4):
        run = schedule(debounced, "web", n, database=store, debounce=Debounce("burst", 60))
    for console in serve(db_url, app_modules="tests.support.debounce_hammer"):
        with console.client() as client:
            client.load_page()
            page = client.get(f"/api/runs/{run.id}").json()
            assert page["run"]["waiting"].startswith('waiting for its debounce window "burst" to be quiet '
                                                     '(4 calls folded in) until ')
            assert page["run"]["args"] == ["web", 3]
            listed = client.get("/api/runs?status=waiting").json()
            [row] = [item for item in listed["runs"] if item["id"] == run.id]
            assert "(4 calls folded in)" in row["waiting"]
