"""check-deploy: dry-replay unfinished runs against the code about to ship.

Runs are left part-way by the code they started with (``deploy_v1``,
stopped with the fault hook, or blocked on an unsafe step), then judged by
the next release (``deploy_v2``): in-process through ``everystep.dryrun``,
and as a real ``everystep check-deploy`` process for the exit codes and
output. A dry replay never executes a step nor writes anything."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import pytest

from everystep import dryrun, registry, schedule
from everystep.dryrun import Prediction
from everystep.errors import SimulatedCrash
from everystep.models import COMPLETED, SCHEDULED
from everystep.store import Store
from tests.apps import deploy_v1, deploy_v2
from tests.support.deploys import deploy
from tests.support.runs import crash_at, execute_run

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(120), pytest.mark.backends("sqlite", "postgres")]

ORDER = {"sku": "A-1", "amount": 30}


def left_after(store: Store, wf: Any, step_id: str) -> str:
    """A run of ``wf`` whose process died right after step ``step_id``'s
    effect: its earlier steps are recorded; it is back in the queue."""
    run = schedule(wf, ORDER, database=store)
    crash_at(step_id)
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    return run.id


def scenario(store: Store) -> dict[str, str]:
    deploy(deploy_v1)
    runs = {
        "diverged": left_after(store, deploy_v1.order, "3"),  # steps 1, 2 recorded: 2 is charge
        "early": left_after(store, deploy_v1.order, "2"),  # only step 1 recorded
        "fresh": schedule(deploy_v1.order, ORDER, database=store).id,
        "reads": left_after(store, deploy_v1.reads, "2"),
        "legacy": schedule(deploy_v1.legacy, ORDER, database=store).id,
    }
    blocked = left_after(store, deploy_v1.checkout, "1")
    assert execute_run(store, blocked) == "blocked"
    runs["blocked"] = blocked
    done = schedule(deploy_v1.order, ORDER, database=store)
    assert execute_run(store, done.id) == COMPLETED
    runs["done"] = done.id
    return runs


def test_verdicts_for_the_next_release(store: Store) -> None:
    runs = scenario(store)
    before = {run_id: (store.get_run(run_id), store.get_steps(run_id)) for run_id in runs.values()}
    deploy(deploy_v2)
    registry._workflows.pop("deploy.legacy", None)  # the release drops it
    try:
        verdicts = {v.run_id: v for v in dryrun.check_deploy(store)}
    finally:
        deploy(deploy_v1)
    outcome = {name: verdicts[run_id].outcome for name, run_id in runs.items() if run_id in verdicts}
    assert outcome == {
        "diverged": Prediction.CODE_ERROR, "early": Prediction.RESUMES, "fresh": Prediction.RESUMES,
        "reads": Prediction.FAILS, "legacy": Prediction.MISSING, "blocked": Prediction.BLOCKED,
    }  # the completed run is not checked
    assert "deploy.charge" in verdicts[runs["diverged"]].detail and "deploy.bill" in verdicts[runs["diverged"]].detail
    assert verdicts[runs["early"]].next_step == "2" and verdicts[runs["fresh"]].next_step == "1"
    assert "KeyError" in verdicts[runs["reads"]].detail
    assert {v.problem for name, v in ((n, verdicts[r]) for n, r in runs.items() if r in verdicts)
            if name in ("diverged", "reads", "legacy")} == {True}
    # Nothing was written: every run and step is exactly as it was.
    for run_id, (run, steps) in before.items():
        assert store.get_run(run_id) == run and store.get_steps(run_id) == steps


def test_the_same_code_resumes_everything(store: Store) -> None:
    runs = scenario(store)
    verdicts = {v.run_id: v for v in dryrun.check_deploy(store)}
    assert {verdicts[r].outcome for n, r in runs.items() if n != "done"} == {
        Prediction.RESUMES, Prediction.BLOCKED}
    assert not any(v.problem for v in verdicts.values())


def test_a_replay_that_never_reaches_a_step_is_reported(store: Store) -> None:
    from everystep import workflow

    @workflow(name="deploy.spins")
    def spins() -> None:
        while True:
            pass

    run = schedule(spins, database=store)
    verdict = dryrun.replay(store.get_run(run.id), [], timeout=0.2)
    assert verdict.outcome == Prediction.TIMEOUT and verdict.problem
    # The abandoned replay is stopped, not left spinning for the life of
    # the process (the console replays on every page view).
    assert not [t for t in threading.enumerate() if t.name == f"everystep-dryrun-{run.id}"]


def test_a_completed_replay_and_a_recorded_terminal(store: Store) -> None:
    from tests.apps import shapes

    run = schedule(shapes.linear, "k", database=store)
    assert execute_run(store, run.id) == COMPLETED
    verdict = dryrun.replay(store.get_run(run.id), store.get_steps(run.id))
    assert verdict.outcome == Prediction.COMPLETES and not verdict.problem
    stopped = schedule(shapes.stopping, "why", database=store)
    assert execute_run(store, stopped.id) == "stopped"
    verdict = dryrun.replay(store.get_run(stopped.id), store.get_steps(stopped.id))
    assert verdict.outcome == Prediction.STOPS and "why" in verdict.detail


def check_deploy(db_url: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "everystep.cli", "check-deploy", "--database", db_url, *args],
        env=env, capture_output=True, text=True, timeout=120,
    )


def test_the_command_lists_what_would_fail_and_exits_1(db_url: str, store: Store, subprocess_env) -> None:
    runs = scenario(store)
    result = check_deploy(db_url, subprocess_env, "--app", "tests.apps.deploy_v2")
    assert result.returncode == 1, result
    listed = {line.split()[0] for line in result.stdout.splitlines()[1:] if line.strip() and "-" in line.split()[0]}
    assert listed == {runs["diverged"], runs["reads"], runs["legacy"]}
    assert "checked 6 unfinished run(s)" in result.stdout and "3 would fail" in result.stdout

    as_json = json.loads(check_deploy(db_url, subprocess_env, "--app", "tests.apps.deploy_v2", "--json").stdout)
    assert as_json["checked"] == 6 and as_json["problems"] == 3
    assert as_json["counts"] == {"code_error": 1, "fails": 1, "missing": 1, "resumes": 2, "blocked": 1}

    same = check_deploy(db_url, subprocess_env, "--app", "tests.apps.deploy_v1", "--all")
    assert same.returncode == 0, same
    assert "none would fail" in same.stdout and runs["fresh"] in same.stdout
    assert store.get_run(runs["fresh"]).status == SCHEDULED  # nothing ran


def test_the_command_needs_the_new_code(db_url: str, subprocess_env) -> None:
    result = check_deploy(db_url, subprocess_env)
    assert result.returncode == 2 and "needs --app" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
