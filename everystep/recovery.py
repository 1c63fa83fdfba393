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
    owns the run) or the database stayed unreachable.
    """
    for attempt, delay in enumerate((*backoff, None)):
        try:
            return outcomes.requeue(store, claim)
        except StoreUnavailable as exc:
            if delay is None:
                break
            if attempt == 0:
                logger.warning("everystep: requeue of run %s failed (%s); retrying", claim.run_id, exc)
            time.sleep(delay)
    logger.error(
        "everystep: run %s left running under %r: the database stayed unreachable; "
        "a restart under the same name resumes it",
        claim.run_id, claim.claimer,
    )
    return False
