"""Streams in-process, on every backend: a body's writes are recorded
steps (a replay writes nothing), a step's writes belong to its attempt (a
crashed attempt's values are withdrawn by the retry's first write), readers
see every value in order and stop at the close or the run's end, bounds
refuse with one line, and the rows go with their run."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

import everystep
from everystep import EverystepError, RunNotFound, schedule
from everystep.models import COMPLETED, FAILED, STEP_DONE, STEP_FAILED
from everystep.runner import Outcome
from everystep.store import Store, utcnow
from everystep.streams import CLOSE_STEP, MAX_VALUES_ENV, MAX_VALUE_BYTES_ENV, WRITE_STEP
from tests.apps import streams as apps
from tests.support.cli import run_in_process
from tests.support.runs import crash_at, execute_run, resume, run_until_settled

pytestmark = pytest.mark.pooled


def values(store: Store, run_id: str, key: str, **options: Any) -> list[Any]:
    return list(everystep.read_stream(run_id, key, timeout=10, database=store, **options))


def test_a_body_writes_recorded_steps_and_readers_see_them_in_order(store: Store) -> None:
    run = schedule(apps.reporter, 3, database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert values(store, run.id, "progress") == [{"done": 1, "of": 3}, {"done": 2, "of": 3}, {"done": 3, "of": 3}]
    steps = store.get_steps(run.id)
    assert [(s.name, s.status, s.result) for s in steps] == [
        (WRITE_STEP, STEP_DONE, 1), (WRITE_STEP, STEP_DONE, 2), (WRITE_STEP, STEP_DONE, 3),
        (CLOSE_STEP, STEP_DONE, 4), ("tests.apps.streams.note", STEP_DONE, 3)]
    [summary] = store.streams_of(run.id)
    assert (summary.key, summary.last_seq, summary.closed) == ("progress", 4, True)


def test_a_replay_after_a_crash_writes_no_value_again(store: Store) -> None:
    run = schedule(apps.reporter, 3, database=store)
    crash_at("3")  # the third write's transaction never happens
    with pytest.raises(everystep.SimulatedCrash):
        execute_run(store, run.id)
    assert [item.seq for item in store.stream_items(run.id, "progress")] == [1, 2]
    assert resume(store, run.id) == Outcome.COMPLETED
    items = store.stream_items(run.id, "progress")
    assert [(item.seq, item.value["done"], item.attempt) for item in items if not item.closed] == [
        (1, 1, None), (2, 2, None), (3, 3, None)]


def test_a_crashed_step_attempts_values_are_withdrawn_by_its_retry(store: Store) -> None:
    run = schedule(apps.producing, 3, database=store)
    crash_at("1")  # after the step's code (its three writes committed), before its record
    with pytest.raises(everystep.SimulatedCrash):
        execute_run(store, run.id)
    first = store.stream_items(run.id, "lines")
    assert [(item.seq, item.value, item.step_id) for item in first] == [(1, 0, "1"), (2, 1, "1"), (3, 2, "1")]
    seen_live = first[:2]  # a reader read two of them while the attempt ran

    assert resume(store, run.id) == Outcome.COMPLETED
    retried = store.stream_items(run.id, "lines")
    assert [(item.seq, item.value) for item in retried] == [(4, 0), (5, 1), (6, 2)]
    [retry_attempt] = {item.attempt for item in retried}
    assert retry_attempt is not None and seen_live[0].attempt is not None and retry_attempt > seen_live[0].attempt
    # A new reader sees the retry's values once; one resuming after seq 2
    # is not sent the withdrawn third, and knows the retry's by its attempt.
    assert values(store, run.id, "lines") == [0, 1, 2]
    resumed = values(store, run.id, "lines", after=2, items=True)
    assert [(item.seq, item.value) for item in resumed] == [(4, 0), (5, 1), (6, 2)]


def test_a_write_after_close_is_refused_and_recorded(store: Store) -> None:
    run = schedule(apps.write_after_close, database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    result = store.get_run(run.id).result
    assert "stream 's' is closed; nothing was written" in result
    assert values(store, run.id, "s") == [1]
    assert store.get_steps(run.id)[-1].status == STEP_FAILED  # the refusal, replayed as it is


def test_an_unstorable_value_writes_nothing(store: Store) -> None:
    run = schedule(apps.unstorable, database=store)
    execute_run(store, run.id)
    failed = store.get_run(run.id)
    assert failed.status == FAILED and "stream 's'" in failed.error["message"]
    assert "\n" not in failed.error["message"]
    assert store.stream_items(run.id, "s") == [] and store.get_steps(run.id) == []

    run = schedule(apps.unstorable_from_step, database=store)
    execute_run(store, run.id)
    assert store.get_run(run.id).status == FAILED
    assert store.stream_items(run.id, "s") == []


def test_a_value_past_its_bound_is_refused(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_VALUE_BYTES_ENV, "100")
    run = schedule(apps.oversized, 200, database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert "past the bound of 100 bytes (EVERYSTEP_STREAM_MAX_VALUE_BYTES)" in store.get_run(run.id).result
    assert store.stream_items(run.id, "s") == []


def test_a_stream_past_its_bound_is_refused(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_VALUES_ENV, "3")
    run = schedule(apps.bounded, 5, database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert "holds its bound of 3 values (EVERYSTEP_STREAM_MAX_VALUES)" in store.get_run(run.id).result
    assert values(store, run.id, "s") == [0, 1, 2]


def test_a_reader_follows_a_run_in_flight_and_ends_with_it(store: Store) -> None:
    run = schedule(apps.producing, 50, database=store)
    reader = everystep.read_stream(run.id, "lines", timeout=30, database=store)
    seen: list[Any] = []
    thread = threading.Thread(target=lambda: seen.extend(reader))
    thread.start()
    assert execute_run(store, run.id) == Outcome.COMPLETED
    thread.join(30)
    assert not thread.is_alive() and seen == list(range(50))


def test_a_silent_stream_times_out_and_an_unknown_run_is_refused(store: Store) -> None:
    run = schedule(apps.producing, 1, database=store)  # scheduled, nothing written
    with pytest.raises(TimeoutError, match="no value on stream 'lines' within 0.2s"):
        next(iter(everystep.read_stream(run.id, "lines", timeout=0.2, database=store)))
    with pytest.raises(RunNotFound):
        everystep.read_stream("00000000-0000-0000-0000-000000000001", "lines", database=store)
    with pytest.raises(EverystepError, match="needs a key"):
        everystep.read_stream(run.id, "", database=store)


def test_writes_outside_a_workflow_and_reads_in_a_body_are_refused(store: Store) -> None:
    with pytest.raises(EverystepError, match="no run to write to"):
        everystep.write_stream("k", 1)


def test_async_twins(store: Store) -> None:
    run = schedule(apps.async_producing, 3, database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED

    async def read() -> list[Any]:
        return [value async for value in await everystep.read_stream_async(run.id, "a", timeout=10, database=store)]

    assert asyncio.run(read()) == ["start", 0, 1, 2]


def test_streams_are_pruned_with_their_run(store: Store) -> None:
    run = schedule(apps.reporter, 2, database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).status == COMPLETED
    assert store.prune_batch(utcnow() + dt.timedelta(seconds=1), [COMPLETED], 10) == (1, 4)
    assert store.stream_items(run.id, "progress") == []


# -- the command line ---------------------------------------------------------------


def cli(db_url: str, tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_in_process([*args, "--database", db_url], env, tmp_path)


def test_the_stream_command_prints_json_lines_and_lists_streams(
        db_url: str, store: Store, tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    run = schedule(apps.reporter, 2, database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    printed = cli(db_url, tmp_path, subprocess_env, "stream", run.id, "progress")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == ['{"done":1,"of":2}', '{"done":2,"of":2}']
    followed = cli(db_url, tmp_path, subprocess_env, "stream", run.id[:8], "progress", "--follow", "--after", "1")
    assert followed.stdout.splitlines() == ['{"done":2,"of":2}']
    listed = cli(db_url, tmp_path, subprocess_env, "stream", run.id)
    assert listed.returncode == 0 and "progress" in listed.stdout and "closed" in listed.stdout
    shown = cli(db_url, tmp_path, subprocess_env, "show", run.id, "--json")
    assert json.loads(shown.stdout)["streams"] == [{"key": "progress", "last_seq": 3, "closed": True}]
    assert f"everystep stream {run.id} KEY" in cli(db_url, tmp_path, subprocess_env, "show", run.id).stdout


def test_the_stream_command_refuses_bad_input_in_one_line(
        db_url: str, store: Store, tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    unknown = cli(db_url, tmp_path, subprocess_env, "stream", "00000000-0000-0000-0000-00000000abcd", "k")
    assert unknown.returncode == 2 and unknown.stdout == "" and len(unknown.stderr.strip().splitlines()) == 1
    assert "no run" in unknown.stderr
    run = schedule(apps.reporter, 1, database=store)
    empty_key = cli(db_url, tmp_path, subprocess_env, "stream", run.id, "")
    assert empty_key.returncode == 2 and len(empty_key.stderr.strip().splitlines()) == 1
    negative = cli(db_url, tmp_path, subprocess_env, "stream", run.id, "k", "--after", "-1")
    assert negative.returncode == 2 and len(negative.stderr.strip().splitlines()) == 1


def test_a_refusal_of_a_steps_values_is_that_steps_failure(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_VALUES_ENV, "3")
    run = schedule(apps.producing, 5, database=store)
    execute_run(store, run.id)
    failed = store.get_run(run.id)
    assert failed.status == FAILED
    assert "holds its bound of 3 values (EVERYSTEP_STREAM_MAX_VALUES)" in failed.error["message"]
    [step] = store.get_steps(run.id)
    assert step.status == STEP_FAILED and step.error["type"] == "everystep.errors.StreamRefused"
    seen = values(store, run.id, "lines")  # the batches before the refused one, which writes none of its values
    assert seen == [0, 1, 2][:len(seen)]


def test_a_retried_attempts_values_are_withdrawn_by_the_next_attempt(store: Store) -> None:
    apps.FLAKY_ATTEMPTS.clear()
    run = schedule(apps.retried, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED  # the first attempt failed, recorded `retrying`
    assert [item.value for item in store.stream_items(run.id, "log")] == ["attempt 1 line 1", "attempt 1 line 2"]
    assert run_until_settled(store, run.id)[-1] == Outcome.COMPLETED
    assert values(store, run.id, "log") == ["attempt 2 line 1", "attempt 2 line 2"]
    assert [item.seq for item in store.stream_items(run.id, "log")] == [3, 4]
