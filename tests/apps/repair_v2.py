"""The fix of ``repair_v1``'s charge step."""

from __future__ import annotations

from typing import Any

from everystep import set_event, step, workflow
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


@workflow(name="repair.approval")
def approval(o: dict[str, Any]) -> str:
    reservation = reserve(o)
    set_event("status", "reserved")
    set_event("status", "approved")
    set_event("approver", "ops")
    amount = charge(o)
    set_event("status", "charged")
    return ship(reservation, amount)
