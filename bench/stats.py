"""Small statistics helpers: medians of repetitions, percentiles, formatting."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Series:
    """Repeated measurements of one quantity (one value per repetition)."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float | None) -> None:
        if value is not None and math.isfinite(value):
            self.values.append(float(value))

    def __bool__(self) -> bool:
        return bool(self.values)

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def low(self) -> float | None:
        return min(self.values) if self.values else None

    @property
    def high(self) -> float | None:
        return max(self.values) if self.values else None

    def cell(self, digits: int = 0, unit: str = "") -> str:
        """``median (min–max)`` for a table cell."""
        if not self.values:
            return "n/a"
        med = fmt(self.median, digits)
        if len(self.values) == 1:
            return f"{med}{unit} (1 rep)"
        return f"{med}{unit} ({fmt(self.low, digits)}–{fmt(self.high, digits)})"


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear-interpolated percentile (``p`` in 0..100), like numpy's default."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = math.ceil(rank)
    if lo == hi:
        return ordered[lo]
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def fmt_ratio(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "n/a"
    if percent:
        return f"{value * 100:.0f} %"
    return f"{value:.2f}×"


def fmt_span(series: Series, percent: bool = False) -> str:
    """A target's ratio: its median and min–max over repetitions."""
    if len(series.values) < 2:
        return f"{fmt_ratio(series.median, percent)}, 1 rep"
    return (f"{fmt_ratio(series.median, percent)}, "
            f"{fmt_ratio(series.low, percent)}–{fmt_ratio(series.high, percent)}")
