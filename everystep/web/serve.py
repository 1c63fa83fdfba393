"""``everystep ui``: serve the console with uvicorn.

The console binds 127.0.0.1 by default and then answers only requests
addressed to a loopback name (no DNS rebinding). Any other address exposes
it to the network, so it refuses to start without a token: one line, exit
code 2. The socket is bound here, before uvicorn starts, so a busy port is
that same one-line error, and ``--port 0`` picks a free port; the first
line printed is the console's address. TERM or INT ends the open streams
and stops the server: exit code 0.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from types import FrameType

from ..errors import EverystepError
from .app import create_app
from .security import LOOPBACK_HOSTS

logger = logging.getLogger("everystep.console")

#: Seconds open streams get to finish when the server stops.
SHUTDOWN_GRACE = 2


def is_loopback(bind: str) -> bool:
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        return False


def open_socket(bind: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise EverystepError(f"--port {port} is not a port number (0-65535)")
    try:
        infos = socket.getaddrinfo(bind.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise EverystepError(f"cannot listen on {bind}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise EverystepError(f"cannot listen on {bind}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def serve(database_url: str, *, bind: str = "127.0.0.1", port: int = 8765, auth_token: str | None = None,
          app_modules: str | Sequence[str] | None = None, read_database_url: str | None = None) -> int:
    if not is_loopback(bind) and not auth_token:
        raise EverystepError(
            f"--bind {bind} would expose the console beyond this host: set --auth-token "
            "(or EVERYSTEP_UI_AUTH_TOKEN), or bind 127.0.0.1 and use a proxy that authenticates"
        )
    import uvicorn

    sock = open_socket(bind, port)
    host, bound_port = sock.getsockname()[:2]
    allowed = list(LOOPBACK_HOSTS) if is_loopback(bind) else None
    app = create_app(database_url, auth_token=auth_token, allowed_hosts=allowed, app_modules=app_modules,
                     read_database_url=read_database_url)
    shown = f"[{host}]" if ":" in host else host
    reads = f", pages read from {app.console.views.store.describe()}" if read_database_url else ""
    print(f"everystep console on http://{shown}:{bound_port}/ ({app.console.store.describe()}{reads})", flush=True)
    if auth_token:
        print("authentication: token required (Bearer, or as the basic-auth password)", flush=True)
    config = uvicorn.Config(app, log_level=logging.getLogger().level or logging.INFO, access_log=False,
                            lifespan="on", timeout_graceful_shutdown=SHUTDOWN_GRACE, log_config=None)
    watcher = app.console.watcher

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            watcher.stop()  # end the open streams, or shutdown would wait for them
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # As uvicorn does, minus raising the signal again once shut down:
            # a stop on TERM/INT is the normal end of this command (exit 0).
            original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    server = Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        app.console.watcher.stop()
    sys.stdout.flush()
    return 0
