"""The supervisor's LISTEN connection: new runs wake the claim loop.

``schedule()`` NOTIFYs inside its transaction, so a committed run reaches
the parent within milliseconds; polling stays as the fallback (and the only
mechanism on SQLite). On MariaDB the connection is a wake-up connection
that ``schedule()`` interrupts after its commit
(``everystep/store/mariadb_wake.py``): it wakes the claim loop and nothing
else. The connection is the parent's own, outside the pool,
watched in its selector. When the server drops it, the parent logs once,
keeps polling and reconnects every ``RETRY`` seconds. It is closed around
every ``fork()`` so no child inherits it.
"""

from __future__ import annotations

import logging
import selectors
import time
from collections.abc import Callable

from everystep.outage import OutageLog
from everystep.store import Notifications, Store

logger = logging.getLogger("everystep.supervisor")

RETRY = 2.0


class Listener:
    def __init__(self, store: Store, selector: selectors.BaseSelector, on_notify: Callable[[str, str], None],
                 who: str, outage: OutageLog | None = None) -> None:
        self.store = store
        self.selector = selector
        self.on_notify = on_notify
        self.who = who
        #: Shared with the runner's other activities: one line per outage.
        self.outage = outage or OutageLog(logger, who)
        self.supported = store.wakes
        self._conn: Notifications | None = None
        self._fd = -1
        self._retry_at = 0.0

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def open(self) -> bool:
        """Connect and LISTEN; True when connected (a failure is logged and
        retried by ``maintain``)."""
        if not self.supported or self._conn is not None:
            return self._conn is not None
        try:
            self._conn = self.store.listen()
        except Exception as exc:
            self.outage.failed(exc, "LISTEN (polling meanwhile)")
            self._retry_at = time.monotonic() + RETRY
            return False
        assert self._conn is not None
        self.outage.ok()
        self._fd = self._conn.fileno()
        self.selector.register(self._fd, selectors.EVENT_READ, self._readable)
        return True

    def close(self) -> None:
        conn, self._conn = self._conn, None
        fd, self._fd = self._fd, -1
        if conn is None:
            return
        try:
            self.selector.unregister(fd)
        except (KeyError, ValueError, OSError):
            pass
        conn.close()

    def maintain(self, now: float) -> bool:
        """Reconnect when due; True if a new connection was made (whatever
        was notified meanwhile was missed: the caller should claim)."""
        if self.supported and self._conn is None and now >= self._retry_at:
            return self.open()
        return False

    def _readable(self, mask: int) -> None:
        """Hand each notification (channel, payload) to ``on_notify``; a lost
        connection is reported as one on the scheduled-runs channel, since
        whatever it would have delivered was missed."""
        notifications: list[tuple[str, str]] = []
        try:
            assert self._conn is not None
            notifications = self._conn.drain()
        except Exception as exc:
            self.outage.failed(exc, "LISTEN (polling meanwhile)")
            self.close()
            self._retry_at = time.monotonic() + RETRY
        for channel, payload in notifications or [("", "")]:
            self.on_notify(channel, payload)
