"""``manage.py migrate`` applies everystep's schema (a ``post_migrate`` receiver).

everystep's tables are versioned by everystep's own migrations
(``everystep/store/migrations/``), not by Django's: after Django has
migrated the configured alias, this applies every everystep version still
missing, through Django's own connection (so it reaches exactly what Django
migrated: the test database, an in-memory SQLite database, a connection
with its ``OPTIONS``). It is the same migrator ``everystep migrate`` runs,
with the same lock and version table, so the two commands can be used in
any order, repeatedly or concurrently, and a newer everystep's versions are
applied by the next ``manage.py migrate`` with no Django migration to write.
The Django models over these tables are unmanaged: Django never alters them.
"""

from __future__ import annotations

import sys
from typing import Any

from django.db import connections

from everystep.store import borrowed

from . import conf, database


def migrate_schema(sender: Any, *, using: str, verbosity: int = 1, **kwargs: Any) -> list[str]:
    """Apply pending everystep migrations to ``using`` if it is everystep's
    database; returns the versions applied."""
    settings = conf.get()
    if not settings.migrate or using != settings.database:
        return []
    wrapper = connections[using]
    database.check_supported(wrapper)
    if wrapper.in_atomic_block:
        raise conf.UnsupportedDatabase("everystep's schema must be migrated outside transaction.atomic()")
    with wrapper.wrap_database_errors:
        wrapper.ensure_connection()
        applied = borrowed.migrate(wrapper.connection)
    if applied and verbosity >= 1:
        out = kwargs.get("stdout") or sys.stdout
        out.write(f"  Applied everystep schema {', '.join(applied)}\n")
    return applied
