"""The kinds of wait a run is released for, each declared once.

A run that waits for something besides the clock records a ``waiting``
step and goes back to ``scheduled`` with a ``wait_key`` saying what ends the
wait early: ``<prefix>:<target>`` (``message:approved``,
``child:01a2…``). Everything that reads waits reads this table:

- the store: the statement that says a wait is over (``ready``, run under
  the releasing run's row lock: ``store/base/waits.py``), and the SQL that
  counts waiting runs by kind (rendered from ``KINDS``, as statuses are);
- ``everystep show``, the console and check-deploy: ``describe``, the wait
  in words from its step's arguments;
- the metric ``everystep_workflows_waiting_by_kind``: ``name`` (with
  ``several`` and ``time``, ``GAUGE_LABELS``);
- the graph: which step name is a wait of which kind (``by_step``).

A kind may wait before any step (``DEBOUNCE``: a run's start, pushed back
by each call folded in): it records no step (``step`` empty) and has no
ready statement; its words come from the run's own columns
(``Store.debounce_windows``, read by ``everystep.waiting``).

A new kind: one ``WaitKind`` here, its ``ready`` statement in each backend's
``queries/*.sql`` (if none there fits), the function that waits
(``everystep.waits``: ``recording.suspend`` with ``kind.key(target)``), and
its export in ``everystep/__init__.py``. The recipe is in the architecture
page.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WaitKind:
    """One kind of wait (see the module)."""

    #: Its word: the metric's label, the console's and the graph's.
    name: str
    #: The step name a wait of this kind records ("": a wait no body
    #: enters, a run's own start: ``DEBOUNCE``).
    step: str
    #: ``wait_key`` is ``<prefix>:<target>``.
    prefix: str
    #: The store statements that say the wait is over, in order: it is over
    #: when the last returns a row (the earlier ones take locks).
    ready: tuple[str, ...]
    #: What the ready statements' parameters are, from the waiting run's
    #: id and the key's target.
    params: Callable[[str, str], dict[str, str]]
    #: The wait's object in words, from its step's recorded arguments.
    describe: Callable[[Sequence[Any]], str]

    def key(self, target: str) -> str:
        return f"{self.prefix}:{target}"


def _first(args: Sequence[Any]) -> str:
    return str(args[0]) if args else "?"


MESSAGE = WaitKind(
    "message", "everystep.recv", "message", ("next_message",),
    lambda run_id, topic: {"run_id": run_id, "topic": topic},
    lambda args: f'message "{_first(args)}"')
CHILD = WaitKind(
    "child", "everystep.child", "child", ("run_ended",),
    lambda run_id, child_id: {"run_id": child_id},
    lambda args: f"child {_first(args)}")
RUN = WaitKind(
    "run", "everystep.wait", "run", ("run_ended",),
    lambda run_id, other: {"run_id": other},
    lambda args: f"run {_first(args)}")
#: A body's ``get_event`` with a timeout; its target is ``<run>:<key>``. The
#: publisher's row is taken first (``lock_watched``): a ``set_event`` under
#: way commits before the read, or finds this run released and wakes it.
EVENT = WaitKind(
    "event", "everystep.get_event", "event", ("lock_watched", "get_event"),
    lambda run_id, target: dict(zip(("run_id", "key"), target.split(":", 1))),
    lambda args: f'event "{args[1] if len(args) > 1 else "?"}" of run {_first(args)}')

#: A debounced run not started until its key's window is quiet
#: (``schedule(..., debounce=Debounce(key, period, max_wait))``): a wait
#: before the first step, so no step records it and nothing ends it early;
#: each call folded in pushes its not-before time back. Its target is the
#: debounce key, its words are read from ``[key, calls folded in]``.
DEBOUNCE = WaitKind(
    "debounce", "", "debounce", (),
    lambda run_id, key: {},
    lambda args: (f'its debounce window "{_first(args)}" to be quiet'
                  + (f" ({args[1]} call{'' if args[1] == 1 else 's'} folded in)" if len(args) > 1 else "")))

KINDS: tuple[WaitKind, ...] = (MESSAGE, CHILD, RUN, EVENT, DEBOUNCE)

#: ``wait_key`` of a run whose scopes wait for different things: any wake ends its wait.
SEVERAL = "*"
#: The labels of ``everystep_workflows_waiting_by_kind``: each kind, several
#: of them at once (parallel branches), or only the clock (a delayed start,
#: a sleep, a retry's backoff).
GAUGE_LABELS: tuple[str, ...] = (*(kind.name for kind in KINDS), "several", "time")

by_step: dict[str, WaitKind] = {kind.step: kind for kind in KINDS if kind.step}
_by_prefix: dict[str, WaitKind] = {kind.prefix: kind for kind in KINDS}


def parse(wait_key: str) -> tuple[WaitKind, str] | None:
    """The kind and target of ``wait_key`` (None for ``SEVERAL`` or an
    unknown one)."""
    prefix, _, target = wait_key.partition(":")
    kind = _by_prefix.get(prefix)
    return (kind, target) if kind is not None else None


__all__ = ["CHILD", "DEBOUNCE", "EVENT", "GAUGE_LABELS", "KINDS", "MESSAGE", "RUN", "SEVERAL", "WaitKind", "by_step",
           "parse"]
