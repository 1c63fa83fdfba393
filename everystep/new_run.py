"""What a new run is written with, decided in one place.

Every way a run comes to be asks ``decide`` for its options:
``schedule()`` and ``schedule_async()``, ``everystep schedule`` (and
``manage.py everystep_schedule``), the console's *Run again*, a cron tick,
``fork``, and ``start()``/``call()`` for a child. So the defaults a
workflow declares and the process's code version are applied alike by all
of them, and a way of starting runs added later cannot forget one:

- name: the workflow's registered name (a name not registered in this
  process is scheduled unchecked, for the runners that have it);
- arguments: checked against the workflow's signature, stored as JSON;
- not before: ``run_at`` (an aware time) or ``delay`` seconds from now;
- placement: ``queue``, ``priority``, ``concurrency_key``, each else the
  workflow's ``@workflow(queue=, priority=)``, else the default queue;
- version: ``app_version``, else for a child its parent's (a child follows
  its parent's release, so the runners serving that release serve its
  children too), else the process's ``--app-version``, else a hash of the
  workflow's code (``everystep.versions``);
- deadline: ``deadline``, else ``timeout`` seconds from now, else the
  workflow's ``@workflow(timeout=)`` from now, else none; a child's is
  bounded by its parent's;
- debounce: ``Debounce(key, period, max_wait)``, checked here (a positive
  period, a ``max_wait`` not below it); refused with an idempotency key
  (the key already makes one run per window) and with ``run_at``/``delay``
  (the window decides the start). The store folds the call into the key's
  waiting run or opens the next window (``store/base/debounce.py``).

A child's parent is read where the child is written, under the parent's
row lock (``Store.start_child``): its version (when ``app_version`` is
None) and the deadline that bounds the child's are taken there.

Everything is checked before anything is written: a bad option raises
``EverystepError`` (``WorkflowArgumentsError`` for arguments the workflow
cannot take) and no run exists.
"""

from __future__ import annotations

import datetime as dt
import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import durations, registry, serde, versions
from .body_rules import BodyRule, declare
from .errors import EverystepError, WorkflowArgumentsError
from .models import Run
from .queues import Placement
from .store import Store, utcnow


#: The longest debounce key (it is part of a primary key on MariaDB).
MAX_DEBOUNCE_KEY = 255


@declare(BodyRule.PLAIN, "A value: the debounce window a schedule() joins; building one reaches nothing.")
@dataclass(frozen=True)
class Debounce:
    """Many schedules, one run after the burst: the first schedule of
    ``key`` (per workflow) creates a run not due until ``period`` seconds
    pass with no further schedule of it; each further one within the window
    replaces the arguments (the last call wins) and pushes the start back,
    never past ``max_wait`` seconds after the first (None: no bound, so a
    steady stream of calls postpones the run for as long as it lasts)."""

    key: str
    period: float | dt.timedelta
    max_wait: float | dt.timedelta | None = None

    def checked(self) -> Debounce:
        """This window with its times in seconds; refused
        (``EverystepError``, one line) unless the key is a non-empty string
        and the period is positive and ``max_wait`` not below it."""
        if not isinstance(self.key, str) or not self.key:
            raise EverystepError(f"debounce key must be a non-empty string, not {self.key!r}")
        if len(self.key) > MAX_DEBOUNCE_KEY:
            raise EverystepError(f"debounce key is longer than {MAX_DEBOUNCE_KEY} characters")
        period = durations.seconds(self.period, "debounce period", positive=True)
        if self.max_wait is None:
            return Debounce(self.key, period, None)
        max_wait = durations.seconds(self.max_wait, "debounce max_wait", positive=True)
        if max_wait < period:
            raise EverystepError(f"debounce max_wait ({max_wait:g} s) must not be shorter than its period "
                                 f"({period:g} s)")
        return Debounce(self.key, period, max_wait)

    def seconds(self) -> tuple[float, float]:
        """Its period and max_wait in seconds (max_wait unbounded: infinity), once ``checked``."""
        period = self.period.total_seconds() if isinstance(self.period, dt.timedelta) else float(self.period)
        if self.max_wait is None:
            return period, math.inf
        bound = self.max_wait.total_seconds() if isinstance(self.max_wait, dt.timedelta) else float(self.max_wait)
        return period, bound


@dataclass(frozen=True)
class NewRun:
    """A new run's options, checked: what its insert writes."""

    name: str
    args_json: str
    idempotency_key: str | None
    not_before: dt.datetime | None
    placement: Placement
    app_version: str | None
    deadline: dt.datetime | None
    #: Checked (``Debounce.checked``); None: an ordinary run.
    debounce: Debounce | None = None


def decide(name: str, args: Sequence[Any], *, idempotency_key: str | None = None,
           run_at: dt.datetime | None = None, delay: float | dt.timedelta | None = None,
           queue: str | None = None, priority: int | None = None, concurrency_key: str | None = None,
           app_version: str | None = None, deadline: dt.datetime | None = None,
           timeout: float | dt.timedelta | None = None, child: bool = False,
           what: str | None = None, debounce: Debounce | None = None) -> NewRun:
    """The options of a new run of workflow ``name`` with positional
    ``args`` (see the module docstring for each default); ``child``: a run
    starts it as its child (``app_version`` None: the parent's); ``what``
    names the arguments in a serialisation error."""
    if not isinstance(name, str) or not name:
        raise EverystepError("workflow name must not be empty")
    check_arguments(name, args)
    args_json = serde.dumps(list(args), what or f"arguments of workflow {name}")
    if idempotency_key is not None and not isinstance(idempotency_key, str):
        raise EverystepError("idempotency_key must be a string")
    if debounce is not None:
        debounce = checked_debounce(debounce, idempotency_key, run_at, delay)
    placement = Placement.of(queue, priority, concurrency_key, defaults=workflow_placement(name))
    if app_version is None and not child:
        app_version = versions.version_for(name)
    return NewRun(name, args_json, idempotency_key, not_before(run_at, delay), placement, app_version,
                  run_deadline(name, deadline, timeout), debounce)


def checked_debounce(debounce: Any, idempotency_key: str | None, run_at: dt.datetime | None,
                     delay: float | dt.timedelta | None) -> Debounce:
    """``debounce`` checked, and refused beside the options it replaces."""
    if not isinstance(debounce, Debounce):
        raise EverystepError(f"debounce must be a Debounce(key, period, max_wait), not {debounce!r}")
    if idempotency_key is not None:
        raise EverystepError("give idempotency_key= or debounce=, not both (a debounce key already makes one run "
                             "per window)")
    if run_at is not None or delay is not None:
        raise EverystepError("give run_at=/delay= or debounce=, not both (the debounce window decides the start)")
    return debounce.checked()


def schedule(store: Store, new: NewRun) -> Run:
    """Insert ``new`` through ``store``'s own connection, committed at once
    (a debounced one folded into its key's waiting run, or opening the next window)."""
    if new.debounce is not None:
        period, max_wait = new.debounce.seconds()
        return store.schedule_debounced(new.name, new.args_json, new.debounce.key, period, max_wait, new.placement,
                                        new.app_version, deadline=new.deadline)
    return store.schedule(new.name, new.args_json, new.idempotency_key, new.not_before, new.placement,
                          new.app_version, deadline=new.deadline)


def check_arguments(name: str, args: Sequence[Any]) -> None:
    """Refuse (``WorkflowArgumentsError``) positional ``args`` that the
    workflow registered as ``name`` cannot take, before a run is written;
    a workflow not importable here is not checked."""
    fn = getattr(registry.get_workflow(name), "fn", None)
    if fn is not None:
        check_call(fn, name, args)


def check_call(fn: Any, name: str, args: Sequence[Any]) -> None:
    """Refuse (``WorkflowArgumentsError``) positional ``args`` that ``fn``,
    the body of workflow ``name``, cannot take."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a callable without one (a builtin): nothing to check against
        return
    try:
        signature.bind(*args)
    except TypeError as exc:
        bare = signature.replace(  # the names say enough; annotations may be unevaluated strings
            parameters=[p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()],
            return_annotation=inspect.Signature.empty)
        raise WorkflowArgumentsError(
            f"workflow {name}{bare} cannot take {len(args)} argument(s) {_preview(args)}: {exc}") from None


def positional(name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    """``args`` and ``kwargs`` for workflow ``name`` as the positional
    arguments a run holds: keywords placed by the workflow's signature, the
    defaults of the parameters before them filled in. Refused
    (``WorkflowArgumentsError``) when they do not fit it, or name a
    keyword-only parameter (a run's arguments are positional); keywords
    for a workflow not importable here cannot be placed, and are refused."""
    if not kwargs:
        check_arguments(name, args)
        return list(args)
    fn = getattr(registry.get_workflow(name), "fn", None)
    if fn is None:
        raise WorkflowArgumentsError(f"workflow {name} is not importable here: its keyword arguments "
                                     f"{sorted(kwargs)} cannot be placed; pass them by position")
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as exc:
        raise WorkflowArgumentsError(f"workflow {name} cannot take {_preview([*args, kwargs])}: {exc}") from None
    bound.apply_defaults()
    if bound.kwargs:
        raise WorkflowArgumentsError(f"workflow {name}: a run's arguments are positional, and "
                                     f"{', '.join(sorted(bound.kwargs))} cannot be given by position")
    return list(bound.args)


def _preview(args: Sequence[Any]) -> str:
    text = repr(list(args))
    return text if len(text) <= 80 else text[:77] + "..."


def workflow_placement(name: str) -> Placement:
    """The queue and priority a registered workflow declares (the default
    queue for a name not registered here)."""
    placement = getattr(registry.get_workflow(name), "placement", None)
    return placement if isinstance(placement, Placement) else Placement()


def run_deadline(name: str, deadline: dt.datetime | None, timeout: float | dt.timedelta | None) -> dt.datetime | None:
    """A new run's deadline: ``deadline``, else ``timeout`` seconds from
    now, else the workflow's own ``timeout`` (None: no deadline)."""
    if deadline is not None and timeout is not None:
        raise EverystepError("give deadline= or timeout=, not both")
    if deadline is not None:
        return aware(deadline, "deadline")
    if timeout is None:
        timeout = getattr(registry.get_workflow(name), "timeout", None)
    if timeout is None:
        return None
    return utcnow() + dt.timedelta(seconds=durations.seconds(timeout, "timeout", positive=True))


def not_before(run_at: dt.datetime | None, delay: float | dt.timedelta | None) -> dt.datetime | None:
    """When a new run may start: ``run_at``, else ``delay`` from now, else now (None)."""
    if run_at is not None and delay is not None:
        raise EverystepError("give run_at= or delay=, not both")
    if run_at is not None:
        return aware(run_at, "run_at")
    if delay is None:
        return None
    return utcnow() + dt.timedelta(seconds=durations.seconds(delay, "delay"))


def aware(when: Any, what: str) -> dt.datetime:
    """``when`` in UTC; refused unless an aware datetime (a naive one's
    zone would be a guess)."""
    if not isinstance(when, dt.datetime) or when.tzinfo is None or when.utcoffset() is None:
        raise EverystepError(f"{what} needs an aware datetime (with a time zone), not {when!r}")
    return when.astimezone(dt.timezone.utc)


__all__ = ["MAX_DEBOUNCE_KEY", "Debounce", "NewRun", "aware", "checked_debounce", "check_arguments", "check_call",
           "decide", "not_before",
           "run_deadline", "schedule", "workflow_placement"]
