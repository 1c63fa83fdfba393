"""Engine statements the database refuses, for a test: ``refuse`` makes the
store's statement fault hook raise the driver's own error for the named
statements (``store.base.core.statement_fault``), ``guarded`` executes a run
as a runner does, and ``quick_backoff`` shortens the give-back's backoff."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

import pytest

from everystep import engine_errors, runner
from everystep.models import Outcome
from everystep.store import Store
from everystep.store.base import core
from tests.apps.pooled import refusal
from tests.support.runs import claim_run


def refuse(names: Collection[str], times: int | None = None) -> list[str]:
    """Refuse the statements ``names`` (the next ``times`` sends of them,
    or every one) with a real error of the store's driver; returns the
    names refused so far."""
    refused: list[str] = []

    def fault(store: Any, name: str) -> None:
        if name in names and (times is None or len(refused) < times):
            refused.append(name)
            raise refusal(store.backend, name)

    core.statement_fault = fault
    return refused


def guarded(store: Store, run_id: str, claimer: str = "tester") -> Outcome:
    return runner.execute_guarded(store, claim_run(store, run_id, claimer), claimer=claimer)


@pytest.fixture
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(engine_errors, "FIRST_BACKOFF", 0.05)
    yield
    core.statement_fault = None
