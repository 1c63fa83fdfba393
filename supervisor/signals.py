"""Signals to the supervisor parent: handlers only record, the loop acts.

gunicorn learned it the hard way: a handler that logs, reaps or touches the
database can deadlock on a lock the interrupted code holds. Here a handler
appends the signal number to a queue, and ``signal.set_wakeup_fd`` wakes
the parent's ``select``; ``SignalQueue.pop_all`` hands the signals to the
loop, which does the work.
"""

from __future__ import annotations

import collections
import os
import selectors
import signal

HANDLED = (
    signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP,
    signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD,
)


class SignalQueue:
    def __init__(self) -> None:
        self._pending: collections.deque[int] = collections.deque()
        self._read_fd = self._write_fd = -1

    def install(self, selector: selectors.BaseSelector) -> None:
        self._read_fd, self._write_fd = os.pipe()
        for fd in (self._read_fd, self._write_fd):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for sig in HANDLED:
            signal.signal(sig, self._record)
        selector.register(self._read_fd, selectors.EVENT_READ, self._drain)

    def _record(self, signum: int, frame: object) -> None:
        self._pending.append(signum)

    def _drain(self, mask: int) -> None:
        try:
            while os.read(self._read_fd, 4096):
                pass
        except BlockingIOError:
            pass

    @property
    def waiting(self) -> bool:
        return bool(self._pending)

    def pop_all(self) -> list[int]:
        signals = []
        while self._pending:
            signals.append(self._pending.popleft())
        return signals

    def fds(self) -> list[int]:
        """Descriptors a forked child must close."""
        return [fd for fd in (self._read_fd, self._write_fd) if fd >= 0]

    def uninstall(self, selector: selectors.BaseSelector) -> None:
        signal.set_wakeup_fd(-1)
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_DFL)
        if self._read_fd >= 0:
            try:
                selector.unregister(self._read_fd)
            except (KeyError, ValueError):
                pass
        for fd in self.fds():
            os.close(fd)
        self._read_fd = self._write_fd = -1
