"""Workflows that continue as new (tests/test_continue_as_new.py, the chaos
suite's looping run)."""

from __future__ import annotations

from typing import Any

import everystep
from everystep import step, workflow


@step
def tally(total: int, payload: Any) -> int:
    return total + int(payload)


@workflow
def subscription(total: int, every: int, until: int) -> Any:
    """Adds up the messages it receives, continuing as new after ``every``
    of them, and returns the total once a message says ``until`` is
    reached (a negative payload)."""
    everystep.set_event("total", total)
    for _ in range(every):
        payload = everystep.recv("add")
        if payload < 0:
            return total
        total = tally(total, payload)
    everystep.continue_as_new(total, every, until)


@workflow
def continues_once(n: int) -> Any:
    if n == 0:
        everystep.continue_as_new(1)
    return f"continued with {n}"


@workflow
def parent_of_a_continuing_child() -> Any:
    return everystep.start(continues_once, 0).result()


@workflow
def continues_in_a_branch() -> Any:
    return everystep.parallel(lambda: everystep.continue_as_new(1), lambda: 2)


@step
def continues_in_a_step() -> Any:
    everystep.continue_as_new(1)


@workflow
def calls_a_continuing_step() -> Any:
    return continues_in_a_step()


@workflow
def continues_by_keyword(n: int, label: str = "plain", step: int = 1) -> Any:
    """Continues once, naming its arguments (``label`` left to its default)."""
    if n == 0:
        everystep.continue_as_new(step=5, n=n + 1)
    return [n, label, step]


@workflow
def continues_with_a_keyword_only(n: int, *, mode: str = "a") -> Any:
    everystep.continue_as_new(n, mode="b")


@workflow
def continues_with_an_unknown_keyword(n: int) -> Any:
    everystep.continue_as_new(n=1, colour="red")


@workflow
def continues_with_too_many(n: int) -> Any:
    everystep.continue_as_new(n, "extra")


@workflow
def continues_with_an_unstorable(n: int) -> Any:
    everystep.continue_as_new(object())
