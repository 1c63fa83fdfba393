"""An app whose import starts a thread and opens a network connection
before the supervisor forks: what the supervisor warns about at start."""

from __future__ import annotations

import socket
import threading

from everystep import step, workflow

_stop = threading.Event()
POLLER = threading.Thread(target=_stop.wait, name="app-poller", daemon=True)
POLLER.start()
LISTENER = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
LISTENER.bind(("127.0.0.1", 0))
LISTENER.listen()
CONNECTION = socket.create_connection(LISTENER.getsockname())


@step
def hello() -> str:
    return "hello"


@workflow
def greet() -> str:
    return hello()
