"""The lifecycle on the command line, on both backends: schedule --at/--in,
show of a retried, a sleeping and a cancelled run (text and --json), and
schedules. Every bad input is one line on stderr and exit code 2."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from typing import Any

import pytest

from everystep import admin, runner, schedule
from everystep.models import SCHEDULED
from everystep.runner import Outcome
from everystep.store import Store
from tests.support.runs import claim_run
from tests.apps.lifecycle_in_process import retrying_flow, sleeps

pytestmark = pytest.mark.timeout(120)


def cli(env: dict[str, str], db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "everystep.cli", *args, "--database", db_url],
                          env=env, capture_output=True, text=True, timeout=120)


def one_line_refusal(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    [line] = result.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize("extra, message", [
    (["--at", "2030-01-01T09:00:00"], "has no time zone offset"),
    (["--at", "tomorrow"], "is not an ISO 8601 time"),
    (["--in", "10"], "bad duration"),
    (["--in", "10m", "--at", "2030-01-01T09:00:00Z"], "not allowed with argument"),
])
def test_bad_schedule_times_are_refused(db_url: str, subprocess_env: dict[str, str], extra: list[str],
                                        message: str) -> None:
    result = cli(subprocess_env, db_url, "schedule", "--app", "tests.apps.lifecycle_in_process", sleeps.name, "[0]",
                 *extra)
    assert message in one_line_refusal(result)


def test_schedule_at_a_time_with_its_offset(db_url: str, store: Store, subprocess_env: dict[str, str]) -> None:
    result = cli(subprocess_env, db_url, "schedule", "--app", "tests.apps.lifecycle_in_process", sleeps.name, "[0]",
                 "--at", "2030-01-01T09:00:00+01:00")
    assert result.returncode == 0, result.stderr
    run = store.get_run(result.stdout.strip())
    assert run.not_before == dt.datetime(2030, 1, 1, 8, 0, tzinfo=dt.timezone.utc)
    shown = cli(subprocess_env, db_url, "show", run.id)
    assert "status     scheduled (delayed until 2030-01-01T08:00:00+00:00)" in shown.stdout


def test_show_a_retried_step_and_a_sleeping_run(db_url: str, store: Store, subprocess_env: dict[str, str]) -> None:
    run = schedule(retrying_flow, f"cli-{store.backend}", 2, database=store)
    for _ in range(2):
        runner.execute(store, claim_run(store, run.id), claimer="tester")
    text = cli(subprocess_env, db_url, "show", run.id).stdout
    assert "ATTEMPT" in text
    assert "step 1 attempt 1 failed at " in text and "builtins.ValueError: attempt 1; next attempt at " in text
    data = json.loads(cli(subprocess_env, db_url, "show", run.id, "--json").stdout)
    [step] = data["steps"]
    assert step["attempt"] == 2 and step["attempts"][0]["attempt"] == 1 and step["effect_uncertain"] is False

    sleeping = schedule(sleeps, 3600, database=store)
    assert runner.execute(store, claim_run(store, sleeping.id), claimer="tester") == Outcome.RELEASED
    text = cli(subprocess_env, db_url, "show", sleeping.id).stdout
    assert "status     scheduled (sleeping until " in text
    assert "sleeping  everystep.sleep" in text
    data = json.loads(cli(subprocess_env, db_url, "show", sleeping.id, "--json").stdout)
    assert data["run"]["status"] == SCHEDULED and data["run"]["waiting"].startswith("sleeping until ")
    admin.cancel(store, sleeping.id)
    data = json.loads(cli(subprocess_env, db_url, "show", sleeping.id, "--json").stdout)
    assert data["run"]["status"] == "cancelled" and data["run"]["waiting"] is None


def test_schedules_lists_periodic_workflows_with_last_and_next_tick(db_url: str, store: Store,
                                                                    subprocess_env: dict[str, str]) -> None:
    refused = cli(subprocess_env, db_url, "schedules")
    assert "schedules needs --app" in one_line_refusal(refused)
    tick = dt.datetime(2030, 5, 1, 10, 0, 2, tzinfo=dt.timezone.utc)
    from everystep import serde
    from everystep.cron import tick_key

    name = "tests.apps.periodic.every_two_seconds"
    run, created = store.schedule_tick(name, serde.dumps([tick], "tick"), tick, tick_key(tick))
    assert created
    again, created = store.schedule_tick(name, serde.dumps([tick], "tick"), tick, tick_key(tick))
    assert (again.id, created) == (run.id, False)
    asked = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    result = cli(subprocess_env, db_url, "schedules", "--app", "tests.apps.periodic", "--json")
    assert result.returncode == 0, result.stderr
    [entry] = json.loads(result.stdout)
    assert (entry["workflow"], entry["cron"], entry["timezone"]) == (name, "*/2 * * * * *", "Europe/Paris")
    assert (entry["last_tick"], entry["last_run"], entry["last_status"]) == (tick.isoformat(), run.id, "scheduled")
    # The next tick after the moment the command looked, which is after
    # ``asked`` however long the command took to start on a loaded machine.
    assert dt.datetime.fromisoformat(entry["next_tick"]) > asked
    text = cli(subprocess_env, db_url, "schedules", "--app", "tests.apps.periodic").stdout
    assert name in text and "LAST TICK (UTC)" in text
