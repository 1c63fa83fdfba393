"""An engine database error never fails a run.

One of everystep's own statements refused by the database (a real error of
the driver, raised by the store's fault hook where the statement would be
sent) gives the run back to the queue with a growing backoff, is logged
once per run and counted; only the workflow's own doing (a step's
exception, a transactional step's own SQL) fails a run. A runner whose
statements keep failing reports itself unhealthy.
"""

from __future__ import annotations

import datetime as dt
import logging
import subprocess
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from everystep import engine_errors, exposition, runner, schedule, step, workflow
from everystep.claimloop import ClaimLoop
from everystep.engine_errors import EngineHealth, backoff
from everystep.errors import StoreError
from everystep.models import COMPLETED, FAILED, RUNNING, SCHEDULED, Outcome
from everystep.outage import OutageLog
from everystep.serde import decode_exception
from everystep.store import Store, connect, utcnow
from everystep.store.base import core
from everystep.transactional import step_connection
from tests.apps.pooled import hops, refusal
from tests.support.refusals import guarded, quick_backoff, refuse  # noqa: F401 - the fixture
from tests.support.scrape import free_port, http_get, metrics_args, scrape
from tests.support.supervisor import Supervisor, supervisor_command, supervisors, wait_run  # noqa: F401
from tests.support.waiting import wait_until

# The engine's own statements: also through PgBouncer in transaction mode.
pytestmark = pytest.mark.pooled


def due_again(store: Store, run_id: str) -> None:
    """Wait out the run's backoff: until a claim would take it."""
    wait_until(lambda: (run := store.get_run(run_id)).not_before is None or run.not_before <= utcnow(),
               f"run {run_id} to be due again", timeout=30)


def engine_errors_counted(kind: str) -> float:
    return REGISTRY.get_sample_value("everystep_engine_errors_total", {"kind": kind}) or 0.0


def kind_of(store: Store) -> str:
    return type(refusal(store.backend, "")).__name__


def test_the_backoff_doubles_from_a_second_up_to_five_minutes() -> None:
    assert [backoff(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff(9) == 256.0 and backoff(10) == backoff(50) == 300.0


def test_a_refused_step_record_gives_the_run_back_and_it_completes_later(store: Store,
                                                                         quick_backoff: None) -> None:
    run = schedule(hops, 3, database=store)
    counted = engine_errors_counted(kind_of(store))
    refused = refuse({"record_step"}, times=1)
    before = utcnow()
    assert guarded(store, run.id) == Outcome.DEFERRED
    assert refused == ["record_step"]
    waiting = store.get_run(run.id)
    assert waiting.status == SCHEDULED and waiting.claimed_by is None
    assert waiting.not_before is not None and waiting.not_before >= before + dt.timedelta(seconds=0.05)
    error = decode_exception(waiting.error)
    assert isinstance(error, StoreError), waiting.error
    assert (error.kind, error.given_back) == (kind_of(store), 1) and "refused by the test" in str(error)
    assert engine_errors_counted(kind_of(store)) == counted + 1
    due_again(store, run.id)
    assert guarded(store, run.id) == Outcome.COMPLETED
    done = store.get_run(run.id)
    assert (done.status, done.result, done.error) == (COMPLETED, 3, None)


def test_the_backoff_grows_with_each_give_back_and_the_run_is_logged_once(
        store: Store, quick_backoff: None, caplog: pytest.LogCaptureFixture) -> None:
    run = schedule(hops, 2, database=store)
    refuse({"record_step"})
    caplog.set_level(logging.DEBUG, logger="everystep")
    for given_back in (1, 2, 3):
        due_again(store, run.id)
        before = utcnow()
        assert guarded(store, run.id) == Outcome.DEFERRED
        waiting = store.get_run(run.id)
        assert decode_exception(waiting.error).given_back == given_back
        assert waiting.not_before >= before + dt.timedelta(seconds=engine_errors.backoff(given_back))
    said = [record for record in caplog.records if "refused one of everystep's statements" in record.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and run.id in said[0].getMessage()
    core.statement_fault = None
    due_again(store, run.id)
    assert guarded(store, run.id) == Outcome.COMPLETED


#: The last step folded with the run's status, or the status alone (what
#: each backend sends: one statement, or a transaction of two).
TERMINAL_WRITES = {"finish_run_with_step", "finish_run"}


@pytest.mark.parametrize("refused", ["the steps read before the body", "the terminal write"])
def test_a_refused_read_or_terminal_write_gives_the_run_back(store: Store, quick_backoff: None,
                                                             refused: str) -> None:
    run = schedule(hops, 2, database=store)
    if refused == "the steps read before the body":
        # A run with steps recorded is read before its body runs again.
        refuse(TERMINAL_WRITES, times=1)
        assert guarded(store, run.id) == Outcome.DEFERRED
        due_again(store, run.id)
        refuse({"replay_steps"})
    else:
        refuse(TERMINAL_WRITES)
    assert guarded(store, run.id) == Outcome.DEFERRED
    assert store.get_run(run.id).status == SCHEDULED
    core.statement_fault = None
    due_again(store, run.id)
    assert guarded(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == 2


@workflow
def fails_by_itself() -> None:
    raise ValueError("the workflow's own doing")


def test_a_run_failing_by_its_own_doing_still_fails_once_its_status_can_be_written(
        store: Store, quick_backoff: None) -> None:
    run = schedule(fails_by_itself, database=store)
    refuse(TERMINAL_WRITES, times=1)
    assert guarded(store, run.id) == Outcome.DEFERRED
    due_again(store, run.id)
    assert guarded(store, run.id) == Outcome.FAILED
    failed = store.get_run(run.id)
    assert failed.status == FAILED and failed.error["type"] == "builtins.ValueError"


def test_a_run_whose_give_back_is_refused_too_stays_claimed_for_catch_up(store: Store) -> None:
    run = schedule(hops, 2, database=store)
    refused = refuse({"record_step", "defer"})
    assert guarded(store, run.id) == Outcome.DEFERRED
    assert refused == ["record_step", "defer"]
    held = store.get_run(run.id)
    assert (held.status, held.claimed_by) == (RUNNING, "tester")
    core.statement_fault = None
    (again,) = store.claim_own("tester", 10, [run.name])
    assert runner.execute_guarded(store, again, claimer="tester") == Outcome.COMPLETED


@step
def meets_a_store_error() -> None:
    raise StoreError("a database error met by the step's own code", "UndefinedTable")


@workflow
def step_with_a_store_error() -> None:
    meets_a_store_error()


def test_a_store_error_inside_a_step_is_the_steps_failure(store: Store) -> None:
    """The workflow's own code met it: the step fails, and so does the run."""
    run = schedule(step_with_a_store_error, database=store)
    assert guarded(store, run.id) == Outcome.FAILED
    assert store.get_run(run.id).error["type"] == "everystep.errors.StoreError"
    assert [record.status for record in store.get_steps(run.id)] == ["failed"]


@step(transactional=True)
def bad_sql() -> None:
    step_connection().cursor().execute("SELECT no_such_column FROM everystep_workflow")


@workflow
def transactional_bad_sql() -> None:
    bad_sql()


def test_a_transactional_steps_own_sql_error_fails_the_run(store: Store) -> None:
    run = schedule(transactional_bad_sql, database=store)
    assert guarded(store, run.id) == Outcome.FAILED
    failed = store.get_run(run.id)
    assert failed.status == FAILED and "no_such_column" in failed.error["message"]


def test_a_refused_claim_is_counted_as_an_engine_error_not_an_outage(store: Store,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    schedule(hops, 1, database=store)
    loop = ClaimLoop(store, "tester", "worker", lease=60, poll=0.01)
    counted = engine_errors_counted(kind_of(store))
    refuse({"claim"})
    caplog.set_level(logging.WARNING, logger="everystep")
    for _ in range(engine_errors.FAILING_AFTER):
        loop.wake()
        assert loop._claim(0.0, 1) == []
    assert not loop.outage.failing
    assert engine_errors_counted(kind_of(store)) == counted + engine_errors.FAILING_AFTER
    failing = loop.engine.failing()
    assert failing is not None and "claiming" in failing
    messages = [record.getMessage() for record in caplog.records]
    assert not any("unreachable" in message for message in messages)
    assert sum("the database refused claiming" in message for message in messages) == 1


def test_healthz_reports_a_runner_whose_statements_keep_failing(store: Store) -> None:
    engine = EngineHealth()
    assert exposition.respond("/healthz", store, engine)[0] == 200
    for index in range(engine_errors.FAILING_AFTER - 1):
        engine.failed(f"run {index} given back")
    assert exposition.respond("/healthz", store, engine)[0] == 200  # a few errors are not a pattern
    engine.failed("claiming: database error: permission denied")
    status, _type, body = exposition.respond("/healthz", store, engine)
    assert status == 503
    assert body.decode().startswith(f"everystep's statements keep failing: {engine_errors.FAILING_AFTER} engine "
                                    "errors in the last 60 s (last: claiming: database error: permission denied)")


def test_an_outage_log_told_of_a_refusal_does_not_start_an_outage(caplog: pytest.LogCaptureFixture) -> None:
    engine = EngineHealth()
    log = OutageLog(logging.getLogger("everystep"), "runner", engine)
    caplog.set_level(logging.WARNING, logger="everystep")
    log.failed(StoreError("database error: permission denied", "InsufficientPrivilege"), "heartbeat")
    assert not log.failing and engine.total == 1
    assert [record.getMessage() for record in caplog.records] == [
        "runner: the database refused heartbeat (database error: permission denied); retrying (counted in "
        "everystep_engine_errors_total, the runner unhealthy while it recurs)"]


def test_a_threaded_worker_gives_runs_back_and_reports_itself_unhealthy(store: Store, quick_backoff: None) -> None:
    from everystep.worker import Worker
    from tests.support.runs import worker_running

    runs = [schedule(hops, 2, database=store) for _ in range(3)]
    refuse({"record_step"})
    worker = Worker(pool_size=2, poll=0.05, name="unhealthy", database=store)
    with worker_running(worker):
        health: Callable[[], Any] = lambda: exposition.respond("/healthz", store, worker.loop.engine)
        status, _type, body = wait_until(lambda: (answer := health())[0] == 503 and answer,
                                         "the worker to report itself unhealthy", timeout=60)
        assert b"keep failing" in body
        assert all(store.get_run(run.id).status in (SCHEDULED, RUNNING) for run in runs)
        core.statement_fault = None
        for run in runs:
            wait_until(lambda: store.get_run(run.id).status == COMPLETED, f"run {run.id} to complete", timeout=60)


def test_engine_health_recovers_once_the_errors_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = EngineHealth()
    for _ in range(engine_errors.FAILING_AFTER):
        engine.failed("claiming: refused")
    assert engine.failing() is not None
    monkeypatch.setattr(engine_errors, "WINDOW", 0.0)
    assert engine.failing() is None and engine.total == engine_errors.FAILING_AFTER


@pytest.mark.backends("postgres")
def test_a_supervisor_gives_runs_back_reports_itself_unhealthy_and_fails_none(
        db_url: str, supervisors: Any, tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """The children's step records are refused (the app's fault hook, in
    every child): the runs go back to the queue, the supervisor says it is
    unhealthy (``ctl status``, ``/healthz``, the metric), each run is logged
    once; once the database accepts them again, every run completes."""
    store = connect(db_url)
    refusals = tmp_path / "refusals"
    refusals.mkdir()
    (refusals / "refuse").write_text("record_step\nfinish_run_with_step\nfinish_run\n")
    port = free_port()
    env = dict(subprocess_env, EVERYSTEP_TEST_REFUSE_DIR=str(refusals))
    supervisor: Supervisor = supervisors(db_url, app="tests.apps.pooled", procs=2, env=env,
                                         args=metrics_args(port)).start()
    runs = [schedule(hops, 3, database=store) for _ in range(4)]
    status = supervisor.wait_status(lambda status: status.get("engine_errors"), "the supervisor to say it is unhealthy")
    assert status["engine_errors"].startswith("everystep's statements keep failing: ")
    code, _type, body = http_get(port, "/healthz")
    assert code == 503 and body.startswith("everystep's statements keep failing"), body
    ctl = subprocess.run([*supervisor_command(), "ctl", "--socket", supervisor.socket_path, "status"],
                         env=subprocess_env, capture_output=True, text=True, timeout=60)
    assert ctl.returncode == 0 and "UNHEALTHY: everystep's statements keep failing" in ctl.stdout, ctl.stdout
    assert scrape(port).total("everystep_engine_errors_total", kind="InsufficientPrivilege") >= 1
    assert not [run for run in runs if store.get_run(run.id).status == FAILED]
    (refusals / "refuse").unlink()
    for run in runs:
        wait_run(store, run.id, [COMPLETED], timeout=120, supervisor=supervisor)
    log = supervisor.log()
    for run in runs:
        said = [line for line in log.splitlines() if "refused one of everystep's statements" in line and run.id in line]
        assert len(said) <= 1, said
    assert sum("refused one of everystep's statements" in line for line in log.splitlines()) >= 1
    assert supervisor.stop() == 0
