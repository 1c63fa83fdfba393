"""Step resource budgets and costs: what the engine and the runners share.

A step may say how much memory and CPU it may use,
``@step(memory_limit="512M", cpu_limit=30)``, and ``everystep-supervisor``
has defaults for the steps that say nothing (``--step-memory-limit``,
``--step-cpu-limit``). A memory limit is what the step may *add* to the
process running it (its memory when the step starts, plus the limit); a CPU
limit is the CPU seconds (user + system) the step may use. A step over its
limit fails with ``StepResourceExceeded``, recorded like any step failure.

Only a runner that gives each run a process of its own can bound a step, so
the engine does not enforce anything itself: the runner hands
``runner.execute`` a ``StepMeter`` (``everystep.context``, with the other
hooks a runner plugs into an execution), which wraps every step it runs (the
supervisor's children do, see ``supervisor/meter.py``). The threaded worker
has none and refuses to start when the app declares limits
(``registry.limited_steps``), rather than pretend to honour them.

A meter also measures each step (``StepCost``), bounded or not: the CPU
seconds it used and how far it raised its process's peak RSS above where it
started. The runner stores both on the step's row; ``run_cost`` sums a
run's steps for ``everystep show``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .errors import EverystepError

if TYPE_CHECKING:
    from .models import StepRecord


class Resource(StrEnum):
    """What a step's budget bounds (``StepResourceExceeded.resource``)."""

    MEMORY = "memory"
    CPU = "cpu"


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)


def parse_size(value: str | int, what: str = "memory_limit") -> int:
    """Bytes from ``512M``, ``1.5G``, ``256MiB``, ``4096`` (K, M, G, T are
    powers of 1024, as in Docker and systemd). ``EverystepError`` otherwise."""
    if isinstance(value, bool):
        raise EverystepError(f"{what} must be a size like 512M or 2G, not {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value.strip())):
        size = int(float(match[1]) * _UNITS[match[2].lower()])
    else:
        raise EverystepError(f"{what} must be a size like 512M or 2G, not {value!r}")
    if size <= 0:
        raise EverystepError(f"{what} must be more than 0 bytes, not {value!r}")
    return size


def parse_cpu(value: float | int | str, what: str = "cpu_limit") -> float:
    """CPU seconds, a positive number. ``EverystepError`` otherwise."""
    try:
        seconds = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise EverystepError(f"{what} must be a positive number of CPU seconds, not {value!r}")
    return seconds


def format_size(size: float) -> str:
    """``268435456`` → ``256 MiB``; one decimal where it matters."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(size) >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size:.0f} B"


def format_cpu(seconds: float) -> str:
    """``0.09 ms``, ``12.5 ms``, ``2.92s``, ``30s``, ``123.5s``: never an
    exponent."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        milliseconds = seconds * 1000
        text = f"{milliseconds:.2g}" if milliseconds < 1 else f"{milliseconds:.3g}" if milliseconds < 100 \
            else f"{milliseconds:.0f}"
        return f"{text} ms"
    if seconds < 10:
        return f"{seconds:.3g}s"
    return f"{seconds:.1f}".removesuffix(".0") + "s"


def describe(resource: Resource | str, amount: float) -> str:
    """An amount of ``resource`` for people: ``256 MiB`` or ``2.01s``."""
    return format_size(amount) if resource == Resource.MEMORY else format_cpu(amount)


def exceeded_message(step_id: str, name: str, resource: Resource, limit: float | None, peak: float | None,
                     how: str) -> str:
    """The one wording of a step over its budget, wherever it was caught:
    ``step 2 (app.resize) exceeded its memory limit of 256 MiB (peak 301 MiB
    above its start): <how>``."""
    what = "memory" if resource == Resource.MEMORY else "CPU"
    head = f"step {step_id} ({name}) exceeded "
    head += f"its {what} limit of {describe(resource, limit)}" if limit is not None else what
    if peak is not None:
        head += f" (peak {describe(resource, peak)}" + (" above its start)" if resource == Resource.MEMORY else ")")
    return f"{head}: {how}"


@dataclass(frozen=True)
class StepCost:
    """What one execution of a step used: CPU seconds (user + system, of its
    process and of the subprocesses it waited for) and how far it raised its
    process's peak resident memory above what the process held when the
    step started, in bytes."""

    cpu_seconds: float
    peak_rss_bytes: int


@dataclass(frozen=True)
class RunCost:
    """A run's steps together: CPU seconds summed, the largest step peak
    (peaks of steps that ran one after the other do not add up)."""

    cpu_seconds: float
    peak_rss_bytes: int
    measured_steps: int

    def to_dict(self) -> dict[str, Any]:
        return {"cpu_seconds": self.cpu_seconds, "peak_rss_bytes": self.peak_rss_bytes,
                "measured_steps": self.measured_steps}


def run_cost(steps: Iterable[StepRecord]) -> RunCost | None:
    """The cost of the measured steps among ``steps``; None if none was."""
    measured = [step for step in steps if step.cpu_seconds is not None]
    if not measured:
        return None
    return RunCost(
        cpu_seconds=sum(step.cpu_seconds or 0.0 for step in measured),
        peak_rss_bytes=max(step.peak_rss_bytes or 0 for step in measured),
        measured_steps=len(measured),
    )








__all__ = [
    "Resource", "RunCost", "StepCost", "describe", "exceeded_message",
    "format_cpu", "format_size", "parse_cpu", "parse_size", "run_cost",
]
