"""Every way of starting a run applies the workflow's defaults alike: its
queue and priority, its ``@workflow(timeout=)`` as the run's deadline, and
the code version (``everystep.new_run`` decides them all). Walked here:
``schedule()`` (own connection, ``conn=``), ``schedule_async()``,
``everystep schedule`` (and its ``--timeout``/``--deadline``), the
console's *Run again*, a cron tick, ``fork``, and ``start()`` for a child,
whose version is its parent's unless it says another. The Django command
is walked in tests/test_django_commands.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from everystep import admin, schedule, schedule_async
from everystep.cron import Ticker
from everystep.models import COMPLETED
from everystep.runner import Outcome
from everystep.store import Store
from tests.apps import defaults as apps
from tests.support.cli import run_in_process
from tests.support.console import serve
from tests.support.defaults import assert_defaults, started
from tests.support.runs import execute_run

pytestmark = pytest.mark.timeout(120)

APP = "tests.apps.defaults"


def cli(db_url: str, tmp_path: Path, env: dict[str, str], *args: str) -> Any:
    return run_in_process([*args, "--database", db_url, "--app", APP], env, tmp_path)


def test_schedule_with_and_without_a_connection_and_async(store: Store, db_url: str) -> None:
    run_id, before, after = started(lambda: schedule(apps.timed, 1, database=store).id)
    assert_defaults(store, run_id, before, after)
    run_id, before, after = started(lambda: apps.timed.schedule(1, database=store).id)
    assert_defaults(store, run_id, before, after)
    run_id, before, after = started(lambda: asyncio.run(schedule_async(apps.timed, 1, database=store)).id)
    assert_defaults(store, run_id, before, after)
    if store.backend == "sqlite":
        import sqlite3

        from everystep.store.sqlite import path_from_url

        with sqlite3.connect(path_from_url(db_url)) as conn:
            run_id, before, after = started(lambda: schedule(apps.timed, 1, conn=conn).id)
        assert_defaults(store, run_id, before, after)


def test_the_command_line(store: Store, db_url: str, tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    def scheduled(*extra: str) -> str:
        done = cli(db_url, tmp_path, subprocess_env, "schedule", apps.timed.name, "[1]", *extra)
        assert done.returncode == 0, done.stderr
        return str(done.stdout.strip())

    run_id, before, after = started(scheduled)
    assert_defaults(store, run_id, before, after)
    run_id, before, after = started(lambda: scheduled("--timeout", "5"))
    assert_defaults(store, run_id, before, after, timeout=5)
    run_id, before, after = started(lambda: scheduled("--app-version", "rel-9", "--queue", "elsewhere"))
    assert_defaults(store, run_id, before, after, version="rel-9", queue="elsewhere")
    run_id = scheduled("--deadline", "2030-01-01T09:00:00+01:00")
    assert store.links(run_id).deadline == dt.datetime(2030, 1, 1, 8, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("extra, message", [
    (["--timeout", "5", "--deadline", "2030-01-01T09:00:00Z"], "not allowed with argument"),
    (["--timeout", "0"], "out of range"),
    (["--deadline", "2030-01-01T09:00:00"], "--deadline '2030-01-01T09:00:00' has no time zone offset"),
    (["--deadline", "soon"], "--deadline 'soon' is not an ISO 8601 time"),
])
def test_bad_deadlines_are_refused_writing_nothing(store: Store, db_url: str, tmp_path: Path,
                                                   subprocess_env: dict[str, str], extra: list[str],
                                                   message: str) -> None:
    done = cli(db_url, tmp_path, subprocess_env, "schedule", apps.timed.name, "[1]", *extra)
    assert done.returncode == 2, (done.stdout, done.stderr)
    [line] = done.stderr.strip().splitlines()
    assert message in line
    assert store.list_runs(limit=10) == []


@pytest.fixture
def console_client(db_url: str) -> Iterator[Any]:
    for server in serve(db_url, app_modules=APP):
        with server.client() as session:
            session.load_page()
            yield session


def test_the_consoles_run_again(store: Store, console_client: Any) -> None:
    source = store.schedule(apps.timed.name, "[1]")  # written bare: no deadline, the default queue

    def again() -> str:
        answer = console_client.act(f"/api/runs/{source.id}/rerun")
        assert answer.status_code == 200, answer.text
        return str(answer.json()["new_run"])

    run_id, before, after = started(again)
    assert_defaults(store, run_id, before, after)


def test_a_cron_tick(store: Store) -> None:
    wall = [dt.datetime(2030, 1, 1, 23, 59, tzinfo=dt.timezone.utc)]
    ticker = Ticker(store, {apps.ticking.name: apps.ticking.cron}, logging.getLogger("test"), "test",
                    clock=lambda: wall[0])
    assert ticker.tick(time.monotonic()) == []  # the first look only learns when the next tick is
    wall[0] = dt.datetime(2030, 1, 2, 0, 0, 1, tzinfo=dt.timezone.utc)
    created: list[Any] = []
    run_id, before, after = started(lambda: (created.extend(ticker.tick(time.monotonic())), created[0].id)[1])
    assert len(created) == 1
    assert_defaults(store, run_id, before, after)


def test_a_fork(store: Store) -> None:
    source = store.schedule(apps.timed.name, "[1]")  # written bare: no deadline, the default queue
    assert execute_run(store, source.id) == Outcome.COMPLETED
    run_id, before, after = started(lambda: admin.fork(store, source.id, "1")[0].id)
    # A fork stays where its source was queued; its deadline is its workflow's.
    assert_defaults(store, run_id, before, after, queue=source.queue, priority=source.priority)


def test_a_child_records_its_parents_version_unless_told_another(store: Store) -> None:
    parent = schedule(apps.parent, "rel-3", app_version="rel-2", database=store)
    _, before, after = started(lambda: execute_run(store, parent.id))
    first, second = store.children(parent.id)
    assert_defaults(store, first.id, before, after, version="rel-2")
    assert_defaults(store, second.id, before, after, version="rel-3")
    for child in (first, second):
        assert execute_run(store, child.id) == Outcome.COMPLETED
    while store.get_run(parent.id).status != COMPLETED:
        assert execute_run(store, parent.id) in (Outcome.RELEASED, Outcome.COMPLETED)
    assert store.get_run(parent.id).result == [1, 2]
