"""The control socket: one JSON object per line each way (``protocol``),
served from the supervisor's event loop without ever blocking it.

Hostile clients are expected. The socket file is mode 0600 and every
connection's peer uid is checked (SO_PEERCRED: our uid or root). A line
longer than ``max_line`` gets an error and the connection is closed; a
client that sends nothing for ``idle_timeout`` seconds, or stops reading its
replies, is dropped; past ``max_clients`` new connections are closed at once.
The request handler's failures become error replies: nothing a client sends
can stop or stall the supervisor. The handler learns who asked (the peer's
pid and uid), so every operator action is logged with its author.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from everystep.vocabulary import INVALID_COMMAND

from .protocol import MAX_CONTROL_LINE, ErrorReply, LineReader, ProtocolError, Reply, Request, decode, encode

logger = logging.getLogger("everystep.supervisor")

MAX_PENDING_OUTPUT = 1024 * 1024
MAX_UNIX_PATH = 107


@dataclass(frozen=True)
class Peer:
    """Who is on the other end of a control connection (SO_PEERCRED)."""

    pid: int | None
    uid: int | None

    def __str__(self) -> str:
        return f"ctl pid {self.pid} uid {self.uid}"


Handler = Callable[[Request, str], Reply]
"""Answers a request; the second argument says who asked, for the log."""


class ControlSocketError(Exception):
    """The control socket cannot be opened (path in use, too long, …)."""


@dataclass(eq=False)
class _Client:
    sock: socket.socket
    peer: Peer
    last_active: float
    reader: LineReader
    outbuf: bytearray = field(default_factory=bytearray)
    close_after_flush: bool = False


def peer_of(sock: socket.socket) -> Peer:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return Peer(None, None)
    pid, uid, _gid = struct.unpack("3i", creds)
    return Peer(pid, uid)


class ControlServer:
    def __init__(
        self,
        path: str,
        handler: Handler,
        selector: selectors.BaseSelector,
        max_clients: int = 64,
        max_line: int = MAX_CONTROL_LINE,
        idle_timeout: float = 10.0,
        on_request: Callable[[str], None] | None = None,
    ) -> None:
        self.path = path
        self.handler = handler
        self.selector = selector
        self.max_clients = max_clients
        self.max_line = max_line
        self.idle_timeout = idle_timeout
        self.on_request = on_request
        self.allowed_uids = {os.geteuid(), 0}
        self._listener: socket.socket | None = None
        self._clients: dict[int, _Client] = {}

    # -- lifecycle ---------------------------------------------------------------

    def open(self) -> None:
        if len(os.fsencode(self.path)) > MAX_UNIX_PATH:
            raise ControlSocketError(f"control socket path is too long for a Unix socket: {self.path}")
        self._remove_stale()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # created 0600: no window where others could connect
        try:
            listener.bind(self.path)
        except OSError as exc:
            listener.close()
            raise ControlSocketError(f"cannot bind control socket {self.path}: {exc.strerror}") from None
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self.selector.register(listener, selectors.EVENT_READ, self._on_accept)

    def _remove_stale(self) -> None:
        if not os.path.exists(self.path):
            return
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(self.path)
        except OSError:
            os.unlink(self.path)  # nobody listening: a leftover of a dead supervisor
            return
        finally:
            probe.close()
        raise ControlSocketError(f"another supervisor is already listening on {self.path}")

    def fds(self) -> list[int]:
        """Descriptors a forked child must close."""
        fds = [client.sock.fileno() for client in self._clients.values()]
        if self._listener is not None:
            fds.append(self._listener.fileno())
        return fds

    def close(self) -> None:
        for client in list(self._clients.values()):
            self._drop(client)
        if self._listener is not None:
            self.selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
            try:
                os.unlink(self.path)
            except OSError:
                pass

    # -- connections ---------------------------------------------------------------

    def _on_accept(self, mask: int) -> None:
        assert self._listener is not None
        for _ in range(64):  # bounded: never starve the rest of the loop
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    logger.warning("everystep-supervisor: control socket cannot accept: %s", exc.strerror)
                    return
                raise
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        peer = peer_of(sock)
        if peer.uid not in self.allowed_uids:
            self._reply_and_close(sock, ErrorReply("permission denied"))
            logger.warning("everystep-supervisor: refused control connection from uid %s (pid %s)",
                           peer.uid, peer.pid)
            return
        if len(self._clients) >= self.max_clients:
            self._reply_and_close(sock, ErrorReply("too many control connections"))
            return
        client = _Client(sock=sock, peer=peer, last_active=time.monotonic(), reader=LineReader(self.max_line))
        self._clients[sock.fileno()] = client
        self.selector.register(sock, selectors.EVENT_READ, lambda mask, c=client: self._on_client(c, mask))

    @staticmethod
    def _reply_and_close(sock: socket.socket, reply: Reply) -> None:
        try:
            sock.send(encode(reply))
        except OSError:
            pass
        sock.close()

    def _on_client(self, client: _Client, mask: int) -> None:
        if mask & selectors.EVENT_READ and not client.close_after_flush:
            self._read(client)
        if client.sock.fileno() in self._clients and mask & selectors.EVENT_WRITE:
            self._flush(client)

    def _read(self, client: _Client) -> None:
        try:
            chunk = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(client)
            return
        if not chunk:
            self._drop(client)
            return
        client.last_active = time.monotonic()
        try:
            lines = client.reader.feed(chunk)
        except ProtocolError as exc:
            lines = []
            self._send(client, ErrorReply(str(exc)))
            client.close_after_flush = True
        for line in lines:
            if line.strip():
                self._send(client, self._answer(line, client.peer))
        self._flush(client)

    def _answer(self, line: bytes, peer: Peer) -> Reply:
        try:
            request = decode(line, Request.KEY)
        except ProtocolError as exc:
            if self.on_request is not None and b'"cmd"' in line:
                self.on_request(INVALID_COMMAND)
            return ErrorReply(str(exc))
        if self.on_request is not None:
            self.on_request(request.TAG)
        assert isinstance(request, Request)
        try:
            return self.handler(request, str(peer))
        except Exception as exc:  # a handler bug must not take the loop down
            logger.exception("everystep-supervisor: control request %r failed", request.TAG)
            return ErrorReply(f"internal error: {type(exc).__name__}: {exc}")

    def _send(self, client: _Client, reply: Reply) -> None:
        client.outbuf += encode(reply)
        if len(client.outbuf) > MAX_PENDING_OUTPUT:
            self._drop(client)  # not reading its replies

    def _flush(self, client: _Client) -> None:
        if client.sock.fileno() not in self._clients:
            return
        while client.outbuf:
            try:
                sent = client.sock.send(client.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(client)
                return
            del client.outbuf[:sent]
        if not client.outbuf and client.close_after_flush:
            self._drop(client)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.outbuf else 0)
        self.selector.modify(client.sock, events, lambda mask, c=client: self._on_client(c, mask))

    def _drop(self, client: _Client) -> None:
        fd = client.sock.fileno()
        if self._clients.pop(fd, None) is None:
            return
        try:
            self.selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()

    def sweep(self, now: float) -> None:
        """Drop clients silent for longer than ``idle_timeout`` (half-open,
        or connected and never sending)."""
        for client in list(self._clients.values()):
            if now - client.last_active > self.idle_timeout:
                self._drop(client)
