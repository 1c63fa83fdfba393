"""``everystep show`` on a run of 100,000 steps: a page of them (the first
hundred, or ``--limit`` of those recorded ``--after`` a step), the count,
the command for the next page, and the run's whole cost summed by the
database; a cursor that is no step of the run is refused in one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from everystep import schedule
from everystep.models import COMPLETED
from everystep.store import Store
from tests.apps import long_runs
from tests.support.cli import run_in_process
from tests.support.long_runs import ticks, write_history
from tests.support.runs import execute_run

pytestmark = [pytest.mark.timeout(600), pytest.mark.backends("sqlite", "postgres")]

STEPS = 100_000


def show(db_url: str, tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_in_process(["show", *args, "--database", db_url], env, tmp_path)


def step_rows(output: str) -> list[str]:
    """The STEP column of ``show``'s step table."""
    lines = output.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("STEP"))
    return [line.split()[0] for line in lines[start + 1:] if line.split()[1:2] == ["done"]]


def test_show_pages_a_run_of_100000_steps(store: Store, db_url: str, tmp_path: Path,
                                          subprocess_env: dict[str, str]) -> None:
    run = schedule(long_runs.ticker, STEPS, database=store)
    write_history(store, run.id, ticks(STEPS))

    first = show(db_url, tmp_path, subprocess_env, run.id)
    assert first.returncode == 0, first.stderr
    assert step_rows(first.stdout) == [str(n) for n in range(1, 101)]
    assert f"100 of 100,000 steps; the next ones: everystep show {run.id} --after 100" in first.stdout

    later = show(db_url, tmp_path, subprocess_env, run.id[:13], "--after", "100", "--limit", "5")
    assert step_rows(later.stdout) == ["101", "102", "103", "104", "105"]
    assert "5 of 100,000 steps, recorded after step 100; the next ones: everystep show" in later.stdout

    data = json.loads(show(db_url, tmp_path, subprocess_env, run.id, "--json", "--after", "99998").stdout)
    assert [step["step_id"] for step in data["steps"]] == ["99999", "100000"]
    assert data["steps_total"] == STEPS and data["steps_next"] is None

    refused = show(db_url, tmp_path, subprocess_env, run.id, "--after", "nope")
    assert refused.returncode == 2 and refused.stdout == ""
    assert f"run {run.id} has no step 'nope'" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


def test_a_short_run_is_shown_whole_as_before_and_limit_0_shows_every_step(
        store: Store, db_url: str, tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    run = schedule(long_runs.mixed, 3, database=store)
    assert execute_run(store, run.id) == COMPLETED
    output = show(db_url, tmp_path, subprocess_env, run.id).stdout
    assert " of " not in output.split("STEP", 1)[1]  # no page line: every step is shown
    everything = json.loads(show(db_url, tmp_path, subprocess_env, run.id, "--json", "--limit", "0").stdout)
    # Listed in step-id order, as show always did (a named step after the positions).
    assert [step["step_id"] for step in everything["steps"]] == ["1", "3.0.1", "3.0.2", "3.1.1", "4", "5", "6",
                                                                 "charge"]
    assert everything["steps_total"] == 8 and everything["steps_next"] is None
