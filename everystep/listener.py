"""A runner's LISTEN connection: new runs wake the claim loop.

``schedule()`` NOTIFYs inside its transaction, so a committed run reaches
a runner (the supervisor's parent, the threaded worker) within
milliseconds; polling stays as the fallback (and the only mechanism on
SQLite). On MariaDB the connection is a wake-up connection that
``schedule()`` interrupts after its commit
(``everystep/store/mariadb_wake.py``): it wakes the claim loop and nothing
else. The connection is the runner's own, outside the pool, watched in
its selector. When the server drops it, the runner logs once, keeps
polling and reconnects every ``RETRY`` seconds. The supervisor closes it
around every ``fork()`` so no child inherits it.

Behind a transaction pooler (``?pooler=transaction``) LISTEN needs a URL of
its own (``--listen-database``); without one the store has no LISTEN
connection to give (``Store.listen_unavailable`` says why), and the runner
polls, saying so once.
"""

from __future__ import annotations

import logging
import selectors
import time
from collections.abc import Callable

from everystep.outage import OutageLog
from everystep.store import Notifications, Store

logger = logging.getLogger("everystep")

RETRY = 2.0


class Listener:
    def __init__(self, store: Store, selector: selectors.BaseSelector, on_notify: Callable[[str, str], None],
                 who: str, outage: OutageLog | None = None, poll: float | None = None,
                 log: logging.Logger | None = None) -> None:
        self.store = store
        self.selector = selector
        self.on_notify = on_notify
        self.who = who
        self.logger = log or logger
        #: Shared with the runner's other activities: one line per outage.
        self.outage = outage or OutageLog(self.logger, who)
        self.supported = store.wakes
        #: The runner's poll interval, for the line saying it polls instead.
        self.poll = poll
        self._conn: Notifications | None = None
        self._fd = -1
        self._retry_at = 0.0
        self._said_polling = False

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def open(self) -> bool:
        """Connect and LISTEN; True when connected (a failure is logged and
        retried by ``maintain``)."""
        if not self.supported or self._conn is not None:
            self._say_polling()
            return self._conn is not None
        try:
            conn = self.store.listen()
        except Exception as exc:
            self.outage.failed(exc, "LISTEN (polling meanwhile)")
            self._retry_at = time.monotonic() + RETRY
            return False
        if conn is None:  # nothing to listen on after all: poll
            self.supported = False
            self._say_polling()
            return False
        self._conn = conn
        self.outage.ok()
        self._fd = self._conn.fileno()
        self.selector.register(self._fd, selectors.EVENT_READ, self._readable)
        return True

    def _say_polling(self) -> None:
        """Once: the runner polls where it could have listened."""
        why = self.store.listen_unavailable
        if self.supported or why is None or self._said_polling:
            return
        self._said_polling = True
        every = f" every {self.poll:g} s" if self.poll is not None else ""
        self.logger.warning("%s: pickup by polling%s: %s", self.who, every, why,
                            extra={"event": "polling_instead_of_listen"})

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
