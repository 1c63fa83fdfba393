"""The last step's record and the run's terminal status in one transaction.

A workflow whose last act is a step (``return step(...)``, or
``x = step(...); return x``) commits that step's record together with its
``completed`` status. These tests pin down when the fold applies (the
bytecode check, then whole runs on every backend), that it is one
transaction (on PostgreSQL the step row and the run row carry the same
``xmin``; on SQLite and MariaDB a trace of the statements the store's
connections send shows them inside one ``BEGIN … COMMIT``), and that every
window it opens ends as before: a process that dies before the commit
replays the step, a stale executor writes nothing, a cancel records the
step it cut off, a claim that moves on between the two writes leaves
neither.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from everystep import admin, parallel, schedule, step, workflow
from everystep.context import current
from everystep.models import (
    CANCELLED, COMPLETED, FAILED, RUNNING, STEP_DONE, STEP_FAILED, STEP_STARTED, Claim,
)
from everystep.context import Observer
from everystep.runner import Outcome
from everystep.store import NewStep, Store, connect, utcnow
from everystep.tail_position import is_tail_call
from tests.apps import supervised
from tests.support.pgbouncer import libpq_url
from tests.support.runs import claim_run, crash_at, execute_run
from tests.support.supervisor import supervisors  # noqa: F401

# The engine's own statements: also through PgBouncer in transaction mode.
pytestmark = pytest.mark.pooled

CALLS: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


# -- tail position in bytecode -------------------------------------------------------------


def probe(*args: Any, **kwargs: Any) -> tuple[bool, Any]:
    """Whether the caller is calling this in tail position."""
    frame = sys._getframe(1)
    return is_tail_call(frame.f_code, frame.f_lasti), args


def returns_the_call() -> Any:
    return probe()


def stores_then_returns() -> Any:
    x = probe()
    return x


def stores_then_returns_another(y: Any = None) -> Any:
    x = probe()
    return y or x


def calls_then_goes_on() -> Any:
    x = probe()
    CALLS["after"] += 1
    return x


def in_with() -> Any:
    with open(__file__):
        return probe()


def in_for() -> Any:
    for _ in range(1):
        return probe()
    return None


def in_try_finally() -> Any:
    try:
        return probe()
    finally:
        CALLS["finally"] += 1


def in_try_except() -> Any:
    try:
        return probe()
    except ValueError:
        return None


def in_if(flag: bool = True) -> Any:
    if flag:
        return probe()
    return None


def with_keywords() -> Any:
    return probe(1, key=2)


def with_star_args(args: tuple[Any, ...] = (1,)) -> Any:
    return probe(*args, **{"key": 2})


def in_tuple() -> Any:
    return probe(), 1


def argument_of_another_call() -> Any:
    return probe(probe())


@pytest.mark.parametrize("body, tail", [
    (returns_the_call, True),
    (stores_then_returns, True),
    (in_try_except, True),
    (in_if, True),
    (with_keywords, True),
    (with_star_args, True),
    (stores_then_returns_another, False),
    (calls_then_goes_on, False),
    (in_with, False),
    (in_for, False),
    (in_try_finally, False),
])
def test_tail_position_is_read_from_the_bytecode(body: Any, tail: bool) -> None:
    assert body()[0] is tail


def test_a_call_whose_result_feeds_another_is_not_in_tail_position() -> None:
    outer, (inner,) = argument_of_another_call()
    assert (outer, inner) == (True, (False, ()))
    assert in_tuple()[0][0] is False


# -- workflows ---------------------------------------------------------------------------


@step
def fold_add(value: int, amount: int) -> int:
    CALLS[f"add{value}+{amount}"] += 1
    return value + amount


@step
def fold_fail(message: str) -> int:
    CALLS["fail"] += 1
    raise ValueError(message)


@step(unsafe_to_repeat=True)
def fold_charge(value: int) -> int:
    CALLS["charge"] += 1
    return value * 10


def plain_note(label: str) -> None:
    CALLS[f"note:{label}"] += 1


@workflow
def fold_tail(start: int) -> int:
    first = fold_add(start, 1)
    return fold_add(first, 1)


@workflow
def fold_tail_stored(start: int) -> int:
    first = fold_add(start, 1)
    last = fold_add(first, 1)
    return last


@workflow
def fold_single(start: int) -> int:
    return fold_add(start, 5)


@workflow
def fold_goes_on(start: int) -> int:
    first = fold_add(start, 1)
    last = fold_add(first, 1)
    plain_note("after")
    return last


def helper(value: int) -> int:
    return fold_add(value, 1)


@workflow
def fold_in_helper(start: int) -> int:
    first = fold_add(start, 1)
    return helper(first)


@workflow
def fold_in_parallel(start: int) -> tuple[Any, ...]:
    first = fold_add(start, 1)
    return parallel(lambda: fold_add(first, 1), lambda: fold_add(first, 2))


@workflow
def fold_unsafe(start: int) -> int:
    first = fold_add(start, 1)
    return fold_charge(first)


@workflow
def fold_failing(start: int) -> int:
    fold_add(start, 1)
    return fold_fail("no")


RETRY_STATE: dict[str, int] = {}


@step(retries=1, backoff=0.0, jitter=False)
def fold_flaky(value: int) -> int:
    RETRY_STATE["attempts"] = RETRY_STATE.get("attempts", 0) + 1
    if RETRY_STATE["attempts"] == 1:
        raise ConnectionError("try again")
    return value + 100


@workflow
def fold_retried(start: int) -> int:
    first = fold_add(start, 1)
    return fold_flaky(first)


# -- what one transaction means, per backend ---------------------------------------------


class StatementTrace:
    """Every statement the store's connections send, from now on: SQLite's
    own trace callback on each connection the store opens; on MariaDB, each
    query the PyMySQL connection sends, with its ``begin()``, ``commit()``
    and ``rollback()`` calls (statements as sent, parameters in place)."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.statements: list[str] = []
        store.close()
        opened = store._open
        trace = self._trace_sqlite if store.backend == "sqlite" else self._trace_mariadb

        def traced_open() -> Any:
            conn = opened()
            trace(conn)
            return conn

        monkeypatch.setattr(store, "_open", traced_open)

    def _trace_sqlite(self, conn: Any) -> None:
        def traced(statement: str) -> None:
            # A statement that fires a trigger (the status checks of
            # store/functions/sqlite/statuses.sql) is reported again, with
            # the same text, as the trigger runs; the store never sends the
            # same statement with the same values twice in a row.
            if not self.statements or self.statements[-1] != statement:
                self.statements.append(statement)

        conn.set_trace_callback(traced)

    def _trace_mariadb(self, conn: Any) -> None:
        raw = conn.raw
        query = raw.query

        def traced_query(sql: Any, *args: Any, **kwargs: Any) -> Any:
            # A multi-statement send (one round trip) is its statements.
            text = sql.decode() if isinstance(sql, bytes) else str(sql)
            self.statements += [part for part in re.split(r";[ \t]*\n", text) if part.strip()]
            return query(sql, *args, **kwargs)

        def traced(verb: str, call: Any) -> Any:
            def sent() -> Any:
                self.statements.append(verb)
                return call()
            return sent

        raw.query = traced_query
        raw.begin = traced("BEGIN", raw.begin)
        raw.commit = traced("COMMIT", raw.commit)
        raw.rollback = traced("ROLLBACK", raw.rollback)

    def write_transactions(self) -> list[list[str]]:
        """The writes made, grouped by the transaction that committed them:
        a ``BEGIN`` (or ``START TRANSACTION``) … ``COMMIT`` block, or one
        autocommitted statement."""
        transactions: list[list[str]] = []
        block: list[str] | None = None
        for statement in (" ".join(text.split()) for text in self.statements):
            verb = statement.split(" ", 1)[0].upper()
            if verb in ("BEGIN", "START"):
                block = []
            elif verb in ("COMMIT", "ROLLBACK"):
                if block and verb == "COMMIT":
                    transactions.append(block)
                block = None
            elif verb in ("INSERT", "UPDATE", "DELETE", "WITH"):
                if block is not None:
                    block.append(statement)
                else:
                    transactions.append([statement])
        return transactions


def transaction_ids(store: Store, run_id: str) -> tuple[str, dict[str, str]]:
    """PostgreSQL: the transaction that last wrote the run row, and each step row's."""
    with psycopg.connect(libpq_url(store.url), autocommit=True) as conn:
        (run_xmin,) = conn.execute("SELECT xmin::text FROM everystep_workflow WHERE id = %s", (run_id,)).fetchone()
        steps = dict(conn.execute("SELECT step_id, xmin::text FROM everystep_step WHERE workflow_id = %s",
                                  (run_id,)).fetchall())
    return run_xmin, steps


TERMINAL_WRITE = re.compile(r"^UPDATE everystep_workflow SET status = '(completed|failed|stopped|blocked)'")
STEP_WRITE = re.compile(r"^INSERT INTO everystep_step .*? SELECT '[^']*', '([^']*)'")


def run_writes(trace: StatementTrace) -> list[list[str]]:
    """SQLite, MariaDB: each transaction that wrote a step or a terminal status, as
    the step ids it wrote and ``"status"``."""
    transactions = []
    for writes in trace.write_transactions():
        written = []
        for write in writes:
            step_write, terminal = STEP_WRITE.match(write), TERMINAL_WRITE.match(write)
            if step_write:
                written.append(step_write.group(1))
            elif terminal:
                written.append("status")
        if written:
            transactions.append(written)
    return transactions


def folded_steps(store: Store, run_id: str, trace: StatementTrace | None) -> list[str]:
    """The step ids written in the same transaction as the run's terminal status."""
    if trace is None:
        run_xmin, steps = transaction_ids(store, run_id)
        return sorted(step_id for step_id, xmin in steps.items() if xmin == run_xmin)
    return sorted(step_id for writes in run_writes(trace) if "status" in writes
                  for step_id in writes if step_id != "status")


@pytest.fixture
def trace(store: Store, monkeypatch: pytest.MonkeyPatch) -> StatementTrace | None:
    return StatementTrace(store, monkeypatch) if store.backend in ("sqlite", "mariadb") else None


# -- the fold ------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [fold_tail, fold_tail_stored])
def test_the_last_step_and_the_status_commit_together(store: Store, trace: StatementTrace | None,
                                                      body: Any) -> None:
    run = schedule(body, 1, database=store)
    assert execute_run(store, run.id) == COMPLETED
    done = store.get_run(run.id)
    assert (done.status, done.result) == (COMPLETED, 3)
    assert [(s.step_id, s.status, s.result) for s in store.get_steps(run.id)] == [("1", STEP_DONE, 2),
                                                                                 ("2", STEP_DONE, 3)]
    assert folded_steps(store, run.id, trace) == ["2"]
    if trace is not None:
        # Two commits in all for the run's writes, where there were three.
        assert run_writes(trace) == [["1"], ["2", "status"]]


def test_a_one_step_workflow_commits_once(store: Store, trace: StatementTrace | None) -> None:
    run = schedule(fold_single, 1, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == 6
    assert folded_steps(store, run.id, trace) == ["1"]


@pytest.mark.parametrize("body", [fold_goes_on, fold_in_helper, fold_in_parallel, fold_unsafe])
def test_a_step_that_is_not_the_last_act_commits_on_its_own(store: Store, trace: StatementTrace | None,
                                                            body: Any) -> None:
    run = schedule(body, 1, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).status == COMPLETED
    assert all(s.status == STEP_DONE for s in store.get_steps(run.id))
    assert folded_steps(store, run.id, trace) == []


def test_a_failing_last_step_is_recorded_before_the_run_fails(store: Store, trace: StatementTrace | None) -> None:
    run = schedule(fold_failing, 1, database=store)
    assert execute_run(store, run.id) == FAILED
    assert store.get_run(run.id).error["type"] == "builtins.ValueError"
    assert [(s.step_id, s.status) for s in store.get_steps(run.id)] == [("1", STEP_DONE), ("2", STEP_FAILED)]
    assert folded_steps(store, run.id, trace) == []


def test_a_retried_last_step_waits_then_folds_its_successful_attempt(store: Store,
                                                                     trace: StatementTrace | None) -> None:
    RETRY_STATE.clear()
    run = schedule(fold_retried, 1, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    assert folded_steps(store, run.id, trace) == []
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == 102
    step2 = store.get_steps(run.id)[1]
    assert (step2.status, step2.attempt) == (STEP_DONE, 2)
    assert folded_steps(store, run.id, trace) == ["2"]


def test_observers_see_the_folded_step_end_after_its_write(store: Store) -> None:
    seen: list[tuple[str, ...]] = []

    class Recorder(Observer):
        def run_settling(self, run: Any, status: str) -> None:
            seen.append(("settling", status))

        def step_finished(self, ctx: Any, step_id: str, name: str, status: str, error: Any, token: Any) -> None:
            rows = [s.step_id for s in store.get_steps(ctx.workflow_id)]
            seen.append(("step", step_id, status, ",".join(rows)))

    run = schedule(fold_tail, 1, database=store)
    assert execute_run(store, run.id, observer=Recorder()) == COMPLETED
    assert seen == [("step", "1", STEP_DONE, "1"), ("settling", COMPLETED), ("step", "2", STEP_DONE, "1,2")]


# -- the windows it opens ------------------------------------------------------------------


def test_a_crash_after_the_last_effect_replays_the_last_step(store: Store) -> None:
    run = schedule(fold_tail, 1, database=store)
    crash_at("2")
    with pytest.raises(Exception, match="died after the effect of step 2"):
        execute_run(store, run.id)
    assert store.get_run(run.id).status == RUNNING
    assert [s.step_id for s in store.get_steps(run.id)] == ["1"]
    assert store.requeue(store.get_run(run.id).claim)
    assert execute_run(store, run.id) == COMPLETED
    assert CALLS == Counter({"add1+1": 1, "add2+1": 2})  # at-least-once: the last step ran again
    assert store.get_run(run.id).result == 3


def test_a_death_while_settling_leaves_the_last_step_unrecorded_and_replayable(store: Store) -> None:
    """The process goes away once the body has returned, before the
    folded commit: nothing of the last step or the status is written."""

    class Dies(Observer):
        def run_settling(self, run: Any, status: str) -> None:
            raise KeyboardInterrupt("the process is going away")

    run = schedule(fold_tail, 1, database=store)
    with pytest.raises(KeyboardInterrupt):
        execute_run(store, run.id, observer=Dies())
    assert store.get_run(run.id).status == RUNNING
    assert [s.step_id for s in store.get_steps(run.id)] == ["1"]
    assert store.requeue(store.get_run(run.id).claim)
    assert execute_run(store, run.id) == COMPLETED
    assert CALLS["add2+1"] == 2 and store.get_run(run.id).result == 3


def test_a_stale_claim_writes_neither_the_step_nor_the_status(store: Store) -> None:
    run = schedule(fold_tail, 1, database=store)
    stale = claim_run(store, run.id, "A").claim
    (fresh,) = [held.claim for held in store.claim_own("A", 10, [fold_tail.name])]
    entry = NewStep("1", fold_add.name, "[1, 1]", "{}", utcnow(), STEP_DONE, "2")
    assert store.finish_run_with_step(stale, entry, COMPLETED, "2") is None
    assert store.get_steps(run.id) == []
    assert store.get_run(run.id).status == RUNNING
    written = store.finish_run_with_step(fresh, entry, COMPLETED, "2")
    assert written is not None and written.ours and written.record.completed_at is not None
    assert store.get_run(run.id).status == COMPLETED
    assert [(s.step_id, s.result) for s in store.get_steps(run.id)] == [("1", 2)]


def test_a_step_that_already_has_an_outcome_keeps_the_run_running(store: Store) -> None:
    run = schedule(fold_tail, 1, database=store)
    claim = claim_run(store, run.id).claim
    entry = NewStep("1", fold_add.name, "[1, 1]", "{}", utcnow(), STEP_DONE, "2")
    assert store.record_step(claim, entry).ours
    assert store.finish_run_with_step(claim, entry, COMPLETED, "2") is None
    assert store.get_run(run.id).status == RUNNING


def _lock_waits(url: str) -> list[str]:
    """MariaDB: what each transaction waiting for a row lock is running."""
    import pymysql

    from everystep.store.mariadb import connect_args

    with pymysql.connect(**connect_args(url), autocommit=True) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT trx_query FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'")
        return [str(query) for (query,) in cursor.fetchall()]


@pytest.mark.backends("mariadb")
def test_a_claim_taken_over_while_the_fold_waits_leaves_neither_write(store: Store) -> None:
    """MariaDB folds in one transaction (one multi-statement send) that
    first locks the run row under the claim, then writes the step and the
    status, each conditional on the claim. Another transaction takes the
    run over (bumps its epoch) and holds the row: the fold waits for it at
    its lock, then finds the claim gone once the takeover commits, and
    writes neither the step nor the status."""
    import pymysql

    from everystep.store.mariadb import connect_args

    run = schedule(fold_tail, 1, database=store)
    claim = claim_run(store, run.id, "A").claim
    entry = NewStep("1", fold_add.name, "[1, 1]", "{}", utcnow(), STEP_DONE, "2")
    written: list[Any] = []
    with pymysql.connect(**connect_args(store.url)) as taker, taker.cursor() as cursor:
        taker.begin()
        cursor.execute("UPDATE everystep_workflow SET claim_epoch = claim_epoch + 1 WHERE id = %s", (run.id,))
        folding = threading.Thread(target=lambda: written.append(
            store.finish_run_with_step(claim, entry, COMPLETED, "2")))
        folding.start()
        deadline = time.monotonic() + 60
        fold_lock = re.compile(r"^(START TRANSACTION;\s*)?SELECT id FROM everystep_workflow\b.*FOR UPDATE", re.S)
        while not any(fold_lock.match(query) for query in _lock_waits(store.url)):
            assert folding.is_alive() and time.monotonic() < deadline, f"the fold did not wait: {written}"
            time.sleep(0.05)
        assert store.get_steps(run.id) == []  # not committed yet
        taker.commit()
        folding.join(timeout=60)
    assert written == [None]
    assert store.get_steps(run.id) == []
    after = store.get_run(run.id)
    assert (after.status, after.claim_epoch) == (RUNNING, claim.epoch + 1)


@step
def fold_superseded(value: int) -> int:
    """Its run is taken from this execution while it runs: forced requeue,
    then claimed again under the same name (a new epoch)."""
    ctx = current()
    assert ctx is not None
    store = ctx.execution.store
    admin.requeue_run(store, ctx.workflow_id, force=True)
    claim_run(store, ctx.workflow_id)
    return value + 1


@workflow
def fold_superseded_flow(start: int) -> int:
    first = fold_add(start, 1)
    return fold_superseded(first)


def test_a_superseded_execution_writes_nothing_at_its_last_step(store: Store) -> None:
    run = schedule(fold_superseded_flow, 1, database=store)
    assert execute_run(store, run.id) == Outcome.LOST
    after = store.get_run(run.id)
    assert (after.status, after.claim_epoch) == (RUNNING, 3)  # forced requeue, claim
    assert [s.step_id for s in store.get_steps(run.id)] == ["1"]


@step
def fold_cancels_itself(value: int) -> int:
    ctx = current()
    assert ctx is not None
    admin.cancel(ctx.execution.store, ctx.workflow_id, "from inside")
    return value + 1


@workflow
def fold_cancelled_flow(start: int) -> int:
    first = fold_add(start, 1)
    return fold_cancels_itself(first)


def test_a_cancel_during_the_last_step_records_it_and_keeps_the_cancel(store: Store) -> None:
    run = schedule(fold_cancelled_flow, 1, database=store)
    assert execute_run(store, run.id) == Outcome.CANCELLED
    after = store.get_run(run.id)
    assert (after.status, after.error["message"], after.result) == (CANCELLED, "from inside", None)
    assert [(s.step_id, s.status, s.result) for s in store.get_steps(run.id)] == [("1", STEP_DONE, 2),
                                                                                 ("2", STEP_DONE, 3)]


@step
def fold_raced(value: int) -> int:
    """A racing execution under the same claim records this very step first,
    with another result: the run goes on with the recorded one."""
    ctx = current()
    assert ctx is not None
    store = ctx.execution.store
    claim: Claim = ctx.execution.claim
    store.record_step(claim, NewStep("2", fold_raced.name, "[2]", "{}", utcnow(), STEP_DONE, "42"))
    return value + 1


@workflow
def fold_raced_flow(start: int) -> int:
    first = fold_add(start, 1)
    return fold_raced(first)


def test_a_last_step_recorded_by_a_racing_execution_settles_with_its_record(store: Store) -> None:
    run = schedule(fold_raced_flow, 1, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == 42
    assert [(s.step_id, s.result) for s in store.get_steps(run.id)] == [("1", 2), ("2", 42)]


def test_an_unsafe_last_step_keeps_its_started_row_protocol(store: Store) -> None:
    run = schedule(fold_unsafe, 1, database=store)
    crash_at("2")
    with pytest.raises(Exception, match="died after the effect"):
        execute_run(store, run.id)
    assert [(s.step_id, s.status) for s in store.get_steps(run.id)] == [("1", STEP_DONE), ("2", STEP_STARTED)]


def test_a_supervised_child_folds_the_last_step(pg_url: str, supervisors: Any, tmp_path: Any) -> None:
    """The same in the product's shape: the supervisor's child executes the
    run after a fork, with the app imported by ``--app``."""
    store = connect(pg_url)
    try:
        runs = [schedule(supervised.tiny, {"dir": str(tmp_path)}, database=store) for _ in range(3)]
        sup = supervisors(pg_url, procs=1, args=["--burst"]).spawn()
        assert sup.wait(timeout=90) == 0, sup.log()
        for run in runs:
            done = store.get_run(run.id)
            assert (done.status, done.result) == (COMPLETED, store.get_steps(run.id)[0].result)
            assert folded_steps(store, run.id, None) == ["1"]
    finally:
        store.close()
