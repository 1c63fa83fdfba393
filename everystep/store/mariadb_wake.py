"""MariaDB's stand-in for LISTEN: a wake-up connection that an idle runner
watches in its selector, woken when a run is scheduled.

MariaDB has no LISTEN/NOTIFY, and none of its locks can signal a future
event to a waiter (a row lock or a ``GET_LOCK`` blocks a waiter only while
someone already holds it). So the connection waits in ``SELECT SLEEP(S) AS
everystep_wake``, sent without waiting for the answer; ``schedule()``,
once its run is committed, calls the ``everystep_wake`` procedure, which
ends those sleeps with ``KILL QUERY``, and the answer (the interruption)
makes the socket readable. Polling stays the fallback: a sleep that runs
its course wakes the runner as a poll would, and a run scheduled in a
caller's transaction (``schedule(conn=...)``, whose commit everystep does
not see) is picked up at the next poll.

The query is sent and its answer read through PyMySQL's ``Connection``
internals (``_execute_command``, ``_read_query_result``: ``query()`` is
these two calls; ``_sock`` for the selector), since PyMySQL has no call
that sends without waiting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pymysql
from pymysql.constants import COMMAND

from .base.values import Notifications
from .channels import SCHEDULED_CHANNEL

#: How long one sleep lasts: a runner whose sleep ends unwoken claims once
#: (as a poll would) and sleeps again.
SLEEP_SECONDS = 30
#: Query execution was interrupted (KILL QUERY); max_statement_time exceeded.
_INTERRUPTED = frozenset({1317, 1969})


class Waking(Notifications):
    """One wake-up connection, the caller's own (never pooled). ``end``
    ends a session's sleep from another session: the server does not notice
    a client gone mid-sleep, so a closed connection's sleep would hold its
    server thread to the end (a supervisor closes it around every fork)."""

    def __init__(self, conn: Any, wait_sql: str, end: Callable[[int], None], seconds: float = SLEEP_SECONDS) -> None:
        self._raw = conn.raw
        self._end = end
        with self._raw.cursor() as cursor:
            cursor.execute("SET SESSION max_statement_time = 0")  # the sleep is not a runaway statement
            self._wait = cursor.mogrify(wait_sql, {"seconds": seconds})
        self._fd: int = self._raw._sock.fileno()
        self._arm()

    def _arm(self) -> None:
        self._raw._execute_command(COMMAND.COM_QUERY, self._wait.encode(self._raw.encoding))

    def fileno(self) -> int:
        return self._fd  # a lost connection cannot say its fileno() any more

    def drain(self) -> list[tuple[str, str]]:
        """The sleep's answer: interrupted means a run was scheduled; one
        that ran its course is reported as a poll would be (an empty
        channel). Then the next sleep is sent."""
        woken = False
        try:
            self._raw._read_query_result()
        except pymysql.err.OperationalError as exc:
            if not exc.args or exc.args[0] not in _INTERRUPTED:
                raise
            woken = True
        self._arm()
        return [(SCHEDULED_CHANNEL, "")] if woken else [("", "")]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._end(self._raw.thread_id())
        with contextlib.suppress(Exception):
            self._raw.close()
