"""One warning when the database goes away and one when it is back, per
process, however many activities notice.

A runner touches the database for several reasons at once: claiming,
heartbeats, the LISTEN connection, operator requests. During an outage every
one of them fails, and each retries on its own schedule; logging each
failure (or each activity's recovery) buries the one fact an operator needs.
So a process has one ``OutageLog``, shared by all its activities: the first
failure starts the outage (one WARNING, naming what failed and the error's
first line), and only a real successful round trip ends it (one WARNING with
how long it lasted). Activities that did not touch the database must not
report success: that would end an outage that is still going on. And a
success within ``SETTLE`` seconds of a failure does not end it either:
while a server terminates its connections one by one, or refuses new ones
while old ones linger, successes and failures interleave for a moment, and
the outage is over only once the failures have stopped.

A statement the database refused while it was reachable (``StoreError``)
is no outage: it goes to the runner's ``EngineHealth`` instead (counted,
logged once per spell, and the runner reported unhealthy while it recurs;
``everystep.engine_errors``).
"""

from __future__ import annotations

import logging
import time

from . import engine_errors
from .errors import StoreError

SETTLE = 1.0


class OutageLog:
    def __init__(self, logger: logging.Logger, who: str, engine: engine_errors.EngineHealth | None = None) -> None:
        self.logger = logger
        self.who = who
        #: Where engine errors go (a runner's account; None: nowhere but the log).
        self.engine = engine
        self.failing_since: float | None = None
        self.last_failure = 0.0
        self.last_error = ""

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def failed(self, exc: BaseException, what: str) -> None:
        """``what`` (claiming, heartbeat…) could not reach the database, or
        the database refused it (``StoreError``: no outage)."""
        if isinstance(exc, StoreError):
            self._refused(exc, what)
            return
        text = str(exc).strip()
        self.last_error = text.splitlines()[0] if text else type(exc).__name__
        self.last_failure = time.monotonic()
        if self.failing_since is None:
            self.failing_since = time.monotonic()
            self.logger.warning("%s: database unreachable (%s failed: %s); retrying until it is back",
                                self.who, what, self.last_error, extra={"event": "outage_started"})

    def ok(self) -> None:
        """A round trip to the database just succeeded."""
        if self.failing_since is not None and time.monotonic() - self.last_failure >= SETTLE:
            self.logger.warning("%s: database reachable again after %.1fs of outage", self.who,
                                time.monotonic() - self.failing_since, extra={"event": "outage_ended"})
            self.failing_since = None

    def _refused(self, exc: StoreError, what: str) -> None:
        engine_errors.count(exc.kind)
        first = self.engine.failed(f"{what}: {exc}") if self.engine is not None else True
        if first:
            self.logger.warning("%s: the database refused %s (%s); retrying (counted in "
                                "everystep_engine_errors_total, the runner unhealthy while it recurs)",
                                self.who, what, exc, extra={"event": "engine_error"})
