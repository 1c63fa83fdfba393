"""Claiming ahead (``supervisor/claim_ahead.py``): while every child is busy
with short runs, the supervisor holds one run claimed for the next child to
free. Held, it is a claimed run like any other: a drain gives it back, a
cancel drops it, and it is executed exactly once."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from everystep import admin, schedule
from everystep.models import CANCELLED, COMPLETED, RUNNING, SCHEDULED
from supervisor.claim_ahead import SHORT_RUN, ClaimAhead
from tests.apps import supervised
from tests.support.supervisor import Supervisor, supervisors, wait_run  # noqa: F401

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(180), pytest.mark.backends("sqlite", "postgres")]

#: How long a test watches for a claim that must not happen (several polls).
QUIET_SECONDS = 1.5


def test_claims_ahead_only_while_runs_are_short_and_up_to_its_limit() -> None:
    ahead = ClaimAhead(limit=1)
    assert not ahead.wanted(0)  # no run has ended: how long runs take is unknown
    ahead.ended(None)
    assert not ahead.wanted(0)
    ahead.ended(SHORT_RUN / 10)
    assert ahead.wanted(0) and not ahead.wanted(1)
    for _ in range(20):  # the runs grow long: the average follows
        ahead.ended(SHORT_RUN * 4)
    assert not ahead.wanted(0)
    never = ClaimAhead(limit=0)
    never.ended(0.001)
    assert not never.wanted(0)


def hold_one_ahead(store: Any, sup: Supervisor, tmp_path: Path) -> tuple[Any, list[Any]]:
    """Quick runs first (the supervisor learns its runs are short), then a
    run held at a gate in the only child, then two quick runs: one of them
    is claimed ahead and held ready, the other waits."""
    spec = {"dir": str(tmp_path)}
    for run in [schedule(supervised.tiny, spec, database=store) for _ in range(3)]:
        wait_run(store, run.id, (COMPLETED,), supervisor=sup)
    gated = schedule(supervised.gated_flow, {**spec, "gate": "open"}, database=store)
    sup.busy_child(gated.id, "2")
    quick = [schedule(supervised.tiny, spec, database=store) for _ in range(2)]
    sup.wait_status(lambda status: status["ready"] == 1, "one run claimed ahead")
    return gated, quick


def statuses(store: Any, runs: list[Any]) -> list[str]:
    return [store.get_run(run.id).status for run in runs]


def test_a_busy_supervisor_holds_one_short_run_ready_and_runs_every_run_once(db_url, store, supervisors,
                                                                                tmp_path):
    sup = supervisors(db_url, procs=1).start()
    gated, quick = hold_one_ahead(store, sup, tmp_path)

    # One claimed ahead (no child runs it yet, no step recorded), the other
    # left to the queue: the limit is one.
    assert sorted(statuses(store, quick)) == [RUNNING, SCHEDULED]
    [held] = [run for run in quick if store.get_run(run.id).status == RUNNING]
    assert store.get_steps(held.id) == []
    assert [child["run_id"] for child in sup.status()["children"]] == [gated.id]

    supervised.open_gate(tmp_path, "open")
    for run in [gated, *quick]:
        wait_run(store, run.id, (COMPLETED,), supervisor=sup)
    for run in quick:
        assert len(supervised.effects(tmp_path, run.id)) == 1  # executed exactly once


def test_a_drain_gives_back_the_run_held_ahead(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=1, args=["--drain", "60"]).start()
    gated, quick = hold_one_ahead(store, sup, tmp_path)
    [held] = [run for run in quick if store.get_run(run.id).status == RUNNING]

    sup.send_signal(signal.SIGTERM)
    wait_run(store, held.id, (SCHEDULED,), supervisor=sup)  # requeued before the drain waits on the child
    supervised.open_gate(tmp_path, "open")
    assert sup.wait() == 0
    run = store.get_run(held.id)
    assert (run.status, run.claimed_by, store.get_steps(held.id)) == (SCHEDULED, None, [])
    assert supervised.effects(tmp_path, held.id) == []


def test_a_cancelled_run_held_ahead_is_dropped_and_never_started(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=1).start()
    gated, quick = hold_one_ahead(store, sup, tmp_path)
    [held] = [run for run in quick if store.get_run(run.id).status == RUNNING]
    [other] = [run for run in quick if run.id != held.id]

    admin.cancel(store, held.id, "test")
    # Dropped: only then can the other be claimed ahead in its place.
    wait_run(store, other.id, (RUNNING,), supervisor=sup)
    assert sup.status()["ready"] == 1
    supervised.open_gate(tmp_path, "open")
    for run in (gated, other):
        wait_run(store, run.id, (COMPLETED,), supervisor=sup)
    assert store.get_run(held.id).status == CANCELLED
    assert supervised.effects(tmp_path, held.id) == []


@pytest.mark.parametrize("case", ["no run ended yet", "--claim-ahead 0"])
def test_nothing_is_claimed_ahead_without_short_runs_or_when_turned_off(db_url, store, supervisors, tmp_path,
                                                                       case):
    off = case == "--claim-ahead 0"
    sup = supervisors(db_url, procs=1, args=["--claim-ahead", "0"] if off else []).start()
    spec = {"dir": str(tmp_path)}
    if off:  # short runs, which would otherwise turn it on
        for run in [schedule(supervised.tiny, spec, database=store) for _ in range(3)]:
            wait_run(store, run.id, (COMPLETED,), supervisor=sup)
    gated = schedule(supervised.gated_flow, {**spec, "gate": "open"}, database=store)
    sup.busy_child(gated.id, "2")
    waiting = schedule(supervised.tiny, spec, database=store)

    deadline = time.monotonic() + QUIET_SECONDS
    while time.monotonic() < deadline:
        assert sup.status()["ready"] == 0
        assert store.get_run(waiting.id).status == SCHEDULED
        time.sleep(0.1)
    supervised.open_gate(tmp_path, "open")
    for run in (gated, waiting):
        wait_run(store, run.id, (COMPLETED,), supervisor=sup)
