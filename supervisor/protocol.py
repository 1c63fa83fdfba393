"""Messages between the supervisor and its children: JSON lines on a socketpair.

The parent reads without blocking from its event loop; a child reads with a
short timeout so it can notice a drain or a dead parent between runs. EOF on
the parent's end is how it learns that a child died, in the same wait as
everything else.

Parent → child: ``{"op": "run", "run": {...}}``, ``{"op": "exit"}``.
Child → parent: ``ready``, ``step`` (a step started), ``step_end``, ``done``
(a run reached a resting point), ``bye`` (leaving on purpose, with a reason).
"""

from __future__ import annotations

import json
import select
import socket
import time
from typing import Any

MAX_MESSAGE = 64 * 1024 * 1024


class ChannelClosed(Exception):
    """The other end is gone."""


class Channel:
    """One end of a parent/child socketpair."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = bytearray()

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: dict[str, Any], timeout: float = 10.0) -> None:
        """Send one message, waiting at most ``timeout`` for buffer space
        (the socket may be non-blocking). Raises ``ChannelClosed``."""
        data = memoryview((json.dumps(message, separators=(",", ":")) + "\n").encode())
        deadline = time.monotonic() + timeout
        while data:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ChannelClosed("peer is not reading") from None
                select.select([], [self.sock], [], remaining)
                continue
            except OSError as exc:
                raise ChannelClosed(str(exc)) from None
            data = data[sent:]

    def read_available(self) -> tuple[list[dict[str, Any]], bool]:
        """Read what is waiting without blocking: (messages, peer_closed)."""
        closed = False
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            self._buffer += chunk
            if len(self._buffer) > MAX_MESSAGE:
                closed = True
                break
        return self._split(), closed

    def receive(self, timeout: float) -> dict[str, Any] | None:
        """Blocking read of one message with a timeout (child side)."""
        messages = self._split(limit=1)
        if messages:
            return messages[0]
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return None
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ChannelClosed("EOF")
        self._buffer += chunk
        messages = self._split(limit=1)
        return messages[0] if messages else None

    def _split(self, limit: int | None = None) -> list[dict[str, Any]]:
        messages = []
        while limit is None or len(messages) < limit:
            end = self._buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                messages.append(message)
        return messages

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
