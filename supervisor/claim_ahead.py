"""Claiming ahead: a run ready for the next child to free.

With every child busy, a child that frees waits for the parent's next claim:
a round trip and the claim's own work, in case 2 at ``--procs 2`` about
0.4 ms of a 3 ms run, while the parent's loop does nothing else. So while
every child is busy with short runs, the parent claims up to ``limit`` runs
ahead and holds them in the ledger (``Ledger.ready``): the next child to
free starts one at once, and the claim that refills it overlaps that
child's work instead of delaying it.

Only for short runs. A run held ahead waits for a child of this supervisor
while another supervisor may have one idle. Held for about one run's time,
that is nothing next to the pickup of a short run and too long for a long
one (whose pickup the claim's round trip hardly delays anyway), so the
parent claims ahead only while the runs ending here took less than
``SHORT_RUN`` seconds on a moving average, and not before one has ended.

A run held ahead is claimed like any other: it counts against its queue's
limits, a cancel or a lost claim drops it (``FenceWatch`` checks the ready
runs too), a drain requeues it, and if the supervisor dies the lease sweep
requeues it with the runs its children held.
"""

from __future__ import annotations

#: Claim ahead only while the runs ending here take less than this, on average.
SHORT_RUN = 0.25
#: The weight of the newest run in the moving average.
WEIGHT = 0.2


class ClaimAhead:
    """When the parent should claim a run no child asked for yet."""

    def __init__(self, limit: int) -> None:
        #: At most this many runs held ready (0: never claim ahead).
        self.limit = limit
        #: Seconds a run here took, moving average (None: none ended yet).
        self.mean_run_seconds: float | None = None

    def ended(self, seconds: float | None) -> None:
        """A run here ended, ``seconds`` after it was handed to its child
        (None: unknown)."""
        if seconds is None:
            return
        mean = self.mean_run_seconds
        self.mean_run_seconds = seconds if mean is None else mean + WEIGHT * (seconds - mean)

    def wanted(self, ready: int) -> bool:
        """Whether to claim one more run while every child is busy and
        ``ready`` runs are held already."""
        mean = self.mean_run_seconds
        return ready < self.limit and mean is not None and mean < SHORT_RUN
