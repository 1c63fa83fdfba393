"""Workflows for the queue tests, importable by real supervisors and
workers (``--app tests.apps.queued``).

``timed`` runs one step that sleeps and returns its own start and end
(``time.time()`` inside the step), so a test computes how many runs were
executing at once from what the steps saw, not from the database's
bookkeeping.
"""

from __future__ import annotations

import os
import time
from typing import Any

from everystep import step, workflow


@step
def nap(seconds: float) -> dict[str, Any]:
    start = time.time()
    time.sleep(seconds)
    return {"start": start, "end": time.time(), "pid": os.getpid()}


@workflow(queue="reports")
def timed(seconds: float) -> dict[str, Any]:
    return nap(seconds)  # type: ignore[no-any-return]


@workflow(queue="urgent", priority=5)
def urgent() -> str:
    return "ok"
