"""schedule(): validation before insert, the returned Run, transactional
scheduling in the caller's psycopg or sqlite3 transaction, idempotency keys
under concurrency."""

from __future__ import annotations

import datetime as dt
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import everystep
from everystep import get_run, get_steps, schedule, serde, step, workflow
from everystep.errors import EverystepError, RunNotFound
from everystep.models import COMPLETED, RUNNING, SCHEDULED
from everystep.store import ENV_VAR, connect
from everystep.store.sqlite import path_from_url
from tests.support.runs import claim_run, execute_run
from tests.support.waiting import wait_until


@step
def shout(text: str) -> str:
    return text.upper()


@workflow
def greet(name: str) -> str:
    return shout(f"hello {name}")


@workflow
def keep(*values: Any) -> list[Any]:
    return list(values)


@workflow
def other_workflow(name: str) -> str:
    return name


def all_runs(store: Any) -> list[Any]:
    return store.list_runs(limit=1000)


# -- the returned Run -------------------------------------------------------------


def test_schedule_returns_the_scheduled_run(store: Any) -> None:
    when = dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc)
    run = schedule(keep, "ada", when, (1, 2), database=store)
    assert isinstance(run, everystep.Run)
    assert uuid.UUID(run.id).version == 7
    assert run.name == "tests.test_schedule.keep"
    assert run.status == "scheduled"
    assert run.args == ["ada", when, (1, 2)]
    assert run.idempotency_key is None and run.claimed_by is None and run.claimed_at is None
    assert run.result is None and run.error is None and run.completed_at is None
    assert run.created_at is not None and run.created_at.tzinfo is not None
    assert store.get_run(run.id) == run


def test_run_ids_are_time_ordered_uuid7(store: Any) -> None:
    runs = [schedule(greet, str(index), database=store) for index in range(3)]
    for run in runs:
        value = uuid.UUID(run.id)
        assert value.version == 7 and value.variant == uuid.RFC_4122
    millis = [uuid.UUID(run.id).int >> 80 for run in runs]
    assert millis == sorted(millis)


def test_schedule_by_name_and_shorthand(store: Any) -> None:
    by_name = schedule("tests.test_schedule.greet", "bob", database=store)
    shorthand = greet.schedule("eve", database=store)
    assert by_name.name == shorthand.name == greet.name
    assert execute_run(store, by_name.id) == COMPLETED
    assert store.get_run(by_name.id).result == "HELLO BOB"


def test_schedule_uses_the_database_from_the_environment(
    db_url: str, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, db_url)
    run = schedule(greet, "env")
    assert get_run(run.id).status == SCHEDULED
    assert store.get_run(run.id).args == ["env"]
    assert get_steps(run.id) == []


def test_get_run_and_get_steps(store: Any) -> None:
    run = schedule(greet, "kay", database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert get_run(run.id, database=store).result == "HELLO KAY"
    (record,) = get_steps(run.id, database=store)
    assert (record.step_id, record.name, record.status, record.result) == ("1", shout.name, "done", "HELLO KAY")
    missing = str(uuid.UUID(int=1))
    with pytest.raises(RunNotFound):
        get_run(missing, database=store)
    with pytest.raises(RunNotFound):
        get_steps(missing, database=store)
    with pytest.raises(RunNotFound):
        get_run("nope", database=store)


# -- validation before insert -------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [({1, 2},), (object(),), ({"k": {3: "int key"}},), ("lone \ud800 surrogate",)],
    ids=["set", "object", "int-key", "surrogate"],
)
def test_unstorable_args_are_refused_before_insert(store: Any, args: tuple[Any, ...]) -> None:
    with pytest.raises(EverystepError, match=r"arguments of workflow tests\.test_schedule\.greet(\[0\].*)? cannot be stored"):
        schedule(greet, *args, database=store)
    assert all_runs(store) == []


def test_oversized_args_are_refused_before_insert(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serde, "MAX_BYTES", 1000)
    with pytest.raises(EverystepError, match="larger than 1000 bytes"):
        schedule(greet, "x" * 2000, database=store)
    assert all_runs(store) == []


def test_only_workflows_can_be_scheduled(store: Any) -> None:
    with pytest.raises(EverystepError, match="is not a workflow"):
        schedule(shout, "x", database=store)
    with pytest.raises(EverystepError, match="is not a workflow"):
        schedule(lambda: None, database=store)
    with pytest.raises(EverystepError, match="must not be empty"):
        schedule("", database=store)
    with pytest.raises(EverystepError, match="idempotency_key must be a string"):
        schedule(greet, "x", idempotency_key=42, database=store)
    assert all_runs(store) == []


def test_conn_must_be_a_database_connection(store: Any) -> None:
    with pytest.raises(EverystepError, match="conn must be a psycopg, sqlite3 or pymysql connection"):
        schedule(greet, "x", conn=object())


# -- in the caller's PostgreSQL transaction -------------------------------------------


def test_psycopg_rollback_leaves_nothing(pg_url: str) -> None:
    store = connect(pg_url)
    try:
        with psycopg.connect(pg_url) as conn:
            run = schedule(greet, "tx", conn=conn)
            assert run.status == SCHEDULED and run.name == greet.name
            # Inside the open transaction: invisible and unclaimable elsewhere.
            assert all_runs(store) == []
            assert store.claim("elsewhere", 10, [greet.name]) == []
            conn.rollback()
        assert all_runs(store) == []
        with pytest.raises(RunNotFound):
            store.get_run(run.id)
    finally:
        store.close()


def test_psycopg_commit_makes_the_run_claimable(pg_url: str) -> None:
    store = connect(pg_url)
    try:
        with psycopg.connect(pg_url) as conn:
            conn.execute("CREATE TEMP TABLE orders (id int)")
            conn.execute("INSERT INTO orders VALUES (1)")
            run = schedule(greet, "order-1", conn=conn)
            assert store.claim("elsewhere", 10, [greet.name]) == []
            conn.commit()
        (claimed,) = store.claim("worker", 10, [greet.name])
        assert claimed.id == run.id and claimed.args == ["order-1"]
        assert runner_execute(store, claimed) == COMPLETED
        assert store.get_run(run.id).result == "HELLO ORDER-1"
    finally:
        store.close()


def runner_execute(store: Any, run: Any) -> str:
    from everystep import runner

    return runner.execute(store, run, claimer="worker")


def test_psycopg_transaction_block_and_dict_rows(pg_url: str) -> None:
    """The caller's connection may use any row factory and explicit
    transaction blocks; an exception in the block rolls the run back."""
    store = connect(pg_url)
    try:
        with psycopg.connect(pg_url, row_factory=dict_row) as conn:
            with pytest.raises(RuntimeError):
                with conn.transaction():
                    schedule(greet, "doomed", conn=conn)
                    raise RuntimeError("the caller's own work failed")
            assert all_runs(store) == []
            with conn.transaction():
                run = schedule(greet, "kept", conn=conn)
                assert run.args == ["kept"]
            assert store.get_run(run.id).status == SCHEDULED
    finally:
        store.close()


def test_psycopg_validation_happens_before_touching_the_connection(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        with pytest.raises(EverystepError):
            schedule(greet, {1}, conn=conn)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_psycopg_notifies_listeners_on_commit_only(pg_url: str) -> None:
    store = connect(pg_url)
    listener = store.listen()
    assert listener is not None
    try:
        with psycopg.connect(pg_url) as conn:
            schedule(greet, "quiet", conn=conn)
            conn.rollback()
            schedule(greet, "loud", conn=conn)
            conn.commit()
        notes = wait_until(listener.drain, "the notification", timeout=30)
        assert notes == [("everystep_scheduled", greet.name)]
        assert listener.drain() == []
    finally:
        listener.close()
        store.close()


def test_psycopg_idempotency_inside_a_transaction(pg_url: str) -> None:
    store = connect(pg_url)
    try:
        existing = schedule(greet, "first", idempotency_key="tx-key", database=store)
        with psycopg.connect(pg_url) as conn:
            again = schedule(greet, "second", idempotency_key="tx-key", conn=conn)
            conn.commit()
        assert again.id == existing.id and again.args == ["first"]
        assert len(all_runs(store)) == 1
    finally:
        store.close()


# -- in the caller's SQLite transaction ---------------------------------------------


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    connect(url).close()  # a fresh file migrates itself
    return url


def test_sqlite_rollback_leaves_nothing(sqlite_url: str) -> None:
    store = connect(sqlite_url)
    conn = sqlite3.connect(path_from_url(sqlite_url))
    try:
        run = schedule(greet, "tx", conn=conn)
        assert run.status == SCHEDULED
        assert conn.in_transaction
        assert all_runs(store) == []
        conn.rollback()
        assert all_runs(store) == []
    finally:
        conn.close()
        store.close()


def test_sqlite_commit_makes_the_run_claimable(sqlite_url: str) -> None:
    store = connect(sqlite_url)
    conn = sqlite3.connect(path_from_url(sqlite_url))
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("CREATE TABLE orders (id INTEGER)")
        conn.execute("INSERT INTO orders VALUES (1)")
        run = schedule(greet, "order-1", conn=conn)
        assert all_runs(store) == []
        conn.commit()
        (claimed,) = store.claim("worker", 10, [greet.name])
        assert claimed.id == run.id
        assert runner_execute(store, claimed) == COMPLETED
    finally:
        conn.close()
        store.close()


def test_sqlite_connection_with_a_custom_row_factory(sqlite_url: str) -> None:
    store = connect(sqlite_url)
    conn = sqlite3.connect(path_from_url(sqlite_url))
    conn.row_factory = lambda cursor, row: {col[0]: value for col, value in zip(cursor.description, row)}
    try:
        run = schedule(greet, "dicts", conn=conn)
        conn.commit()
        assert run.args == ["dicts"]
        assert store.get_run(run.id).status == SCHEDULED
    finally:
        conn.close()
        store.close()


# -- idempotency keys -------------------------------------------------------------------


def test_repeated_schedule_with_a_key_returns_the_existing_run(store: Any) -> None:
    first = schedule(greet, "once", idempotency_key="order-42", database=store)
    assert first.idempotency_key == "order-42"
    again = schedule(greet, "different args", idempotency_key="order-42", database=store)
    assert again.id == first.id and again.args == ["once"]
    assert execute_run(store, first.id) == COMPLETED
    after = schedule(greet, "once", idempotency_key="order-42", database=store)
    assert after.id == first.id and after.status == COMPLETED
    assert len(all_runs(store)) == 1


def test_keys_are_per_workflow_and_none_means_no_key(store: Any) -> None:
    a = schedule(greet, "x", idempotency_key="shared", database=store)
    b = schedule(other_workflow, "x", idempotency_key="shared", database=store)
    c = schedule(greet, "x", idempotency_key="other", database=store)
    d = schedule(greet, "x", database=store)
    e = schedule(greet, "x", database=store)
    assert len({a.id, b.id, c.id, d.id, e.id}) == 5


def test_eight_threads_scheduling_one_key_at_once_make_one_run(db_url: str) -> None:
    stores = [connect(db_url) for _ in range(8)]
    barrier = threading.Barrier(8)
    results: list[Any] = [None] * 8

    def go(index: int) -> None:
        barrier.wait(30)
        try:
            results[index] = schedule(greet, f"thread {index}", idempotency_key="order-8", database=stores[index])
        except BaseException as exc:  # reported by the asserts below
            results[index] = exc

    threads = [threading.Thread(target=go, args=(index,)) for index in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(isinstance(result, BaseException) for result in results), results
        assert len({run.id for run in results}) == 1
        (run,) = all_runs(stores[0])
        assert run.id == results[0].id and run.idempotency_key == "order-8"
    finally:
        for store in stores:
            store.close()


def test_eight_transactions_scheduling_one_key_at_once_make_one_run(pg_url: str) -> None:
    barrier = threading.Barrier(8)
    results: list[Any] = [None] * 8

    def go(index: int) -> None:
        try:
            with psycopg.connect(pg_url) as conn:
                barrier.wait(30)
                results[index] = schedule(greet, f"tx {index}", idempotency_key="order-tx", conn=conn)
        except BaseException as exc:  # reported by the asserts below
            results[index] = exc

    threads = [threading.Thread(target=go, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(isinstance(result, BaseException) for result in results), results
    assert len({run.id for run in results}) == 1
    store = connect(pg_url)
    try:
        assert [run.id for run in all_runs(store)] == [results[0].id]
    finally:
        store.close()


def test_a_claimed_run_is_returned_as_running(store: Any) -> None:
    run = schedule(greet, "k", idempotency_key="busy", database=store)
    claim_run(store, run.id, "w")
    again = schedule(greet, "k", idempotency_key="busy", database=store)
    assert again.id == run.id and again.status == RUNNING and again.claimed_by == "w"
