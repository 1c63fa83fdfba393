"""Polling with generous deadlines: tests synchronise on conditions, never
on fixed sleeps, and stay green on slow, noisy machines."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    what: str,
    timeout: float = 60.0,
    interval: float = 0.05,
    detail: Callable[[], str] = lambda: "",
) -> T:
    """Poll ``predicate`` until it returns something truthy and return it;
    fail after ``timeout`` seconds, adding ``detail()`` (a log, say)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail()}")
        time.sleep(interval)


def wait_for_file(path: Path, timeout: float, interval: float = 0.02) -> None:
    """Block (inside a step) until ``path`` exists: a gate the test opens."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} never opened")
        time.sleep(interval)
