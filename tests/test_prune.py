"""Retention: ``everystep prune`` and ``Store.prune_batch`` on both backends.

The guarantee under test is that only finished runs (completed, stopped,
failed) older than the cutoff are deleted, always with their steps, and
that scheduled, running and blocked runs are never touched: not by the
command, not by the store method given any status list, and not while a
real supervisor is claiming and finishing runs next to the prune.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from everystep import retention, schedule
from everystep.errors import EverystepError
from everystep.models import BLOCKED, COMPLETED, FAILED, RUNNING, SCHEDULED, STOPPED, STEP_DONE
from everystep.store import NewStep, Store, utcnow
from tests.apps import workers
from tests.apps.workers import effects
from tests.support.supervisor import supervisors  # noqa: F401  (fixture)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

FLOW = "tests.prune.flow"
CLAIMER = "pruner-test"
OLD = dt.timedelta(days=40)


def _make_run(store: Store, status: str, steps: int = 2) -> str:
    """A run of ``FLOW`` in ``status``, with ``steps`` recorded steps when it
    was claimed (everything but ``scheduled``)."""
    run = store.schedule(FLOW, "[]")
    if status == SCHEDULED:
        return run.id
    claimed = [r for r in store.claim(CLAIMER, 1000, [FLOW]) if r.id == run.id]
    assert claimed, "the run just scheduled could not be claimed"
    claim = claimed[0].claim
    for index in range(steps):
        store.record_step(claim, NewStep(str(index + 1), "noop", "[]", "{}", utcnow(), STEP_DONE, "1"))
    if status != RUNNING:
        assert store.finish_run(claim, status, result_json="null")
    return run.id


def _set_completed_at(store: Store, run_ids: list[str], when: dt.datetime) -> None:
    """Backdate runs (also unfinished ones: the statements must refuse them
    whatever their timestamps say)."""
    with store.connection() as conn:
        for run_id in run_ids:
            if store.backend == "sqlite":
                conn.execute("UPDATE everystep_workflow SET completed_at = ? WHERE id = ?",
                             (when.isoformat(), run_id))
            else:
                conn.execute("UPDATE everystep_workflow SET completed_at = %s WHERE id = %s", (when, run_id))


def _ids(store: Store) -> set[str]:
    return {run.id for run in store.list_runs(limit=100_000)}


def _step_count(store: Store) -> int:
    with store.connection() as conn:
        return int(conn.execute("SELECT count(*) AS steps FROM everystep_step").fetchone()["steps"])


@pytest.fixture
def history(store: Store) -> dict[str, list[str]]:
    """Old runs in every status, young finished runs, and their steps."""
    runs: dict[str, list[str]] = {}
    for status in (COMPLETED, FAILED, STOPPED, BLOCKED, RUNNING):
        runs[f"old-{status}"] = [_make_run(store, status) for _ in range(3)]
    runs["young-completed"] = [_make_run(store, COMPLETED) for _ in range(2)]
    # Last: every claim above would have taken them.
    runs[f"old-{SCHEDULED}"] = [_make_run(store, SCHEDULED) for _ in range(3)]
    old = [run_id for key, ids in runs.items() if key.startswith("old-") for run_id in ids]
    _set_completed_at(store, old, utcnow() - OLD)
    return runs


def test_prune_deletes_old_finished_runs_with_their_steps_in_batches(store, history):
    before_steps = _step_count(store)
    seen: list[int] = []
    report = retention.prune(store, dt.timedelta(days=30), batch=2,
                             progress=lambda r: seen.append(r.runs))

    gone = set(history[f"old-{COMPLETED}"] + history[f"old-{FAILED}"] + history[f"old-{STOPPED}"])
    assert report.runs == 9 and report.steps == 18
    assert report.batches == 5 and seen == [2, 4, 6, 8, 9]
    remaining = _ids(store)
    assert not gone & remaining
    kept = [run_id for key in ("old-blocked", "old-running", "old-scheduled", "young-completed")
            for run_id in history[key]]
    assert set(kept) <= remaining
    assert _step_count(store) == before_steps - 18
    for run_id in gone:
        assert store.get_steps(run_id) == []
    # Nothing left to do: a second pass deletes nothing.
    assert retention.prune(store, dt.timedelta(days=30)).runs == 0


def test_prune_only_the_statuses_asked_for(store, history):
    assert retention.count(store, dt.timedelta(days=30), [FAILED]) == (3, 6)
    report = retention.prune(store, dt.timedelta(days=30), [FAILED])
    assert report.runs == 3
    remaining = _ids(store)
    assert not set(history[f"old-{FAILED}"]) & remaining
    assert set(history[f"old-{COMPLETED}"] + history[f"old-{STOPPED}"]) <= remaining


def test_the_statements_never_delete_unfinished_runs_whatever_they_are_asked(store, history):
    # Bypass the status validation: the SQL itself must refuse.
    cutoff = utcnow() + dt.timedelta(days=1)
    assert store.count_prunable(cutoff, [SCHEDULED, RUNNING, BLOCKED]) == (0, 0)
    assert store.prune_batch(cutoff, [SCHEDULED, RUNNING, BLOCKED], 1000) == (0, 0)
    unfinished = history["old-blocked"] + history["old-running"] + history["old-scheduled"]
    assert set(unfinished) <= _ids(store)
    statuses = Counter(store.get_run(run_id).status for run_id in unfinished)
    assert statuses == {BLOCKED: 3, RUNNING: 3, SCHEDULED: 3}


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("10m", 600), ("2h", 7200), ("30d", 2_592_000), (" 5 m ", 300)])
def test_durations(text, seconds):
    assert retention.parse_duration(text) == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "30", "d", "1.5h", "-1d", "3w", "10 minutes"])
def test_bad_durations_are_refused(text):
    with pytest.raises(EverystepError, match="bad duration"):
        retention.parse_duration(text)


def test_status_list_is_validated(store):
    assert retention.parse_statuses("failed, completed,failed") == (FAILED, COMPLETED)
    for status in (SCHEDULED, RUNNING, BLOCKED):
        with pytest.raises(EverystepError, match="never pruned"):
            retention.parse_statuses(f"completed,{status}")
    with pytest.raises(EverystepError, match="unknown status"):
        retention.parse_statuses("done")
    with pytest.raises(EverystepError, match="at least one"):
        retention.parse_statuses(" , ")
    with pytest.raises(EverystepError, match="--batch"):
        retention.prune(store, dt.timedelta(days=1), batch=0)


# -- the command ------------------------------------------------------------------


def _cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "everystep.cli", "prune", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize("args, fragment", [
    (["--older-than", "3x"], "bad duration"),
    (["--older-than", "30"], "bad duration"),
    (["--older-than", "1d", "--status", "running"], "never pruned"),
    (["--older-than", "1d", "--status", "scheduled,completed"], "never pruned"),
    (["--older-than", "1d", "--status", "finished"], "unknown status"),
    (["--older-than", "1d", "--batch", "0"], "--batch"),
    (["--older-than", "1d", "--batch", "ten"], "--batch"),
    ([], "--older-than"),
])
def test_cli_refuses_bad_input_with_one_line_and_exit_2(store, history, db_url, subprocess_env, tmp_path,
                                                        args, fragment):
    before = _ids(store)
    result = _cli(subprocess_env, tmp_path, "--database", db_url, *args)
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result
    assert result.stdout == "" and len(lines) == 1, result.stderr
    assert lines[0].startswith("everystep: error: ") and fragment in lines[0], lines[0]
    assert _ids(store) == before


def test_cli_dry_run_counts_then_prune_reports_progress(store, history, db_url, subprocess_env, tmp_path):
    before = _ids(store)
    dry = _cli(subprocess_env, tmp_path, "--database", db_url, "--older-than", "30d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip() == ("would delete 9 completed/stopped/failed/cancelled/continued run(s) finished more than 30d ago "
                                  "(18 steps)")
    assert _ids(store) == before

    real = _cli(subprocess_env, tmp_path, "--database", db_url, "--older-than", "30d",
                "--status", "completed,stopped", "--batch", "4")
    assert real.returncode == 0, real.stderr
    lines = real.stdout.splitlines()
    assert lines[0].startswith("deleting 6 completed/stopped run(s)")
    assert [line.split(" runs ")[0] for line in lines[1:-1]] == ["deleted 4 of ~6", "deleted 6 of ~6"]
    assert lines[-1].startswith("done: deleted 6 runs and 12 steps")
    assert before - _ids(store) == set(history[f"old-{COMPLETED}"] + history[f"old-{STOPPED}"])


# -- next to a working supervisor --------------------------------------------------


@pytest.mark.timeout(240)
def test_prune_beside_a_working_supervisor_never_touches_unfinished_runs(store, db_url, supervisors, tmp_path):
    # History to prune, then live runs a real supervisor claims and finishes
    # while the prune deletes, every pass, whatever has finished (cutoff 0s).
    old = [_make_run(store, COMPLETED, steps=3) for _ in range(60)]
    _set_completed_at(store, old, utcnow() - OLD)
    spec: dict[str, Any] = {"dir": str(tmp_path)}
    sup = supervisors(db_url, procs=3, app="tests.apps.workers", poll=0.05).start()
    # Two runs wait in their middle step until a pass has pruned others, so
    # passes certainly run while claimed, unfinished runs exist.
    held = [schedule(workers.three_steps, {**spec, "gate": "release"}, database=store).id for _ in range(2)]
    live = held + [schedule(workers.three_steps, spec, database=store).id for _ in range(98)]

    deleted_live = 0
    overlapped = False  # a pass deleted finished live runs while others were still unfinished

    def drained() -> bool:
        nonlocal deleted_live, overlapped
        before = _ids(store) & set(live)
        report = retention.prune(store, dt.timedelta(0), batch=7)
        deleted_live += report.runs
        after = _ids(store) & set(live)
        overlapped = overlapped or bool(before - after and after)
        if overlapped:
            (tmp_path / "release").touch()
        return not after

    wait_until(drained, "every live run finished and pruned", timeout=180, interval=0.01,
               detail=lambda: f"\n--- supervisor log ---\n{sup.log()}")
    sup.stop()

    # Every live run executed each of its steps to the end exactly once: a
    # prune that deleted a claimed run would have cut it short (its writes
    # refused) or made it run twice.
    for run_id in live:
        assert effects(tmp_path, run_id) == ["first", "middle:start", "middle:end", "last"], sup.log()
    assert overlapped
    assert deleted_live == len(old) + len(live)
    assert not set(old) & _ids(store)
    assert _step_count(store) == 0
