"""Durations as the API takes them: seconds (an int or a float) or a
``timedelta``, checked in one place for every option that takes one
(timeouts, delays, periods, a sleep), so each refuses the same things in
the same words."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from .errors import EverystepError


def seconds(value: Any, what: str, *, positive: bool = False) -> float:
    """``value`` in seconds; refused in one line naming ``what`` unless a
    finite number (not a bool) that is 0 or more, or above 0 when
    ``positive``."""
    raw = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) \
            or (raw <= 0 if positive else raw < 0):
        bound = "a positive number of seconds" if positive else "a finite number of seconds, 0 or more"
        raise EverystepError(f"{what} must be {bound}, not {value!r}")
    return float(raw)


__all__ = ["seconds"]
