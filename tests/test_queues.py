"""Queues and flow control, claim by claim, on every backend: placement,
priorities, the limits the claim enforces (concurrency, per key, rate),
pause, the queues a runner serves, fairness between queues, and the upgrade
of a database that recorded version 7 as a placeholder."""

from __future__ import annotations

import dataclasses
import itertools
import json
import datetime as dt
import sqlite3
import threading
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from everystep import schedule, workflow
from everystep.errors import EverystepError
from everystep.models import COMPLETED, RUNNING, SCHEDULED
from everystep.queues import Placement, QueueSettings, parse_queue_list, parse_rate
from everystep.store import Store, connect, migrations, utcnow
from tests.apps import queued
from tests.support.pgserver import PgServer


@workflow(name="queues.job")
def job(n: int = 0) -> int:
    return n


@workflow(name="queues.heavy", queue="heavy", priority=3)
def heavy() -> str:
    return "ok"


NAMES = [job.name, heavy.name]


def limit(store: Store, queue: str, **settings: Any) -> None:
    store.update_queue(queue, lambda current: dataclasses.replace(current, **settings))


def claim(store: Store, n: int = 100, queues: list[str] | None = None, claimer: str = "tester") -> list[Any]:
    return store.claim(claimer, n, NAMES, queues)


def finish(store: Store, run: Any) -> None:
    assert store.finish_run(run.claim, COMPLETED, "null")


# -- placement -------------------------------------------------------------------------------


def test_runs_go_to_the_workflows_queue_unless_schedule_says_otherwise(store: Store) -> None:
    plain = schedule(job, database=store)
    declared = schedule(heavy, database=store)
    moved = schedule(heavy, database=store, queue="other", priority=-2, concurrency_key="acct-1")
    by_name = schedule("queues.heavy", database=store)
    assert (plain.queue, plain.priority, plain.concurrency_key) == ("default", 0, None)
    assert (declared.queue, declared.priority) == ("heavy", 3)
    assert (moved.queue, moved.priority, moved.concurrency_key) == ("other", -2, "acct-1")
    assert (by_name.queue, by_name.priority) == ("heavy", 3)
    assert store.get_run(moved.id).to_dict()["concurrency_key"] == "acct-1"


@pytest.mark.parametrize("options, message", [
    ({"queue": ""}, "must not be empty"),
    ({"queue": "a b"}, "bad queue name"),
    ({"priority": 1.5}, "priority must be an integer"),
    ({"priority": 2**40}, "priority must be an integer"),
    ({"concurrency_key": ""}, "concurrency_key must be"),
])
def test_bad_placements_are_refused_before_anything_is_written(store: Store, options: dict[str, Any],
                                                                message: str) -> None:
    with pytest.raises(EverystepError, match=message):
        schedule(job, database=store, **options)
    assert store.list_runs() == []


def test_rates_and_queue_lists_parse_or_say_why_not() -> None:
    assert parse_rate("100/60s") == (100, 60.0)
    assert parse_rate("10/s") == (10, 1.0)
    assert parse_rate("5/2m") == (5, 120.0)
    assert parse_rate("1/500ms") == (1, 0.5)
    for bad in ("", "10", "0/s", "x/s", "10/0s", "10/3d"):
        with pytest.raises(EverystepError):
            parse_rate(bad)
    assert parse_queue_list("reports, default,reports") == ["reports", "default"]
    for bad in ("", "a,,b", ",", "a b"):
        with pytest.raises(EverystepError):
            parse_queue_list(bad)


# -- order -----------------------------------------------------------------------------------


def test_a_larger_priority_is_claimed_first_then_the_oldest(store: Store) -> None:
    low = [schedule(job, i, database=store, priority=1).id for i in range(2)]
    high = [schedule(job, i, database=store, priority=9).id for i in range(2)]
    middle = schedule(job, database=store).id
    order = [claim(store, 1)[0].id for _ in range(5)]
    assert order == high + low + [middle]
    assert claim(store, 1) == []


def test_a_batch_comes_back_highest_priority_first(store: Store) -> None:
    first = schedule(job, database=store).id
    urgent = schedule(job, database=store, priority=7).id
    assert [run.id for run in claim(store, 10)] == [urgent, first]


# -- limits ----------------------------------------------------------------------------------


def test_concurrency_counts_running_runs_and_frees_a_slot_when_one_ends(store: Store) -> None:
    limit(store, "default", concurrency=2)
    ids = [schedule(job, i, database=store).id for i in range(5)]
    first = claim(store)
    assert [run.id for run in first] == ids[:2]
    assert claim(store) == []
    finish(store, first[0])
    assert [run.id for run in claim(store)] == [ids[2]]
    assert claim(store) == []


def test_a_released_run_waiting_to_wake_counts_against_no_limit(store: Store) -> None:
    limit(store, "default", concurrency=1)
    sleeper = schedule(job, database=store).id
    other = schedule(job, database=store).id
    [running] = claim(store)
    assert running.id == sleeper
    assert store.release(running.claim, utcnow() + dt.timedelta(hours=1))
    assert [run.id for run in claim(store)] == [other]


def test_key_concurrency_allows_one_run_per_key_and_keyless_runs_freely(store: Store) -> None:
    limit(store, "default", key_concurrency=1)
    keyed = {key: [schedule(job, database=store, concurrency_key=key).id for _ in range(4)]
             for key in ("a", "b", "c")}
    keyless = schedule(job, database=store).id
    got = claim(store)
    assert sorted(run.id for run in got) == sorted([keyed["a"][0], keyed["b"][0], keyed["c"][0], keyless])
    assert claim(store) == []
    finish(store, next(run for run in got if run.concurrency_key == "b"))
    assert [run.id for run in claim(store)] == [keyed["b"][1]]


def test_key_concurrency_and_concurrency_together(store: Store) -> None:
    limit(store, "default", concurrency=2, key_concurrency=2)
    for key in ("a", "b"):
        for _ in range(3):
            schedule(job, database=store, concurrency_key=key)
    assert len(claim(store)) == 2
    assert claim(store) == []


def test_the_rate_caps_claims_in_any_window_of_its_period(store: Store) -> None:
    limit(store, "default", rate_limit=3, rate_period=3600.0)
    for i in range(5):
        schedule(job, i, database=store)
    got = claim(store, 2)
    assert len(got) == 2
    assert len(claim(store, 10)) == 1
    # Ending runs frees no claims: the window still holds three.
    for run in got:
        finish(store, run)
    assert claim(store, 10) == []
    # Claims older than the window no longer count.
    limit(store, "default", rate_period=0.01)
    time.sleep(0.05)
    assert len(claim(store, 10)) == 2


def test_a_paused_queue_is_skipped_and_resumes(store: Store) -> None:
    held = [schedule(heavy, database=store).id for _ in range(3)]
    free = schedule(job, database=store).id
    limit(store, "heavy", paused=True)
    assert [run.id for run in claim(store)] == [free]
    assert claim(store) == []
    assert store.next_due(NAMES) is None
    limit(store, "heavy", paused=False)
    assert sorted(run.id for run in claim(store)) == sorted(held)


def test_limits_set_while_runs_wait_apply_from_the_next_claim(store: Store) -> None:
    """Claims from queues without limits take PostgreSQL's fast path; a
    limit or a pause set after runs were scheduled and claimed that way
    holds from the very next claim, whether the claimer serves every queue,
    several or one."""
    ids = [schedule(job, i, database=store).id for i in range(8)]
    for served in (None, ["default", "other"], ["default"]):
        assert claim(store, 1, queues=served)[0].id == ids.pop(0)
    # Three running: a concurrency of 4 leaves one slot.
    limit(store, "default", concurrency=4)
    assert [run.id for run in claim(store, 10)] == [ids.pop(0)]
    for served in (None, ["default", "other"], ["default"]):
        assert claim(store, 10, queues=served) == []
    limit(store, "default", concurrency=None, paused=True)
    for served in (None, ["default", "other"], ["default"]):
        assert claim(store, 10, queues=served) == []
    limit(store, "default", paused=False, rate_limit=1, rate_period=3600.0)
    assert [run.id for run in claim(store, 10, queues=["default"])] == [ids.pop(0)]
    assert claim(store, 10) == []
    # A row left with no limit and no pause is a queue without limits again.
    limit(store, "default", rate_limit=None, rate_period=None)
    assert [run.id for run in claim(store, 10)] == ids


def test_a_key_limit_set_while_keyed_runs_wait_applies_from_the_next_claim(store: Store) -> None:
    for key in ("a", "b"):
        for _ in range(3):
            schedule(job, database=store, concurrency_key=key)
    assert [run.concurrency_key for run in claim(store, 1)] == ["a"]
    limit(store, "default", key_concurrency=1)
    assert [run.concurrency_key for run in claim(store, 10)] == ["b"]
    assert claim(store, 10) == []


def test_a_paused_queue_among_queues_without_limits_is_never_claimed(store: Store) -> None:
    for queue in ("a", "b", "c"):
        for i in range(20):
            schedule(job, i, database=store, queue=queue)
    assert len(claim(store, 3)) == 3
    limit(store, "b", paused=True)
    for served in (None, ["a", "b", "c"], ["b", "c"]):
        got = [claim(store, 1, queues=served)[0].queue for _ in range(4)]
        assert "b" not in got and got
    assert claim(store, 10, queues=["b"]) == []
    rest = claim(store, 100)
    assert {run.queue for run in rest} == {"a", "c"} and len(rest) == 40 - 2 - 12
    limit(store, "b", paused=False)
    assert len(claim(store, 100)) == 19


def test_a_batch_across_queues_without_limits_keeps_shares_and_priorities(store: Store) -> None:
    """The fast path's shares and second round: a batch of ten over four
    queues gives each about a quarter, the short queue's unused share goes
    to the others, and each queue's runs come highest priority first, its
    sleeping run of a higher priority skipped."""
    for queue in ("a", "b", "c"):
        schedule(job, database=store, queue=queue, priority=5, delay=3600)
        for i in range(4):
            schedule(job, i, database=store, queue=queue, priority=i % 2)
    schedule(job, database=store, queue="short")
    got = claim(store, 10)
    assert len(got) == 10
    assert [run.queue for run in got].count("short") == 1
    for queue in ("a", "b", "c"):
        priorities = [run.priority for run in got if run.queue == queue]
        assert priorities == [1, 1, 0, 0][:len(priorities)] and len(priorities) >= 2
    assert sorted(run.priority for run in claim(store, 10)) == [0, 0, 0]


def test_pausing_leaves_running_runs_running(store: Store) -> None:
    schedule(heavy, database=store)
    [run] = claim(store)
    limit(store, "heavy", paused=True)
    assert store.get_run(run.id).status == RUNNING
    finish(store, run)
    assert store.get_run(run.id).status == COMPLETED


# -- which queues, and fairness ----------------------------------------------------------------


def test_a_runner_claims_only_from_the_queues_it_serves(store: Store) -> None:
    in_default = schedule(job, database=store).id
    in_heavy = schedule(heavy, database=store).id
    assert [run.id for run in claim(store, queues=["heavy"])] == [in_heavy]
    assert claim(store, queues=["heavy", "nothing-here"]) == []
    assert claim(store, queues=[]) == []
    assert [run.id for run in claim(store, queues=["default"])] == [in_default]


def test_a_full_or_limited_queue_never_stalls_the_others(store: Store) -> None:
    limit(store, "blocked-by-limit", concurrency=0)
    limit(store, "paused", paused=True)
    for queue in ("blocked-by-limit", "paused"):
        for _ in range(200):
            schedule(job, database=store, queue=queue, priority=9)
    for _ in range(200):
        schedule(heavy, database=store)  # a busy queue of higher priority
    lone = schedule(job, database=store).id
    # A claim of two gives each queue with due runs its share.
    got = claim(store, 2)
    assert sorted(run.queue for run in got) == ["default", "heavy"]
    assert lone in [run.id for run in got]
    claimed_from = {row.queue for row in store.list_runs(status=RUNNING, limit=1000)}
    assert claimed_from == {"heavy", "default"}


def test_a_lone_slot_goes_to_every_queue_in_turn(store: Store) -> None:
    for queue in ("a", "b", "c"):
        for _ in range(30):
            schedule(job, database=store, queue=queue)
    seen = {claim(store, 1)[0].queue for _ in range(30)}
    assert seen == {"a", "b", "c"}


def test_a_short_queue_leaves_its_share_to_the_others(store: Store) -> None:
    schedule(job, database=store, queue="short")
    for _ in range(10):
        schedule(job, database=store, queue="long")
    assert len(claim(store, 6)) == 6


def test_next_due_times_only_the_served_queues(store: Store) -> None:
    schedule(job, database=store, queue="soon", delay=30)
    schedule(job, database=store, queue="later", delay=3000)
    assert 25 < (store.next_due(NAMES) or 0) <= 30.1
    assert 2900 < (store.next_due(NAMES, ["later"]) or 0) <= 3000.1
    assert store.next_due(NAMES, ["elsewhere"]) is None


def test_queues_lists_counts_limits_and_pause(store: Store) -> None:
    limit(store, "heavy", concurrency=4, key_concurrency=1, rate_limit=100, rate_period=60.0, paused=True)
    for _ in range(2):
        schedule(job, database=store)
    schedule(job, database=store, delay=3600)
    [run] = claim(store, 1, queues=["default"])
    found = {queue.name: queue for queue in store.queues()}
    assert set(found) == {"default", "heavy"}
    assert (found["default"].pending, found["default"].waiting, found["default"].running) == (1, 1, 1)
    assert found["default"].scheduled == 2 and found["default"].oldest_pending_age_seconds >= 0
    assert found["heavy"].settings == QueueSettings("heavy", 4, 1, 100, 60.0, True)
    assert found["heavy"].to_dict()["paused"] is True


# -- concurrent claimers (threads, each with its own connection) --------------------------------


def test_concurrent_claimers_never_pass_the_limit_together(store: Store, db_url: str) -> None:
    limit(store, "default", concurrency=3, key_concurrency=2)
    for i in range(60):
        schedule(job, i, database=store, concurrency_key=f"k{i % 2}")
    peak = []
    errors: list[BaseException] = []

    def claimer(index: int) -> None:
        own = connect(db_url)
        try:
            for _ in range(30):
                for run in own.claim(f"c{index}", 2, NAMES):
                    running = own.list_runs(status=RUNNING, limit=100)
                    peak.append((len(running), max(sum(1 for r in running if r.concurrency_key == key)
                                                   for key in ("k0", "k1"))))
                    own.finish_run(run.claim, COMPLETED, "null")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert peak and max(total for total, _ in peak) <= 3 and max(per_key for _, per_key in peak) <= 2


# -- the upgrade over the placeholder ------------------------------------------------------------


#: The versions written after the release that recorded 7 as a placeholder.
LATER = [m for m in migrations.available("postgres") if m.version > 8]


def _apply_as_of_the_placeholder(execute: Any, backend: str, record: Any) -> None:
    """The schema of the release that recorded 7 as its placeholder: every
    version up to 8 but 7."""
    for migration in migrations.available(backend):
        if migration.version > 8:
            break
        if migration.version == 7:
            record(7, migrations.PLACEHOLDER)
            continue
        for statement in migration.statements():
            execute(statement)
        record(migration.version, migration.name)


def test_a_sqlite_database_that_recorded_7_as_reserved_gets_the_queues(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE everystep_migration (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                 "applied_at TEXT NOT NULL)")
    _apply_as_of_the_placeholder(conn.execute, "sqlite", lambda version, name: conn.execute(
        "INSERT INTO everystep_migration VALUES (?, ?, '2024-01-01')", (version, name)))
    conn.execute("INSERT INTO everystep_workflow (id, name, args, status, created_at) VALUES "
                 "('01a2aaaa-0000-7000-8000-000000000001', 'queues.job', '[]', 'scheduled', "
                 "'2024-01-01T00:00:00+00:00')")
    conn.close()
    store = connect(f"sqlite:///{path}")  # migrates itself
    try:
        assert store.migrate() == []
        assert store.get_run("01a2aaaa-0000-7000-8000-000000000001").queue == "default"
        limit(store, "default", concurrency=1)
        assert len(claim(store)) == 1
    finally:
        store.close()
    with sqlite3.connect(path) as check:
        assert check.execute("SELECT name FROM everystep_migration WHERE version = 7").fetchone()[0] == "queues"


def test_a_postgres_database_that_recorded_7_as_reserved_gets_the_queues(pg_server: Any) -> None:
    url = pg_server.create_database()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE everystep_migration (version integer PRIMARY KEY, name text NOT NULL, "
                         "applied_at timestamptz NOT NULL)")
            _apply_as_of_the_placeholder(conn.execute, "postgres", lambda version, name: conn.execute(
                "INSERT INTO everystep_migration VALUES (%s, %s, now())", (version, name)))
        store = connect(url)
        try:
            assert store.migrate() == ["0007_queues"] + [f"{m.version:04d}_{m.name}" for m in LATER]
            assert store.migrate() == []
            schedule(job, database=store)
            limit(store, "default", concurrency=1)
            assert len(claim(store)) == 1
        finally:
            store.close()
    finally:
        pg_server.drop_database(url)


def test_a_mariadb_database_that_recorded_7_as_reserved_gets_the_queues(mariadb_server: Any) -> None:
    import pymysql

    from everystep.store.mariadb import connect_args

    url = mariadb_server.create_database()
    try:
        with pymysql.connect(**connect_args(url), autocommit=True) as conn, conn.cursor() as cursor:
            cursor.execute("CREATE TABLE everystep_migration (version INT PRIMARY KEY, name VARCHAR(255) NOT NULL, "
                           "applied_at DATETIME(6) NOT NULL)")
            _apply_as_of_the_placeholder(cursor.execute, "mariadb", lambda version, name: cursor.execute(
                "INSERT INTO everystep_migration VALUES (%s, %s, UTC_TIMESTAMP(6))", (version, name)))
            cursor.execute("INSERT INTO everystep_workflow (id, name, args, status, created_at) VALUES "
                           "('01a2aaaa-0000-7000-8000-000000000001', 'queues.job', '[]', 'scheduled', "
                           "UTC_TIMESTAMP(6))")
        store = connect(url)
        try:
            assert store.migrate() == ["0007_queues"] + [f"{m.version:04d}_{m.name}" for m in LATER]
            assert store.migrate() == []
            assert store.get_run("01a2aaaa-0000-7000-8000-000000000001").queue == "default"
            schedule(job, database=store)
            limit(store, "default", concurrency=1)
            assert len(claim(store)) == 1
        finally:
            store.close()
        with pymysql.connect(**connect_args(url)) as conn, conn.cursor() as cursor:
            cursor.execute("SELECT name FROM everystep_migration WHERE version = 7")
            assert cursor.fetchone() == ("queues",)
    finally:
        mariadb_server.drop_database(url)


# -- metrics -------------------------------------------------------------------------------------


def test_queue_gauges_are_labelled_by_queue_and_zeroed_when_a_queue_empties(store: Store) -> None:
    from prometheus_client import REGISTRY

    from everystep import metrics

    def sample(name: str, queue: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"queue": queue})

    limit(store, "heavy", paused=True)
    schedule(heavy, database=store)
    for _ in range(2):
        schedule(job, database=store, queue="gauged")
    metrics.refresh_queue_gauges(store)
    assert sample("everystep_queue_pending", "gauged") == 2
    assert sample("everystep_queue_pending", "heavy") == 1
    assert sample("everystep_queue_paused", "heavy") == 1
    assert sample("everystep_queue_paused", "gauged") == 0
    for run in claim(store, queues=["gauged"]):
        finish(store, run)
    metrics.refresh_queue_gauges(store)
    assert sample("everystep_queue_pending", "gauged") == 0
    assert sample("everystep_queue_running", "gauged") == 0


# -- the commands ------------------------------------------------------------------------------


def run_cli(capsys: Any, *argv: str) -> tuple[int, str, str]:
    from everystep.cli import main

    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_queue_commands_set_pause_resume_and_list(store: Store, db_url: str, capsys: Any) -> None:
    code, out, _ = run_cli(capsys, "queue", "set", "reports", "--concurrency", "4", "--key-concurrency", "1",
                           "--rate", "100/60s", "--create", "--database", db_url)
    assert code == 0 and "concurrency 4, per key 1, rate 100/60s" in out
    assert run_cli(capsys, "queue", "--database", db_url, "pause", "reports")[0] == 0
    code, out, _ = run_cli(capsys, "queue", "set", "reports", "--rate", "none", "--database", db_url)
    assert code == 0 and "rate unlimited" in out and "paused" in out
    schedule(job, database=store, queue="reports")
    code, out, _ = run_cli(capsys, "queues", "--database", db_url, "--json")
    [reports] = json.loads(out)
    assert (reports["queue"], reports["scheduled"], reports["concurrency"], reports["rate_limit"],
            reports["paused"]) == ("reports", 1, 4, None, True)
    assert run_cli(capsys, "queue", "resume", "reports", "--database", db_url)[0] == 0
    code, out, _ = run_cli(capsys, "queues", "--database", db_url)
    assert code == 0 and out.splitlines()[0].split()[:4] == ["QUEUE", "SCHEDULED", "RUNNING", "BLOCKED"]
    assert out.splitlines()[1].split()[:2] == ["reports", "1"] and " no " in out


@pytest.mark.parametrize("argv, message", [
    (["queue", "set", "reports"], "needs --concurrency"),
    (["queue", "set", "reports", "--rate", "5/x"], "is not COUNT/PERIOD"),
    (["queue", "set", "reports", "--concurrency", "-1"], "out of range"),
    (["queue", "set", "reports", "--key-concurrency", "0"], "out of range"),
    (["queue", "pause", ""], "must not be empty"),
    (["queue", "pause", "a b"], "bad queue name"),
    (["worker", "--queues", "a,,b"], "empty queue name"),
    (["schedule", "queues.job", "--queue", ""], "must not be empty"),
])
def test_bad_queue_input_is_one_line_and_exit_2(db_url: str, capsys: Any, argv: list[str], message: str) -> None:
    code, _, err = run_cli(capsys, *argv, "--database", db_url)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_the_supervisor_refuses_an_empty_queue_name(capsys: Any) -> None:
    from supervisor.cli import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--queues", "reports,"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "empty queue name" in err and len(err.strip().splitlines()) == 1
    assert build_parser().parse_args(["--queues", "reports,default"]).queues == ["reports", "default"]


def test_schedule_command_places_runs(store: Store, db_url: str, capsys: Any) -> None:
    code, out, _ = run_cli(capsys, "schedule", "queues.heavy", "--database", db_url, "--priority", "8",
                           "--concurrency-key", "acct")
    assert code == 0
    run = store.get_run(out.strip())
    assert (run.queue, run.priority, run.concurrency_key) == ("heavy", 8, "acct")
    code, out, _ = run_cli(capsys, "show", run.id, "--database", db_url)
    assert "queue      heavy (priority 8, concurrency key acct)" in out


# -- an unserved backlog costs a claim nothing ------------------------------------------------


BACKLOG = 20_000
# What one claim may read of the runs table's indexes, at most: 1 % of the
# backlog it must not read. A claim reads a few dozen entries (its probes,
# and the primary key twice per run taken: the lock, then the update), plus
# the dead versions the claims and requeues before it in the same loop left
# behind (at most 2 per run taken per claim, in each index) when the server
# has not yet marked them dead; reading the backlog reads 20,000 per claim.
READ_PER_CLAIM = BACKLOG // 100
PLAN_MODES = ("force_custom_plan", "force_generic_plan")


def index_reads(store: Store) -> dict[str, int]:
    """Index entries read so far from each index of the runs table.

    The store's own session flushes its statistics first: PostgreSQL does it
    before it answers (ReadyForQuery), so every entry this store's claims
    read is counted, and only then, whatever the machine's load. Only this
    store's session touches the runs table while a test measures; a session
    that closed before flushing would report its reads whenever its backend
    exits, inside some later window (the flake this replaced)."""
    with store.connection() as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
    with store.connection() as conn:
        rows = conn.execute("SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes "
                            "WHERE relname = 'everystep_workflow'").fetchall()
    return {row["indexrelname"]: int(row["idx_tup_read"]) for row in rows}


def reads_since(store: Store, before: dict[str, int]) -> dict[str, int]:
    """The entries each index read since ``before``, by this store's session."""
    return {name: count - before[name] for name, count in index_reads(store).items() if count > before[name]}


def end_session(store: Store) -> None:
    """Close the store's session with nothing left to report: a closed
    session's backend flushes its pending statistics as it exits, at a
    moment nobody controls, so they are flushed first."""
    index_reads(store)
    store.close()


def pin_plans(store: Store, mode: str) -> None:
    """Make the session plan the claim's statements one way: PostgreSQL
    switches a cached statement to a generic plan after five executions
    when its costs say so, and a bound must hold on both plans."""
    with store.connection() as conn:
        conn.execute(f"SET plan_cache_mode = {mode}")


@pytest.fixture
def quiet_runs_table(pg_url: str) -> Iterator[str]:
    """The runs table without autovacuum, whose ANALYZE would re-plan the
    claim in the middle of a measurement; statistics are made by the test."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE everystep_workflow SET (autovacuum_enabled = false)")
    try:
        yield pg_url
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE everystep_workflow RESET (autovacuum_enabled)")


def test_a_backlog_in_paused_unserved_or_limited_queues_costs_a_postgres_claim_a_few_index_entries(
        quiet_runs_table: str) -> None:
    """20,000 due runs wait in each of a paused queue, a queue at its limit
    and a queue this claimer does not serve; five due runs of a served
    queue are claimed reading a handful of index entries (the server's
    statistics), not the backlog, on either plan."""
    pg_url = quiet_runs_table
    store = connect(pg_url)
    try:
        limit(store, "paused", paused=True)
        limit(store, "full", concurrency=0)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for queue in ("paused", "full", "elsewhere"):
                conn.execute(
                    "INSERT INTO everystep_workflow (id, name, args, status, created_at, queue) "
                    "SELECT gen_random_uuid(), %s, '[0]', 'scheduled', clock_timestamp() - interval '1 hour', %s "
                    "FROM generate_series(1, %s)", (job.name, queue, BACKLOG))
            conn.execute("VACUUM ANALYZE everystep_workflow")
        due = sorted(schedule(job, database=store, queue="served").id for _ in range(5))

        for queues in (["served", "paused", "full"], None):
            if queues is None:  # every queue served: the unserved one goes
                with psycopg.connect(pg_url, autocommit=True) as conn:
                    conn.execute("DELETE FROM everystep_workflow WHERE queue = 'elsewhere'")
                    conn.execute("VACUUM ANALYZE everystep_workflow")  # no dead index entries left to step over
            for mode in PLAN_MODES:
                pin_plans(store, mode)
                before = index_reads(store)
                claimed = store.claim("tester", 10, NAMES, queues)
                read = reads_since(store, before)
                assert sorted(run.id for run in claimed) == due
                assert read.get("everystep_workflow_pkey"), (queues, mode, read)  # the claim was counted
                assert sum(read.values()) <= READ_PER_CLAIM, (queues, mode, read)
                for run in claimed:
                    store.requeue(run.claim)
                end_session(store)  # the next plan mode is planned afresh
    finally:
        store.close()


def test_sleeping_runs_of_a_higher_priority_cost_a_postgres_claim_a_few_index_entries(
        quiet_runs_table: str) -> None:
    """20,000 runs of a higher priority sleeping in the served queues cost a
    claim a few index entries (the priority walk steps over them), in a
    claim of a few runs and in a claim of one, in one queue or in several,
    with the queues given or found, on the fast path for queues without
    limits and, once the queue has a limit, on the general one, with the
    claim's statements planned for their parameters and planned generically."""
    pg_url = quiet_runs_table
    store = connect(pg_url)
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for queue in ("served", "other"):
                conn.execute(
                    "INSERT INTO everystep_workflow (id, name, args, status, created_at, queue, priority, not_before) "
                    "SELECT gen_random_uuid(), %s, '[0]', 'scheduled', clock_timestamp() - interval '1 hour', %s, 9, "
                    "clock_timestamp() + interval '1 hour' FROM generate_series(1, %s)", (job.name, queue, BACKLOG // 2))
            conn.execute("VACUUM ANALYZE everystep_workflow")
        due = [schedule(job, database=store, queue="served", priority=p).id for p in (1, 0, 0)]

        shapes = [(["served"], 10), (None, 10), (["served", "other"], 1), (None, 1)]
        for limited in (False, True):
            if limited:
                limit(store, "served", concurrency=1000)
            for (queues, batch), mode in itertools.product(shapes, PLAN_MODES):
                pin_plans(store, mode)
                before = index_reads(store)
                for _ in range(8):  # on one connection, as a runner's claims
                    claimed = store.claim("tester", batch, NAMES, queues)
                    assert [run.id for run in claimed] == due[:batch]
                    for run in claimed:
                        store.requeue(run.claim)
                read = reads_since(store, before)
                end_session(store)  # the next shape is planned afresh
                assert sum(read.values()) <= 8 * READ_PER_CLAIM, (limited, queues, batch, mode, read)
    finally:
        store.close()


def test_runs_nobody_serves_ahead_in_a_served_queue_cost_a_postgres_claim_a_few_index_entries(
        quiet_runs_table: str) -> None:
    """20,000 due runs of a workflow this claimer does not serve wait in its
    own queue and priority, older than its runs: a claim reads a few index
    entries, not them, with few served names (one probe each) and with many
    (the names holding runs are visited instead), in one queue or all, on
    the fast path and, once the queue has a limit, on the general one, on
    either plan."""
    pg_url = quiet_runs_table
    store = connect(pg_url)
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO everystep_workflow (id, name, args, status, created_at, queue) "
                "SELECT gen_random_uuid(), 'another.app.job', '[0]', 'scheduled', "
                "clock_timestamp() - interval '1 hour', 'served' FROM generate_series(1, %s)", (BACKLOG,))
            conn.execute("VACUUM ANALYZE everystep_workflow")
        due = sorted(schedule(job, database=store, queue="served").id for _ in range(3))
        many = NAMES + [f"queues.unused{i}" for i in range(8)]

        shapes = ((NAMES, ["served"], 10), (many, ["served"], 10), (NAMES, None, 1), (many, None, 2))
        for limited in (False, True):
            if limited:
                limit(store, "served", concurrency=1000)
            for (names, queues, batch), mode in itertools.product(shapes, PLAN_MODES):
                pin_plans(store, mode)
                before = index_reads(store)
                for _ in range(8):  # on one connection, as a runner's claims
                    claimed = store.claim("tester", batch, names, queues)
                    assert len(claimed) == min(batch, 3) and {run.id for run in claimed} <= set(due)
                    for run in claimed:
                        store.requeue(run.claim)
                read = reads_since(store, before)
                end_session(store)  # the next shape is planned afresh
                assert sum(read.values()) <= 8 * READ_PER_CLAIM, (limited, len(names), queues, batch, mode, read)
    finally:
        store.close()


@pytest.mark.parametrize("limited", [False, True], ids=["fast-path", "limited-queue"])
def test_claim_plans_made_on_a_new_database_still_read_a_few_index_entries_of_a_backlog(
        pg_server: PgServer, limited: bool) -> None:
    """A runner's session plans the claim once, generically, and keeps the
    plan. Made on a new database (no statistics yet, a few runs), the plan
    must still walk the claim index: one through the status index reads
    every scheduled run on every claim, so a backlog that arrives later is
    drained in quadratic time, until an ANALYZE happens to re-plan it."""
    pg_url = pg_server.create_database()
    store = connect(pg_url)
    try:
        store.migrate()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE everystep_workflow SET (autovacuum_enabled = false)")  # nothing re-plans it
        if limited:
            limit(store, "default", concurrency=1000)
        first = [schedule(job, database=store).id for _ in range(200)]
        assert [run.id for run in store.claim("tester", 1, NAMES)] == first[:1]  # the session's plans are made

        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO everystep_workflow (id, name, args, status, created_at) "
                "SELECT gen_random_uuid(), %s, '[0]', 'scheduled', clock_timestamp() - interval '1 hour' "
                "FROM generate_series(1, %s)", (job.name, BACKLOG))
        before = index_reads(store)
        for _ in range(8):  # on the same session, as a runner's claims
            assert len(store.claim("tester", 1, NAMES)) == 1
        read = reads_since(store, before)
        assert sum(read.values()) <= 8 * READ_PER_CLAIM, read
    finally:
        store.close()
        pg_server.drop_database(pg_url)


@pytest.mark.parametrize("limited", [False, True], ids=["fast-path", "limited-queue"])
def test_a_postgres_claim_fills_its_batch_past_runs_another_claimer_holds(pg_url: str, limited: bool) -> None:
    """The oldest due runs are locked by another transaction (a claimer in
    the middle of its claim): the claim skips them and still takes its whole
    batch from the runs behind, oldest first, without waiting."""
    store = connect(pg_url)
    try:
        if limited:
            limit(store, "served", concurrency=1000)
        runs = [schedule(job, n, database=store, queue="served").id for n in range(6)]
        with psycopg.connect(pg_url) as holder:
            holder.execute("SELECT id FROM everystep_workflow WHERE id = ANY(%s::uuid[]) FOR UPDATE",
                           (runs[:2],))
            claimed = store.claim("tester", 3, NAMES, ["served"])
            assert [run.id for run in claimed] == runs[2:5]
            holder.rollback()
        assert [run.id for run in store.claim("tester", 3, NAMES, ["served"])] == [runs[0], runs[1], runs[5]]
    finally:
        store.close()


def test_a_backlog_in_paused_unserved_or_limited_queues_costs_a_mariadb_claim_a_few_index_entries(
        mariadb_url: str) -> None:
    """The same on MariaDB, counted by the server's handler statistics of
    the claim's own session: the queues holding scheduled runs are found by
    one probe of the claim index per queue, each served queue is read one
    priority at a time."""
    store = connect(mariadb_url)
    try:
        limit(store, "paused", paused=True)
        limit(store, "full", concurrency=0)
        with store.connection() as conn:
            for queue in ("paused", "full", "elsewhere"):
                conn.execute(
                    "INSERT INTO everystep_workflow (id, name, args, status, created_at, queue) "
                    "SELECT UUID(), %(name)s, '[0]', 'scheduled', UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, %(queue)s "
                    "FROM seq_1_to_20000", {"name": job.name, "queue": queue})
            conn.execute("ANALYZE TABLE everystep_workflow")
        due = sorted(schedule(job, database=store, queue="served").id for _ in range(5))

        def index_entries_read() -> int:
            with store.connection() as conn:
                rows = conn.execute("SHOW SESSION STATUS LIKE 'Handler_read%%'").fetchall()
            return sum(int(row["Value"]) for row in rows
                       if row["Variable_name"] in ("Handler_read_key", "Handler_read_next", "Handler_read_prev",
                                                   "Handler_read_first", "Handler_read_last"))

        for queues in (["served", "paused", "full"], None):
            if queues is None:  # every queue served: the unserved one goes
                with store.connection() as conn:
                    conn.execute("DELETE FROM everystep_workflow WHERE queue = 'elsewhere'")
            before = index_entries_read()
            claimed = store.claim("tester", 10, NAMES, queues)
            read = index_entries_read() - before
            assert sorted(run.id for run in claimed) == due
            assert read <= 60, (queues, read)
            for run in claimed:
                store.requeue(run.claim)
    finally:
        store.close()


def test_a_run_scheduled_in_the_callers_transaction_keeps_its_placement(store: Store, db_url: str) -> None:
    if store.backend == "sqlite":
        conn: Any = sqlite3.connect(db_url.removeprefix("sqlite:///"))
    elif store.backend == "mariadb":
        import pymysql

        from everystep.store.mariadb import connect_args

        conn = pymysql.connect(**connect_args(db_url))
    else:
        conn = psycopg.connect(db_url)
    try:
        run = schedule(heavy, conn=conn, priority=4, concurrency_key="acct-9")
        conn.commit()
    finally:
        conn.close()
    stored = store.get_run(run.id)
    assert (stored.queue, stored.priority, stored.concurrency_key) == ("heavy", 4, "acct-9")


# -- the console -------------------------------------------------------------------------------


def test_the_console_filters_runs_by_queue_and_shows_it(store: Store) -> None:
    from everystep.web.views import BadRequest, Views

    heavy_ids = {schedule(heavy, database=store).id for _ in range(2)}
    schedule(job, database=store)
    views = Views(store)
    data = views.runs({"queue": "heavy"}, with_counts=False)
    assert {run["id"] for run in data["runs"]} == heavy_ids and data["filter"]["queue"] == "heavy"
    assert {run["queue"] for run in data["runs"]} == {"heavy"}
    assert len(views.runs({"queue": "heavy", "status": SCHEDULED}, with_counts=False)["runs"]) == 2
    assert len(views.runs({}, with_counts=False)["runs"]) == 3
    assert any(item["name"] == "queue" for item in views.meta()["filters"])
    with pytest.raises(BadRequest, match="bad queue name"):
        views.runs({"queue": "no spaces"})
