"""Checking that a new run took the defaults ``tests/apps/defaults.py``
declares (tests/test_new_runs.py, tests/test_django_commands.py)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from everystep import versions
from everystep.store import Store, utcnow
from tests.apps import defaults as apps


def started(action: Callable[[], str]) -> tuple[str, dt.datetime, dt.datetime]:
    """Run ``action`` (it returns a run id) between two readings of the clock."""
    before = utcnow()
    run_id = action()
    return run_id, before, utcnow()


def assert_defaults(store: Store, run_id: str, before: dt.datetime, after: dt.datetime, *,
                    version: str | None = None, queue: str = apps.QUEUE, priority: int = apps.PRIORITY,
                    timeout: float = apps.TIMEOUT) -> None:
    """The run went to the workflow's queue with its priority, recorded
    ``version`` (default: this process's for the workflow) and is due to be
    cancelled ``timeout`` seconds after it was started (between ``before``
    and ``after``)."""
    run = store.get_run(run_id)
    expected = versions.version_for(run.name) if version is None else version
    assert (run.queue, run.priority, run.app_version) == (queue, priority, expected), run
    deadline = store.links(run_id).deadline
    span = dt.timedelta(seconds=timeout)
    assert deadline is not None and before + span <= deadline <= after + span, (before, deadline, after)
