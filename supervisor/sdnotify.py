"""The systemd notify protocol (sd_notify(3)), stdlib only.

A message is one AF_UNIX datagram of ``KEY=value`` lines sent to
``NOTIFY_SOCKET``: too small a protocol to take a dependency for.

Contract: outside systemd every method is a no-op, so the arbiter never asks
"am I under systemd?".  Sending never raises and never blocks: a full queue
(EAGAIN), a vanished path (ENOENT) or a dead receiver (ECONNREFUSED) costs one
warning per outage and the message is dropped; a lost notification is
harmless, a stalled supervisor loop is not.  Only the process that built the
notifier speaks: ``unset=True`` hides the variables from children and the
programs their steps run, and a forked child holding the inherited object
stays silent, for a child's ``WATCHDOG=1`` must never vouch for a hung parent.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger("everystep.supervisor")


def _positive_int(value: str | None) -> int | None:
    """An int > 0, or None for unset or garbage: a bad value disables, never crashes."""
    try:
        number = int(value) if value is not None else 0
    except ValueError:
        return None
    return number if number > 0 else None


class Notifier:
    """Talks to systemd for the supervisor process; ``Notifier(None)`` is a no-op."""

    def __init__(self, address: bytes | None, watchdog_usec: int | None = None) -> None:
        """``address``: an AF_UNIX address (``b"\\0name"`` is abstract); prefer :meth:`from_env`."""
        self._owner_pid = os.getpid()
        # Ping at half of WatchdogSec, as sd_watchdog_enabled(3) advises.
        self._interval = watchdog_usec / 2_000_000 if watchdog_usec else None
        self._last_ping: float | None = None
        self._failing = False  # one warning per outage, not one per loop iteration
        self._target: tuple[socket.socket, bytes] | None = None
        if address is not None:
            try:
                kind = socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
                self._target = (socket.socket(socket.AF_UNIX, kind), address)
            except OSError as exc:
                log.warning("systemd notify disabled: cannot create socket: %s", exc)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, unset: bool = False) -> Notifier:
        """Read ``environ`` (default ``os.environ``); ``unset=True`` then deletes the variables."""
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        watchdog_usec = _positive_int(env.get("WATCHDOG_USEC"))
        watchdog_pid = env.get("WATCHDOG_PID")
        # A watchdog for another process (or an unparsable pid) is not ours to feed.
        if watchdog_pid is not None and _positive_int(watchdog_pid) != os.getpid():
            watchdog_usec = None
        if unset:
            for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
                os.environ.pop(key, None)
        address: bytes | None = None
        if raw.startswith("@") and len(raw) > 1:
            address = b"\0" + os.fsencode(raw[1:])  # Linux abstract namespace
        elif raw.startswith("/"):
            address = os.fsencode(raw)
        elif raw:  # a relative path or systemd 253's vsock: cannot be reached here
            log.warning("systemd notify disabled: unsupported NOTIFY_SOCKET=%r "
                        "(expected an absolute path or @abstract name)", raw)
        return cls(address, watchdog_usec)

    def ready(self, status: str) -> bool:
        """``READY=1``: start-up (or a reload) is complete."""
        return self._send(READY=1, STATUS=status)

    def status(self, text: str) -> bool:
        """``STATUS=``: the one-line state shown by ``systemctl status``."""
        return self._send(STATUS=text)

    def starting(self, text: str, extend_seconds: float) -> bool:
        """``STATUS=`` while start-up waits on something (the database),
        with ``EXTEND_TIMEOUT_USEC=``: systemd (236+) allows that much more
        time for ``READY=1`` before ``TimeoutStartSec`` fails the start."""
        return self._send(STATUS=text, EXTEND_TIMEOUT_USEC=int(extend_seconds * 1_000_000))

    def stopping(self) -> bool:
        """``STOPPING=1``: a drain started, so systemd shows "deactivating"."""
        return self._send(STOPPING=1)

    def reloading(self) -> bool:
        """``RELOADING=1``, then :meth:`ready` when done."""
        # systemd 253+ ignores RELOADING=1 without MONOTONIC_USEC; older ones skip the field.
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self._send(RELOADING=1, MONOTONIC_USEC=usec)

    def seconds_until_watchdog(self, now: float) -> float | None:
        """How long the loop may block before a ping is owed; None without a watchdog."""
        if self._interval is None or self._target is None:
            return None
        if self._last_ping is None:
            return 0.0
        return max(0.0, self._last_ping + self._interval - now)

    def maybe_watchdog(self, now: float) -> bool:
        """``WATCHDOG=1`` if due at monotonic ``now``; called on every loop iteration."""
        wait = self.seconds_until_watchdog(now)
        if wait is None or wait > 0:
            return False
        self._last_ping = now  # even if sending fails: retry at the ping rate, not every turn
        return self._send(WATCHDOG=1)

    def fileno(self) -> int:
        """The socket's descriptor (a forked child closes it), or -1."""
        return self._target[0].fileno() if self._target is not None else -1

    def _send(self, **fields: object) -> bool:
        """One datagram of ``KEY=value`` lines; True if the kernel took it."""
        if self._target is None or os.getpid() != self._owner_pid:
            return False
        sock, address = self._target
        # A line break inside a value would start a new assignment: flatten it.
        message = "\n".join(f"{key}={' '.join(str(value).splitlines())}" for key, value in fields.items())
        try:
            sock.sendto(message.encode("utf-8"), address)
        except OSError as exc:
            if not self._failing:
                self._failing = True
                log.warning("systemd notify: send to NOTIFY_SOCKET failed (%s): %s; "
                            "dropping notifications until it works again",
                            errno.errorcode.get(exc.errno or 0, exc.errno), exc)
            return False
        self._failing = False
        return True
