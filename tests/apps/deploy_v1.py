"""The code of a deployment, as the runs in the database recorded it.

``deploy_v2`` is the next release: ``check-deploy`` compares the two. Names
are explicit so both versions register the same workflows and steps."""

from __future__ import annotations

from typing import Any

from everystep import step, workflow


@step(name="deploy.reserve")
def reserve(order: dict[str, Any]) -> dict[str, Any]:
    return {"sku": order["sku"]}


@step(name="deploy.charge")
def charge(order: dict[str, Any]) -> int:
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
    charge(o)
    return ship(o["sku"])


@workflow(name="deploy.legacy")
def legacy(o: dict[str, Any]) -> dict[str, Any]:
    return reserve(o)


@workflow(name="deploy.checkout")
def checkout(o: dict[str, Any]) -> str:
    paid = pay(o)
    return ship(paid)


@workflow(name="deploy.reads")
def reads(o: dict[str, Any]) -> str:
    reserved = reserve(o)
    return ship(reserved["sku"])
