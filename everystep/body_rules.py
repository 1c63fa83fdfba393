"""What a workflow body may call, declared next to each public function.

A body runs again from the top after every crash, wait and resume, so a
call it makes that reaches the world must not reach it again on the replay.
Every public callable of ``everystep`` is in one of four classes, declared
where it is defined with ``declare(...)``:

- ``recorded``: in a body, its outcome is a step record (effect and record
  in one transaction where there is an effect); a replay returns the
  recorded outcome and never repeats the effect.
- ``wait``: a recorded wait that holds no process, thread or connection
  while it lasts (the run is released, as ``recv`` releases it).
- ``refused``: called in a body it raises ``BodyCallRefused``, naming the
  call to use instead, before anything is written.
- ``plain``: has no effect of its own on the world (a decorator, a type, a
  fork whose branches' calls follow their own class), so it is the same in
  a body and outside.

Inside a step's own code and outside any workflow, every function is a
plain call: a step is recorded as a whole, at least once (``idempotency_key``
makes a send or a schedule from a step's code safe to repeat).

The declarations are read by the reference (``docgen``) and held by a test
that walks ``everystep.__all__``: a public callable without one fails it.
This module imports nothing of everystep, so the lowest layers (errors,
models) can declare their types too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

T = TypeVar("T")

#: The attribute a declaration is stored under, on the function or type.
ATTRIBUTE = "__everystep_in_body__"


class BodyRule(StrEnum):
    """How a call behaves in a workflow body (see the module)."""

    RECORDED = "recorded"
    WAIT = "wait"
    REFUSED = "refused"
    PLAIN = "plain"


@dataclass(frozen=True)
class Declaration:
    """One callable's class in a body, what it does there (``note``, a
    sentence for the reference), and for a refused one what to use instead."""

    rule: BodyRule
    note: str
    instead: str | None = None
    #: The step names the call records in a body, in order (``call`` is a
    #: child's start, then the wait for its end): each takes a position in
    #: its scope, so the graph reads them here to number what follows.
    records: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.rule == BodyRule.REFUSED) != (self.instead is not None):
            raise ValueError("a refused call names what to use instead; no other call does")


def declare(rule: BodyRule, note: str, *, instead: str | None = None,
            records: tuple[str, ...] = ()) -> Callable[[T], T]:
    """Declare the decorated function or type's class in a body. It only
    records the declaration: a refused function is refused by
    ``refusals.refused_in_body``, which declares it too."""
    declaration = Declaration(rule, note, instead, records)

    def mark(obj: T) -> T:
        setattr(obj, ATTRIBUTE, declaration)
        return obj

    return mark


def declaration_of(obj: Any) -> Declaration | None:
    """The declaration of a public callable (inherited by subclasses of a
    declared type), or None."""
    found = getattr(obj, ATTRIBUTE, None)
    return found if isinstance(found, Declaration) else None


__all__ = ["ATTRIBUTE", "BodyRule", "Declaration", "declaration_of", "declare"]
