"""A careless release of ``patch_v1``: the tax step added without a patch,
so the step ids after it shift under runs already recorded."""

from __future__ import annotations

from typing import Any

from everystep import workflow
from tests.apps.patch_v1 import charge, notify, reserve, ship, tax


@workflow(name="patch.order")
def order(o: dict[str, Any]) -> str:
    reserve(o)
    tax(o)
    charge(o)
    shipped = ship(o["sku"])
    return notify(shipped)
