"""Workflows whose histories grow long: a loop of steps and a loop that
handles messages for ever (tests/test_long_runs*.py, the console's long
run page). Their long histories are written straight into the tables by
``tests.support.long_runs``, not executed step by step."""

from __future__ import annotations

from typing import Any

import everystep
from everystep import step, workflow


@step
def tick(i: int) -> int:
    return i


@step
def handle(message: Any) -> Any:
    return message


@workflow
def ticker(n: int) -> int:
    """``n`` recorded steps, one per iteration."""
    for i in range(n):
        tick(i)
    return n


@workflow
def subscription(account: str) -> None:
    """A message, then its handling, for ever: two records per message."""
    while True:
        message = everystep.recv("event")
        handle(message)


@workflow
def pages_through(target: str, size: int) -> list[list[str]]:
    """Reads another run's steps a page at a time (each page a recorded
    read), then sleeps: a replay must see the same pages."""
    pages: list[list[str]] = []
    after = None
    while True:
        page = everystep.get_steps(target, after=after, limit=size)
        pages.append([record.step_id for record in page])
        if len(page) < size:
            break
        after = page[-1].step_id
    everystep.sleep(3600)
    return pages


@step
def leg(i: int) -> int:
    return i


@workflow
def mixed(n: int) -> str:
    """Positions, a named step, a fork's branches and a loop: ids whose
    text order, step order and record order all differ."""
    leg(0)
    leg(1, everystep_id="charge")
    everystep.parallel(lambda: [leg(2), leg(3)], lambda: leg(4))
    for i in range(n):
        leg(5 + i)
    return "done"
