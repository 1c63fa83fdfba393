"""Which Django connection everystep uses, and the URL its own processes use.

Scheduling, reading and ``manage.py migrate`` go through Django's connection
for the configured alias. everystep's own processes (the worker and the
supervisor started by the management commands, and the admin's resolve
action, which needs a transaction of its own) open their own connections, so
they need a URL everystep's ``connect()`` understands: ``database_url``
derives it from the alias's settings exactly as Django interprets them
(``OPTIONS``, ``service``, test database names), so the URL is never written
twice. One builder per Django vendor; a vendor without one (MySQL/MariaDB,
until everystep speaks it) is refused with a clear error.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

from django.db import connections

from everystep.store import Store, default_store

from . import conf
from .conf import UnsupportedDatabase

#: Connection parameters Django hands psycopg that are not libpq settings.
_NOT_LIBPQ = frozenset({"context", "cursor_factory", "prepare_threshold"})


def connection(alias: str | None = None) -> Any:
    """Django's connection (``DatabaseWrapper``) for ``alias`` or the
    configured one, checked to be one everystep can use."""
    alias = alias or conf.get().database
    if alias not in connections.settings:
        raise UnsupportedDatabase(f"settings.EVERYSTEP['DATABASE'] is {alias!r}, which is not in settings.DATABASES")
    wrapper = connections[alias]
    check_supported(wrapper)
    return wrapper


def check_supported(wrapper: Any) -> None:
    if wrapper.vendor == "sqlite":
        return
    if wrapper.vendor == "postgresql":
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        if is_psycopg3:
            return
        raise UnsupportedDatabase(
            f"database {wrapper.alias!r} uses psycopg2; everystep needs psycopg 3 (pip install 'psycopg[binary]'; "
            "Django 4.2+ prefers it when both are installed)"
        )
    raise UnsupportedDatabase(
        f"database {wrapper.alias!r} uses Django's {wrapper.vendor} backend; everystep supports PostgreSQL and SQLite"
    )


def database_url(wrapper: Any) -> str:
    """An everystep URL for the database behind ``wrapper``."""
    check_supported(wrapper)
    return _URL_BUILDERS[wrapper.vendor](wrapper)


def store(alias: str | None = None) -> Store:
    """The process-wide everystep Store for the configured database."""
    return default_store(database_url(connection(alias)))


def _sqlite_url(wrapper: Any) -> str:
    if wrapper.is_in_memory_db():
        raise UnsupportedDatabase(
            f"database {wrapper.alias!r} is an in-memory SQLite database, which only Django's own connection can "
            "reach: everystep's worker, supervisor and admin actions need a file (for tests, set "
            "DATABASES[...]['TEST']['NAME'] to a file path)"
        )
    name = os.fspath(wrapper.settings_dict["NAME"])
    if name.startswith("file:"):  # Django opens SQLite with uri=True
        name = unquote(urlsplit(name).path)
    if "?" in name:
        raise UnsupportedDatabase(f"SQLite database path {name!r} contains '?', which everystep URLs cannot carry")
    return "sqlite:///" + os.path.abspath(name)


def _postgres_url(wrapper: Any) -> str:
    """``postgresql://user:password@host:port/dbname?libpq-options``, every
    part percent-encoded (libpq decodes them), credentials in the authority
    so everystep's logs redact the password."""
    params = {
        key: value for key, value in wrapper.get_connection_params().items()
        if key not in _NOT_LIBPQ and value is not None
    }
    user = str(params.pop("user", "") or "")
    password = str(params.pop("password", "") or "")
    host = str(params.pop("host", "") or "")
    port = str(params.pop("port", "") or "")
    dbname = str(params.pop("dbname", "") or "")
    authority = ""
    if user or password:
        authority = quote(user, safe="") + (":" + quote(password, safe="") if password else "") + "@"
    if host and "," not in host:
        authority += f"[{host}]" if ":" in host and not host.startswith("/") else quote(host, safe="")
        if port:
            authority += f":{port}"
    else:
        # No host (libpq's default socket) or several hosts: as parameters.
        params.update({key: value for key, value in (("host", host), ("port", port)) if value})
    url = f"postgresql://{authority}/{quote(dbname, safe='')}"
    if params:
        url += "?" + urlencode(sorted((key, str(value)) for key, value in params.items()), quote_via=quote, safe="")
    return url


# The MariaDB backend plugs in here ("mysql": _mysql_url) once everystep has one.
_URL_BUILDERS: dict[str, Callable[[Any], str]] = {
    "postgresql": _postgres_url,
    "sqlite": _sqlite_url,
}
