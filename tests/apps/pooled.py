"""Workflows for the tests of production shapes (a pooler between runners
and PostgreSQL, engine errors), imported by real supervisors and workers.

- ``hops(count)``: ``count`` short steps, each recorded on its own, then
  the last one folded with the run's status: the statements a runner
  sends all day.
- The engine fault: with ``EVERYSTEP_TEST_REFUSE_DIR`` set, importing this
  module installs ``store.base.core.statement_fault`` (in a supervisor's
  parent, so every child inherits it): while the file ``refuse`` in that
  directory exists, every statement named in it (one name a line) is
  refused with a real error of the store's driver (``refusal``), and each
  refusal appends ``<pid> <statement>`` to ``refused`` there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from everystep import step, workflow
from everystep.store.base import core

REFUSE_DIR_ENV = "EVERYSTEP_TEST_REFUSE_DIR"


@step
def hop(value: int) -> int:
    return value + 1


@workflow
def hops(count: int) -> int:
    value = 0
    for _ in range(count - 1):
        value = hop(value)
    return hop(value)


def refusal(backend: str, name: str) -> Exception:
    """What the database says when it refuses statement ``name``: an error
    that is no outage (not a lost connection), in the driver's own type."""
    message = f"permission denied for table everystep_step (statement {name}, refused by the test)"
    if backend in ("postgres", "pgbouncer"):
        import psycopg.errors

        return psycopg.errors.InsufficientPrivilege(message)
    if backend == "mariadb":
        import pymysql

        return pymysql.err.ProgrammingError(1142, message)
    import sqlite3

    return sqlite3.IntegrityError(message)


def refuse_while_told(directory: Path) -> Any:
    """The fault hook: refuse the statements ``directory/refuse`` names."""

    def fault(store: Any, name: str) -> None:
        try:
            names = (directory / "refuse").read_text().split()
        except FileNotFoundError:
            return
        if name in names:
            with open(directory / "refused", "a") as out:
                out.write(f"{os.getpid()} {name}\n")
            raise refusal(store.backend, name)

    return fault


if os.environ.get(REFUSE_DIR_ENV):
    core.statement_fault = refuse_while_told(Path(os.environ[REFUSE_DIR_ENV]))
