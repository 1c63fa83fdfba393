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

from .context import Context, Observer

if TYPE_CHECKING:
    from .models import Run

logger = logging.getLogger("everystep")




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
        groups = {group: _overriding(flat, *methods) for group, methods in _GROUPS.items()}
        # Bound once: the step hooks run around every step.
        self._hooks: dict[str, list[tuple[Observer, Any]]] = {
            method: [(observer, getattr(observer, method)) for observer in groups[group]]
            for group, methods in _GROUPS.items() for method in methods
        }

    def _each(self, method: str, *args: Any) -> list[Any]:
        tokens = []
        for observer, hook in self._hooks[method]:
            try:
                tokens.append(hook(*args))
            except Exception:
                logger.exception("everystep: observer %r failed in %s", observer, method)
                tokens.append(None)
        return tokens

    def _each_finished(self, method: str, tokens: list[Any] | None, *args: Any) -> None:
        hooks = self._hooks[method]
        for (observer, hook), token in zip(hooks, tokens or [None] * len(hooks)):
            try:
                hook(*args, token)
            except Exception:
                logger.exception("everystep: observer %r failed in %s", observer, method)

    def run_started(self, run: Run, ctx: Context) -> list[Any]:
        return self._each("run_started", run, ctx)

    def run_settling(self, run: Run, status: str) -> None:
        self._each("run_settling", run, status)

    def run_finished(self, run: Run, ctx: Context, status: str, error: BaseException | None, token: Any) -> None:
        self._each_finished("run_finished", token, run, ctx, status, error)

    def step_started(self, ctx: Context, step_id: str, name: str, timeout: float | None, unsafe: bool) -> list[Any]:
        return self._each("step_started", ctx, step_id, name, timeout, unsafe)

    def step_finished(
        self, ctx: Context, step_id: str, name: str, status: str, error: BaseException | None, token: Any
    ) -> None:
        self._each_finished("step_finished", token, ctx, step_id, name, status, error)

    def fork_started(self, ctx: Context, fork_id: str, branches: int) -> list[Any]:
        return self._each("fork_started", ctx, fork_id, branches)

    def fork_finished(self, ctx: Context, fork_id: str, error: BaseException | None, token: Any) -> None:
        self._each_finished("fork_finished", token, ctx, fork_id, error)


#: Hook groups: a started/finished pair goes to the same observers, so the
#: tokens of one line up with the other.
_GROUPS = {
    "run": ("run_started", "run_finished"),
    "settling": ("run_settling",),
    "step": ("step_started", "step_finished"),
    "fork": ("fork_started", "fork_finished"),
}


def _overriding(observers: list[Observer], *methods: str) -> list[Observer]:
    return [observer for observer in observers if _overrides(type(observer), methods)]


def _overrides(cls: type[Observer], methods: tuple[str, ...]) -> bool:
    """Whether ``cls`` overrides any of ``methods``: asked per observer and
    hook group each time a run starts, answered once per class."""
    key = (cls, methods)
    found = _OVERRIDES.get(key)
    if found is None:
        found = _OVERRIDES[key] = any(getattr(cls, method) is not getattr(Observer, method) for method in methods)
    return found


_OVERRIDES: dict[tuple[type[Observer], tuple[str, ...]], bool] = {}
