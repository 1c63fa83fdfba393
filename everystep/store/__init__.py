"""Storage: all SQL lives in this package; the rest of everystep speaks to a Store.

``connect(url)`` picks the backend from the URL scheme:
``postgresql://…`` (or ``postgres://…``) for PostgreSQL, ``sqlite:///path.db``
for the embedded default. ``resolve_url`` applies the lookup order every
command uses: explicit URL, then ``EVERYSTEP_DATABASE_URL``, then
``sqlite:///everystep.db``.
"""

from __future__ import annotations

import os
import threading

from ..errors import EverystepError
from .base import LOST, ClaimState, NewStep, RunnerInfo, Store, StepWrite, new_run_id, utcnow

DEFAULT_URL = "sqlite:///everystep.db"
ENV_VAR = "EVERYSTEP_DATABASE_URL"


def resolve_url(url: str | None = None) -> str:
    return url or os.environ.get(ENV_VAR) or DEFAULT_URL


def connect(url: str | None = None) -> Store:
    """Open a Store for ``url`` (resolved as ``resolve_url`` does)."""
    url = resolve_url(url)
    scheme = url.split(":", 1)[0].lower()
    if scheme in ("postgresql", "postgres") or scheme.startswith("postgresql+"):
        from .postgres import PostgresStore

        return PostgresStore(url.replace("postgresql+psycopg://", "postgresql://", 1))
    if scheme == "sqlite":
        from .sqlite import SQLiteStore

        return SQLiteStore(url)
    raise EverystepError(f"unsupported database URL {url!r}: expected postgresql://… or sqlite:///path.db")


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
    "DEFAULT_URL",
    "ENV_VAR",
    "LOST",
    "ClaimState",
    "NewStep",
    "RunnerInfo",
    "Store",
    "StepWrite",
    "close_default_stores",
    "connect",
    "default_store",
    "new_run_id",
    "resolve_url",
    "utcnow",
]
