"""The history bound: the execution that takes a run's history past the
threshold says so once, pointing at continue_as_new; a long history is
noted on its run's row, and the largest among unfinished runs is a gauge.
In process on every backend, through the threaded worker, and through a
real supervisor whose children execute the run in turn."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

import everystep
from everystep import EverystepError, admin, history_bound, metrics, schedule
from everystep.history_bound import HistoryBound
from everystep.runner import Outcome
from everystep.store import Store
from everystep.worker import Worker
from supervisor.cli import build_parser, config_from_args
from tests.apps import long_runs
from tests.support.cli import run_in_process
from tests.support.long_runs import messages, write_history
from tests.support.runs import execute_run, worker_running
from tests.support.supervisor import Supervisor, supervisors  # noqa: F401
from tests.support.waiting import wait_until

WARN_AT = 50


def said(caplog: pytest.LogCaptureFixture, run_id: str) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if "past the history warning" in record.getMessage() and run_id in record.getMessage()]


def a_subscription(store: Store, handled: int) -> str:
    """A subscription that has handled ``handled`` messages (two records each)."""
    run = schedule(long_runs.subscription, "acct-1", database=store)
    write_history(store, run.id, messages(handled))
    return run.id


def counted(store: Store, run_id: str) -> int:
    """The records an execution of a subscription counts as it releases the
    run: every row but that of the recv it begins waiting in (which the
    next execution loads and counts)."""
    return len(store.step_ids(run_id)) - 1


def handle(store: Store, run_id: str, count: int, bound: HistoryBound) -> None:
    for n in range(count):
        everystep.send(run_id, "event", {"live": n}, database=store)
    assert execute_run(store, run_id, observer=bound) == Outcome.RELEASED


def test_the_execution_that_crosses_the_threshold_says_so_once_and_notes_the_history(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="everystep")
    run_id = a_subscription(store, 23)  # 46 records
    bound = HistoryBound(WARN_AT)
    handle(store, run_id, 1, bound)  # 49 records (and the recv that waits): still under
    assert said(caplog, run_id) == [] and store.largest_history() == 0
    handle(store, run_id, 2, bound)  # past 50
    [line] = said(caplog, run_id)
    records = counted(store, run_id)
    assert f"run {run_id} ({long_runs.subscription.name}) holds {records} step records, past the history " \
           f"warning at {WARN_AT}" in line and "everystep.continue_as_new(...)" in line
    assert store.largest_history() == records
    handle(store, run_id, 3, bound)  # further past: nothing more is said, the note follows
    assert len(said(caplog, run_id)) == 1 and store.largest_history() == counted(store, run_id)

    metrics.refresh_queue_gauges(store)
    assert REGISTRY.get_sample_value("everystep_workflows_largest_history") == counted(store, run_id)
    admin.cancel(store, run_id)  # a finished run is no longer the gauge's
    metrics.refresh_queue_gauges(store)
    assert store.largest_history() == 0 and REGISTRY.get_sample_value("everystep_workflows_largest_history") == 0


def test_a_run_that_starts_past_the_threshold_is_said_at_its_first_execution(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="everystep")
    run_id = a_subscription(store, 30)  # 60 records before its first claim, as a fork's copies
    bound = HistoryBound(WARN_AT)
    handle(store, run_id, 1, bound)
    handle(store, run_id, 1, bound)
    assert len(said(caplog, run_id)) == 1


def test_a_short_history_costs_no_note_and_0_turns_the_warning_off(store: Store,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="everystep")
    run_id = a_subscription(store, 30)
    handle(store, run_id, 1, HistoryBound(0))  # 63 records: under the note's 1,000, and no warning
    assert said(caplog, run_id) == [] and store.largest_history() == 0
    assert HistoryBound(0).noted_from == history_bound.NOTED_FROM == 1000 and HistoryBound(50).noted_from == 50


def test_the_threshold_comes_from_the_option_the_environment_or_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(history_bound.ENV_VAR, raising=False)
    assert history_bound.threshold() == 10_000 and history_bound.threshold(7) == 7
    monkeypatch.setenv(history_bound.ENV_VAR, "2500")
    assert history_bound.threshold() == 2500 and history_bound.threshold(0) == 0
    for bad, says in (("lots", "$EVERYSTEP_HISTORY_WARNING must be a whole number"), ("-3", "not -3")):
        monkeypatch.setenv(history_bound.ENV_VAR, bad)
        with pytest.raises(EverystepError, match=says.replace("$", r"\$")):
            history_bound.threshold()


def test_the_threaded_worker_says_it_once(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="everystep")
    run_id = a_subscription(store, 24)  # 48 records
    worker = Worker(pool_size=1, poll=0.05, database=store, name="history-worker", history_warning=WARN_AT)
    with worker_running(worker):
        for n in range(6):
            everystep.send(run_id, "event", {"live": n}, database=store)
            wait_until(lambda: len(store.step_ids(run_id)) >= 50 + 2 * n, timeout=60,
                       what=f"message {n} handled")
    assert len(said(caplog, run_id)) == 1 and store.largest_history() >= 58


def test_a_bad_threshold_is_refused_in_one_line_by_both_runners(store: Store, db_url: str, tmp_path: Path,
                                                                 subprocess_env: dict[str, str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    worker = run_in_process(["worker", "--database", db_url, "--history-warning", "-1"], subprocess_env, tmp_path)
    assert worker.returncode == 2 and "--history-warning" in worker.stderr
    env = {**subprocess_env, history_bound.ENV_VAR: "lots"}
    worker = run_in_process(["worker", "--database", db_url], env, tmp_path)
    assert worker.returncode == 2 and len(worker.stderr.strip().splitlines()) == 1
    assert "$EVERYSTEP_HISTORY_WARNING must be a whole number of step records" in worker.stderr
    args = build_parser().parse_args(["--database", db_url, "--socket", str(tmp_path / "s.sock")])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(history_bound.ENV_VAR, "lots")
        with pytest.raises(SystemExit) as exited:
            config_from_args(args, "", db_url)
    assert exited.value.code == 2
    assert "$EVERYSTEP_HISTORY_WARNING must be a whole number" in capsys.readouterr().err


@pytest.mark.backends("sqlite", "postgres")
def test_across_a_supervisors_children_the_run_is_said_once(store: Store, db_url: str, supervisors: Any) -> None:
    run_id = a_subscription(store, 23)  # 46 records
    supervisor: Supervisor = supervisors(db_url, procs=2, app="tests.apps.long_runs",
                                         args=["--history-warning", str(WARN_AT)])
    supervisor.start()
    for n in range(8):  # each message an execution, in whichever child is free
        everystep.send(run_id, "event", {"live": n}, database=store)
        wait_until(lambda: len(store.step_ids(run_id)) >= 48 + 2 * n, timeout=120, what=f"message {n} handled")
    wait_until(lambda: store.largest_history() >= 62, timeout=120, what="the history noted")
    assert supervisor.stop() == 0
    lines = [line for line in supervisor.log().splitlines() if "past the history warning" in line]
    assert len(lines) == 1 and run_id in lines[0] and "continue_as_new" in lines[0], supervisor.log()
