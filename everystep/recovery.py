"""Giving runs back to the queue when the database is having trouble.

A run must never stay claimed forever: when its execution was cut short by a
database outage, the runner keeps trying to requeue it for a bounded time.
If that still fails, the run stays ``running`` under the runner's name,
where a restart under the same name (catchup) picks it up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from .errors import StoreUnavailable
from . import outcomes
from .models import Claim
from .store import Store

logger = logging.getLogger("everystep")

BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0, 5.0)


def requeue_patiently(store: Store, claim: Claim, backoff: Sequence[float] = BACKOFF) -> bool:
    """Requeue the run if ``claim`` is still its current one, riding out an outage.

    Returns True when requeued, False when the claim was gone (someone else
    owns the run) or the database stayed unreachable. The interruption was
    logged by the caller; this says once how it ended.
    """
    outage_started: float | None = None
    for delay in (*backoff, None):
        try:
            requeued = outcomes.requeue(store, claim)
        except StoreUnavailable:
            if delay is None:
                break
            outage_started = outage_started or time.monotonic()
            time.sleep(delay)
            continue
        if outage_started is not None:
            logger.warning("everystep: database reachable again after %.1fs; run %s %s", time.monotonic() - outage_started,
                           claim.run_id, "requeued" if requeued else "was taken by another runner meanwhile")
        return requeued
    logger.error(
        "everystep: run %s left running under %r: the database stayed unreachable; "
        "a restart under the same name resumes it, or another runner once the lease expires",
        claim.run_id, claim.claimer,
    )
    return False
