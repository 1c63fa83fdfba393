"""The connection provider: how a host framework lends its own connection.

Without it, ``schedule()`` writes through everystep's own connection and
commits at once, and ``get_run()`` / ``get_steps()`` / ``wait()`` read through
it. A framework that owns the application's database connection (Django's
``everystep.contrib.django`` sets this at start-up) installs a provider, and
from then on those calls go through the framework's connection instead, when
no explicit ``conn=`` or ``database=`` is given:

- a run scheduled inside the framework's transaction commits or rolls back
  with it (no second connection, no second copy of the database URL);
- reads see that transaction's own uncommitted runs.

A provider is a zero-argument callable returning a context manager that
yields an open DB-API connection everystep understands (psycopg 3 or
sqlite3). everystep never commits, rolls back or closes it; the context
manager is where the framework translates errors or marks its transaction
as broken. This is the one piece of process-wide state besides the workflow
registry and the fault hook, and it only changes when a host calls
``set_connection_provider``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from .refusals import refused_in_body

ConnectionProvider = Callable[[], AbstractContextManager[Any]]

_provider: ConnectionProvider | None = None
_lock = threading.Lock()


@refused_in_body("set_connection_provider() at start-up, outside workflows (everystep.contrib.django does)",
                 "Installs the host framework's connection for the whole process, once, at start-up.")
def set_connection_provider(provider: ConnectionProvider | None) -> ConnectionProvider | None:
    """Install ``provider`` (``None`` removes it); returns the previous one,
    so a caller can put it back."""
    global _provider
    with _lock:
        previous, _provider = _provider, provider
    return previous


def connection_provider() -> ConnectionProvider | None:
    """The installed provider, or ``None``."""
    return _provider


__all__ = ["ConnectionProvider", "connection_provider", "set_connection_provider"]
