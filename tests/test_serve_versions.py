"""Blue/green: two supervisors on one database, each serving only the runs
started under its own code version (``--serve-versions current``), so runs
in flight stay on the code that started them while new runs go to the new."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from everystep import registry, schedule, versions
from everystep.api import WorkflowFunction
from everystep.models import COMPLETED
from everystep.runner import Outcome
from everystep.store import connect
from tests.apps import patch_v1, patch_v2, waits
from tests.support.cli import run_in_process
from tests.support.runs import execute_run
from tests.support.supervisor import supervisors, wait_run  # noqa: F401
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]

ORDER = {"sku": "A-1", "amount": 30}


def test_two_supervisors_each_take_only_their_versions_runs(db_url: str, supervisors: Any) -> None:
    store = connect(db_url)
    blue_version, green_version = versions.code_version(patch_v1.order), versions.code_version(patch_v2.order)
    assert blue_version != green_version
    blue = supervisors(db_url, procs=2, app="tests.apps.patch_v1", args=["--serve-versions", "current"])
    green = supervisors(db_url, procs=2, app="tests.apps.patch_v2", args=["--serve-versions", "current"])
    try:
        blue.spawn()
        green.spawn()
        blue.wait_idle()
        green.wait_idle()
        old = [schedule("patch.order", ORDER, database=store, app_version=blue_version).id for _ in range(6)]
        new = [schedule("patch.order", ORDER, database=store, app_version=green_version).id for _ in range(6)]
        unversioned = store.schedule("patch.order", '[{"sku": "A-1", "amount": 30}]').id
        everything = [*old, *new, unversioned]

        def finished() -> list[Any] | None:
            runs = [store.get_run(run_id) for run_id in everything]
            return runs if all(run.status == COMPLETED for run in runs) else None

        wait_until(finished, "every run to complete", timeout=180, interval=0.2,
                   detail=lambda: blue.log()[-2000:] + green.log()[-2000:])
        assert {store.get_run(run_id).claimed_by for run_id in old} == {blue.name}
        assert {store.get_run(run_id).claimed_by for run_id in new} == {green.name}
        assert store.get_run(unversioned).claimed_by in (blue.name, green.name)
        # Each ran its own code: the old runs have no patch marker, the new ones took the new branch.
        assert not any(step.name == "everystep.patch" for run_id in old for step in store.get_steps(run_id))
        assert all(any(step.step_id == "@patch:tax" and step.result is True for step in store.get_steps(run_id))
                   for run_id in new)
        listed = store.list_runs(version=blue_version, limit=100)
        assert sorted(run.id for run in listed) == sorted(old)
    finally:
        store.close()
        for runner in (blue, green):
            if runner.proc is not None and runner.proc.poll() is None:
                runner.stop()


def test_a_childs_runs_on_its_parents_release(db_url: str, supervisors: Any, subprocess_env: dict[str, str]) -> None:
    """Release 1.0 is running when a 2.0 run (executed here) starts three
    children: they record 2.0, so the 1.0 supervisor never takes them, and
    the 2.0 supervisor started afterwards runs them all."""
    store = connect(db_url)
    old = supervisors(db_url, procs=2, app="tests.apps.waits",
                      args=["--app-version", "1.0", "--serve-versions", "current"]).start()
    new = supervisors(db_url, procs=2, app="tests.apps.waits",
                      args=["--app-version", "2.0", "--serve-versions", "current"])
    try:
        parent = schedule(waits.parent_of_releases, 3, database=store, app_version="2.0")
        assert execute_run(store, parent.id) == Outcome.RELEASED
        children = store.children(parent.id)
        assert [child.app_version for child in children] == ["2.0"] * 3
        listed = run_in_process(["show", children[0].id, "--database", db_url], subprocess_env, Path.cwd())
        assert "version    2.0" in listed.stdout
        new.start()
        done = wait_run(store, parent.id, (COMPLETED,), timeout=120, supervisor=new)
        assert done.result == ["2.0"] * 3, old.log()[-3000:]
        assert {store.get_run(child.id).claimed_by for child in children} == {new.name}
    finally:
        store.close()


def test_current_serves_the_versions_of_the_loaded_code() -> None:
    for module in (patch_v1,):
        for value in vars(module).values():
            if isinstance(value, WorkflowFunction):
                registry.register_workflow(value.name, value)
    assert versions.code_version(patch_v1.order) in (versions.served("current") or [])
    assert versions.served("all") is None and versions.served("a, b") == ["a", "b"]
    versions.set_app_version("blue-7")
    try:
        assert versions.served("current") == ["blue-7"]
    finally:
        versions.set_app_version(None)
