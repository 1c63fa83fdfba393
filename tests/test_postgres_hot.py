"""The hot statements' own path to libpq (``everystep.store.postgres_hot``):
it is taken, it reads what psycopg's cursor reads, it stands aside where it
cannot do exactly that, and its failures are psycopg's."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from everystep import patched, runner, schedule, step, workflow
from everystep.errors import EverystepError
from everystep.models import Claim
from everystep.store import connect, postgres_hot
from everystep.store.base import NewStep, utcnow
from everystep.store.postgres import HOT_STATEMENTS, PostgresStore
from supervisor.meter import ChildMeter


@workflow
def hot_job(index: int) -> int:
    return index


@step
def hot_step(value: int) -> int:
    return value + 1


@workflow
def hot_three(value: int) -> int:
    return hot_step(hot_step(hot_step(value)))


@workflow
def hot_patched(value: int) -> int:
    """Two patch markers: one with a step's record, one with the run's end."""
    value = hot_step(value)
    if patched("hot-a"):
        value = hot_step(value)
    if patched("hot-b"):
        value += 1
    return hot_step(value)


#: The hot statements a run without patches sends.
PLAIN = ("claim", "record_step", "finish_run_with_step")


def _hot_names(names: tuple[str, ...]) -> set[str]:
    return {f"everystep_hot_{HOT_STATEMENTS.index(name) + 1}" for name in names}


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[PostgresStore]:
    store = connect(pg_url)
    assert isinstance(store, PostgresStore)
    try:
        yield store
    finally:
        store.close()


def _prepared_names(store: PostgresStore) -> set[str]:
    with store.connection() as conn:
        return {row["name"] for row in conn.execute("SELECT name FROM pg_prepared_statements").fetchall()}


def _step(step_id: str, status: str = "done", result: str = '{"i": 1}') -> NewStep:
    return NewStep(step_id, "tests.test_postgres_hot.noop", '[{"i": 1}]', "{}", utcnow(), status=status,
                   result_json=result)


def _claim_one(store: PostgresStore) -> Claim:
    (run,) = store.claim("hot", 1, [hot_job.name])
    return Claim(run.id, "hot", run.claim_epoch)


def _bypassed(store: PostgresStore) -> None:
    """Make this store's connections take psycopg's cursor for everything."""
    with store.connection() as conn:
        conn.hot_prepared.usable = False


def test_a_runners_statements_go_through_it(pg_store: PostgresStore) -> None:
    for index in range(2):
        schedule(hot_job, index, database=pg_store)
    claim = _claim_one(pg_store)
    assert pg_store.record_step(claim, _step("1")) is not None
    assert pg_store.finish_run_with_step(claim, _step("2"), "completed", "2") is not None
    assert _prepared_names(pg_store) >= _hot_names(PLAIN)
    assert pg_store.get_run(claim.run_id).status == "completed"
    assert [record.step_id for record in pg_store.get_steps(claim.run_id)] == ["1", "2"]


def test_the_runner_takes_it_for_every_write(pg_store: PostgresStore) -> None:
    """Runs executed by the runner (whose statuses are str enums), with
    patch markers and without: none of their writes went to psycopg's
    cursor, which would have prepared its own copy of a statement executed
    this often."""
    meter = ChildMeter()
    try:
        for index in range(8):
            schedule(hot_three if index % 2 else hot_patched, index, database=pg_store)
        for run in pg_store.claim("hot", 8, [hot_three.name, hot_patched.name]):
            assert runner.execute_guarded(pg_store, run, claimer="hot", meter=meter) == "completed"
    finally:
        meter.close()
    with pg_store.connection() as conn:
        prepared = conn.execute("SELECT name, statement FROM pg_prepared_statements").fetchall()
    ours = {row["name"] for row in prepared if row["name"].startswith("everystep_hot_")}
    assert ours == {f"everystep_hot_{n}" for n in range(1, len(HOT_STATEMENTS) + 1)}
    assert not [row for row in prepared
                if row["name"].startswith("_pg3_") and "everystep_step" in row["statement"]]
    assert all(record.status == "done" for record in pg_store.get_steps(run.id))


def test_what_it_reads_is_what_psycopg_reads(pg_url: str) -> None:
    """A claim and a step record, each once through this path and once
    through psycopg's cursor: the same values, of the same types."""
    hot, plain = connect(pg_url), connect(pg_url)
    assert isinstance(hot, PostgresStore) and isinstance(plain, PostgresStore)
    try:
        _bypassed(plain)
        schedule(hot_job, 1, database=hot, queue="q1", priority=3, concurrency_key="k")
        schedule(hot_job, 1, database=hot, queue="q1", priority=3, concurrency_key="k")
        (ours,) = hot.claim("hot", 1, [hot_job.name])
        (theirs,) = plain.claim("hot", 1, [hot_job.name])
        assert ours.id != theirs.id
        for field in dataclasses.fields(ours):
            mine, other = getattr(ours, field.name), getattr(theirs, field.name)
            assert type(mine) is type(other), field.name
            if isinstance(mine, dt.datetime):
                assert mine.tzinfo == other.tzinfo and mine.utcoffset() == other.utcoffset()
            elif field.name not in ("id", "claimed_at", "created_at"):
                assert mine == other, field.name
        written = [store.record_step(Claim(run.id, "hot", run.claim_epoch), _step("1"))
                   for store, run in ((hot, ours), (plain, theirs))]
        assert all(write is not None and write.ours for write in written)
        mine_at, theirs_at = (write.record.completed_at for write in written if write is not None)
        assert type(mine_at) is type(theirs_at) and mine_at.tzinfo == theirs_at.tzinfo
        assert _prepared_names(plain).isdisjoint({f"everystep_hot_{n}" for n in range(1, 4)})
    finally:
        hot.close()
        plain.close()


def test_a_fenced_write_writes_nothing_through_it(pg_store: PostgresStore) -> None:
    schedule(hot_job, 1, database=pg_store)
    claim = _claim_one(pg_store)
    stale = dataclasses.replace(claim, epoch=claim.epoch - 1)
    assert pg_store.record_step(stale, _step("1")) is None
    assert pg_store.finish_run_with_step(stale, _step("1"), "completed", "1") is None
    assert pg_store.get_steps(claim.run_id) == []
    assert pg_store.get_run(claim.run_id).status == "running"


def test_a_statement_the_server_forgot_is_prepared_again(pg_store: PostgresStore) -> None:
    """A pooler's ``DISCARD ALL`` (here ``DEALLOCATE ALL``) between two steps:
    the next record prepares again and is written once."""
    schedule(hot_job, 1, database=pg_store)
    claim = _claim_one(pg_store)
    assert pg_store.record_step(claim, _step("1")) is not None
    with pg_store.connection() as conn:
        conn.execute("DEALLOCATE ALL")
    write = pg_store.record_step(claim, _step("2"))
    assert write is not None and write.ours
    assert [record.step_id for record in pg_store.get_steps(claim.run_id)] == ["1", "2"]


def test_its_errors_are_the_stores_errors(pg_store: PostgresStore) -> None:
    schedule(hot_job, 1, database=pg_store)
    claim = _claim_one(pg_store)
    with pytest.raises(EverystepError, match="everystep_step_step_id_check") as raised:
        pg_store.record_step(claim, _step("x" * 301))
    assert isinstance(raised.value.__cause__, psycopg.errors.CheckViolation)
    assert pg_store.record_step(claim, _step("1")) is not None  # the connection is still good


def test_a_session_not_in_iso_datestyle_is_left_to_psycopg(pg_url: str) -> None:
    """Timestamps are read as ISO text; a session in another DateStyle (or
    encoding) takes psycopg's loaders, which say plainly what they cannot parse."""
    with psycopg.connect(pg_url, options="-c DateStyle=SQL,DMY") as conn:
        prepared = postgres_hot.Prepared(conn)
        assert not prepared.usable
        statement = postgres_hot.HotStatement(97, "SELECT %(value)s::int AS value")
        assert postgres_hot.execute(conn, prepared, statement, {"value": 1}) is None
    with psycopg.connect(pg_url, options="-c DateStyle=ISO,DMY") as conn:
        assert postgres_hot.Prepared(conn).usable


@pytest.fixture
def raw_conn(pg_store: PostgresStore) -> Iterator[Any]:
    with pg_store.connection() as conn:
        yield conn


def _round_trip(conn: Any, sql: str, **params: Any) -> dict[str, Any] | None:
    rows = postgres_hot.execute(conn, conn.hot_prepared, postgres_hot.HotStatement(99, sql), params)
    conn.execute("DEALLOCATE everystep_hot_99")
    return rows[0] if rows else None


def test_parameters_reach_the_server_as_psycopg_sends_them(raw_conn: Any) -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30)))
    row = _round_trip(
        raw_conn,
        "SELECT %(text)s::text AS text, %(number)s::bigint AS number, %(flag)s::bool AS flag,"
        " %(ratio)s::float8 AS ratio, %(nan)s::float8 AS nan, %(inf)s::float8 AS inf,"
        " %(nothing)s::text AS nothing, %(when)s::timestamptz AS when_,"
        " %(text)s::text || '%%' AS percent",
        text="it's ünïcode", number=2**40, flag=False, ratio=0.1 + 0.2, nan=math.nan, inf=-math.inf,
        nothing=None, when=when,
    )
    assert row is not None
    assert row["text"] == "it's ünïcode" and row["number"] == 2**40 and row["flag"] is False
    assert row["ratio"] == 0.1 + 0.2 and math.isnan(row["nan"]) and row["inf"] == -math.inf
    assert row["nothing"] is None and row["when_"] == when and row["percent"] == "it's ünïcode%"


def test_a_text_array_parameter_arrives_intact(raw_conn: Any) -> None:
    names = ['plain', 'with "quotes"', "back\\slash", "comma,brace}{", "", "NULL", "ünïcode"]
    row = _round_trip(raw_conn, "SELECT array_to_json(%(names)s::text[]) AS names", names=names)
    assert row is not None and row["names"] == names


def test_what_it_cannot_write_or_read_is_left_to_psycopg(raw_conn: Any) -> None:
    statement = postgres_hot.HotStatement(98, "SELECT %(value)s::numeric AS value")
    assert postgres_hot.execute(raw_conn, raw_conn.hot_prepared, statement, {"value": Decimal("1.5")}) is None
    assert postgres_hot.execute(raw_conn, raw_conn.hot_prepared, statement, {"value": [1, 2]}) is None
    # numeric is not a column type it reads: the statement is left to psycopg.
    assert postgres_hot.execute(raw_conn, raw_conn.hot_prepared, statement, {"value": "1.5"}) is None
    assert raw_conn.execute(statement.sql, {"value": "1.5"}).fetchone()["value"] == Decimal("1.5")


def test_the_installed_psycopg_has_what_it_uses() -> None:
    """The releases pyproject pins give this path everything it needs: if
    this fails, a psycopg upgrade moved an internal, and every store is on
    the cursor path (correct, slower) until this module follows."""
    assert postgres_hot.missing() == []
    assert postgres_hot.available()


def test_a_psycopg_without_its_internals_runs_on_the_cursor(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A psycopg release that moved ``psycopg.generators``: the store says so
    at DEBUG, and runs still execute and record, every statement through
    psycopg's cursor (nothing of this path is prepared)."""
    monkeypatch.setattr(postgres_hot, "generators", None)
    assert postgres_hot.missing() == ["psycopg.generators.execute"] and not postgres_hot.available()
    with caplog.at_level(logging.DEBUG, logger="everystep.store.postgres"):
        store = connect(pg_url)
    assert isinstance(store, PostgresStore)
    assert [record.getMessage() for record in caplog.records if record.levelno == logging.DEBUG] == [
        f"psycopg {psycopg.__version__} lacks psycopg.generators.execute: the hot statements take psycopg's cursor"]
    meter = ChildMeter()
    try:
        for index in range(3):
            schedule(hot_three, index, database=store)
        runs = store.claim("hot", 3, [hot_three.name])
        assert len(runs) == 3
        for run in runs:
            assert runner.execute_guarded(store, run, claimer="hot", meter=meter) == "completed"
        for run in runs:
            assert store.get_run(run.id).result == run.args[0] + 3
            assert [record.status for record in store.get_steps(run.id)] == ["done", "done", "done"]
        assert not any(name.startswith("everystep_hot_") for name in _prepared_names(store))
        with store.connection() as conn:
            assert conn.hot_prepared is None
    finally:
        meter.close()
        store.close()
