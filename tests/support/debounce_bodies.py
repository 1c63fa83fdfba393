"""A workflow whose body schedules debounced runs (tests/test_debounce.py)."""

from __future__ import annotations

from everystep import Debounce, schedule, workflow
from tests.support.debounce_hammer import debounced


@workflow
def twice() -> list[str]:
    first = schedule(debounced, "body", 1, debounce=Debounce("from-a-body", 30))
    second = schedule(debounced, "body", 2, debounce=Debounce("from-a-body", 30))
    return [first.id, second.id]
