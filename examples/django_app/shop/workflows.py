"""The shop's workflows. Steps use the Django ORM like any other code.

``fulfil_order`` reserves stock, charges the card (unsafe to repeat: a crash
in the middle blocks the run for an operator instead of charging twice) and
marks the order paid. Each step is recorded as it completes, so a worker
restart resumes the order where it stopped. ``mark_paid`` is transactional:
its ORM update commits in one transaction with its record, so the order is
marked paid exactly once, whatever dies when.
"""

from __future__ import annotations

from decimal import Decimal

from everystep import step, workflow

from .models import Order


@step
def reserve_stock(order_id: int) -> str:
    Order.objects.filter(pk=order_id, status=Order.Status.NEW).update(status=Order.Status.RESERVED)
    return Order.objects.get(pk=order_id).sku


@step(unsafe_to_repeat=True)
def charge_card(order_id: int, amount: Decimal) -> str:
    # A payment provider's API call would go here; its charge id comes back.
    return f"ch_{order_id}_{amount}"


@step(transactional=True)
def mark_paid(order_id: int, charge_id: str) -> None:
    Order.objects.filter(pk=order_id).update(status=Order.Status.PAID, charge_id=charge_id)


@workflow
def fulfil_order(order_id: int) -> dict[str, str]:
    sku = reserve_stock(order_id)
    amount = Order.objects.values_list("amount", flat=True).get(pk=order_id)
    charge_id = charge_card(order_id, amount, everystep_id="charge")
    mark_paid(order_id, charge_id)
    return {"sku": sku, "charge": charge_id}
