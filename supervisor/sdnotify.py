"""The systemd notify protocol (sd_notify(3)) over ``NOTIFY_SOCKET``, stdlib only.

Under ``Type=notify`` systemd considers the service started only once the main
process sends ``READY=1``, shows ``STATUS=`` in ``systemctl status``, and with
``WatchdogSec=`` restarts the service if ``WATCHDOG=1`` stops arriving.  A
single datagram on an AF_UNIX socket carries newline-separated ``KEY=value``
assignments; that is small enough that pulling in a dependency for it is not
worth it.

Contract:

* Outside systemd (``NOTIFY_SOCKET`` unset or unusable) every method is a
  no-op, so callers never branch on "am I under systemd?".
* Sending never raises and never blocks.  The socket is non-blocking: a
  receiver whose queue is full (``EAGAIN``), a vanished socket path
  (``ENOENT``) or a dead receiver (``ECONNREFUSED``) costs one warning on the
  ``everystep.supervisor`` logger and the message is dropped.  A lost
  notification is harmless next to a supervisor loop that stalls.
* Only the process that created the :class:`Notifier` speaks.  A forked
  child inherits the object (and the socket, which is close-on-exec only
  across ``exec``); with ``NotifyAccess=main`` systemd would drop its
  messages anyway, and a child's ``WATCHDOG=1`` must never vouch for a hung
  parent.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections.abc import Mapping

__all__ = ["Notifier"]

log = logging.getLogger("everystep.supervisor")

# The variables systemd sets for a notify service.  Removed on request so
# forked children and subprocesses (workflow steps may run anything) do not
# talk to systemd on the supervisor's behalf.
_ENV_KEYS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def _parse_address(value: str) -> bytes | None:
    """Turn ``NOTIFY_SOCKET`` into an AF_UNIX address, or None if unusable.

    ``@name`` is Linux's abstract namespace (leading NUL byte); ``/path`` is a
    filesystem socket.  Anything else (relative paths, systemd 253's
    ``vsock:`` addresses) is not something an AF_UNIX socket can reach.
    """
    if value.startswith("@") and len(value) > 1:
        return b"\0" + os.fsencode(value[1:])
    if value.startswith("/"):
        return os.fsencode(value)
    return None


def _parse_positive_int(value: str | None) -> int | None:
    """An int > 0, or None for unset/garbage: a bad value disables, never crashes."""
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if number > 0 else None


def _monotonic_usec() -> int:
    """CLOCK_MONOTONIC in µs: the clock systemd compares MONOTONIC_USEC with."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class Notifier:
    """Talks to systemd for one process; a silent no-op outside systemd.

    Build it with :meth:`from_env`.  The supervisor calls :meth:`ready` once
    the children are up, :meth:`status` on changes, :meth:`maybe_watchdog`
    on every loop iteration, :meth:`reloading` / :meth:`ready` around a
    reload and :meth:`stopping` when a drain starts.
    """

    def __init__(
        self,
        address: bytes | None = None,
        *,
        watchdog_usec: int | None = None,
        watchdog_pid: int | None = None,
    ) -> None:
        """Open the socket for ``address`` (an AF_UNIX address) if given.

        Prefer :meth:`from_env`; this exists so the address and watchdog
        settings can be given directly.
        """
        self._address = address
        self._watchdog_usec = watchdog_usec
        self._watchdog_pid = watchdog_pid
        # Whoever builds the notifier is the process systemd knows about.
        self._owner_pid = os.getpid()
        self._last_watchdog: float | None = None
        # True while a failure has been reported and no send succeeded since:
        # one warning per outage, not one per loop iteration.
        self._failing = False
        self._sock: socket.socket | None = None
        if address is not None:
            try:
                self._sock = socket.socket(
                    socket.AF_UNIX,
                    socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK,
                )
            except OSError as exc:
                log.warning("systemd notify disabled: cannot create socket: %s", exc)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        unset: bool = False,
    ) -> Notifier:
        """Build from ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID``.

        ``environ`` defaults to ``os.environ``.  With ``unset=True`` those
        three variables are then removed from ``os.environ`` (like
        sd_notify's ``unset_environment``) so that children forked or spawned
        later do not inherit them; the returned notifier keeps working.
        """
        env = os.environ if environ is None else environ
        raw_socket = env.get("NOTIFY_SOCKET") or None
        watchdog_usec = _parse_positive_int(env.get("WATCHDOG_USEC"))
        raw_pid = env.get("WATCHDOG_PID")
        watchdog_pid = _parse_positive_int(raw_pid)
        # A WATCHDOG_PID we cannot parse names nobody: treat it as not ours.
        if raw_pid is not None and watchdog_pid is None:
            watchdog_usec = None
        if unset:
            for key in _ENV_KEYS:
                os.environ.pop(key, None)

        address: bytes | None = None
        if raw_socket is not None:
            address = _parse_address(raw_socket)
            if address is None:
                log.warning(
                    "systemd notify disabled: unsupported NOTIFY_SOCKET=%r "
                    "(expected an absolute path or @abstract name)",
                    raw_socket,
                )
        return cls(address, watchdog_usec=watchdog_usec, watchdog_pid=watchdog_pid)

    # -- state ---------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """True when there is a socket to systemd (messages may still fail)."""
        return self._sock is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between pings: half of ``WATCHDOG_USEC``, as systemd advises.

        None when no watchdog is configured, or ``WATCHDOG_PID`` names another
        process (the watchdog is then that process's job, not ours).
        """
        if self._watchdog_usec is None:
            return None
        if self._watchdog_pid is not None and self._watchdog_pid != os.getpid():
            return None
        return self._watchdog_usec / 2 / 1_000_000

    # -- low level -----------------------------------------------------------

    def send(self, message: str) -> bool:
        """Send one raw datagram; True if the kernel accepted it.

        Never raises and never blocks: failures are logged once per outage and
        swallowed, because nothing the caller could do about them is worth
        stalling the supervisor loop for.
        """
        sock = self._sock
        if sock is None or self._address is None:
            return False
        if os.getpid() != self._owner_pid:
            log.debug("systemd notify: not sending from forked pid %d", os.getpid())
            return False
        try:
            sock.sendto(message.encode("utf-8"), self._address)
        except OSError as exc:
            self._report_failure(exc)
            return False
        if self._failing:
            log.info("systemd notify: sending works again")
            self._failing = False
        return True

    def notify(self, **fields: object) -> bool:
        """Send ``KEY=value`` assignments, in the given order, as one datagram.

        Newlines inside a value are replaced by spaces: the protocol separates
        assignments with newlines, so a stray one in a status text would
        otherwise inject a field.
        """
        if not fields:
            return False
        lines = []
        for key, value in fields.items():
            text = str(value).replace("\r", " ").replace("\n", " ")
            lines.append(f"{key}={text}")
        return self.send("\n".join(lines))

    # -- the well-known assignments ------------------------------------------

    def ready(self, status: str | None = None) -> bool:
        """``READY=1``: start-up (or a reload) is complete."""
        if status is None:
            return self.notify(READY=1)
        return self.notify(READY=1, STATUS=status)

    def status(self, text: str) -> bool:
        """``STATUS=``: the one-line state shown by ``systemctl status``."""
        return self.notify(STATUS=text)

    def stopping(self, status: str | None = None) -> bool:
        """``STOPPING=1``: a drain started, so systemd shows "deactivating"."""
        if status is None:
            return self.notify(STOPPING=1)
        return self.notify(STOPPING=1, STATUS=status)

    def reloading(self, status: str | None = None) -> bool:
        """``RELOADING=1`` with ``MONOTONIC_USEC=``; follow with :meth:`ready`.

        systemd ≥ 253 matches the timestamp against the reload request and
        ignores a RELOADING=1 without it; older versions ignore the extra
        field, so it is always sent.
        """
        if status is None:
            return self.notify(RELOADING=1, MONOTONIC_USEC=_monotonic_usec())
        return self.notify(
            RELOADING=1, MONOTONIC_USEC=_monotonic_usec(), STATUS=status
        )

    def watchdog(self, now: float | None = None) -> bool:
        """``WATCHDOG=1`` now; ``now`` (monotonic) restarts the interval count."""
        self._last_watchdog = time.monotonic() if now is None else now
        return self.notify(WATCHDOG=1)

    # -- watchdog pacing for an event loop -----------------------------------

    def watchdog_due(self, now: float) -> bool:
        """True when a ping is owed at monotonic time ``now``.

        Always False without a watchdog; True on the first call, then once
        :attr:`watchdog_interval` has elapsed since the last ping.
        """
        interval = self.watchdog_interval
        if interval is None or self._sock is None:
            return False
        return self._last_watchdog is None or now - self._last_watchdog >= interval

    def maybe_watchdog(self, now: float) -> bool:
        """Ping if due; True only when a ping was sent and accepted.

        Meant to be called on every loop iteration with ``time.monotonic()``.
        The interval restarts even if the send failed, so a broken socket is
        retried at the ping rate rather than on every iteration.
        """
        if not self.watchdog_due(now):
            return False
        return self.watchdog(now)

    def seconds_until_watchdog(self, now: float) -> float | None:
        """How long the loop may block before the next ping is owed.

        None without a watchdog; use it to cap the selector timeout so a quiet
        loop still pings in time.
        """
        interval = self.watchdog_interval
        if interval is None or self._sock is None:
            return None
        if self._last_watchdog is None:
            return 0.0
        return max(0.0, self._last_watchdog + interval - now)

    # -- lifetime ------------------------------------------------------------

    def fileno(self) -> int:
        """The socket's descriptor, or -1 (a forked child closes it)."""
        return self._sock.fileno() if self._sock is not None else -1

    def close(self) -> None:
        """Close the socket; later calls become no-ops.  Idempotent."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Notifier(address={self._address!r}, "
            f"watchdog_interval={self.watchdog_interval!r}, enabled={self.enabled})"
        )

    def _report_failure(self, exc: OSError) -> None:
        """Warn on the first failure of an outage; later ones only at debug."""
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        if self._failing:
            log.debug("systemd notify: send failed again (%s): %s", name, exc)
            return
        self._failing = True
        log.warning(
            "systemd notify: send to NOTIFY_SOCKET failed (%s): %s; "
            "dropping notifications until it works again",
            name,
            exc,
        )
