"""One clear warning per database outage, not one per retry."""

from __future__ import annotations

import logging
import time


class OutageLog:
    """Tracks whether the database is failing for one activity (claims,
    heartbeats…): warns when an outage starts, says so when it ends, and
    stays quiet in between."""

    def __init__(self, logger: logging.Logger, who: str, what: str) -> None:
        self.logger = logger
        self.who = who
        self.what = what
        self.failing_since: float | None = None
        self.last_error = ""

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def failed(self, exc: BaseException) -> None:
        self.last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if self.failing_since is None:
            self.failing_since = time.monotonic()
            self.logger.warning("%s: %s failed, retrying until the database is back: %s",
                                self.who, self.what, self.last_error)

    def ok(self) -> None:
        if self.failing_since is not None:
            self.logger.warning("%s: database reachable again; %s resumed after %.1fs",
                                self.who, self.what, time.monotonic() - self.failing_since)
            self.failing_since = None
