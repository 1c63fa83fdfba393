"""Django's connection, lent to everystep (installed by the AppConfig).

``everystep.schedule()`` (and ``get_run``/``get_steps``/``wait``) without
``conn=`` or ``database=`` run their statements on the raw DB-API connection
behind ``django.db.connections[EVERYSTEP["DATABASE"]]``, in the calling
thread's connection, so they join whatever ``transaction.atomic()`` block
(or savepoint) is open: a run scheduled in a block that rolls back never
existed, one scheduled in a block that commits is claimable at that commit.

The statements get Django's treatment of its own queries where it matters:
an atomic block already marked for rollback refuses them, driver errors come
out as ``django.db`` exceptions, and an error inside an atomic block marks
it for rollback even if the caller catches the exception.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.db import transaction

from . import database


@contextlib.contextmanager
def django_connection() -> Iterator[Any]:
    wrapper = database.connection()
    wrapper.validate_no_broken_transaction()
    with transaction.mark_for_rollback_on_error(using=wrapper.alias), wrapper.wrap_database_errors:
        wrapper.ensure_connection()
        yield wrapper.connection
