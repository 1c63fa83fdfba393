"""``Config.before_fork``: a host embedding the supervisor closes what its
children must not inherit (Django's database connections) right before the
parent forks. Real forks: a supervisor process whose children report whether
the host's handle was still open in them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from everystep.models import COMPLETED
from everystep.store import Store
from tests.apps import forking
from tests.support.supervisor import short_socket_dir

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(120), pytest.mark.backends("sqlite", "postgres")]


def run_host(db_url: str, log: Path, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    socket_dir = short_socket_dir()
    try:
        return subprocess.run(
            [sys.executable, "-m", "tests.apps.forking", db_url, str(socket_dir / "sup.sock"), str(log), *flags],
            env=env, capture_output=True, text=True, timeout=100,
        )
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)


def reports(store: Store, run_ids: list[str]) -> list[dict[str, Any]]:
    runs = [store.get_run(run_id) for run_id in run_ids]
    assert [run.status for run in runs] == [COMPLETED] * len(runs), [run.error for run in runs]
    return [run.result for run in runs]


def test_before_fork_hooks_run_in_the_parent_before_every_fork(
    db_url: str, store: Store, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    run_ids = [store.schedule(forking.inherited.name, "[]").id for _ in range(4)]
    log = tmp_path / "host.log"
    done = run_host(db_url, log, subprocess_env, "--hook")
    assert done.returncode == 0, done.stderr
    results = reports(store, run_ids)
    parent = {result["ppid"] for result in results}
    assert len(parent) == 1, results
    # Each run had a fresh child (--max-runs-per-child 1): several batches
    # of forks, the hook called in the parent before each of them.
    hook_pids = [line.split()[0] for line in log.read_text().splitlines() if line.endswith("before_fork")]
    assert len(hook_pids) >= 2 and set(hook_pids) == {str(parent.pop())}
    assert len({result["pid"] for result in results}) == len(results)
    assert not any(result["inherited_open"] for result in results)


def test_without_the_hook_children_inherit_the_hosts_handle(
    db_url: str, store: Store, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """The control: the hook, not chance, is what closed the handle."""
    run_ids = [store.schedule(forking.inherited.name, "[]").id for _ in range(2)]
    done = run_host(db_url, tmp_path / "host.log", subprocess_env)
    assert done.returncode == 0, done.stderr
    assert all(result["inherited_open"] for result in reports(store, run_ids))
