"""Stored functions (and triggers), one file each, re-applied when their text changes.

Numbered migrations (``migrations/<backend>/NNNN_*.sql``) hold the schema's
history: tables, columns, indexes, each applied once. A function is not
history: only its current body matters, and a body restated in full by each
migration that changed it made every change to the claim a new copy of
hundreds of lines. So each function lives in ``functions/<backend>/NAME.sql``
as ``CREATE OR REPLACE FUNCTION`` (repeatable migrations, as Flyway and yoyo
call them), and the migrator re-applies a file

- when its SHA-256 differs from the one recorded in ``everystep_function``
  (a changed body: the change is the file's diff), or
- when a numbered migration was applied in the same run, so a version that
  must drop a function (to change its result type) or alters what a
  ``LANGUAGE sql`` body is checked against gets it back at once.

It runs after the numbered migrations, in their transaction and under their
lock (PostgreSQL: ``pg_advisory_xact_lock``), so two migrators never apply a
file twice, a failure leaves neither half, and a fresh database gets its
functions before anything calls them. Files are applied in name order; a
PL/pgSQL body is only parsed when created, so the order matters only for a
``LANGUAGE sql`` body that calls another function.

PostgreSQL's files are functions; MariaDB's are procedures (``CREATE OR
REPLACE PROCEDURE``, each body between ``-- $$`` marks so that
``split_statements`` keeps it whole; DDL commits at once there, so the
migrator's lock, not a transaction, keeps two migrators apart). SQLite
claims in Python (``queue_claim.py``); its only file holds triggers. The
step does nothing where the record table does not exist yet (a schema
older than the version creating it, as an older release would leave it).

A file may name a status set by placeholder, as the named statements do
(``{active_statuses}``), or a whole vocabulary (``{run_statuses}``,
``{step_statuses}``, ``{request_statuses}``: ``STATUS_DOMAINS``). It is
rendered from ``everystep.models`` when read, and its hash is the rendered
text's, so a status added to the models changes the text and the migrator
re-applies the file: that is how ``statuses.sql``, each backend's check of
what a status column may hold, follows the enums without a numbered
migration or a table rebuild (on PostgreSQL the functions its CHECK
constraints call; on SQLite and MariaDB, triggers).

A file may also take a named statement of the backend's queries whole
(``{statement:record_step}``), its ``%(name)s`` parameters turned into the
function's ``p_name`` arguments: a function that only wraps a statement (so
that its plan is kept per server session, ``step_records.sql``) then never
holds a second copy of it, and a change to the statement changes the
file's text, so the migrator re-applies it.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ... import models
from .. import queries
from ..migrations import split_statements
from ..queries import STATUS_SETS, sql_list

log = logging.getLogger(__name__)

#: Placeholder → every status its column may hold.
STATUS_DOMAINS: dict[str, tuple[str, ...]] = {
    "run_statuses": tuple(models.RunStatus),
    "step_statuses": tuple(models.StepStatus),
    "request_statuses": tuple(models.RequestStatus),
}

#: Only these are rendered (a PL/pgSQL body has braces of its own: '{}');
#: a misspelt one is caught, not left for the database to choke on.
_PLACEHOLDER = re.compile(r"\{(\w*status\w*)\}|\{statement:(\w+)\}")
#: A named statement's parameter (psycopg's style), or its escaped ``%``.
_PARAMETER = re.compile(r"%\((\w+)\)s|%%")


def render(text: str, backend: str | None = None) -> str:
    """``text`` with each status placeholder replaced by its set as an SQL
    list, read from the models now, and each ``{statement:NAME}`` by the
    backend's named statement (``as_function_body``). An unknown one is an
    error, never left in a body the database would reject later."""
    known = {**STATUS_SETS, **STATUS_DOMAINS}

    def rendered(match: re.Match[str]) -> str:
        if match[2] is not None:
            if backend is None:
                raise LookupError(f"{match[0]}: no backend to read the statement from")
            return as_function_body(queries.load(backend)[match[2]])
        if match[1] not in known:
            raise LookupError(f"unknown status placeholder {match[0]}; known: {', '.join(sorted(known))}")
        return sql_list(known[match[1]])

    return _PLACEHOLDER.sub(rendered, text)


def as_function_body(statement: str) -> str:
    """A named statement as a function's body runs it: each ``%(name)s``
    parameter the argument ``p_name``, ``%%`` a ``%``."""
    return _PARAMETER.sub(lambda match: "%" if match[1] is None else f"p_{match[1]}", statement)


@dataclass(frozen=True)
class Function:
    """One file of ``functions/<backend>/``: its name (the file's stem) and
    its text, rendered (``render``)."""

    name: str
    sql: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()

    def statements(self) -> list[str]:
        return split_statements(self.sql)


def available(backend: str) -> list[Function]:
    """The backend's function files, in name order (none: an empty list)."""
    folder = resources.files(__package__).joinpath(backend)
    if not folder.is_dir():
        return []
    found = [Function(entry.name.removesuffix(".sql"), render(entry.read_text(encoding="utf-8"), backend))
             for entry in folder.iterdir() if entry.name.endswith(".sql")]
    return sorted(found, key=lambda function: function.name)


def apply(conn: Any, backend: str, sql: Mapping[str, str], params: Callable[..., dict[str, Any]],
          everything: bool) -> list[str]:
    """Re-apply the function files whose text changed (all of them when
    ``everything``: a numbered migration just ran); returns their names.
    Runs inside the migrator's transaction, on ``conn``."""
    files = available(backend)
    if not files or not conn.execute(sql["function_table_exists"]).fetchone()["present"]:
        return []
    recorded = {row["name"]: row["sha256"] for row in conn.execute(sql["applied_functions"]).fetchall()}
    done = []
    for function in files:
        if not everything and recorded.get(function.name) == function.sha256:
            continue
        for statement in function.statements():
            conn.execute(statement)
        conn.execute(sql["record_function"], params(name=function.name, sha256=function.sha256))
        done.append(function.name)
    if done:
        log.info("applied functions %s", ", ".join(done))
    return done
