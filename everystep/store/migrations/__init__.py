"""Versioned schema, one directory per backend.

Files are named ``NNNN_description.sql`` and applied in order, each once,
inside one transaction with the version row that records it. The backends
serialise concurrent ``migrate`` calls (an advisory lock on PostgreSQL,
``BEGIN IMMEDIATE`` on SQLite), so two processes migrating at once apply
each version exactly once.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from importlib import resources

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    def statements(self) -> list[str]:
        """Split the file into statements (migrations hold no procedural code,
        so a statement ends where SQLite says it is complete)."""
        out: list[str] = []
        buffer = ""
        for line in self.sql.splitlines(keepends=True):
            if not buffer and (not line.strip() or line.lstrip().startswith("--")):
                continue
            buffer += line
            if sqlite3.complete_statement(buffer):
                out.append(buffer.strip().rstrip(";"))
                buffer = ""
        if buffer.strip():
            out.append(buffer.strip().rstrip(";"))
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
