"""A cron expression in a time zone: what ``@workflow(cron=..., timezone=...)``
declares, validated when the workflow is, evaluated by ``cronsim`` (a
maintained library, the extra ``everystep[cron]``; everystep does not parse
cron by hand), so "at 02:30 every day" follows daylight saving time as the
local clock does. The runners' side (enqueueing each tick) is
``everystep.cron``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import EverystepError

UTC = dt.timezone.utc


def _cronsim() -> Any:
    try:
        import cronsim
    except ImportError:
        raise EverystepError(
            "cron schedules need the cron extra: pip install 'everystep[cron]'") from None
    return cronsim


@dataclass(frozen=True)
class CronSchedule:
    """A validated cron expression in a time zone."""

    expr: str
    timezone: str = "UTC"

    @classmethod
    def parse(cls, expr: Any, timezone: Any = None) -> CronSchedule:
        """``EverystepError`` with one line for anything unusable."""
        if not isinstance(expr, str) or not expr.strip():
            raise EverystepError(f"cron must be a cron expression such as '*/5 * * * *', not {expr!r}")
        zone_name = "UTC" if timezone is None else timezone
        if not isinstance(zone_name, str):
            raise EverystepError(f"timezone must be an IANA zone name such as 'Europe/Paris', not {timezone!r}")
        try:
            ZoneInfo(zone_name)
        except (ZoneInfoNotFoundError, ValueError):
            raise EverystepError(f"unknown timezone {zone_name!r} (an IANA name such as 'Europe/Paris')") from None
        cronsim = _cronsim()
        try:
            cronsim.CronSim(expr, dt.datetime.now(UTC))
        except cronsim.CronSimError as exc:
            raise EverystepError(f"invalid cron expression {expr!r}: {exc}") from None
        return cls(" ".join(expr.split()), zone_name)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def next_after(self, when: dt.datetime) -> dt.datetime:
        """The first tick strictly after ``when`` (UTC)."""
        sim = _cronsim().CronSim(self.expr, when.astimezone(self.zone))
        return next(sim).astimezone(UTC)  # type: ignore[no-any-return]

    def latest_at_or_before(self, when: dt.datetime) -> dt.datetime:
        """The last tick at or before ``when`` (UTC)."""
        after = when.astimezone(self.zone).replace(microsecond=0) + dt.timedelta(seconds=1)
        sim = _cronsim().CronSim(self.expr, after, reverse=True)
        return next(sim).astimezone(UTC)  # type: ignore[no-any-return]

    def describe(self) -> str:
        return f"{self.expr} ({self.timezone})"


__all__ = ["UTC", "CronSchedule"]
