"""Claiming ahead (``supervisor/claim_ahead.py``): while every child is busy
with short runs, the supervisor holds runs claimed for the next children to
free, claimed in one batch once those held are handed out. Held, a run is a
claimed run like any other: a drain gives it back, a cancel drops it, and it
is executed exactly once."""

from __future__ import annotations

import datetime as dt
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from everystep import admin, schedule
from everystep.models import CANCELLED, COMPLETED, RUNNING, SCHEDULED
from everystep.store.base.values import utcnow
from supervisor.claim_ahead import SHORT_RUN, ClaimAhead
from tests.apps import supervised
from tests.support.supervisor import Supervisor, supervisors, wait_run  # noqa: F401

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(180), pytest.mark.backends("sqlite", "postgres")]

#: How long a test watches for a claim that must not happen (several polls).
QUIET_SECONDS = 1.5


def test_claims_ahead_only_while_runs_are_short_and_up_to_its_limit() -> None:
    ahead = ClaimAhead(limit=1)
    assert ahead.wanted(0, 1) == 0  # no run has ended: how long runs take is unknown
    ahead.ended(None)
    assert ahead.wanted(0, 1) == 0
    ahead.ended(SHORT_RUN / 10)
    assert (ahead.wanted(0, 1), ahead.wanted(1, 1), ahead.wanted(0, 8)) == (1, 0, 1)
    for _ in range(20):  # the runs grow long: the average follows
        ahead.ended(SHORT_RUN * 4)
    assert ahead.wanted(0, 1) == 0
    never = ClaimAhead(limit=0)
    never.ended(0.001)
    assert never.wanted(0, 1) == 0


def test_claims_a_batch_once_the_held_runs_are_handed_out_four_per_child_bounded_by_time() -> None:
    ahead = ClaimAhead(limit=8)
    ahead.ended(0.003)
    assert [ahead.wanted(ready, 2) for ready in (0, 1, 7)] == [8, 0, 0]  # refilled only when empty
    assert [ahead.wanted(0, children) for children in (0, 1, 2, 8)] == [0, 4, 8, 8]  # scaled to none: none
    for _ in range(40):  # runs of a third of SHORT_RUN: about SHORT_RUN of them, not eight
        ahead.ended(SHORT_RUN / 3)
    assert ahead.wanted(0, 8) == 3
    for _ in range(40):  # just under SHORT_RUN: still one, never none while runs are short
        ahead.ended(SHORT_RUN * 0.9)
    assert ahead.wanted(0, 8) == 1


def hold_ahead(store: Any, sup: Supervisor, tmp_path: Path, quick: int = 2, held: int = 1) -> tuple[Any, list[Any]]:
    """Quick runs first (the supervisor learns its runs are short), then a
    run held at a gate in the only child, then ``quick`` quick runs, all due
    at one moment: ``held`` of them are claimed ahead and held ready, the
    others wait."""
    spec = {"dir": str(tmp_path)}
    for run in [schedule(supervised.tiny, spec, database=store) for _ in range(3)]:
        wait_run(store, run.id, (COMPLETED,), supervisor=sup)
    gated = schedule(supervised.gated_flow, {**spec, "gate": "open"}, database=store)
    sup.busy_child(gated.id, "2")
    due = utcnow() + dt.timedelta(seconds=3)  # every one scheduled by then, even on a loaded machine
    runs = [schedule(supervised.tiny, spec, database=store, run_at=due) for _ in range(quick)]
    sup.wait_status(lambda status: status["ready"] == held, f"{held} run(s) claimed ahead")
    return gated, runs


def quiet_period() -> Iterator[None]:
    """Every 0.1 s for ``QUIET_SECONDS``: the loop body asserts that what
    must not happen does not."""
    deadline = time.monotonic() + QUIET_SECONDS
    while time.monotonic() < deadline:
        yield
        time.sleep(0.1)


def statuses(store: Any, runs: list[Any]) -> list[str]:
    return [store.get_run(run.id).status for run in runs]


def test_a_busy_supervisor_holds_one_short_run_ready_and_runs_every_run_once(db_url, store, supervisors,
                                                                                tmp_path):
    sup = supervisors(db_url, procs=1, args=["--claim-ahead", "1"]).start()
    gated, quick = hold_ahead(store, sup, tmp_path)

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
    sup = supervisors(db_url, procs=1, args=["--drain", "60", "--claim-ahead", "1"]).start()
    gated, quick = hold_ahead(store, sup, tmp_path)
    [held] = [run for run in quick if store.get_run(run.id).status == RUNNING]

    sup.send_signal(signal.SIGTERM)
    wait_run(store, held.id, (SCHEDULED,), supervisor=sup)  # requeued before the drain waits on the child
    supervised.open_gate(tmp_path, "open")
    assert sup.wait() == 0
    run = store.get_run(held.id)
    assert (run.status, run.claimed_by, store.get_steps(held.id)) == (SCHEDULED, None, [])
    assert supervised.effects(tmp_path, held.id) == []


def test_a_cancelled_run_held_ahead_is_dropped_and_never_started(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=1, args=["--claim-ahead", "1"]).start()
    gated, quick = hold_ahead(store, sup, tmp_path)
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


def test_runs_held_ahead_are_claimed_in_one_batch_and_refilled_only_once_handed_out(db_url, store, supervisors,
                                                                                   tmp_path):
    sup = supervisors(db_url, procs=1).start()  # the default: up to 8, four per child
    gated, quick = hold_ahead(store, sup, tmp_path, quick=5, held=4)

    now = [store.get_run(run.id) for run in quick]
    held = [run for run in now if run.status == RUNNING]
    assert len(held) == 4 and len({run.claimed_at for run in held}) == 1  # one claim took all four
    [waiting] = [run for run in now if run.status == SCHEDULED]
    for _ in quiet_period():  # four held: no claim for the fifth while the child is busy
        assert store.get_run(waiting.id).status == SCHEDULED

    supervised.open_gate(tmp_path, "open")
    for run in [gated, *quick]:
        wait_run(store, run.id, (COMPLETED,), supervisor=sup)
    for run in quick:
        assert len(supervised.effects(tmp_path, run.id)) == 1  # executed exactly once


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

    for _ in quiet_period():
        assert sup.status()["ready"] == 0
        assert store.get_run(waiting.id).status == SCHEDULED
    supervised.open_gate(tmp_path, "open")
    for run in (gated, waiting):
        wait_run(store, run.id, (COMPLETED,), supervisor=sup)
