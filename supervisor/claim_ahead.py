"""Claiming ahead: runs ready for the next children to free.

With every child busy, a child that frees waits for the parent's next claim:
a round trip and the claim's own work, in case 2 at ``--procs 2`` about
0.4 ms of a 3 ms run, while the parent's loop does nothing else. So while
every child is busy with short runs, the parent claims runs ahead and holds
them in the ledger (``Ledger.ready``): the next child to free starts one at
once, and the claim that refills the queue overlaps the children's work
instead of delaying it.

In batches. Once the held runs are all handed out, the parent claims up to
``limit`` at once, ``PER_CHILD`` per child: one claim's round trip and
server work then serve several runs, which on a machine whose cores the
runs keep busy is CPU every run saves (a claim costs the server more than
a step record does). Refilling only an empty queue keeps the batches whole;
refilling one run at a time would make them single claims again. Four per
child, so a held run waits for about four runs of the children before it:
at ``--procs 2`` a batch of 8 took 6 % less CPU per run than one of 4
(docs/explanation/performance.md).

Only for short runs. A run held ahead waits for a child of this supervisor
while another supervisor may have one idle. So the runs held are bounded by
time as well as by number: about ``SHORT_RUN`` seconds of runs at the
moving average of the runs ending here, and none before one has ended or
while that average is ``SHORT_RUN`` or more. Held for that long, a run
loses nothing next to the pickup of a short run, and a long one (whose
pickup the claim's round trip hardly delays) is never held.

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
#: Runs claimed in one batch per child at most.
PER_CHILD = 4


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

    def wanted(self, ready: int, children: int) -> int:
        """How many runs to claim now, while every one of ``children`` is
        busy and ``ready`` runs are held already: none until those are
        handed out, then a batch of at most ``limit``, ``PER_CHILD`` per child and
        about ``SHORT_RUN`` seconds of runs."""
        mean = self.mean_run_seconds
        if ready or self.limit <= 0 or children <= 0 or mean is None or mean >= SHORT_RUN:
            return 0
        return min(self.limit, PER_CHILD * children, int(SHORT_RUN / mean))  # each at least 1 here
