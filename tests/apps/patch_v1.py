"""A workflow as the runs in flight recorded it; ``patch_v2`` adds a step
under ``patched("tax")`` and ``patch_v3`` deprecates that patch. Names are
explicit so the three versions register the same workflow and steps."""

from __future__ import annotations

from typing import Any

from everystep import recv, step, workflow


@step(name="patch.reserve")
def reserve(order: dict[str, Any]) -> str:
    return str(order["sku"])


@step(name="patch.tax")
def tax(order: dict[str, Any]) -> int:
    return int(order["amount"]) // 10


@step(name="patch.charge")
def charge(order: dict[str, Any]) -> int:
    return int(order["amount"])


@step(name="patch.ship")
def ship(sku: str) -> str:
    return f"shipped {sku}"


@step(name="patch.notify")
def notify(message: str) -> str:
    return message


@workflow(name="patch.order")
def order(o: dict[str, Any]) -> str:
    reserve(o)
    charge(o)
    shipped = ship(o["sku"])
    return notify(shipped)


@workflow(name="patch.approved")
def approved(o: dict[str, Any]) -> str:
    """Waits for an approval between reserving and charging."""
    reserve(o)
    recv("approval")
    return ship(str(charge(o)))
