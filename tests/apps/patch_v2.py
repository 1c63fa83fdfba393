"""The next release of ``patch_v1``: a tax step, under a patch."""

from __future__ import annotations

from typing import Any

from everystep import parallel, patched, recv, workflow
from tests.apps.patch_v1 import charge, notify, reserve, ship, tax


@workflow(name="patch.order")
def order(o: dict[str, Any]) -> str:
    reserve(o)
    if patched("tax"):
        tax(o)
    charge(o)
    shipped = ship(o["sku"])
    return notify(shipped)


@workflow(name="patch.approved")
def approved(o: dict[str, Any]) -> str:
    """A tax step before the approval: runs already waiting for it are past
    the patch point."""
    reserve(o)
    if patched("approval-tax"):
        tax(o)
    recv("approval")
    return ship(str(charge(o)))


@workflow(name="patch.tail")
def tail(o: dict[str, Any]) -> bool:
    reserve(o)
    return patched("tail")


@workflow(name="patch.fan")
def fan(o: dict[str, Any]) -> list[Any]:
    """Two branches ask about one patch: the run has one answer."""
    first, second = parallel(lambda: [patched("fan"), reserve(o)], lambda: [patched("fan"), charge(o)])
    return [first, second]
