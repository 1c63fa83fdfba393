"""The supervisor's LISTEN connection: new runs wake the claim loop.

``schedule()`` NOTIFYs inside its transaction, so a committed run reaches
the parent within milliseconds; polling stays as the fallback (and the only
mechanism on SQLite). The connection is the parent's own, outside the pool,
watched in its selector. When the server drops it, the parent logs once,
keeps polling and reconnects every ``RETRY`` seconds. It is closed around
every ``fork()`` so no child inherits it.
"""

from __future__ import annotations

import logging
import selectors
import time
from collections.abc import Callable
from typing import Any

from everystep.store import Store

logger = logging.getLogger("everystep.supervisor")

RETRY = 2.0


class Listener:
    def __init__(self, store: Store, selector: selectors.BaseSelector, on_notify: Callable[[], None],
                 who: str, channels: dict[str, Callable[[str], None]] | None = None) -> None:
        self.store = store
        #: More channels to LISTEN on, each with its handler (called with the payload).
        self.channels = dict(channels or {})
        self.selector = selector
        self.on_notify = on_notify
        self.who = who
        self.supported = hasattr(store, "listen_connection")
        self._conn: Any = None
        self._fd = -1  # as registered: a lost psycopg connection cannot say its fileno()
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
            self._conn = self.store.listen_connection(tuple(self.channels))  # type: ignore[attr-defined]
        except Exception as exc:
            logger.warning("%s: LISTEN unavailable, polling only: %s", self.who, exc)
            self._retry_at = time.monotonic() + RETRY
            return False
        self._fd = self._conn.fileno()
        self.selector.register(self._fd, selectors.EVENT_READ, self._readable)
        return True

    def close(self) -> None:
        conn, self._conn = self._conn, None
        fd, self._fd = self._fd, -1
        if conn is None:
            return
        try:
            # By the number we registered: once the server has dropped the
            # connection, conn.fileno() raises, which would escape the loop.
            self.selector.unregister(fd)
        except (KeyError, ValueError, OSError):
            pass
        try:
            conn.close()
        except Exception:
            pass

    def maintain(self, now: float) -> bool:
        """Reconnect when due; True if a new connection was made (whatever
        was notified meanwhile was missed: the caller should claim)."""
        if self.supported and self._conn is None and now >= self._retry_at:
            return self.open()
        return False

    def _readable(self, mask: int) -> None:
        try:
            for note in self._conn.notifies(timeout=0):
                handler = self.channels.get(note.channel)
                if handler is not None:
                    handler(note.payload)
        except Exception as exc:
            logger.warning("%s: LISTEN connection lost (%s); polling until it is back", self.who, exc)
            self.close()
            self._retry_at = time.monotonic() + RETRY
        self.on_notify()
