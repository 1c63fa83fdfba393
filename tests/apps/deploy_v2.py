"""The next release of ``deploy_v1``: step 2 of ``deploy.order`` now bills
instead of charging, ``deploy.reads`` reads a key the recorded result does
not have, and ``deploy.legacy`` is gone."""

from __future__ import annotations

from typing import Any

from everystep import step, workflow


@step(name="deploy.reserve")
def reserve(order: dict[str, Any]) -> dict[str, Any]:
    return {"item": order["sku"]}


@step(name="deploy.bill")
def bill(order: dict[str, Any]) -> int:
    return order["amount"]


@step(name="deploy.ship")
def ship(item: Any) -> str:
    return f"shipped {item}"


@step(name="deploy.pay", unsafe_to_repeat=True)
def pay(order: dict[str, Any]) -> int:
    return order["amount"]


@workflow(name="deploy.order")
def order(o: dict[str, Any]) -> str:
    reserve(o)
    bill(o)
    return ship(o["sku"])


@workflow(name="deploy.checkout")
def checkout(o: dict[str, Any]) -> str:
    paid = pay(o)
    return ship(paid)


@workflow(name="deploy.reads")
def reads(o: dict[str, Any]) -> str:
    reserved = reserve(o)
    return ship(reserved["item"])
