"""MariaDB's hot path in round trips, and its wake-up: a 3-step run costs
a claim (one procedure call), two step records and the folded last step,
each step's record committed before the next step starts; a run scheduled
while a supervisor idles is picked up by the wake-up connection, not by
the poll. Counted and observed on a real server; speed is measured by the
benchmarks, never asserted here."""

from __future__ import annotations

import dataclasses
import re
import selectors
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pytest

pymysql = pytest.importorskip("pymysql", reason="the MariaDB backend's driver (pip install -e '.[test]')")

from pymysql.constants import COMMAND  # noqa: E402

from everystep import registry, runner, schedule, step, workflow  # noqa: E402
from everystep.context import current  # noqa: E402
from everystep.models import COMPLETED, Outcome  # noqa: E402
from everystep.store import Store, connect  # noqa: E402
from everystep.store.mariadb import MariaDBStore, connect_args  # noqa: E402
from everystep.store.channels import SCHEDULED_CHANNEL  # noqa: E402
from everystep.store.mariadb_wake import Waking  # noqa: E402
from tests.apps import supervised  # noqa: E402
from tests.support.supervisor import supervisors  # noqa: E402,F401

pytestmark = [pytest.mark.backends("mariadb"), pytest.mark.timeout(180)]


@pytest.fixture
def fresh_url(mariadb_server: Any) -> Iterator[str]:
    """A database of its own, without everystep's tables."""
    url = mariadb_server.create_database("everystep_fresh")
    try:
        yield url
    finally:
        mariadb_server.drop_database(url)


@step
def committed_steps(value: int) -> int:
    """How many of its run's steps another connection sees committed, as
    this step starts (the step records before it must all be durable)."""
    ctx = current()
    assert ctx is not None
    store = ctx.execution.store
    with pymysql.connect(**connect_args(store.url), autocommit=True) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM everystep_step WHERE workflow_id = %s", (ctx.workflow_id,))
        row = cursor.fetchone()
    seen = int(row[0]) if row else -1
    assert seen == value, f"step {value + 1} started with {seen} earlier step records committed, not {value}"
    return value + 1


@workflow
def three_steps(start: int) -> int:
    a = committed_steps(start)
    b = committed_steps(a)
    return committed_steps(b)


class RoundTrips:
    """Every command the store's connections send the server (one round
    trip each; a multi-statement send or a CALL is one), from now on."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[str] = []
        store.close()
        opened = store._open

        def traced_open() -> Any:
            conn = opened()
            send = conn.raw._execute_command

            def traced(command: int, sql: Any) -> Any:
                if command == COMMAND.COM_QUERY:
                    text = sql.decode() if isinstance(sql, bytes) else str(sql)
                    self.sent.append(" ".join(text.split()))
                return send(command, sql)

            conn.raw._execute_command = traced
            return conn

        monkeypatch.setattr(store, "_open", traced_open)

    def kinds(self) -> list[str]:
        """What each round trip began with: the procedure called, the
        table written, or the transaction sent whole."""
        return [match.group(0) if (match := _KIND.match(text)) else text[:40] for text in self.sent]


_KIND = re.compile(r"CALL \w+|INSERT INTO \w+|START TRANSACTION;")


def test_a_three_step_run_takes_four_round_trips(mariadb_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a supervisor issues them: a claim for every workflow the
    application registers with room for two runs (the parent), then the
    run's execution (a child): the claim is one procedure call, the first
    two steps one autocommitted record each, the last step and the run's
    status one multi-statement transaction."""
    store = connect(mariadb_url)
    try:
        run = schedule(three_steps, 0, database=store)
        store.ping()  # connections are opened (and set up) before counting
        trips = RoundTrips(store, monkeypatch)
        store.ping()
        trips.sent.clear()
        claimed = store.claim("counting", 2, registry.workflow_names())
        assert [each.id for each in claimed] == [run.id]
        assert runner.execute_guarded(store, claimed[0], claimer="counting") == Outcome.COMPLETED
        assert trips.kinds() == ["CALL everystep_claim", "INSERT INTO everystep_step", "INSERT INTO everystep_step",
                             "START TRANSACTION;"], (
            trips.sent)
        assert len(trips.sent) <= 6
        done = store.get_run(run.id)
        assert (done.status, done.result) == (COMPLETED, 3)
        assert [(s.step_id, s.result) for s in store.get_steps(run.id)] == [("1", 1), ("2", 2), ("3", 3)]
    finally:
        store.close()


def test_schedule_interrupts_a_waiting_wake_up_connection(mariadb_url: str) -> None:
    store, scheduler = connect(mariadb_url), connect(mariadb_url)
    waking = store.listen()
    assert waking is not None
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(waking.fileno(), selectors.EVENT_READ)
            assert selector.select(0.2) == []  # asleep
            schedule(supervised.tiny, {"dir": "/x"}, database=scheduler)
            assert selector.select(10), "schedule() did not wake the sleeping connection"
            assert waking.drain() == [(SCHEDULED_CHANNEL, "")]
            assert selector.select(0.2) == []  # asleep again
            schedule(supervised.tiny, {"dir": "/x"}, database=scheduler)
            assert selector.select(10) and waking.drain() == [(SCHEDULED_CHANNEL, "")]
    finally:
        waking.close()
        store.close()
        scheduler.close()


def test_wake_off_in_the_url_leaves_runners_polling(mariadb_url: str) -> None:
    store = connect(mariadb_url + "?wake=off")
    try:
        assert store.listen() is None
        assert store.schedule(supervised.tiny.name, '[{"dir": "/x"}]').status == "scheduled"
    finally:
        store.close()


def test_an_idle_supervisor_is_woken_by_schedule_not_by_its_poll(mariadb_url: str, supervisors: Any,
                                                                 tmp_path: Path) -> None:
    """Polling every 30 s, the supervisor still starts a run scheduled while
    it idles within seconds: the wake-up connection, not the poll."""
    sup = supervisors(mariadb_url, procs=1, poll=30).start()
    time.sleep(1.0)  # past its first claims: idle until woken or polled
    store = connect(mariadb_url)
    try:
        run = schedule(supervised.tiny, {"dir": str(tmp_path)}, database=store)
        deadline = time.monotonic() + 10
        while store.get_run(run.id).status != COMPLETED:
            assert time.monotonic() < deadline, f"not picked up within 10 s at --poll 30\n{sup.log()}"
            time.sleep(0.05)
    finally:
        store.close()


def test_a_database_migrated_before_the_claim_procedure_says_to_migrate(fresh_url: str) -> None:
    from everystep.errors import SchemaMissing

    store = connect(fresh_url)
    try:
        store.migrate()
        with pymysql.connect(**connect_args(fresh_url), autocommit=True) as conn, conn.cursor() as cursor:
            cursor.execute("DROP PROCEDURE everystep_claim")
            cursor.execute("DELETE FROM everystep_function")
        with pytest.raises(SchemaMissing, match="everystep migrate"):
            store.claim("r", 1, ["w"])
        store.migrate()  # puts the procedure back
        assert store.claim("r", 1, ["w"]) == []
    finally:
        store.close()


def test_the_claim_procedure_holds_the_longest_keys_the_schema_does(mariadb_url: str) -> None:
    """Its lists are temporary tables of its own: a 300-character
    concurrency key (the column's width) is claimed and counted whole."""
    from everystep.queues import Placement

    store = connect(mariadb_url)
    try:
        store.update_queue("long-keys", lambda current: dataclasses.replace(current, key_concurrency=1))
        key = "k" * 300
        for keyed in (key, key, None):
            store.schedule("w.long", "[]", placement=Placement(queue="long-keys", concurrency_key=keyed))
        claimed = store.claim("r", 10, ["w.long"])
        assert sorted(run.concurrency_key or "" for run in claimed) == ["", key]
    finally:
        store.close()


def test_the_claim_procedure_never_waits_on_rows_others_hold(mariadb_url: str) -> None:
    """Scheduled runs an operator holds, a running run a step writer holds
    (counted by the queue's limits), in a limited queue, with more served
    names than the claim reads one by one: with a one-second statement
    timeout, a claim that waited on any of them would fail. It takes the
    free runs, and the held ones once they are released."""
    from everystep.queues import Placement

    store = connect(mariadb_url)
    impatient = MariaDBStore(mariadb_url, statement_timeout=1)
    try:
        store.update_queue("held", lambda current: dataclasses.replace(current, concurrency=20, key_concurrency=2))
        names = [f"w.held{i}" for i in range(6)]
        runs = [store.schedule(names[i % 6], "[]", placement=Placement(queue="held", concurrency_key=f"k{i % 4}"))
                for i in range(8)]
        writing = store.claim("writer", 1, names)[0]  # running: its row held below, as a step writer holds it
        held = [run for run in runs if run.id != writing.id][:2]
        with store.locked_run(held[0].id), store.locked_run(held[1].id), store.locked_run(writing.id):
            taken = {run.id for run in impatient.claim("impatient", 10, names)}
        free = {run.id for run in runs} - {writing.id} - {run.id for run in held}
        assert taken == free
        assert {run.id for run in impatient.claim("later", 10, names)} == {run.id for run in held}
    finally:
        store.close()
        impatient.close()


def test_a_closed_wake_up_connection_leaves_no_sleeping_session(mariadb_url: str) -> None:
    """The server does not notice a client gone mid-sleep: closing ends the
    sleep first (a supervisor closes and reopens it around every fork)."""
    store = connect(mariadb_url)
    waking = store.listen()
    assert isinstance(waking, Waking)
    session = waking._raw.thread_id()  # the server's id of its session

    def sleeping() -> int:
        with pymysql.connect(**connect_args(mariadb_url), autocommit=True) as conn, conn.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM information_schema.PROCESSLIST"
                           " WHERE ID = %s AND INFO LIKE 'SELECT SLEEP(%%) AS everystep_wake'", (session,))
            row = cursor.fetchone()
        return int(row[0]) if row else 0

    try:
        deadline = time.monotonic() + 10
        while sleeping() != 1:
            assert time.monotonic() < deadline, "the wake-up connection never slept"
            time.sleep(0.05)
    finally:
        waking.close()
        store.close()
    deadline = time.monotonic() + 10
    while sleeping() != 0:
        assert time.monotonic() < deadline, "a closed wake-up connection still sleeps on the server"
        time.sleep(0.05)
