"""The nodes of a ``Plan``: what a workflow body does, as ``plan.analyse``
reads it from the source. Each is a frozen value the overlay
(``overlay.build_graph``) walks against the run's records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class StepCall:
    """A call of a ``@step``."""

    function: str  # the step's registered name (what a record stores)
    label: str  # the callable as written, e.g. ``create_vm``
    line: int | None
    name: str | None = None  # a constant ``everystep_id``
    dynamic_name: bool = False  # an ``everystep_id`` computed at run time
    unsafe: bool = False
    exactly_once: bool = False  # a transactional step: its writes commit with its record


@dataclass(frozen=True)
class Wait:
    """A call that makes the run wait (see ``waits``)."""

    kind: str
    function: str  # the step name its record carries
    label: str  # the call as written, e.g. ``everystep.sleep``
    line: int | None
    name: str | None = None
    dynamic_name: bool = False


@dataclass(frozen=True)
class Fork:
    """A ``parallel(...)`` call: its branches run as lanes."""

    branches: tuple[tuple[Node, ...], ...]
    line: int | None
    name: str | None = None
    dynamic_name: bool = False
    dynamic: bool = False  # branches built at run time: known only from records


@dataclass(frozen=True)
class Loop:
    """A ``for``/``while`` loop or comprehension whose body makes steps.
    ``count``: at most how many times the body runs, when the source says
    (``for width in (320, 1280)``: 2); None when only the records can tell."""

    body: tuple[Node, ...]
    text: str
    line: int | None
    count: int | None = None


@dataclass(frozen=True)
class Arm:
    label: str
    body: tuple[Node, ...]


@dataclass(frozen=True)
class Choice:
    """``if``/``elif``/``else``, ``match``, a conditional expression: one arm runs."""

    arms: tuple[Arm, ...]
    line: int | None


@dataclass(frozen=True)
class Try:
    """``try``: ``handlers`` run after a failure in ``body``, ``orelse``
    after none, ``final`` always."""

    body: tuple[Node, ...]
    handlers: tuple[Arm, ...]
    orelse: tuple[Node, ...]
    final: tuple[Node, ...]
    line: int | None


@dataclass(frozen=True)
class Exit:
    """``return`` or ``raise``: nothing after it in the same path runs."""

    text: str
    line: int | None


@dataclass(frozen=True)
class Patch:
    """A ``patched(id)`` call: its answer is recorded once per run, as a
    marker row at ``@patch:<id>`` that takes no position in its scope."""

    patch_id: str | None  # None: an id computed at run time
    label: str
    line: int | None


Node = Union[StepCall, Wait, Fork, Loop, Choice, Try, Exit, Patch]


@dataclass(frozen=True)
class Plan:
    workflow: str
    nodes: tuple[Node, ...] | None  # None: the source could not be read
    reason: str | None = None
    notes: tuple[str, ...] = ()
    file: str | None = None
    line: int | None = None

    @property
    def ok(self) -> bool:
        return self.nodes is not None


__all__ = ["Arm", "Choice", "Exit", "Fork", "Loop", "Node", "Patch", "Plan", "StepCall", "Try", "Wait"]
