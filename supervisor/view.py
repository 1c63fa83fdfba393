"""What the operator-facing parts see of the arbiter.

``reporting`` (what the supervisor says about itself), ``verbs`` (what
operators may ask) and ``reload`` take the arbiter as one of these
protocols, not as the whole object: they read what is listed here and act
through it (the three acts ``Operable`` names, the claim loop's names on a
reload, a child's ``kill``), never on the children's channels, the
selector or the fork machinery. The ``Arbiter`` satisfies both (mypy
checks it where it hands itself over), and a test may pass a stand-in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from everystep.claimloop import ClaimLoop
    from everystep.store import Store

    from .children import Child
    from .config import Config
    from .ledger import Ledger
    from .sdnotify import Notifier
    from .states import ByeReason, StopMode


class SupervisorView(Protocol):
    """What a supervisor's state reads as, for its status and metrics."""

    @property
    def name(self) -> str: ...

    @property
    def who(self) -> str:
        """How its log lines name it."""

    @property
    def procs(self) -> int: ...

    @property
    def stopping(self) -> StopMode | None: ...

    @property
    def started(self) -> float:
        """``time.monotonic()`` at its start."""

    @property
    def config(self) -> Config: ...

    @property
    def store(self) -> Store: ...

    @property
    def children(self) -> Mapping[int, Child]: ...

    @property
    def restarts(self) -> Mapping[str, int]:
        """Children replaced, by ``RestartReason``."""

    @property
    def ledger(self) -> Ledger:
        """Runs held between children, and the count of those that ended."""

    @property
    def loop(self) -> ClaimLoop:
        """Where runs come from (its counters, the names it claims)."""


class Operable(SupervisorView, Protocol):
    """A supervisor an operator may act on: the view, its systemd notifier,
    and the three acts operators' requests come down to."""

    @property
    def notifier(self) -> Notifier: ...

    def scale(self, procs: int, who: str) -> int:
        """Set the number of children; returns the previous number."""

    def begin_drain(self) -> None: ...

    def replace_children(self, reason: ByeReason) -> int:
        """Replace every child (idle now, busy at their next step boundary);
        returns how many."""


__all__ = ["Operable", "SupervisorView"]
