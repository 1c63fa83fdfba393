"""``/metrics`` and ``/healthz`` over HTTP.

``respond`` is the whole protocol, shared by the threaded worker's server
(a ``ThreadingHTTPServer`` on its own thread) and the supervisor's, which is
served from its event loop because the parent must never hold a thread
while it forks.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import metrics
from .engine_errors import EngineHealth
from .store import Store

logger = logging.getLogger("everystep")


def bind_error(bind: str, port: int, exc: OSError) -> str:
    """The one line to say when the metrics port cannot be served."""
    return f"cannot serve metrics on {bind}:{port}: {exc.strerror or exc}"


def respond(path: str, store: Store | None, engine: EngineHealth | None = None) -> tuple[int, str, bytes]:
    """(status, content type, body) for a GET of ``path``. ``/healthz`` is
    503 while the database is unreachable or while the runner's engine
    statements keep failing (``engine``)."""
    route = path.split("?", 1)[0]
    if route == "/metrics":
        body, content_type = metrics.render(store)
        return 200, content_type, body
    if route in ("/healthz", "/health"):
        ok, reason = metrics.health(store) if store is not None else (True, "ok")
        failing = engine.failing() if engine is not None and ok else None
        if failing is not None:
            ok, reason = False, failing
        return (200 if ok else 503), "text/plain; charset=utf-8", (reason + "\n").encode()
    return 404, "text/plain; charset=utf-8", b"not found: try /metrics or /healthz\n"


class ThreadedMetricsServer:
    """HTTP server for ``everystep worker --metrics-port``."""

    def __init__(self, port: int, bind: str, store: Store | None, engine: EngineHealth | None = None) -> None:
        server_store = store

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                try:
                    status, content_type, body = respond(self.path, server_store, engine)
                except Exception as exc:  # never let a scrape kill the thread
                    logger.exception("everystep: /metrics failed")
                    status, content_type, body = 500, "text/plain", f"error: {exc}\n".encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((bind, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="everystep-metrics", daemon=True)

    def start(self) -> ThreadedMetricsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
