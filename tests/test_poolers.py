"""PostgreSQL behind a connection pooler: a real PgBouncer, stock settings.

In transaction mode (``?pooler=transaction``) the store prepares nothing,
keeps no session state between transactions (its statement timeout goes
inside each transaction, not in the ``options`` startup parameter a stock
PgBouncer refuses) and LISTENs only on a direct URL of its own
(``--listen-database``), else runners poll and say so once. In session
mode PgBouncer is used as a direct connection is, LISTEN included.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from everystep import schedule
from everystep.errors import EverystepError, StoreUnavailable
from everystep.models import COMPLETED
from everystep.store import LOST, Marker, NewStep, connect, functions, pooling, utcnow
from everystep.store.channels import SCHEDULED_CHANNEL
from everystep.store.postgres import FUNCTION_FORMS, function_call
from everystep.worker import Worker
from tests.apps.pooled import hops
from tests.support.pgbouncer import PgBouncer, libpq_url
from tests.support.runs import worker_running
from tests.support.supervisor import Supervisor, supervisors  # noqa: F401
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

APP = "tests.apps.pooled"
POLLING = "pickup by polling"


# -- the parameter ---------------------------------------------------------------------


def test_the_pooler_parameter_is_taken_out_of_the_url_and_the_rest_kept() -> None:
    assert pooling.split("postgresql://u:p@h:6432/db?sslmode=require&pooler=transaction&application_name=x") == (
        "postgresql://u:p@h:6432/db?sslmode=require&application_name=x", "transaction")
    assert pooling.split("postgresql://h/db?pooler=Session") == ("postgresql://h/db", "session")
    assert pooling.split("postgresql://h/db") == ("postgresql://h/db", "none")


def test_an_unknown_pooler_value_names_the_valid_ones() -> None:
    with pytest.raises(EverystepError) as caught:
        connect("postgresql://nobody@127.0.0.1:1/db?pooler=statement")
    assert str(caught.value) == ("unknown pooler=statement in the database URL: it takes transaction, session "
                                 "or none")


@pytest.mark.parametrize("command", [["everystep", "runs"], ["everystep-supervisor", "--procs", "0"]])
def test_an_unknown_pooler_value_exits_2_in_one_line(command: list[str], subprocess_env: dict[str, str],
                                                     tmp_path: Path) -> None:
    url = "postgresql://nobody@127.0.0.1:1/db?pooler=bogus"
    done = subprocess.run([str(Path(sys.executable).parent / command[0]), *command[1:], "--database", url],
                          env=subprocess_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "pooler=bogus" in line and "transaction, session or none" in line


def test_listen_through_a_transaction_pooler_is_refused_in_one_line(subprocess_env: dict[str, str],
                                                                    tmp_path: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "everystep-supervisor"), "--procs", "0",
         "--database", "postgresql://nobody@127.0.0.1:1/db?pooler=transaction",
         "--listen-database", "postgresql://nobody@127.0.0.1:2/db?pooler=transaction"],
        env=subprocess_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "LISTEN cannot work" in line and "a notification reaches only the server session that listened" in line


# -- transaction mode --------------------------------------------------------------------


def test_nothing_is_prepared_and_settings_stay_inside_each_transaction(pooled_url: str,
                                                                       pgbouncer_transaction: PgBouncer) -> None:
    store = connect(pooled_url, statement_timeout=0.5)
    try:
        with store.connection() as conn:
            # Its settings go with every statement, the hot ones too: all take the cursor.
            assert conn.prepare_threshold is None and conn.hot_prepared is None
            for _ in range(10):  # psycopg would prepare a statement run this often
                assert conn.execute("SELECT current_setting('statement_timeout') AS t").fetchone()["t"] == "500ms"
        runner_store = connect(pooled_url)  # a child's: no settings, the hot path sent whole
        run = schedule(hops, 1, database=runner_store)
        claimed = runner_store.claim("pooled", 10, [run.name])
        assert [item.id for item in claimed] == [run.id]
        for index in range(10):
            runner_store.record_step(claimed[0].claim, NewStep(f"s{index}", "x", "[]", "{}", utcnow(),
                                                               status="done", result_json="1"))
        with runner_store.connection() as conn:
            assert not conn.hot_prepared.named
            assert conn.execute("SELECT count(*) AS n FROM pg_prepared_statements").fetchone()["n"] == 0
        assert len(runner_store.get_steps(run.id)) == 10
        with pytest.raises(StoreUnavailable, match="statement timeout"):
            with store.connection() as conn:
                conn.execute("SELECT pg_sleep(3)")
        # Another client of the same PgBouncer, on the server sessions the
        # store used: nothing it set outlived its transactions.
        with psycopg.connect(libpq_url(pooled_url), autocommit=True, prepare_threshold=None) as other:
            for _ in range(5):
                assert other.execute("SHOW statement_timeout").fetchone() == ("0",)
    finally:
        store.close()


def test_behind_the_pooler_the_step_records_are_calls_of_functions_taking_their_statements_parameters(
        pooled_url: str, pg_url: str) -> None:
    # Nothing stays prepared behind the pooler, so the step records are
    # PL/pgSQL functions, whose plans the server keeps per session: each
    # takes exactly its statement's parameters, named p_..., in their order.
    pooled, direct = connect(pooled_url), connect(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for name in FUNCTION_FORMS:
            statement = dict.__getitem__(direct.sql, name)
            assert dict.__getitem__(pooled.sql, name) == function_call(name, statement)
            arguments = conn.execute(
                "SELECT array(SELECT a.name FROM unnest(p.proargnames, p.proargmodes) AS a(name, mode) "
                "WHERE a.mode = 'i') FROM pg_proc AS p WHERE p.proname = %s", (f"everystep_{name}",)).fetchone()
            assert arguments is not None, f"everystep_{name} is missing"
            parameters = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
            assert arguments[0] == [f"p_{parameter}" for parameter in parameters]
    assert functions.as_function_body("id = %(run_id)s AND x LIKE 'a%%'") == "id = p_run_id AND x LIKE 'a%'"
    with pytest.raises(KeyError):
        functions.render("{statement:no_such_statement}", "postgres")


def test_behind_the_pooler_each_step_record_writes_what_its_statement_writes(pooled_url: str) -> None:
    store = connect(pooled_url)
    run = schedule(hops, 1, database=store)
    claim = store.claim("pooled", 10, [run.name])[0].claim

    def step(step_id: str) -> NewStep:
        return NewStep(step_id, "x", "[1]", "{}", utcnow(), status="done", result_json=f'"{step_id}"')

    marker = Marker("patch:p", "everystep.patched", '["p"]', "true")
    written = store.record_step(claim, step("a"))
    assert written is not LOST and written is not None and written.ours and written.record.result == "a"
    assert store.record_step(claim, step("b"), markers=[marker]) is not LOST
    stale = dataclasses.replace(claim, epoch=claim.epoch - 1)
    assert store.record_step(stale, step("c")) is LOST
    assert store.finish_run_with_step(stale, step("c"), COMPLETED, result_json="3") is LOST
    assert store.finish_run_with_step(claim, step("c"), COMPLETED, result_json="3",
                                      markers=[marker._replace(step_id="patch:q")]) is not LOST
    assert store.get_run(run.id).status == COMPLETED
    steps = {record.step_id: record for record in store.get_steps(run.id)}
    assert sorted(steps) == ["a", "b", "c", "patch:p", "patch:q"]
    assert steps["c"].result == "c" and steps["patch:p"].result is True


def test_a_read_only_store_behind_the_pooler_reads_and_refuses_writes(pooled_url: str) -> None:
    run = schedule(hops, 1, database=pooled_url)
    reader = connect(pooled_url, read_only=True)
    try:
        assert reader.get_run(run.id).status == "scheduled"
        with pytest.raises(StoreUnavailable, match="read-only transaction"):
            with reader.connection() as conn:
                conn.execute("DELETE FROM everystep_workflow")
    finally:
        reader.close()
    assert connect(pooled_url).get_run(run.id).status == "scheduled"


def test_notify_sent_through_the_pooler_reaches_a_direct_listener(pooled_url: str, pg_url: str) -> None:
    store = connect(pooled_url, listen_url=pg_url)
    listening = store.listen()
    assert listening is not None
    try:
        run = schedule(hops, 1, database=store)
        heard: list[tuple[str, str]] = []

        def notified() -> bool:
            if select.select([listening.fileno()], [], [], 0.5)[0]:
                heard.extend(listening.drain())
            return (SCHEDULED_CHANNEL, run.name) in heard

        wait_until(notified, "the NOTIFY of schedule() through PgBouncer", timeout=60)
    finally:
        listening.close()
        store.close()


def test_without_a_listen_url_the_store_has_no_listen_connection_and_says_why(pooled_url: str) -> None:
    store = connect(pooled_url)
    assert store.listen() is None and not store.wakes
    assert store.listen_unavailable == ("LISTEN needs a direct connection; pass --listen-database "
                                        "(or $EVERYSTEP_LISTEN_DATABASE_URL)")


def test_a_supervisor_runs_every_run_through_a_stock_pgbouncer(pooled_url: str, supervisors: Any) -> None:
    store = connect(pooled_url)
    runs = [schedule(hops, 4, database=store) for _ in range(60)]
    supervisor: Supervisor = supervisors(pooled_url, app=APP, procs=2, args=["--burst"])
    supervisor.spawn()
    assert supervisor.wait(timeout=240) == 0, supervisor.log()
    assert {store.get_run(run.id).status for run in runs} == {COMPLETED}, supervisor.log()
    assert [store.get_run(run.id).result for run in runs[:3]] == [4, 4, 4]
    said = [line for line in supervisor.log().splitlines() if POLLING in line]
    assert len(said) == 1 and said[0].endswith(": pickup by polling every 0.1 s: LISTEN needs a direct connection; "
                                               "pass --listen-database (or $EVERYSTEP_LISTEN_DATABASE_URL)")


def test_without_the_parameter_a_stock_pgbouncer_refusal_says_what_to_add(pooled_url: str, supervisors: Any) -> None:
    unmarked = pooling.split(pooled_url)[0]
    supervisor: Supervisor = supervisors(unmarked, app=APP, procs=1)
    supervisor.spawn()
    assert supervisor.wait(timeout=120) == 2
    last = supervisor.log().strip().splitlines()[-1]
    assert "unsupported startup parameter: options" in last and "add ?pooler=transaction to the URL" in last


def idle_after_first_claim(supervisor: Supervisor) -> None:
    """Its first claim found nothing: from now on only a wake-up claims."""
    supervisor.wait_status(lambda status: status["runs"]["empty_claims"] >= 1, "a first, empty claim")


def test_listen_on_a_direct_url_wakes_a_supervisor_behind_the_pooler(pooled_url: str, pg_url: str,
                                                                    supervisors: Any) -> None:
    """--poll 3600: a run scheduled once the supervisor is idle is picked up
    only if a notification wakes it."""
    supervisor: Supervisor = supervisors(pooled_url, app=APP, procs=1, poll=3600,
                                         args=["--listen-database", pg_url]).start()
    idle_after_first_claim(supervisor)
    run = schedule(hops, 2, database=pooled_url)
    wait_until(lambda: connect(pooled_url).get_run(run.id).status == COMPLETED, "the run woken by NOTIFY",
               timeout=60, detail=lambda: f"\n--- log ---\n{supervisor.log()}")
    assert POLLING not in supervisor.log()


def test_a_threaded_worker_listens_on_its_listen_url_and_polls_without_one(
        pooled_url: str, pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="everystep")
    listening = Worker(pool_size=1, poll=3600, name="listening", database=connect(pooled_url, listen_url=pg_url))
    with worker_running(listening):
        wait_until(lambda: listening.loop.empty_claims >= 1, "a first, empty claim")
        run = schedule(hops, 2, database=pooled_url)
        wait_until(lambda: connect(pooled_url).get_run(run.id).status == COMPLETED, "the run woken by NOTIFY")
    assert not [record for record in caplog.records if POLLING in record.getMessage()]
    polling = Worker(pool_size=1, poll=0.05, name="polling", database=connect(pooled_url))
    with worker_running(polling):
        run = schedule(hops, 2, database=pooled_url)
        wait_until(lambda: connect(pooled_url).get_run(run.id).status == COMPLETED, "the run found by polling")
    said = [record.getMessage() for record in caplog.records if POLLING in record.getMessage()]
    assert said == ["everystep worker polling: pickup by polling every 0.05 s: LISTEN needs a direct connection; "
                    "pass --listen-database (or $EVERYSTEP_LISTEN_DATABASE_URL)"]


# -- session mode --------------------------------------------------------------------------


def test_session_pooling_works_as_a_direct_connection_listen_included(pg_url: str,
                                                                     pgbouncer_session: PgBouncer,
                                                                     supervisors: Any) -> None:
    url = pgbouncer_session.url_for(pg_url)
    store = connect(url)
    assert store.wakes and store._hot  # prepared statements: the session stays one server session
    supervisor: Supervisor = supervisors(url, app=APP, procs=2, poll=3600).start()
    idle_after_first_claim(supervisor)
    runs = [schedule(hops, 3, database=store) for _ in range(20)]
    for run in runs:
        wait_until(lambda: store.get_run(run.id).status == COMPLETED, "runs woken by NOTIFY through PgBouncer",
                   timeout=60, detail=lambda: f"\n--- log ---\n{supervisor.log()}")
    assert POLLING not in supervisor.log()
