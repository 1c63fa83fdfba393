"""Helpers to drive runs in-process: claim one specific run and execute it."""

from __future__ import annotations

from typing import Any

from everystep import runner
from everystep.models import SCHEDULED, Run
from everystep.store import Store


def claim_run(store: Store, run_id: str, claimer: str = "tester") -> Run:
    """Claim exactly ``run_id`` (scheduled) for ``claimer``; other runs
    claimed along the way are put back."""
    run = store.get_run(run_id)
    assert run.status == SCHEDULED, f"run {run_id} is {run.status}"
    claimed = store.claim(claimer, 10_000, [run.name])
    mine = [item for item in claimed if item.id == run_id]
    for other in claimed:
        if other.id != run_id:
            store.requeue(other.id, claimer)
    assert mine, f"run {run_id} could not be claimed"
    return mine[0]


def execute_run(store: Store, run_id: str, claimer: str = "tester", **options: Any) -> str:
    """Claim ``run_id`` and execute it once; returns what ``runner.execute`` returns."""
    run = claim_run(store, run_id, claimer)
    return runner.execute(store, run, claimer=claimer, **options)
