"""Workflows the run-lifecycle tests execute in-process (retries, durable
sleep, delayed starts, cancels), also scheduled by name by the lifecycle's
CLI and console tests (``--app tests.apps.lifecycle_in_process``).

- ``retrying_flow``: ``flaky`` (``retries=2``, no backoff) fails until its
  ``succeed_on``-th attempt; the body catches the final failure;
- ``not_retried_flow``: a step retried only on ``KeyError`` raises
  ``ValueError``;
- ``sleeps`` and ``sleeps_until``: a durable sleep between two steps, and
  one until a time;
- ``swallows_the_sleep``: a body that tries to catch the sleep;
- ``sleepy_branches`` and ``sleep_beside_a_failure``: parallel branches
  that sleep beside steps that complete or fail;
- ``gated_then_last``: a step held until a file exists, then a last one.

``CALLS`` counts the attempts of each key a test passes.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import everystep
from everystep import parallel, step, workflow
from tests.support.waiting import wait_for_file

CALLS: dict[str, int] = {}


def _count(key: str) -> int:
    CALLS[key] = CALLS.get(key, 0) + 1
    return CALLS[key]


@step(retries=2, backoff=0.0, jitter=False)
def flaky(key: str, succeed_on: int) -> int:
    attempt = _count(key)
    if attempt < succeed_on:
        raise ValueError(f"attempt {attempt}")
    return attempt


@step(retries=5, backoff=0.0, retry_on=KeyError)
def only_key_errors(key: str) -> None:
    _count(key)
    raise ValueError("not retried")


@step
def plain(value: Any) -> Any:
    return value


@workflow
def retrying_flow(key: str, succeed_on: int) -> Any:
    try:
        return flaky(key, succeed_on)
    except ValueError as exc:
        return f"gave up: {exc}"


@workflow
def not_retried_flow(key: str) -> str:
    try:
        only_key_errors(key)
    except ValueError:
        return "caught"
    return "no"


@workflow
def sleeps(seconds: float) -> str:
    plain("before")
    everystep.sleep(seconds)
    return plain("after")


@workflow
def sleeps_until(when: dt.datetime) -> str:
    everystep.sleep_until(when)
    return "woke"


@workflow
def swallows_the_sleep() -> str:
    try:
        everystep.sleep(3600)
    except Exception:  # Suspended is not an Exception: this never runs
        return "swallowed"
    return "after"


@workflow
def sleepy_branches(first: float, second: float) -> Any:
    return parallel(lambda: (everystep.sleep(first), plain("a"))[1],
                    [lambda: plain("b1"), lambda: plain("b2")],
                    lambda: (everystep.sleep(second), plain("c"))[1])


@workflow
def sleep_beside_a_failure() -> Any:
    @step
    def boom() -> None:
        raise RuntimeError("boom")

    try:
        return parallel(lambda: everystep.sleep(3600), boom)
    except RuntimeError:
        return "caught"


@step
def gate_step(path: str) -> str:
    wait_for_file(Path(path), 60)
    return "through"


@workflow
def gated_then_last(path: str) -> str:
    gate_step(path)
    return plain("last")
