"""A bad deploy: the charge step fails every time. ``repair_v2`` is the fix.
``CALLS`` counts executions per step, so a test can tell a replayed result
from a re-run."""

from __future__ import annotations

from collections import Counter
from typing import Any

from everystep import set_event, step, workflow

CALLS: Counter[str] = Counter()


@step(name="repair.reserve")
def reserve(order: dict[str, Any]) -> str:
    CALLS["reserve"] += 1
    return f"{order['sku']}#{CALLS['reserve']}"


@step(name="repair.charge")
def charge(order: dict[str, Any]) -> int:
    CALLS["charge"] += 1
    raise ValueError("charge: currency field missing")


@step(name="repair.pay", unsafe_to_repeat=True)
def pay(order: dict[str, Any]) -> int:
    CALLS["pay"] += 1
    return int(order["amount"])


@step(name="repair.ship")
def ship(reservation: str, amount: int) -> str:
    CALLS["ship"] += 1
    return f"shipped {reservation} for {amount}"


@workflow(name="repair.order")
def order(o: dict[str, Any]) -> str:
    reservation = reserve(o)
    amount = charge(o)
    return ship(reservation, amount)


@workflow(name="repair.checkout")
def checkout(o: dict[str, Any]) -> str:
    reservation = reserve(o)
    amount = pay(o)
    return ship(reservation, amount)


@workflow(name="repair.approval")
def approval(o: dict[str, Any]) -> str:
    """Publishes its state as it goes: a web handler reads it with get_event."""
    reservation = reserve(o)
    set_event("status", "reserved")
    set_event("status", "approved")
    set_event("approver", "ops")
    amount = charge(o)
    set_event("status", "charged")
    return ship(reservation, amount)
