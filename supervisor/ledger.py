"""The runs a supervisor holds between its children, and the account of
those that ended.

Apart from the arbiter because none of it is about processes: claimed runs
wait here (``ready``) for an available child; a run whose child died comes
back here by what ``fate.decide`` said (``apply`` records the steps cut
off, then redispatches, requeues or fails the run); every ended run is
counted (``counts``, by outcome) for the status reply and the progress
lines; ``crashes`` counts, per run, the children that died executing it,
for ``fate.decide``'s crash limit. A run is redispatched to another child
while the supervisor runs, requeued once it is stopping; at exit, whatever
is still claimed under the supervisor's name is requeued.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Iterable

from everystep import outcomes
from everystep.claimloop import ClaimLoop
from everystep.errors import EverystepError, StoreUnavailable
from everystep.models import Outcome, Run
from everystep.store import Store

from .children import Child
from .fate import Action, ChildEnd, Decision

logger = logging.getLogger("everystep.supervisor")


class Ledger:
    def __init__(self, store: Store, name: str, who: str, loop: ClaimLoop, stopping: Callable[[], bool]) -> None:
        self.store = store
        self.name = name
        self.who = who
        self.loop = loop
        self.stopping = stopping
        self.ready: collections.deque[Run] = collections.deque()  # claimed, waiting for a child
        self.crashes: collections.Counter[str] = collections.Counter()
        self.counts: collections.Counter[str] = collections.Counter()

    def held(self, children: Iterable[Child]) -> list[str]:
        """Every run id held here: waiting, executing or settling."""
        held = [run.id for run in self.ready]
        for kid in children:
            held += [run.id for run in (kid.run, kid.finishing_run) if run is not None]
        return held

    def ended(self, kid: Child, run: Run, outcome: Outcome) -> None:
        """``kid`` said (``Done``) how its execution of ``run`` ended."""
        self.counts[outcome] += 1
        if outcome.settled:
            self.crashes.pop(run.id, None)
        if outcome == Outcome.UNFINISHED:
            self.redispatch(run)  # still ours: the database blinked, replay recovers
        elif outcome == Outcome.DEFERRED:
            self.loop.engine.failed(f"run {run.id} ({run.name}) given back")
        outcomes.log_outcome(logger, self.who, run, outcome, f" in child {kid.slot} (pid {kid.pid})",
                             child_pid=kid.pid)
        self.loop.wake()

    def apply(self, end: ChildEnd, decision: Decision) -> None:
        """Carry out what ``fate.decide`` said about a dead child's run."""
        run = end.run
        claim = run.claim_as(self.name)
        if decision.crashed:
            self.crashes[run.id] += 1
        try:
            record = outcomes.fail_cancelled_step if decision.action == Action.CANCELLED else outcomes.fail_step
            # Each record carries the step's real start, not the kill's time.
            for step, error in decision.fail_steps:
                record(self.store, claim, run.name, step.step, step.name, error, step.attempt, step.started_at())
            for step, error in decision.retry_steps:
                assert step.retry_in is not None
                outcomes.retry_step(self.store, claim, run.name, step.step, step.name, step.attempt, error,
                                    step.retry_in, step.started_at())
            if decision.action == Action.CANCELLED:
                self.crashes.pop(run.id, None)
                self.counts[Outcome.CANCELLED] += 1
                logger.info("%s: run %s (%s) cancelled; its child (pid %d) was killed", self.who, run.id,
                            run.name, end.pid, extra={"run_id": run.id, "workflow": run.name, "event": "run_cancelled"})
            elif decision.action == Action.REDISPATCH:
                self.redispatch(run)
            elif decision.action == Action.REQUEUE:
                self.counts[Outcome.REQUEUED] += self.loop.requeue(run)
            elif decision.action == Action.FAIL_RUN:
                self.crashes.pop(run.id, None)
                assert decision.run_error is not None
                if outcomes.fail_run(self.store, claim, run, decision.run_error):
                    self.counts[Outcome.FAILED] += 1
            else:
                logger.info("%s: run %s was taken from the child (pid %d) that executed it; its current "
                            "holder carries on", self.who, run.id, end.pid)
        except StoreUnavailable as exc:
            logger.warning("%s: cannot record what happened to run %s (%s); retrying it", self.who, run.id, exc)
            self.redispatch(run)

    def redispatch(self, run: Run) -> None:
        if self.stopping():
            self.counts[Outcome.REQUEUED] += self.loop.requeue(run)
        else:
            # It may have recorded steps since it was claimed: the next child
            # must read them rather than trust the claim-time answer.
            self.ready.appendleft(dataclasses.replace(run, has_steps=None))

    def requeue_ready(self) -> None:
        """Stopping: give back every run no child has started."""
        while self.ready:
            run = self.ready.popleft()
            self.counts[Outcome.REQUEUED] += self.loop.requeue(run)

    def requeue_leftovers(self) -> None:
        """At exit, once stopped: requeue whatever is still claimed under
        this name. Only while the name is still ours: after a takeover, what
        is claimed under it belongs to the new holder."""
        if not self.loop.lease.still_ours():
            return
        try:
            leftover = self.store.requeue_all(self.name)
        except EverystepError as exc:
            leftover = []
            logger.error("%s: final requeue failed: %s", self.who, exc)
        if leftover:
            logger.warning("%s: requeued %d run(s) still claimed at exit", self.who, len(leftover))

    def drop(self, runs: list[Run]) -> None:
        """Forget claimed runs that moved on before any child started them."""
        if runs:
            self.ready = collections.deque(run for run in self.ready if run not in runs)
