"""The child's step meter: measure every step, bound those with a budget.

Every step a supervisor child runs is measured from the child's own
accounting, around the step's function:

- **CPU seconds**: user + system time of the child (``getrusage``
  ``RUSAGE_SELF``, every thread) and of the subprocesses it waited for
  (``RUSAGE_CHILDREN``), after minus before. Steps running at the same
  time in parallel branches share one process: each is charged the
  process's CPU while it ran.
- **Peak RSS growth**: the process's resident-memory high-water mark is
  reset to its current RSS as the step starts (``/proc/self/clear_refs``),
  so ``ru_maxrss`` afterwards is the step's own peak; growth is that peak
  minus the RSS at the start. (Some kernels fold an exiting thread's peak
  into ``ru_maxrss`` for good, where no reset reaches it; when it hides the
  reset mark, the meter reads ``VmHWM`` from ``/proc/self/status`` instead.)

That costs a handful of system calls on descriptors opened once (bench case
6 measures it). A step with a budget, its own or the supervisor's default,
is bounded as well:

- **memory**: in the child's own cgroup where the supervisor made one
  (``supervisor/cgroups.py``), the group's limit is set to its usage plus
  the step's limit, and the kernel kills the child if the step goes over
  (the parent attributes the kill); otherwise ``RLIMIT_DATA`` is set to the
  process's data size plus the limit, so an allocation past it fails, and
  the ``MemoryError`` becomes ``StepResourceExceeded`` here.
- **CPU**: the soft ``RLIMIT_CPU`` is set to the CPU already used plus the
  limit (rounded up to the second: the kernel counts whole seconds). At it
  the kernel sends ``SIGXCPU``, and the handler raises
  ``StepResourceExceeded`` in the step if the step runs on the main thread
  (between bytecodes; never in the runner's own code). A step in a branch
  thread, or stuck in C code, or one that swallows the exception is killed
  by the parent, which polls the child's CPU (``budgets.py``). The hard
  limit is never lowered, so an unprivileged child can lift the soft one
  when the step ends.

Several bounded steps in flight at once (parallel branches) share the
process's bounds: the tightest applies until it ends.

The parent learns each bounded step's budget and where the process stood
when it started through the step board and a ``StepStarted`` message
(``budget`` is read by the child's ``Reporter``), so it can enforce it if
the child does not, and blame the right steps when the kernel kills the
child.
"""

from __future__ import annotations

import logging
import math
import os
import resource
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from everystep import metrics
from everystep.errors import StepResourceExceeded
from everystep.context import StepGauge, StepMeter
from everystep.resources import Resource, StepCost, exceeded_message

from .cgroups import OpenGroup

if TYPE_CHECKING:
    from everystep.registry import DeclaredStep
    from everystep.context import Context

logger = logging.getLogger("everystep.supervisor")

PAGE = os.sysconf("SC_PAGE_SIZE")
#: ``ru_maxrss`` above the RSS at the start by more than this means the
#: reset high-water mark is hidden behind an exited thread's (see above).
MASK_SLACK = 1 << 20


@dataclass(frozen=True)
class Budget:
    """A bounded step as the parent needs to know it: its limits, and where
    the process stood as it started (CPU seconds and memory bytes, read the
    way the parent reads them: from the child's cgroup where it has one that
    counts them, else from the process)."""

    memory_limit: int | None
    cpu_limit: float | None
    cpu_start: float
    memory_start: int
    #: The absolute bounds this step sets (in the child's own units).
    memory_cap: int | None
    cpu_cap: float | None
    data_cap: int | None


class ChildMeter(StepMeter):
    """The ``StepMeter`` of a supervisor child (one per process, made after
    the fork). ``install`` takes over ``SIGXCPU``."""

    def __init__(self, memory_default: int | None = None, cpu_default: float | None = None,
                 group: OpenGroup | None = None) -> None:
        self.memory_default = memory_default
        self.cpu_default = cpu_default
        self.group = group
        self._lock = threading.Lock()
        self._active: dict[tuple[str, str], Budget] = {}
        self._main = threading.main_thread().ident
        #: The gauge whose step runs on the main thread now (SIGXCPU raises there).
        self._armed: _Gauge | None = None
        self._data_rlimit = resource.getrlimit(resource.RLIMIT_DATA)
        self._cpu_rlimit = resource.getrlimit(resource.RLIMIT_CPU)
        self._statm = _open("/proc/self/statm", os.O_RDONLY)
        self._status = _open("/proc/self/status", os.O_RDONLY)
        self._clear_refs = _open("/proc/self/clear_refs", os.O_WRONLY)
        self._histograms: dict[tuple[str, str], tuple[Any, Any]] = {}

    def install(self) -> None:
        signal.signal(signal.SIGXCPU, self._on_sigxcpu)

    def close(self) -> None:
        """Close the descriptors it reads (a child leaves with them open)."""
        for fd in (self._statm, self._status, self._clear_refs):
            if fd is not None:
                os.close(fd)
        self._statm = self._status = self._clear_refs = None

    # -- the runner's side ----------------------------------------------------------

    def begin(self, ctx: Context, step_id: str, step: DeclaredStep) -> StepGauge:
        memory = step.memory_limit if step.memory_limit is not None else self.memory_default
        cpu = step.cpu_limit if step.cpu_limit is not None else self.cpu_default
        key = (ctx.workflow_id, step_id)
        budget = None
        if memory is not None or cpu is not None:
            try:
                budget = self._bound(key, memory, cpu)
            except (OSError, ValueError) as exc:
                # Never fail a step for this; it runs unbounded, and says so.
                logger.warning("everystep-supervisor child %d: cannot bound step %s of run %s: %s",
                               os.getpid(), step_id, ctx.workflow_id, exc)
        return _Gauge(self, ctx.workflow_name, step.name, step_id, key, budget)

    def budget(self, run_id: str, step_id: str) -> Budget | None:
        """The budget of a step in flight (for the reporter), if it has one."""
        return self._active.get((run_id, step_id))

    # -- reading the process ----------------------------------------------------------

    def rss(self) -> int:
        if self._statm is None:
            return 0
        try:
            return int(os.pread(self._statm, 128, 0).split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            return 0

    def _status_field(self, name: bytes) -> int | None:
        if self._status is None:
            return None
        try:
            data = os.pread(self._status, 8192, 0)
            start = data.find(name)
            if start < 0:
                return None
            return int(data[start + len(name):data.index(b"\n", start)].split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            return None

    def hwm(self) -> int | None:
        return self._status_field(b"VmHWM:")

    def reset_hwm(self) -> bool:
        if self._clear_refs is None:
            return False
        try:
            os.write(self._clear_refs, b"5")
        except OSError:
            self._clear_refs = None
            return False
        return True

    def cpu_now(self) -> float:
        """CPU seconds, counted as the parent counts them for this child."""
        if self.group is not None:
            seconds = self.group.cpu_seconds()
            if seconds is not None:
                return seconds
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    # -- bounds -----------------------------------------------------------------------

    def _bound(self, key: tuple[str, str], memory: int | None, cpu: float | None) -> Budget:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        process_cpu = usage.ru_utime + usage.ru_stime
        with self._lock:
            cpu_start = self.cpu_now()
            memory_cap = data_cap = None
            if self.group is not None:
                memory_start = self.group.usage()
                if memory is not None:
                    memory_cap = memory_start + memory
            else:
                memory_start = self.rss()
                if memory is not None:
                    data = self._status_field(b"VmData:")
                    data_cap = (data if data is not None else memory_start) + memory
            budget = Budget(memory_limit=memory, cpu_limit=cpu, cpu_start=cpu_start, memory_start=memory_start,
                            memory_cap=memory_cap, cpu_cap=process_cpu + cpu if cpu is not None else None,
                            data_cap=data_cap)
            first_memory_bound = memory is not None and not any(
                other.memory_limit is not None for other in self._active.values())
            self._active[key] = budget
            self._apply()
            if first_memory_bound and self.group is not None:
                self.group.reset_peak()
        return budget

    def _unbound(self, key: tuple[str, str]) -> None:
        with self._lock:
            if self._active.pop(key, None) is not None:
                self._apply()

    def _apply(self) -> None:
        """Set the process's bounds to the tightest of the steps in flight
        (or lift them). Called with the lock held."""
        budgets = self._active.values()
        memory_caps = [budget.memory_cap for budget in budgets if budget.memory_cap is not None]
        data_caps = [budget.data_cap for budget in budgets if budget.data_cap is not None]
        cpu_caps = [budget.cpu_cap for budget in budgets if budget.cpu_cap is not None]
        try:
            if self.group is not None:
                self.group.set_limit(min(memory_caps) if memory_caps else None)
            _set_soft(resource.RLIMIT_DATA, self._data_rlimit, min(data_caps) if data_caps else None)
            _set_soft(resource.RLIMIT_CPU, self._cpu_rlimit,
                      math.ceil(min(cpu_caps)) if cpu_caps else None)
        except (OSError, ValueError) as exc:
            # Never fail a step for this: the parent still enforces budgets.
            logger.warning("everystep-supervisor child %d: cannot set step limits: %s", os.getpid(), exc)

    def _on_sigxcpu(self, signum: int, frame: FrameType | None) -> None:
        gauge = self._armed
        if gauge is not None and gauge.budget is not None and gauge.budget.cpu_limit is not None:
            raise gauge.exceeded(Resource.CPU, "stopped at its limit (SIGXCPU)")
        # Not a step we can interrupt here: the parent kills the child if
        # the step keeps going past its budget.

    # -- metrics ------------------------------------------------------------------------

    def observe(self, workflow: str, step: str, cost: StepCost) -> None:
        children = self._histograms.get((workflow, step))
        if children is None:
            found = metrics.get()
            if found is None:
                return
            children = self._histograms[(workflow, step)] = (
                found.step_cpu.labels(workflow, step), found.step_peak_rss.labels(workflow, step))
        children[0].observe(cost.cpu_seconds)
        children[1].observe(cost.peak_rss_bytes)


class _Gauge(StepGauge):
    """One step's measurement in a child (see the module docstring)."""

    __slots__ = ("meter", "workflow", "name", "step_id", "key", "budget", "cpu0", "rss0", "maxrss0", "reset",
                 "ended")

    def __init__(self, meter: ChildMeter, workflow: str, name: str, step_id: str, key: tuple[str, str],
                 budget: Budget | None) -> None:
        self.meter = meter
        self.workflow = workflow
        self.name = name
        self.step_id = step_id
        self.key = key
        self.budget = budget
        self.ended = False
        self.reset = meter.reset_hwm()
        self.rss0 = meter.rss()
        own = resource.getrusage(resource.RUSAGE_SELF)
        waited = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu0 = own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime
        self.maxrss0 = own.ru_maxrss * 1024

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        main = threading.get_ident() == self.meter._main
        if main:
            self.meter._armed = self
        try:
            return fn(*args, **kwargs)
        except MemoryError as exc:
            failure = self.failed(exc)
            if failure is exc:
                raise
            raise failure from exc
        finally:
            if main:
                self.meter._armed = None

    def failed(self, exc: MemoryError) -> Exception:
        if self.budget is not None and self.budget.memory_limit is not None:
            return self.exceeded(Resource.MEMORY, "an allocation past it was refused (RLIMIT_DATA)")
        return exc

    def _cost(self) -> StepCost:
        own = resource.getrusage(resource.RUSAGE_SELF)
        waited = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime - self.cpu0
        peak = own.ru_maxrss * 1024
        if self.reset:
            if peak <= self.maxrss0 and self.maxrss0 > self.rss0 + MASK_SLACK:
                peak = self.meter.hwm() or peak  # ru_maxrss hides the reset mark
            growth = peak - self.rss0
        else:
            growth = peak - self.maxrss0  # how far the step raised the process's lifetime peak
        return StepCost(cpu_seconds=max(cpu, 0.0), peak_rss_bytes=max(growth, 0))

    def exceeded(self, what: Resource, how: str) -> StepResourceExceeded:
        cost = self._cost()
        if what == Resource.MEMORY:
            limit: float | None = self.budget.memory_limit if self.budget else None
            peak: float = cost.peak_rss_bytes
        else:
            limit = self.budget.cpu_limit if self.budget else None
            peak = cost.cpu_seconds
        message = exceeded_message(self.step_id, self.name, what, limit, peak, how)
        return StepResourceExceeded(message, what.value, limit, peak)

    def end(self) -> StepCost | None:
        if self.ended:
            return None
        self.ended = True
        if self.budget is not None:
            self.meter._unbound(self.key)
        cost = self._cost()
        try:
            self.meter.observe(self.workflow, self.name, cost)
        except Exception:
            logger.exception("everystep-supervisor child %d: step cost not exported", os.getpid())
        return cost


def _set_soft(which: int, original: tuple[int, int], value: int | None) -> None:
    """Set the soft limit to ``value`` (None: back to what the process
    started with); the hard limit stays, so it can always be lifted again."""
    soft, hard = original
    if value is not None:
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
    if resource.getrlimit(which)[0] != soft:
        resource.setrlimit(which, (soft, hard))


def _open(path: str, flags: int) -> int | None:
    try:
        return os.open(path, flags | os.O_CLOEXEC)
    except OSError:
        return None


__all__ = ["Budget", "ChildMeter"]
