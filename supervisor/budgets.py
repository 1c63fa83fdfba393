"""The parent's side of step budgets: cgroups, the backstop, and blame.

A child bounds its own steps (``meter.py``); the parent makes sure it
happens and says what happened:

- **cgroups**: at start it makes a cgroup tree where the host allows
  (``cgroups.py``, ``--cgroups auto``), a cgroup per child before forking
  it, and removes each one after reaping its child. It logs once how step
  budgets are enforced here.
- **the backstop**: every ``CHECK_EVERY`` seconds while a bounded step is
  in flight, it reads the child's CPU (its cgroup's where that counts it,
  else the process's) and, without a cgroup, its RSS; a step past its CPU
  budget by ``CPU_GRACE`` (the child's own ``SIGXCPU`` comes first), or past
  its memory budget at all (``RLIMIT_DATA`` should have refused it), gets
  its child killed (``KillReason.RESOURCE``), which ``fate.decide`` turns
  into ``StepResourceExceeded`` for the step.
- **blame**: a child that died of a SIGKILL nobody here sent is checked for
  an out-of-memory kill: its cgroup's ``oom_kill`` count, or, without one,
  the host's (``/proc/vmstat``) having moved since it was handed its run.
  Such a child's steps in flight fail with ``StepResourceExceeded`` rather
  than the run counting a crash.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterable

import psutil

from everystep.resources import Resource, describe

from .cgroups import CgroupError, CgroupTree, ChildGroup
from .children import Child
from .fate import Overrun
from .states import StepInFlight

logger = logging.getLogger("everystep.supervisor")

CHECK_EVERY = 0.25
#: CPU seconds past a budget before the parent kills: the child's own
#: SIGXCPU (at the budget, rounded up to the second) acts first.
CPU_GRACE = 1.0
VMSTAT = "/proc/vmstat"


class Budgets:
    def __init__(self, who: str, cgroups: bool = True, memory_default: int | None = None,
                 cpu_default: float | None = None) -> None:
        self.who = who
        self.use_cgroups = cgroups
        self.memory_default = memory_default
        self.cpu_default = cpu_default
        self.tree: CgroupTree | None = None
        self.why_not = "--cgroups off"
        self._next_check = 0.0
        self._oom_kills = host_oom_kills()

    # -- lifecycle --------------------------------------------------------------------

    def open(self) -> None:
        if self.use_cgroups:
            self.tree, self.why_not = CgroupTree.open()
        defaults = [f"memory {describe(Resource.MEMORY, self.memory_default)}" if self.memory_default else "",
                    f"CPU {describe(Resource.CPU, self.cpu_default)}" if self.cpu_default else ""]
        named = ", ".join(part for part in defaults if part) or "none"
        if self.tree is not None:
            how = f"memory by a cgroup per child ({self.tree.describe()})"
        else:
            how = f"memory by RLIMIT_DATA (no cgroup: {self.why_not})"
        logger.info("%s: step budgets: %s, CPU by RLIMIT_CPU and SIGXCPU, the parent as backstop; defaults: %s",
                    self.who, how, named)

    def close(self) -> None:
        if self.tree is not None:
            self.tree.close()

    def group_for(self, slot: int) -> ChildGroup | None:
        """A cgroup for the child about to be forked (None: rlimits only)."""
        if self.tree is None:
            return None
        try:
            return self.tree.create(slot)
        except CgroupError as exc:
            logger.warning("%s: %s; child %d bounds memory with RLIMIT_DATA", self.who, exc, slot)
            return None

    def joined(self, kid: Child, joined: bool) -> None:
        """The child said (``Ready``) whether it joined its cgroup."""
        if not joined and kid.group is not None:
            self._remove(kid.group)
            kid.group = None

    def handed_run(self, kid: Child) -> None:
        kid.oom_baseline = self._oom_kills

    def sweep(self) -> None:
        """Keep the host's OOM-kill count current (needed without cgroups)."""
        if self.tree is None:
            self._oom_kills = host_oom_kills()

    # -- the backstop ---------------------------------------------------------------------

    def next_due(self, kids: Iterable[Child], now: float) -> float | None:
        if any(step.bounded for kid in kids for step in kid.timed_steps.values()):
            return max(self._next_check, now)
        return None

    def check(self, kids: Iterable[Child], now: float) -> list[tuple[Child, Overrun]]:
        """Children whose bounded step went over its budget."""
        if now < self._next_check:
            return []
        self._next_check = now + CHECK_EVERY
        over = []
        for kid in kids:
            bounded = [step for step in kid.timed_steps.values() if step.bounded]
            if bounded:
                overrun = self._overrun(kid, bounded)
                if overrun is not None:
                    over.append((kid, overrun))
        return over

    def _overrun(self, kid: Child, steps: list[StepInFlight]) -> Overrun | None:
        cpu, rss = self._usage(kid)
        how = f"its process (pid {kid.pid}) was killed by the supervisor"
        for step in steps:
            if cpu is not None and step.cpu_limit is not None and step.cpu_start is not None:
                used = cpu - step.cpu_start
                if used > step.cpu_limit + CPU_GRACE:
                    return Overrun(Resource.CPU, how, used)
            if rss is not None and step.memory_limit is not None and step.memory_start is not None:
                grown = rss - step.memory_start
                if grown > step.memory_limit:
                    return Overrun(Resource.MEMORY, how, grown)
        return None

    def _usage(self, kid: Child) -> tuple[float | None, int | None]:
        """(CPU seconds, RSS bytes) of the child, as its meter counts them;
        RSS only without a cgroup (with one, the kernel bounds memory)."""
        cpu = kid.group.cpu_seconds() if kid.group is not None else None
        try:
            process = kid.process()
            with process.oneshot():
                if cpu is None:
                    times = process.cpu_times()
                    cpu = times.user + times.system
                rss = process.memory_info().rss if kid.group is None else None
        except (psutil.Error, OSError):
            return cpu, None
        return cpu, rss

    # -- blame ----------------------------------------------------------------------------

    def ended(self, kid: Child, status: int, steps: list[StepInFlight]) -> Overrun | None:
        """Why a dead child's steps failed, if for a resource: the backstop
        killed it, or the kernel's out-of-memory killer did. Removes its cgroup."""
        try:
            if kid.overrun is not None:
                return kid.overrun
            if kid.kill_reason is not None or not (os.WIFSIGNALED(status)
                                                   and os.WTERMSIG(status) == signal.SIGKILL):
                return None
            return self._oom_killed(kid, steps)
        finally:
            if kid.group is not None:
                self._remove(kid.group)
                kid.group = None

    def _oom_killed(self, kid: Child, steps: list[StepInFlight]) -> Overrun | None:
        if kid.group is not None:
            if kid.group.oom_kills() == 0:
                return None
            how = f"its process (pid {kid.pid}) was killed by the kernel's out-of-memory killer"
            peak = kid.group.peak()
            starts = [step.memory_start for step in steps if step.memory_limit is not None
                      and step.memory_start is not None]
            grown = peak - min(starts) if peak is not None and starts else None
            return Overrun(Resource.MEMORY, how, grown)
        now = host_oom_kills()
        self._oom_kills = now
        if now is None or kid.oom_baseline is None or now <= kid.oom_baseline:
            return None
        how = (f"its process (pid {kid.pid}) was killed by SIGKILL while the kernel's out-of-memory killer "
               "was at work (/proc/vmstat)")
        return Overrun(Resource.MEMORY, how)

    def _remove(self, group: ChildGroup) -> None:
        if self.tree is not None:
            self.tree.remove(group)


def host_oom_kills() -> int | None:
    """The host's count of out-of-memory kills (Linux 4.13+), or None."""
    try:
        with open(VMSTAT, "rb") as handle:
            for line in handle:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


__all__ = ["Budgets", "CHECK_EVERY", "CPU_GRACE", "host_oom_kills"]
