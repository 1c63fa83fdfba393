"""What the parent enforces on its children whatever they are doing.

A step's timeout, a channel the child stopped reading, the drain deadline
and a bounded step's resource budget (the backstop of ``budgets.py``): each
is enforced by killing the child's process group, since a child may be
stuck in C code that no alarm of its own would interrupt (RQ's lesson).
Apart from the arbiter so that every deadline is in one place: the arbiter
asks ``next_at`` how long its ``select`` may wait and calls ``enforce``
every tick; what becomes of a killed child's run is for ``fate.decide`` to
say once the child is reaped. One clock: ``time.monotonic()``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from everystep import metrics
from everystep.resources import describe

from .budgets import Budgets
from .children import Child
from .reporting import plural
from .states import ChildState, KillReason

logger = logging.getLogger("everystep.supervisor")


class Deadlines:
    def __init__(self, who: str, name: str, stall_timeout: float, budgets: Budgets) -> None:
        self.who = who
        self.name = name
        self.stall_timeout = stall_timeout
        self.budgets = budgets
        #: When a drain gives up waiting and kills the children left (None: never).
        self.drain_by: float | None = None

    def next_at(self, children: Iterable[Child], now: float) -> float | None:
        """The earliest moment something may be due (None: nothing is timed)."""
        kids = list(children)
        candidates = []
        for kid in kids:
            for step in kid.timed_steps.values():
                if step.timeout is not None:
                    candidates.append(step.started + step.timeout)
            if kid.channel.stalled_since is not None:
                candidates.append(kid.channel.stalled_since + self.stall_timeout)
        budget_check = self.budgets.next_due(kids, now)
        if budget_check is not None:
            candidates.append(budget_check)
        if self.drain_by is not None:
            candidates.append(self.drain_by)
        return min(candidates, default=None)

    def enforce(self, children: Iterable[Child], now: float) -> None:
        kids = list(children)
        self._steps_and_channels(kids, now)
        self._drain(kids, now)
        self._budgets(kids, now)

    def _steps_and_channels(self, kids: list[Child], now: float) -> None:
        for kid in kids:
            if kid.state == ChildState.KILLED:
                continue
            overdue = [step for step in kid.timed_steps.values() if step.overdue(now)]
            if overdue:
                kid.overdue_steps = overdue
                logger.warning("%s: step %s of run %s exceeded its timeout; killing child %d (pid %d)",
                               self.who, overdue[0].step, overdue[0].run, kid.slot, kid.pid)
                kid.kill(KillReason.TIMEOUT)
                metrics.record(lambda m: m.step_timeouts.labels(self.name).inc(len(overdue)))
            elif kid.channel.stalled_since is not None and now - kid.channel.stalled_since >= self.stall_timeout:
                logger.warning("%s: child %d (pid %d) has not read its channel for %.0fs; killing it",
                               self.who, kid.slot, kid.pid, now - kid.channel.stalled_since)
                kid.kill(KillReason.UNRESPONSIVE)

    def _drain(self, kids: list[Child], now: float) -> None:
        if self.drain_by is None or now < self.drain_by:
            return
        self.drain_by = None
        left = [kid for kid in kids if kid.state != ChildState.KILLED]
        if left:
            logger.warning("%s: drain deadline passed; killing %s and requeueing their runs",
                           self.who, plural(len(left), "child", "children"))
        for kid in left:
            kid.kill(KillReason.DRAIN_DEADLINE)

    def _budgets(self, kids: list[Child], now: float) -> None:
        """The backstop: kill a child whose bounded step went over its budget
        without the child stopping it (``budgets.py``)."""
        live = [kid for kid in kids if kid.state != ChildState.KILLED]
        for kid, overrun in self.budgets.check(live, now):
            kid.overrun = overrun
            logger.warning("%s: a step of run %s went over its %s budget (%s); killing child %d (pid %d)",
                           self.who, kid.run.id if kid.run else "-", overrun.resource,
                           describe(overrun.resource, overrun.peak or 0.0), kid.slot, kid.pid)
            kid.kill(KillReason.RESOURCE)
