"""Versioned schema, one directory per backend.

Files are named ``NNNN_description.sql`` and applied in order, each once,
inside one transaction with the version row that records it. A version
recorded as ``reserved`` (a placeholder from an older release) is applied
when a real migration of that number exists. The backends
serialise concurrent ``migrate`` calls (an advisory lock on PostgreSQL,
``BEGIN IMMEDIATE`` on SQLite), so two processes migrating at once apply
each version exactly once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

#: The name of a version recorded before its migration existed (a number
#: kept free so backends stay numbered alike). When the real file arrives,
#: the migrator applies it over the placeholder and renames the record.
PLACEHOLDER = "reserved"

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    def statements(self) -> list[str]:
        return split_statements(self.sql)


def split_statements(sql: str) -> list[str]:
    """Split a file into statements: each ends with ``;`` at the end of a
    line, outside a dollar-quoted function body. Comment lines before a
    statement are dropped."""
    out: list[str] = []
    buffer: list[str] = []
    in_body = False
    for line in sql.splitlines():
        stripped = line.strip()
        if not buffer and (not stripped or stripped.startswith("--")):
            continue
        buffer.append(line)
        if stripped.count("$$") % 2:
            in_body = not in_body
        if not in_body and stripped.endswith(";") and not stripped.startswith("--"):
            out.append("\n".join(buffer).strip().rstrip(";"))
            buffer = []
    if "".join(buffer).strip():
        out.append("\n".join(buffer).strip().rstrip(";"))
    return out


def available(backend: str) -> list[Migration]:
    folder = resources.files(__package__).joinpath(backend)
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda migration: migration.version)


def latest(backend: str) -> int:
    return max(migration.version for migration in available(backend))
