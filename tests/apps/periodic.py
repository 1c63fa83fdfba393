"""A periodic workflow for the cron tests, loaded only by the supervisors of
those tests (``--app tests.apps.periodic``): every runner with it loaded
enqueues its ticks, every two seconds."""

from __future__ import annotations

import datetime as dt
from typing import Any

from everystep import step, workflow


@step
def stamp(tick: dt.datetime) -> str:
    return tick.isoformat()


@workflow(cron="*/2 * * * * *", timezone="Europe/Paris")
def every_two_seconds(tick: dt.datetime) -> Any:
    return stamp(tick)
