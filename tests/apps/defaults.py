"""Workflows that declare every default a new run takes from its workflow
(a queue, a priority, a timeout), for tests/test_new_runs.py: each way of
starting a run must apply them alike."""

from __future__ import annotations

from typing import Any

import everystep
from everystep import step, workflow

QUEUE = "defaults-q"
PRIORITY = 7
TIMEOUT = 300


@step
def answer(value: Any) -> Any:
    return value


@workflow(name="defaults.timed", queue=QUEUE, priority=PRIORITY, timeout=TIMEOUT)
def timed(value: Any) -> Any:
    return answer(value)


@workflow(name="defaults.ticking", cron="0 0 * * *", queue=QUEUE, priority=PRIORITY, timeout=TIMEOUT)
def ticking(tick: Any) -> Any:
    return answer(str(tick))


@workflow(name="defaults.parent")
def parent(release: str | None) -> Any:
    """Starts ``timed`` twice: once with the defaults (its own version: this
    run's), once under ``release``."""
    first = everystep.start(timed, 1)
    second = everystep.start(timed, 2, app_version=release)
    return answer([first.result(), second.result()])
