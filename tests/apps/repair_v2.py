"""The fix of ``repair_v1``'s charge step."""

from __future__ import annotations

from typing import Any

from everystep import step, workflow
from tests.apps.repair_v1 import CALLS, reserve, ship


@step(name="repair.charge")
def charge(order: dict[str, Any]) -> int:
    CALLS["charge"] += 1
    return int(order["amount"])


@workflow(name="repair.order")
def order(o: dict[str, Any]) -> str:
    reservation = reserve(o)
    amount = charge(o)
    return ship(reservation, amount)
