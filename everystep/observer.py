"""The observer hook: how the runner tells the world what it is doing.

The runner calls these methods around each run, step and parallel fork.
Metrics, tracing, error reporting and the supervisor's child (which reports
step starts to its parent for timeouts and ``ctl status``) all plug in here,
so the runner itself knows nothing about processes or telemetry.

``*_started`` methods may return a token that the runner hands back to the
matching ``*_finished`` call (a tracing span, a start time). Observers must
not raise; ``Observers`` logs and swallows what they do raise, so a broken
integration can never fail a run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import Context
    from .models import Run

logger = logging.getLogger("everystep")


class Observer:
    """No-op base class; override what you need."""

    def run_started(self, run: Run, ctx: Context) -> Any:
        return None

    def run_settling(self, run: Run, status: str) -> None:
        """The body is done; the runner is about to write ``status`` (a run
        status, or ``requeued``). Runs no more workflow code after this."""

    def run_finished(self, run: Run, ctx: Context, status: str, error: BaseException | None, token: Any) -> None:
        """``status`` is a run status, or ``requeued``/``lost``/``crashed``."""

    def step_started(self, ctx: Context, step_id: str, name: str, timeout: float | None, unsafe: bool) -> Any:
        return None

    def step_finished(
        self, ctx: Context, step_id: str, name: str, status: str, error: BaseException | None, token: Any
    ) -> None:
        """``status`` is ``done`` or ``failed`` (or ``crashed`` when the fault
        hook simulated a process death before the record)."""

    def fork_started(self, ctx: Context, fork_id: str, branches: int) -> Any:
        return None

    def fork_finished(self, ctx: Context, fork_id: str, error: BaseException | None, token: Any) -> None:
        pass


class Observers(Observer):
    """Fan out to several observers, isolating their failures.

    Each hook pair calls only the observers that override it (the runner
    calls step hooks on every step, most observers care about a few hooks),
    and nested ``Observers`` are flattened.  A ``*_started`` hook returns the
    list of its observers' tokens, which the matching ``*_finished`` takes back.
    """

    def __init__(self, observers: Iterable[Observer | None] = ()) -> None:
        flat: list[Observer] = []
        for observer in observers:
            if isinstance(observer, Observers):
                flat.extend(observer.observers)
            elif observer is not None:
                flat.append(observer)
        self.observers: list[Observer] = flat
        self._by_hook = {
            "run": _overriding(flat, "run_started", "run_finished"),
            "settling": _overriding(flat, "run_settling"),
            "step": _overriding(flat, "step_started", "step_finished"),
            "fork": _overriding(flat, "fork_started", "fork_finished"),
        }

    def _each(self, group: str, method: str, *args: Any) -> list[Any]:
        tokens = []
        for observer in self._by_hook[group]:
            try:
                tokens.append(getattr(observer, method)(*args))
            except Exception:
                logger.exception("everystep: observer %r failed in %s", observer, method)
                tokens.append(None)
        return tokens

    def _each_finished(self, group: str, method: str, tokens: list[Any] | None, *args: Any) -> None:
        observers = self._by_hook[group]
        tokens = tokens or [None] * len(observers)
        for observer, token in zip(observers, tokens):
            try:
                getattr(observer, method)(*args, token)
            except Exception:
                logger.exception("everystep: observer %r failed in %s", observer, method)

    def run_started(self, run: Run, ctx: Context) -> list[Any]:
        return self._each("run", "run_started", run, ctx)

    def run_settling(self, run: Run, status: str) -> None:
        self._each("settling", "run_settling", run, status)

    def run_finished(self, run: Run, ctx: Context, status: str, error: BaseException | None, token: Any) -> None:
        self._each_finished("run", "run_finished", token, run, ctx, status, error)

    def step_started(self, ctx: Context, step_id: str, name: str, timeout: float | None, unsafe: bool) -> list[Any]:
        return self._each("step", "step_started", ctx, step_id, name, timeout, unsafe)

    def step_finished(
        self, ctx: Context, step_id: str, name: str, status: str, error: BaseException | None, token: Any
    ) -> None:
        self._each_finished("step", "step_finished", token, ctx, step_id, name, status, error)

    def fork_started(self, ctx: Context, fork_id: str, branches: int) -> list[Any]:
        return self._each("fork", "fork_started", ctx, fork_id, branches)

    def fork_finished(self, ctx: Context, fork_id: str, error: BaseException | None, token: Any) -> None:
        self._each_finished("fork", "fork_finished", token, ctx, fork_id, error)


def _overriding(observers: list[Observer], *methods: str) -> list[Observer]:
    return [
        observer for observer in observers
        if any(getattr(type(observer), method) is not getattr(Observer, method) for method in methods)
    ]
