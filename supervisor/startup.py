"""Waiting for the database at start, instead of exiting.

A supervisor is often started while its database is not there yet: a host
booting, a deploy overlapping a database restart, a pod scheduled before
the database's. Exiting at once (exit 3) makes the service manager restart
it every few seconds, and systemd gives up after five starts in ten
seconds; Kubernetes backs off (CrashLoopBackOff). So the parent waits:

- it tries the database with a growing pause (``FIRST_PAUSE`` doubling up
  to ``MAX_PAUSE``), logs one line when it starts waiting and one when the
  database answers;
- it tells systemd ``STATUS=waiting for the database…`` with
  ``EXTEND_TIMEOUT_USEC`` (so ``TimeoutStartSec`` does not kill a
  supervisor that is merely waiting), feeds the watchdog, and sends
  ``READY=1`` only later, once the arbiter runs on a database that answered;
- ``--wait-for-database S`` bounds the wait (then exit 3, as before);
  ``0`` does not wait at all.

Only an unreachable database is waited for. A database that refuses the
configuration (``StoreMisconfigured``: no such database or role, a bad
password or option) or has no schema is a mistake waiting cannot fix:
the caller exits 2 at once.

A stop signal before the arbiter's loop runs (importing the app, waiting
for the database) stops the start-up (``stop_signals``): nothing is
claimed yet, so there is nothing to drain, and the supervisor exits as a
drain ends, with its last ``stopped`` line: 0 for TERM (what systemd and
Kubernetes send), 130 for INT. The handler raises (``StopAtStart``), as
Python's own SIGINT handler does, since what it interrupts (an app's
import, a sleep, a connection attempt) holds nothing to settle; the
arbiter installs its recording handlers first thing, so from then on a
signal is queued for its loop.

It also looks, once the app is imported, for what a fork cannot carry
(``warn_fork_hazards``): threads the app's import started exist in the
parent only (a child has none of them, and may inherit a lock one held),
and network connections it opened would be shared by every child, their
bytes interleaved on one socket. Either is said in one warning line; the
supervisor still starts.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator

import psutil

from everystep.errors import StoreMisconfigured, StoreUnavailable

from .sdnotify import Notifier

FIRST_PAUSE = 0.5
MAX_PAUSE = 10.0
#: How much longer systemd should wait for READY=1 at each retry: the next
#: pause and then some, so a live wait never hits TimeoutStartSec while a
#: hung one still does.
EXTEND_MARGIN = 30.0


class StopAtStart(BaseException):
    """A stop signal came while the supervisor was starting (``signum``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


#: The exit code of a start-up stopped by each signal: TERM drains (0),
#: INT is Ctrl-C (128 + SIGINT).
STOPPED_AT_START = {signal.SIGTERM: 0, signal.SIGINT: 130}


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """While inside, TERM and INT raise ``StopAtStart``; the previous
    handlers come back on the way out."""

    def stop(signum: int, frame: object) -> None:
        raise StopAtStart(signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOPPED_AT_START}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def wait_for_database(check: Callable[[], None], *, limit: float | None, notifier: Notifier,
                      logger: logging.Logger, who: str, where: str,
                      sleep: Callable[[float], None] = time.sleep) -> None:
    """Call ``check`` until it stops raising ``StoreUnavailable``.

    ``limit``: seconds to keep trying (None: as long as it takes; 0: one
    try). The last ``StoreUnavailable`` is raised once the limit is
    passed; ``StoreMisconfigured`` and any other error at once.
    """
    started = time.monotonic()
    pause = FIRST_PAUSE
    waiting = False
    while True:
        try:
            check()
        except StoreMisconfigured:
            raise
        except StoreUnavailable as exc:
            now = time.monotonic()
            left = None if limit is None else limit - (now - started)
            if left is not None and left <= 0:
                raise
            reason = _first_line(exc)
            if not waiting:
                waiting = True
                bound = "as long as it takes" if limit is None else f"up to {limit:g}s"
                logger.warning("%s: database %s unreachable (%s); waiting for it, %s (--wait-for-database)",
                               who, where, reason, bound, extra={"event": "waiting_for_database"})
            nap = pause if left is None else min(pause, left)
            notifier.starting(f"waiting for the database: {reason}", extend_seconds=nap + EXTEND_MARGIN)
            _sleep_feeding_watchdog(nap, notifier, sleep)
            pause = min(pause * 2, MAX_PAUSE)
            continue
        if waiting:
            logger.warning("%s: database %s reachable after %.1fs of waiting; starting", who, where,
                           time.monotonic() - started, extra={"event": "database_reached"})
        return


def _sleep_feeding_watchdog(seconds: float, notifier: Notifier, sleep: Callable[[float], None]) -> None:
    deadline = time.monotonic() + seconds
    while True:
        now = time.monotonic()
        if now >= deadline:
            return
        notifier.maybe_watchdog(now)
        until_ping = notifier.seconds_until_watchdog(now)
        sleep(min(deadline - now, until_ping if until_ping is not None and until_ping > 0 else deadline - now))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def warn_fork_hazards(logger: logging.Logger, who: str) -> None:
    """Warn about threads and network connections that exist before the
    fork (call it right after the app's import, before the supervisor
    opens connections of its own)."""
    threads = [thread.name for thread in threading.enumerate() if thread is not threading.main_thread()]
    if threads:
        logger.warning("%s: the app's import started %d thread(s) (%s); children are forked without them and "
                       "may inherit a lock one of them held: start threads in the child, after the fork "
                       "(e.g. in the first step that needs them)", who, len(threads), ", ".join(threads),
                       extra={"event": "threads_before_fork"})
    try:
        connections = psutil.Process().net_connections(kind="inet")
    except (psutil.Error, OSError):
        return
    if connections:
        where = ", ".join(sorted({_address(conn.raddr or conn.laddr) for conn in connections}))
        logger.warning("%s: the app's import opened %d network connection(s) (%s); every child inherits "
                       "them and would share one socket: open connections in the child, after the fork", who, len(connections), where,
                       extra={"event": "connections_before_fork"})


def _address(addr: object) -> str:
    ip, port = getattr(addr, "ip", ""), getattr(addr, "port", "")
    return f"{ip}:{port}" if ip else "?"
