"""Transactional steps: a step's own SQL and its record in one transaction.

A ``@step(transactional=True)`` runs its statements on a connection of this
store inside a transaction the store began (``step_transaction``); its
record is written in that same transaction, by a statement that is fenced
like every executor write *and* holds the run's row until the commit
(``record_step_locked``: ``FOR SHARE`` on PostgreSQL, ``LOCK IN SHARE
MODE`` on MariaDB; on SQLite ``BEGIN IMMEDIATE`` holds the database's write
lock from the start). So a claim that bumps the epoch either commits before
the record is written (the record is refused, everything rolls back) or
waits for the commit (the record is there for the next executor to replay).

Crash windows: none between the step's writes and its record. A process
that dies before the commit leaves neither (the server rolls the
transaction back with its connection); after, both. A refused record, a
record a racing execution wrote first, or a failing body rolls back.

The transaction is on a pooled connection of this store, or, where a host
framework owns the application's connection (Django), on the framework's
connection inside its own transaction block (``StepTransaction.on``); the
record then goes through a cursor that reads like ours, as
``schedule_on`` does. The driver's ``commit()`` and ``rollback()`` on a
connection of ours refuse while the step's transaction is open
(``CommitGuard``), so a step cannot end the transaction its record belongs
to.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ...errors import EverystepError
from ...models import Claim, StepRecord
from .core import StoreCore
from .values import Marker, NewStep, StepWrite

if TYPE_CHECKING:
    from . import Store

#: Said by the guard and by a transaction found ended after the body.
OWN_COMMIT = ("a transactional step must not commit or roll back its transaction: everystep commits it with "
              "the step's record (raise an exception to roll the step back)")
#: Said of a body that caught the error of one of its statements and returned.
FAILED_INSIDE = ("a statement of this transactional step failed and its transaction can only roll back; "
                 "the step returned anyway, so its writes are rolled back and the step fails")


class CommitGuard:
    """Mixed into a backend's connection class: ``commit()`` and
    ``rollback()`` refuse while a step's transaction is open on it."""

    #: Set by ``StepTransaction`` while the step's body runs (an instance attribute then).
    everystep_step_open: bool = False

    def everystep_lend(self, lent: bool) -> None:
        """The step's body starts (True) or ended (False) using this
        connection; a backend may set it up for its user meanwhile."""
        self.everystep_step_open = lent

    def commit(self) -> None:
        if self.everystep_step_open:
            raise EverystepError(OWN_COMMIT)
        super().commit()  # type: ignore[misc]

    def rollback(self) -> None:
        if self.everystep_step_open:
            raise EverystepError(OWN_COMMIT)
        super().rollback()  # type: ignore[misc]


class StepTransaction:
    """One transactional step's transaction: the connection handed to the
    step (``connection``), then its record, commit or rollback."""

    def __init__(self, store: Store, raw: Any, executor: Any,
                 commit: Callable[[], None], rollback: Callable[[], None],
                 ended: Callable[[], bool] | None = None, failed: Callable[[], bool] | None = None) -> None:
        #: The DB-API connection the step's body uses.
        self.connection = raw
        self._store = store
        self._executor = executor  # runs our statements (rows by name)
        self._commit = commit
        self._rollback = rollback
        self._ended = ended or (lambda: not store.in_transaction(raw))
        self._failed = failed or (lambda: store.transaction_failed(raw))
        self.open = True
        #: How the step's body failed (its own doing, recorded as its failure).
        self.body_error: BaseException | None = None

    @classmethod
    @contextlib.contextmanager
    def on(cls, store: Store, raw: Any, commit: Callable[[], None], rollback: Callable[[], None],
           ended: Callable[[], bool], failed: Callable[[], bool]) -> Iterator[StepTransaction]:
        """A transaction a host framework began on its own connection
        ``raw``: ``commit`` and ``rollback`` end it the framework's way,
        ``ended`` says whether the body ended it, ``failed`` whether it can
        only roll back."""
        with store._caller_cursor(raw) as cursor:
            tx = cls(store, raw, cursor, commit, rollback, ended, failed)
            try:
                yield tx
            finally:
                tx.close()

    def guard(self, on: bool) -> None:
        """While the body runs, the driver's commit/rollback refuse."""
        if isinstance(self.connection, CommitGuard):
            self.connection.everystep_lend(on)

    def ended_by_body(self) -> bool:
        """Whether the body ended the transaction itself (``COMMIT`` as SQL)."""
        with self._mapped():
            return self._ended()

    def failed_in_body(self) -> bool:
        """Whether a statement of the body failed and the transaction can
        only roll back (the body caught the error and returned)."""
        with self._mapped():
            return self._failed()

    def record(self, claim: Claim, step: NewStep, decoded: StepRecord | None = None,
               markers: Sequence[Marker] = ()) -> StepWrite | None:
        """Write the step's record (after the patch ``markers`` it carries)
        in this transaction, fenced by ``claim`` and holding the run's row to
        the commit. Not ours (``LOST``, or a racing execution's record):
        rolled back, nothing of the step stays."""
        store = self._store
        params = store._step_params(claim, step)
        with self._mapped():
            store._record_markers(self._executor, params, markers)
            row = self._executor.execute(store.sql[store.step_record_statement], params).fetchone()
            if row is not None:
                return StepWrite(store._written(claim, step, decoded, row), ours=True)
            conflict = store._conflict(self._executor, params)
        self.rollback()
        return conflict

    def commit(self) -> None:
        with self._mapped():
            self.open = False
            self._commit()

    def rollback(self) -> None:
        if not self.open:
            return
        with self._mapped():
            self.open = False
            self._rollback()

    def close(self) -> None:
        """Roll back whatever was not committed (an exception, a crash)."""
        self.guard(False)
        if self.open:
            with contextlib.suppress(EverystepError):
                self.rollback()

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[None]:
        """Driver errors as the store's choke point says them."""
        store = self._store
        try:
            yield
        except EverystepError:
            raise
        except (*store._unavailable, *store._driver_errors) as exc:
            raise store.error_for(exc) from exc


class StepTransactions(StoreCore):
    """The store's side of transactional steps."""

    #: The statement that records a step inside its transaction.
    step_record_statement: ClassVar[str] = "record_step_locked"

    @contextlib.contextmanager
    def step_transaction(self) -> Iterator[StepTransaction]:
        """Begin a transaction on a connection of this store's pool for a
        transactional step; whatever is not committed when it closes rolls
        back. The connection goes back to the pool afterwards (a broken one
        is discarded by ``connection()``)."""
        with self.connection() as conn:
            conn.execute(self.sql["begin_write"])
            tx = StepTransaction(self, self._raw(conn), conn,  # type: ignore[arg-type]
                                 lambda: conn.execute(self.sql["commit"]),
                                 lambda: conn.execute(self.sql["rollback"]))
            try:
                yield tx
            finally:
                tx.close()

    def _raw(self, conn: Any) -> Any:
        """The DB-API connection behind a pooled one (the step's)."""
        return conn

    def in_transaction(self, raw: Any) -> bool:
        """Whether the DB-API connection ``raw`` is inside a transaction."""
        return bool(raw.in_transaction)

    def transaction_failed(self, raw: Any) -> bool:
        """Whether ``raw``'s transaction can only roll back (PostgreSQL's
        aborted state; elsewhere a failed statement leaves it usable)."""
        return False
