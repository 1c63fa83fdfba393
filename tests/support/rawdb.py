"""A plain driver connection to a test database, of the test's own: no
Store, so no pool, no migration (a SQLite store migrates on opening), in
autocommit."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Any

import psycopg

from tests.support.pgbouncer import libpq_url


@contextlib.contextmanager
def reader(url: str) -> Iterator[Any]:
    """A plain connection to ``url`` (SQLite, PostgreSQL or MariaDB), in autocommit."""
    if url.startswith("sqlite"):
        conn: Any = sqlite3.connect(url[len("sqlite:///"):], isolation_level=None, timeout=30)
    elif url.startswith("postgres"):
        conn = psycopg.connect(libpq_url(url), autocommit=True)
    else:
        import pymysql

        from everystep.store.mariadb import connect_args

        conn = pymysql.connect(**connect_args(url), autocommit=True)
    try:
        yield conn
    finally:
        conn.close()
