"""A workflow with several short steps, so runs are mid-flight when the
database goes away."""

from __future__ import annotations

import time

from everystep import step, workflow


@step
def slow_add(x: int, delay: float) -> int:
    time.sleep(delay)
    return x + 1


@workflow
def outage_flow(x: int) -> int:
    for _ in range(4):
        x = slow_add(x, 0.1)
    return x
