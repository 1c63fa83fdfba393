"""Storage: all SQL lives in this package; the rest of everystep speaks to a Store.

``connect(url)`` picks the backend from the URL scheme:
``postgresql://…`` (or ``postgres://…``) for PostgreSQL, ``sqlite:///path.db``
for the embedded default, ``mariadb://…`` (or ``mysql://…``) for MariaDB. ``resolve_url`` applies the lookup order every
command uses: explicit URL, then ``EVERYSTEP_DATABASE_URL``, then
``sqlite:///everystep.db``. ``backend_for_connection`` finds the backend of
a caller's own connection (``schedule(conn=...)``).

A backend is one module here, one ``queries/<backend>.sql``, one
``migrations/<backend>/`` folder and one line in ``BACKENDS``.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any

from ..errors import EverystepError
from . import pooling
from .base import (
    LOST, ClaimState, DebounceWindow, Marker, NewStep, Notifications, RunnerInfo, Store, StepWrite, StreamBounds,
    StreamItem, StreamSummary, new_run_id, utcnow,
)

DEFAULT_URL = "sqlite:///everystep.db"
ENV_VAR = "EVERYSTEP_DATABASE_URL"

#: URL scheme → the Store class implementing it ("module:Class", imported on use).
BACKENDS: dict[str, str] = {
    "postgresql": "everystep.store.postgres:PostgresStore",
    "postgres": "everystep.store.postgres:PostgresStore",
    "sqlite": "everystep.store.sqlite:SQLiteStore",
    "mariadb": "everystep.store.mariadb:MariaDBStore",
    "mysql": "everystep.store.mariadb:MariaDBStore",
}


def resolve_url(url: str | None = None) -> str:
    return url or os.environ.get(ENV_VAR) or DEFAULT_URL


def _backend(path: str) -> type[Store]:
    module, name = path.split(":")
    cls: type[Store] = getattr(importlib.import_module(module), name)
    return cls


def connect(url: str | None = None, statement_timeout: float | None = None, read_only: bool = False,
            listen_url: str | None = None) -> Store:
    """Open a Store for ``url`` (resolved as ``resolve_url`` does).

    ``statement_timeout`` bounds every statement (and connecting), in
    seconds; by default the backend's own limits apply. ``read_only``: a
    store that never writes nor migrates, and whose sessions the database
    itself holds read-only (``everystep replay``, against a replica or a
    role granted SELECT only). ``listen_url`` (PostgreSQL; else
    ``EVERYSTEP_LISTEN_DATABASE_URL``): where runners LISTEN, a direct
    connection when ``url`` goes through a transaction pooler
    (``?pooler=transaction``, see ``store.pooling``)."""
    url = resolve_url(url)
    scheme = url.split(":", 1)[0].lower()
    scheme, _, driver = scheme.partition("+")  # SQLAlchemy-style postgresql+psycopg://
    if scheme not in BACKENDS:
        expected = ", ".join(f"{name}://…" for name in BACKENDS)
        raise EverystepError(f"unsupported database URL {url!r}: expected one of {expected}")
    if driver:
        url = scheme + url[url.index(":"):]
    cls = _backend(BACKENDS[scheme])
    options: dict[str, Any] = {"read_only": True} if read_only else {}
    if cls.backend == "postgres":
        options["listen_url"] = listen_url or os.environ.get(pooling.LISTEN_ENV_VAR) or None
    elif listen_url:
        raise EverystepError(f"a LISTEN database URL is for PostgreSQL; {scheme}:// runners need none")
    return cls(url, statement_timeout, **options)


def backend_for_connection(conn: Any) -> type[Store]:
    """The Store class whose backend ``conn`` (a caller's own DB-API
    connection) belongs to."""
    drivers = []
    for path in dict.fromkeys(BACKENDS.values()):
        try:
            cls = _backend(path)
        except ImportError:  # an optional driver that is not installed
            continue
        if cls.accepts(conn):
            return cls
        drivers.append(cls.driver)
    named = " or ".join([", ".join(drivers[:-1]), drivers[-1]] if len(drivers) > 2 else drivers)
    raise EverystepError(f"conn must be a {named} connection, not {type(conn).__name__}")


_defaults: dict[tuple[str, int], Store] = {}
_defaults_lock = threading.Lock()


def default_store(url: str | None = None) -> Store:
    """The process-wide Store for ``url``, opened on first use.

    Keyed by pid as well as URL, so a forked child never reuses its parent's.
    """
    key = (resolve_url(url), os.getpid())
    with _defaults_lock:
        store = _defaults.get(key)
        if store is None:
            store = _defaults[key] = connect(key[0])
        return store


def close_default_stores() -> None:
    """Close the connections of every default Store of this process."""
    with _defaults_lock:
        stores = [store for (url, pid), store in _defaults.items() if pid == os.getpid()]
    for store in stores:
        store.close()


__all__ = [
    "BACKENDS",
    "DEFAULT_URL",
    "ENV_VAR",
    "LOST",
    "ClaimState",
    "DebounceWindow",
    "Marker",
    "NewStep",
    "Notifications",
    "RunnerInfo",
    "Store",
    "StepWrite", "StreamBounds", "StreamItem", "StreamSummary",
    "backend_for_connection",
    "close_default_stores",
    "connect",
    "default_store",
    "new_run_id",
    "resolve_url",
    "utcnow",
]
