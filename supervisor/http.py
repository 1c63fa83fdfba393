"""``/metrics`` and ``/healthz`` served from the supervisor's event loop.

The parent forks children at any time, so it must not run a server thread;
this is a minimal non-blocking HTTP/1.0 responder instead: read one request
head (bounded size and time), answer it through ``everystep.exposition``,
close. A client that dawdles is dropped; nothing it does can stall the loop
for longer than one response takes to render.
"""

from __future__ import annotations

import logging
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger("everystep.supervisor")

MAX_HEAD = 8192
MAX_CLIENTS = 32

Responder = Callable[[str], tuple[int, str, bytes]]
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    opened: float
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)


class LoopHTTPServer:
    def __init__(self, bind: str, port: int, selector: selectors.BaseSelector, responder: Responder,
                 timeout: float = 5.0) -> None:
        self.selector = selector
        self.responder = responder
        self.timeout = timeout
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, port))
        listener.listen(64)
        listener.setblocking(False)
        self.listener = listener
        self.port = listener.getsockname()[1]
        self._conns: dict[int, _Conn] = {}
        selector.register(listener, selectors.EVENT_READ, self._on_accept)

    def fds(self) -> list[int]:
        return [self.listener.fileno(), *self._conns]

    def _on_accept(self, mask: int) -> None:
        for _ in range(32):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                logger.warning("everystep-supervisor: metrics server cannot accept: %s", exc)
                return
            if len(self._conns) >= MAX_CLIENTS:
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Conn(sock=sock, opened=time.monotonic())
            self._conns[sock.fileno()] = conn
            self.selector.register(sock, selectors.EVENT_READ, lambda m, c=conn: self._on_conn(c, m))

    def _on_conn(self, conn: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_READ and not conn.outbuf:
            try:
                chunk = conn.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close(conn)
                return
            if not chunk:
                self._close(conn)
                return
            conn.inbuf += chunk
            if b"\r\n\r\n" in conn.inbuf or b"\n\n" in conn.inbuf:
                self._answer(conn)
            elif len(conn.inbuf) > MAX_HEAD:
                self._queue(conn, 400, "text/plain", b"request head too large\n")
        if conn.outbuf:
            self._flush(conn)

    def _answer(self, conn: _Conn) -> None:
        request_line = bytes(conn.inbuf.split(b"\n", 1)[0]).decode("latin-1").strip()
        parts = request_line.split()
        if len(parts) < 2:
            self._queue(conn, 400, "text/plain", b"bad request\n")
        elif parts[0] not in ("GET", "HEAD"):
            self._queue(conn, 405, "text/plain", b"only GET\n")
        else:
            try:
                status, content_type, body = self.responder(parts[1])
            except Exception as exc:
                logger.exception("everystep-supervisor: %s failed", parts[1])
                status, content_type, body = 500, "text/plain", f"error: {exc}\n".encode()
            self._queue(conn, status, content_type, b"" if parts[0] == "HEAD" else body, len(body))

    def _queue(self, conn: _Conn, status: int, content_type: str, body: bytes, length: int | None = None) -> None:
        head = (f"HTTP/1.0 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n")
        conn.outbuf += head.encode("latin-1") + body
        self.selector.modify(conn.sock, selectors.EVENT_WRITE, lambda m, c=conn: self._on_conn(c, m))

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        del conn.outbuf[:sent]
        if not conn.outbuf:
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock.fileno(), None) is None:
            return
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def sweep(self, now: float) -> None:
        for conn in list(self._conns.values()):
            if now - conn.opened > self.timeout:
                self._close(conn)

    def close(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn)
        self.selector.unregister(self.listener)
        self.listener.close()
