"""A real console for tests: uvicorn on a loopback socket, in a thread.

``ConsoleServer`` binds 127.0.0.1 on a free port, serves
``everystep.web.app(...)`` with uvicorn from a background thread and stops
it at the end; requests go over real HTTP (httpx). ``client()`` is a
browser-like session: it loads a page first, so it holds the CSRF cookie
and sends the page's token with every POST, as the console's script does.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn

from everystep.web import app as console_app
from everystep.web.serve import open_socket

START_TIMEOUT = 30.0


class ConsoleServer:
    def __init__(self, database_url: str, **options: Any) -> None:
        self.app = console_app(database_url, **options)
        self.store = self.app.console.store
        self.sock = open_socket("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=1, log_config=None)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="console-server", daemon=True)

    def start(self) -> ConsoleServer:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise AssertionError("the console server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.app.console.watcher.stop()  # end open streams first, as everystep ui does
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
        self.app.console.watcher.stop()

    def client(self, **options: Any) -> Session:
        return Session(self.url, **options)


class Session(httpx.Client):
    """An httpx client that behaves like the console's page script."""

    def __init__(self, base_url: str, **options: Any) -> None:
        options.setdefault("timeout", 30.0)
        super().__init__(base_url=base_url, **options)
        self.csrf = ""

    def load_page(self, path: str = "/") -> httpx.Response:
        response = self.get(path)
        match = re.search(r'data-csrf="([^"]*)"', response.text)
        if match:
            self.csrf = match.group(1)
        return response

    def act(self, path: str, body: dict[str, Any] | None = None, **options: Any) -> httpx.Response:
        if not self.csrf:
            self.load_page()
        headers = {"x-csrf-token": self.csrf, **options.pop("headers", {})}
        return self.post(path, json=body or {}, headers=headers, **options)


def serve(database_url: str, **options: Any) -> Iterator[ConsoleServer]:
    server = ConsoleServer(database_url, **options).start()
    try:
        yield server
    finally:
        server.stop()
