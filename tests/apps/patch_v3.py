"""The release after ``patch_v2``: the old branch of patch "tax" is gone."""

from __future__ import annotations

from typing import Any

from everystep import deprecate_patch, workflow
from tests.apps.patch_v1 import charge, notify, reserve, ship, tax


@workflow(name="patch.order")
def order(o: dict[str, Any]) -> str:
    reserve(o)
    deprecate_patch("tax")
    tax(o)
    charge(o)
    shipped = ship(o["sku"])
    return notify(shipped)
