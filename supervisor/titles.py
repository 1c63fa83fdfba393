"""Process titles, so ``ps`` shows which child runs which workflow and step."""

from __future__ import annotations

try:
    from setproctitle import setproctitle as _set
except ImportError:  # pragma: no cover - setproctitle is a dependency
    def _set(title: str) -> None:
        pass

PREFIX = "everystep-supervisor"


def master(name: str, state: str = "") -> None:
    _set(f"{PREFIX}: master {name}{' ' + state if state else ''}")


def child_idle(slot: int) -> None:
    _set(f"{PREFIX}: child {slot} idle")


def child_busy(slot: int, workflow: str, run_id: str, step_id: str | None = None) -> None:
    suffix = f" step {step_id}" if step_id else ""
    _set(f"{PREFIX}: child {slot} {workflow} {run_id}{suffix}")
