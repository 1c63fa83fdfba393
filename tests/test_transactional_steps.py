"""Transactional steps: the step's own SQL and its record commit together.

Each step here inserts a row into ``tx_effect`` through ``step_connection()``;
the tests read that table and the step rows from connections of their own.
On every backend: the writes and the record commit together (and neither
is visible before), an exception rolls the writes back and a retry starts a
fresh transaction, the step may not end the transaction itself,
``step_connection()`` outside one raises, the declaration with
``unsafe_to_repeat`` is refused, a fenced executor writes nothing, and
parallel branches each have a transaction of their own. The SIGKILL tests
are in ``test_transactional_crashes.py``.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import everystep
from everystep import parallel, runner, schedule, step, step_connection, transactional, workflow
from everystep.context import current
from everystep.errors import EverystepError, SimulatedCrash
from everystep.models import COMPLETED, STEP_DONE, STEP_FAILED, Outcome
from everystep.store import Store, connect
from tests.support.rawdb import reader
from tests.support.runs import claim_run, execute_run, resume, run_until_settled

# Also through PgBouncer in transaction mode (the pooled lane).
pytestmark = [pytest.mark.timeout(120), pytest.mark.pooled]

PROBE: dict[str, Any] = {}


# -- the application's table, on every backend ------------------------------------------


def placeholder(conn: Any) -> str:
    return "?" if isinstance(conn, sqlite3.Connection) else "%s"


def run_sql(conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """``sql`` with ``?`` placeholders, on any of the three drivers."""
    sql = sql.replace("?", placeholder(conn))
    if isinstance(conn, (sqlite3.Connection, psycopg.Connection)):
        cursor = conn.execute(sql, params)
        return [tuple(row) for row in cursor.fetchall()] if cursor.description else []
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return [tuple(row) for row in cursor.fetchall()] if cursor.description else []


def rows(url: str, run_id: str | None = None) -> list[str]:
    with reader(url) as conn:
        found = run_sql(conn, "SELECT run_id, label FROM tx_effect ORDER BY label")
    return [label for owner, label in found if run_id is None or owner == run_id]


@pytest.fixture
def effects(db_url: str) -> str:
    with reader(db_url) as conn:
        run_sql(conn, "CREATE TABLE IF NOT EXISTS tx_effect (run_id VARCHAR(64) NOT NULL, label VARCHAR(64) NOT NULL)")
        run_sql(conn, "DELETE FROM tx_effect")
    return db_url


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    PROBE.clear()
    yield
    transactional.commit_fault = None


def insert(label: str) -> None:
    ctx = current()
    run_sql(step_connection(), "INSERT INTO tx_effect (run_id, label) VALUES (?, ?)",
            (ctx.workflow_id if ctx else "-", label))


# -- workflows ---------------------------------------------------------------------------------


@step(transactional=True)
def add_row(label: str) -> str:
    insert(label)
    probe = PROBE.get("during")
    if probe is not None:
        probe()
    return label


@workflow
def three_rows(prefix: str) -> list[str]:
    return [add_row(f"{prefix}-{index}") for index in range(1, 4)]


ATTEMPTS: list[int] = []


@step(transactional=True, retries=2, backoff=0.0, jitter=False)
def flaky_row(label: str) -> str:
    ATTEMPTS.append(len(ATTEMPTS) + 1)
    insert(f"{label}-attempt-{len(ATTEMPTS)}")
    if len(ATTEMPTS) < 2:
        raise ValueError("the first attempt fails after its insert")
    return label


@workflow
def flaky(label: str) -> str:
    return flaky_row(label)


@step(transactional=True)
def failing_row(label: str) -> str:
    insert(label)
    raise ValueError("no such customer")


@workflow
def failing(label: str) -> str:
    try:
        return failing_row(label)
    except ValueError as exc:
        return f"caught: {exc}"


@step(transactional=True)
def ends_its_transaction(how: str) -> str:
    insert(how)
    conn = step_connection()
    if how == "commit":
        conn.commit()
    elif how == "rollback":
        conn.rollback()
    elif how == "begin":
        conn.begin()
    elif how == "ddl":
        run_sql(conn, "CREATE TABLE IF NOT EXISTS tx_implicit (x INT)")
    else:
        run_sql(conn, "COMMIT")
    return how


@workflow
def self_committing(how: str) -> str:
    return ends_its_transaction(how)


@step
def plain_step() -> str:
    try:
        step_connection()
    except EverystepError as exc:
        return str(exc)
    return "no error"


@workflow
def plain(_: Any) -> str:
    return plain_step()


@step(transactional=True)
def branch_row(label: str) -> Any:
    insert(label)
    barrier = PROBE.get("barrier")
    if barrier is not None:
        barrier.wait(timeout=60)
    conn = step_connection()
    PROBE.setdefault("connections", []).append(id(conn))
    if label.endswith("fails"):
        raise ValueError(f"{label} rolls back")
    return label


@workflow
def branches(_: Any) -> Any:
    try:
        return parallel(lambda: branch_row("left"), lambda: branch_row("right-fails"))
    except ValueError as exc:
        return f"caught: {exc}"


# -- writes and record together ----------------------------------------------------------------


def test_writes_and_record_commit_together(store: Store, effects: str) -> None:
    run = schedule(three_rows, "a", database=store)
    seen: list[tuple[list[str], list[str]]] = []

    def look() -> None:
        # Mid-step, and once the record is written but not committed: neither
        # the row nor the record can be seen from outside.
        seen.append((rows(effects, run.id), [s.step_id for s in store.get_steps(run.id)]))

    PROBE["during"] = look
    transactional.commit_fault = lambda ctx, step_id, phase: look() if phase == "committing" else None
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert seen == [([], []), ([], []), (["a-1"], ["1"]), (["a-1"], ["1"]), (["a-1", "a-2"], ["1", "2"]),
                    (["a-1", "a-2"], ["1", "2"])]
    assert rows(effects, run.id) == ["a-1", "a-2", "a-3"]
    done = store.get_run(run.id)
    assert done.status == COMPLETED and done.result == ["a-1", "a-2", "a-3"]
    assert [(s.step_id, s.status, s.result) for s in store.get_steps(run.id)] == [
        ("1", STEP_DONE, "a-1"), ("2", STEP_DONE, "a-2"), ("3", STEP_DONE, "a-3")]


def test_a_replay_returns_the_recorded_result_without_running_the_step(store: Store, effects: str) -> None:
    run = schedule(three_rows, "b", database=store)
    calls: list[str] = []

    def crash(ctx: Any, step_id: str) -> None:
        calls.append(step_id)
        if step_id == "3":
            raise SimulatedCrash("dies before the third record")

    runner.fault = crash
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    runner.fault = None
    assert rows(effects, run.id) == ["b-1", "b-2"]  # the third's insert rolled back with its process
    assert resume(store, run.id) == Outcome.COMPLETED
    assert rows(effects, run.id) == ["b-1", "b-2", "b-3"]
    assert calls == ["1", "2", "3"]


def test_a_step_outside_a_workflow_is_a_plain_call_and_has_no_connection(effects: str) -> None:
    with pytest.raises(EverystepError, match=r"only available inside a @step\(transactional=True\) step"):
        step_connection()
    with pytest.raises(EverystepError, match="only available inside"):
        add_row("outside")
    assert everystep.step_connection is step_connection


def test_step_connection_in_a_plain_step_raises_one_line(store: Store, effects: str) -> None:
    run = schedule(plain, None, database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    message = store.get_run(run.id).result
    assert "only available inside a @step(transactional=True) step" in message and "\n" not in message


def test_transactional_and_unsafe_to_repeat_is_refused_at_declaration() -> None:
    with pytest.raises(EverystepError, match="never unsafe to repeat"):
        @step(transactional=True, unsafe_to_repeat=True)
        def both() -> None: ...


def test_the_driver_connection_type(store: Store, effects: str) -> None:
    kinds: list[Any] = []

    @step(transactional=True, name="tests.kind_of_connection")
    def kind() -> str:
        conn = step_connection()
        kinds.append(conn)
        assert run_sql(conn, "SELECT 1") == [(1,)]  # plain rows, as the driver gives them
        return type(conn).__name__

    @workflow(name="tests.kind")
    def kind_flow(_: Any) -> str:
        return kind()

    run = schedule(kind_flow, None, database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    expected = {"sqlite": sqlite3.Connection, "postgres": psycopg.Connection}.get(store.backend)
    if expected is None:
        import pymysql

        expected = pymysql.connections.Connection
    assert isinstance(kinds[0], expected)


# -- failures, retries, and what the step may not do ---------------------------------------------


def test_an_exception_rolls_the_writes_back_and_is_recorded(store: Store, effects: str) -> None:
    run = schedule(failing, "gone", database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == "caught: no such customer"
    assert rows(effects, run.id) == []
    (record,) = store.get_steps(run.id)
    assert record.status == STEP_FAILED and record.error["message"] == "no such customer"


def test_a_retried_attempt_starts_a_fresh_transaction(store: Store, effects: str) -> None:
    ATTEMPTS.clear()
    run = schedule(flaky, "pay", database=store)
    assert run_until_settled(store, run.id)[-1] == Outcome.COMPLETED
    assert ATTEMPTS == [1, 2]
    assert rows(effects, run.id) == ["pay-attempt-2"]  # the first attempt's insert rolled back
    (record,) = store.get_steps(run.id)
    assert record.status == STEP_DONE and record.attempt == 2


@pytest.mark.parametrize("how", ["commit", "rollback"])
def test_commit_or_rollback_inside_the_step_raises(store: Store, effects: str, how: str) -> None:
    run = schedule(self_committing, how, database=store)
    assert execute_run(store, run.id) == Outcome.FAILED
    failed = store.get_run(run.id)
    assert failed.error["type"] == "everystep.errors.EverystepError"
    assert "must not commit or roll back its transaction" in failed.error["message"]
    assert rows(effects, run.id) == []  # the step failed: its writes rolled back
    (record,) = store.get_steps(run.id)
    assert record.status == STEP_FAILED


def test_a_commit_sent_as_sql_fails_the_step(store: Store, effects: str) -> None:
    run = schedule(self_committing, "sql", database=store)
    assert execute_run(store, run.id) == Outcome.FAILED
    assert "must not commit or roll back its transaction" in store.get_run(run.id).error["message"]
    assert store.get_steps(run.id)[0].status == STEP_FAILED


@pytest.mark.backends("mariadb")
def test_begin_inside_the_step_raises_on_mariadb(store: Store, effects: str) -> None:
    run = schedule(self_committing, "begin", database=store)
    assert execute_run(store, run.id) == Outcome.FAILED
    assert "must not commit or roll back its transaction" in store.get_run(run.id).error["message"]
    assert rows(effects, run.id) == []


@pytest.mark.backends("mariadb")
def test_an_implicit_commit_fails_the_step_on_mariadb(store: Store, effects: str) -> None:
    run = schedule(self_committing, "ddl", database=store)
    assert execute_run(store, run.id) == Outcome.FAILED
    assert "must not commit or roll back its transaction" in store.get_run(run.id).error["message"]


# -- fencing ------------------------------------------------------------------------------------------


def test_a_fenced_executor_writes_nothing(store: Store, effects: str) -> None:
    run = schedule(three_rows, "f", database=store)
    stale = claim_run(store, run.id, "old")
    assert store.requeue(stale.claim)
    claim_run(store, run.id, "new")  # the epoch moves on
    assert runner.execute(store, stale, claimer="old") == Outcome.LOST
    assert rows(effects, run.id) == [] and store.get_steps(run.id) == []
    assert runner.execute(store, store.get_run(run.id), claimer="new") == Outcome.COMPLETED
    assert rows(effects, run.id) == ["f-1", "f-2", "f-3"]


@pytest.mark.backends("postgres", "mariadb")
def test_a_claim_during_the_step_fences_its_transaction(store: Store, effects: str, db_url: str) -> None:
    """The epoch moves on while the body runs (no lock is held yet): the
    record is refused and the step's writes roll back with it."""
    run = schedule(three_rows, "g", database=store)
    claimed = claim_run(store, run.id, "old")
    other = connect(db_url)

    def fence() -> None:
        PROBE.pop("during")
        assert other.requeue(claimed.claim)
        claim_run(other, run.id, "new")

    PROBE["during"] = fence
    try:
        assert runner.execute(store, claimed, claimer="old") == Outcome.LOST
    finally:
        other.close()
    assert rows(effects, run.id) == [] and store.get_steps(run.id) == []


@pytest.mark.backends("postgres", "mariadb")
def test_a_claim_after_the_record_waits_for_the_commit(store: Store, effects: str, db_url: str) -> None:
    """Once the record holds the run's row, a claim bumping the epoch waits
    for the commit: the new executor then finds the step recorded and does
    not run it again."""
    run = schedule(three_rows, "h", database=store)
    claimed = claim_run(store, run.id, "old")
    other = connect(db_url)
    requeued = threading.Event()

    def requeue() -> None:
        other.requeue(claimed.claim)
        requeued.set()

    def committing(ctx: Any, step_id: str, phase: str) -> None:
        if phase == "committing" and step_id == "1":
            thread = threading.Thread(target=requeue, daemon=True)
            thread.start()
            # The requeue cannot pass the lock this transaction holds.
            assert not requeued.wait(1.0)
            PROBE["thread"] = thread
        elif phase == "committed" and step_id == "1":
            # Once the lock is released the requeue goes through before step
            # 2 begins (else step 2 might take the row first, on a loaded
            # machine, and commit under the old claim as it rightly may).
            assert requeued.wait(60), "the requeue never got past the commit"

    transactional.commit_fault = committing
    try:
        outcome = runner.execute(store, claimed, claimer="old")
        PROBE["thread"].join(60)
        assert requeued.is_set()
    finally:
        other.close()
    assert outcome == Outcome.LOST  # step 2's record finds the run taken
    assert rows(effects, run.id) == ["h-1"]
    assert [s.step_id for s in store.get_steps(run.id)] == ["1"]
    assert execute_run(store, run.id, "new") == Outcome.COMPLETED
    assert rows(effects, run.id) == ["h-1", "h-2", "h-3"]


# -- parallel ------------------------------------------------------------------------------------------


def test_parallel_branches_each_have_their_own_transaction(store: Store, effects: str) -> None:
    if store.backend != "sqlite":
        # Both transactions open at once (on SQLite the second waits for the
        # first's write lock instead).
        PROBE["barrier"] = threading.Barrier(2)
    run = schedule(branches, None, database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == "caught: right-fails rolls back"
    assert rows(effects, run.id) == ["left"]  # the failing branch's insert rolled back alone
    statuses = {s.step_id: s.status for s in store.get_steps(run.id)}
    assert statuses == {"1.0.1": STEP_DONE, "1.1.1": STEP_FAILED}
    if store.backend != "sqlite":
        assert len(set(PROBE["connections"])) == 2


# -- check-deploy and the console ------------------------------------------------------------------


def test_check_deploy_and_the_graph_mark_a_transactional_step_exactly_once(store: Store, effects: str) -> None:
    from everystep import dryrun
    from everystep.graph import analyse, build_graph, recorded_graph

    run = schedule(three_rows, "c", database=store)
    runner.fault = lambda ctx, step_id: (_ for _ in ()).throw(SimulatedCrash("dies")) if step_id == "2" else None
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    runner.fault = None

    (verdict,) = [v for v in dryrun.check_deploy(store) if v.run_id == run.id]
    assert verdict.outcome == dryrun.Prediction.RESUMES and verdict.next_step == "2"
    assert verdict.detail.endswith(f"then runs step 2 ({add_row.name}; exactly once: a transactional step)")

    records = store.get_steps(run.id)
    steps = step_nodes(build_graph(analyse(three_rows), records, active=True))
    assert steps and all(node["exactly_once"] for node in steps)
    (recorded,) = step_nodes(recorded_graph(records, "no source"))
    assert recorded["exactly_once"] is True
    assert [node["exactly_once"] for node in step_nodes(build_graph(analyse(plain), [], active=True))] == [False]


def step_nodes(tree: Any) -> list[dict[str, Any]]:
    """Every step node of a console graph, however deeply nested."""
    if isinstance(tree, dict):
        found = [tree] if tree.get("kind") == "step" else []
        return found + [node for value in tree.values() for node in step_nodes(value)]
    if isinstance(tree, list):
        return [node for item in tree for node in step_nodes(item)]
    return []


# -- a caught statement error, and runs scheduled from inside ------------------------------------------


@step(transactional=True)
def swallows_an_error(label: str) -> str:
    insert(label)
    try:
        run_sql(step_connection(), "INSERT INTO no_such_table (x) VALUES (1)")
    except Exception:
        pass  # PostgreSQL's transaction can now only roll back
    return label


@workflow
def swallowing(label: str) -> str:
    return swallows_an_error(label)


@pytest.mark.backends("postgres")
def test_a_caught_statement_error_fails_the_step_on_postgres(store: Store, effects: str) -> None:
    run = schedule(swallowing, "s", database=store)
    assert execute_run(store, run.id) == Outcome.FAILED
    assert "can only roll back" in store.get_run(run.id).error["message"]
    assert rows(effects, run.id) == []
    assert store.get_steps(run.id)[0].status == STEP_FAILED


@step(transactional=True)
def schedule_follow_up(label: str) -> str:
    insert(label)
    return schedule(three_rows, f"{label}-child", conn=step_connection()).id


@workflow
def parent(label: str) -> str:
    return schedule_follow_up(label)


def test_a_run_scheduled_on_the_step_connection_commits_with_the_step(store: Store, effects: str) -> None:
    run = schedule(parent, "p", database=store)

    def crash(ctx: Any, step_id: str, phase: str) -> None:
        if phase == "committing":
            raise SimulatedCrash("dies before the commit")

    transactional.commit_fault = crash
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    transactional.commit_fault = None
    assert [r.id for r in store.list_runs()] == [run.id]  # the follow-up rolled back with the step
    assert resume(store, run.id) == Outcome.COMPLETED
    child = store.get_run(store.get_run(run.id).result)
    assert child.name == three_rows.name and child.args == ["p-child"]
    assert rows(effects, run.id) == ["p"]


@pytest.mark.backends("postgres", "mariadb")
def test_a_cancel_during_the_step_rolls_its_writes_back_and_records_nothing(
        store: Store, effects: str, db_url: str) -> None:
    """Under the threaded worker a cancel takes effect at the step boundary:
    the transactional step's record is refused, so its writes roll back,
    and nothing is recorded for it (it did not happen)."""
    from everystep import admin

    run = schedule(three_rows, "x", database=store)
    other = connect(db_url)

    def cancel() -> None:
        PROBE.pop("during")
        admin.cancel(other, run.id, "customer left")

    PROBE["during"] = cancel
    try:
        assert execute_run(store, run.id) == Outcome.CANCELLED
    finally:
        other.close()
    assert store.get_run(run.id).status == "cancelled"
    assert rows(effects, run.id) == [] and store.get_steps(run.id) == []


# -- async ---------------------------------------------------------------------------------------


@step(transactional=True)
async def add_row_async(label: str, fail: bool = False) -> str:
    import asyncio

    await asyncio.sleep(0)
    insert(label)
    if fail:
        raise ValueError(f"{label} failed after its insert")
    return label


@workflow
async def async_rows(prefix: str) -> list[str]:
    rows_made = [await add_row(f"{prefix}-1"), await add_row_async(f"{prefix}-2")]
    try:
        await add_row_async(f"{prefix}-3", True)
    except ValueError:
        pass
    return rows_made


def test_async_bodies_and_async_steps_commit_their_writes_with_their_records(store: Store, effects: str) -> None:
    run = schedule(async_rows, "c", database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert rows(effects, run.id) == ["c-1", "c-2"]  # the failed step's insert rolled back
    assert [(s.step_id, s.status) for s in store.get_steps(run.id)] == [
        ("1", STEP_DONE), ("2", STEP_DONE), ("3", "failed")]
