"""Transactional steps on Django's connection (installed by the AppConfig).

A ``@step(transactional=True)`` of a Django project runs in a
``transaction.atomic()`` block that everystep opens on Django's own
connection for ``EVERYSTEP["DATABASE"]`` (in the executing thread), when
the run executes against that database: the step's ORM writes, any
``transaction.atomic(using=...)`` block inside it (a savepoint) and
``step_connection()`` (the raw connection behind it) all join the
transaction that also writes the step's record, and one commit ends them.
Django's own rules hold inside: ``transaction.commit()`` there is refused
by Django (``TransactionManagementError``).

A run executed against another database keeps everystep's own connection.
A transactional step cannot start inside an atomic block already open on
that alias (its commit would not be the block's): refused, with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, transaction

from everystep.errors import EverystepError, StoreUnavailable
from everystep.store import Store
from everystep.store.base.step_transactions import StepTransaction

from . import database
from .conf import UnsupportedDatabase


def django_step_transaction(store: Store) -> AbstractContextManager[StepTransaction] | None:
    """The step's transaction on Django's connection, or None when the run
    executes against another database than the everystep alias's."""
    try:
        wrapper = database.connection()
        if database.database_url(wrapper) != store.url:
            return None
    except UnsupportedDatabase:
        return None  # not a database everystep runs on: the run's is another
    if wrapper.in_atomic_block:
        raise EverystepError(
            f"a transactional step cannot run inside an open transaction.atomic() block on database "
            f"{wrapper.alias!r}: it commits with its record"
        )
    return _atomic(store, wrapper)


@contextlib.contextmanager
def _atomic(store: Store, wrapper: Any) -> Iterator[StepTransaction]:
    block = transaction.atomic(using=wrapper.alias)
    try:
        block.__enter__()
    except (OperationalError, InterfaceError) as exc:
        raise StoreUnavailable(f"database {wrapper.alias!r} unavailable: {exc}") from exc
    open_ = [True]

    def end(rollback: bool) -> None:
        if not open_[0]:
            return
        open_[0] = False
        if rollback:
            transaction.set_rollback(True, using=wrapper.alias)
        try:
            block.__exit__(None, None, None)
        except DatabaseError as exc:
            # The driver's own error, which the store maps (unavailable or refused).
            raise (exc.__cause__ or exc) from exc

    try:
        wrapper.ensure_connection()
        raw = wrapper.connection
        with StepTransaction.on(store, raw, lambda: end(False), lambda: end(True),
                                ended=lambda: not wrapper.in_atomic_block,
                                failed=lambda: bool(wrapper.needs_rollback) or store.transaction_failed(raw)) as tx:
            yield tx
    finally:
        end(True)
