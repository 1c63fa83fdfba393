"""Transactional steps: exactly once for a step's writes to the engine's database.

A plain step's effect and its record are two commits, so a process that
dies between them runs the effect again on the next claim (at-least-once).
A ``@step(transactional=True)`` writes to the engine's own database through
``step_connection()``, inside the transaction that also writes its record:
one commit ends both.

    @step(transactional=True)
    def mark_paid(order_id):
        step_connection().execute("UPDATE orders SET paid = true WHERE id = %s", (order_id,))

Its life, in ``runner.run_step``::

    BEGIN                    opened(): before the body (SQLite: BEGIN IMMEDIATE)
      the body's statements  step_connection() is this transaction's connection
      the step's record      record(): fenced by the claim, holding the run's row
    COMMIT                   both, or (an exception, a refused record) ROLLBACK

- Crash windows: none between the writes and the record. A process that
  dies before the commit leaves neither, and the replay runs the step
  again; after it, both, and the replay returns the recorded result. So
  such a step never needs ``unsafe_to_repeat`` (declaring both is refused)
  and never leaves its run ``blocked``.
- An exception in the body rolls its writes back; the failure is then
  recorded as for any step (on its own), and retries apply: a retried
  attempt begins a fresh transaction.
- Fencing: a stale executor's record is refused and its transaction rolls
  back, its writes with it. A step timeout or a cancel kills the child as
  for any step: the open transaction dies with its connection.
- The step must not commit or roll back: the driver's ``commit()`` and
  ``rollback()`` raise ``EverystepError`` while the step runs, and a
  ``COMMIT`` sent as SQL is found after the body and fails the step.
- Parallel branches run on their own threads, so each transactional step
  in them has its own connection and its own transaction.
- On SQLite the transaction holds the database's write lock from its start
  (``BEGIN IMMEDIATE``): keep such steps short, as every other writer waits.
- Outside a running workflow a transactional step is a plain call, and
  ``step_connection()`` raises: there is no transaction to join.

A host framework that owns the application's connection (Django: see
``everystep.contrib.django.steps``) installs a ``TransactionProvider``;
the step's transaction is then the framework's, on the framework's
connection, so its ORM writes join it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from .errors import EverystepError, SimulatedCrash
from .refusals import refused_in_body
from .store.base.step_transactions import FAILED_INSIDE, OWN_COMMIT, StepTransaction
from .store.base.values import Marker, NewStep, StepWrite

if TYPE_CHECKING:
    from .registry import DeclaredStep
    from .context import Context, Execution
    from .models import StepRecord
    from .store import Store

#: A host framework's way to open a step's transaction on its own connection:
#: called with the executing store; returns a context manager yielding the
#: ``StepTransaction``, or None to leave it to the store (another database).
TransactionProvider = Callable[["Store"], "AbstractContextManager[StepTransaction] | None"]

_provider: TransactionProvider | None = None

#: The transaction of the transactional step running on this thread.
_open: contextvars.ContextVar[StepTransaction | None] = contextvars.ContextVar(
    "everystep_step_transaction", default=None)

#: Test hook, called ``(ctx, step_id, phase)`` around a transactional step's
#: commit: ``"committing"`` once its record is written and before COMMIT,
#: ``"committed"`` right after. Raising ``SimulatedCrash`` (or a SIGKILL of
#: the process) there leaves the database as a process death would.
commit_fault: Callable[[Context, str, str], None] | None = None


@refused_in_body("step_connection() in the code of a @step(transactional=True) step the body calls",
                 "Its connection is the transaction of a transactional step, which a body is not.")
def step_connection() -> Any:
    """The DB-API connection of the engine's database, inside the transaction
    that will also record the running transactional step: a
    ``psycopg.Connection`` on PostgreSQL, a ``sqlite3.Connection`` on
    SQLite, a PyMySQL connection on MariaDB. Run the step's SQL on it; never
    commit or roll it back."""
    tx = _open.get()
    if tx is None or not tx.open:
        raise EverystepError("step_connection() is only available inside a @step(transactional=True) step "
                             "running in a workflow")
    return tx.connection


def set_transaction_provider(provider: TransactionProvider | None) -> TransactionProvider | None:
    """Install ``provider`` (None removes it); returns the previous one."""
    global _provider
    previous, _provider = _provider, provider
    return previous


def check_declaration(unsafe_to_repeat: bool) -> None:
    """``@step(transactional=True, unsafe_to_repeat=True)`` is refused."""
    if unsafe_to_repeat:
        raise EverystepError("a transactional step is exactly once (its writes commit with its record), so it is "
                             "never unsafe to repeat: drop unsafe_to_repeat= or transactional=")


@contextlib.contextmanager
def opened(ex: Execution, step: DeclaredStep) -> Iterator[StepTransaction | None]:
    """The step's transaction, open while the step runs and is recorded
    (None for a plain step). Whatever it has not committed on the way out
    rolls back; the database failing to begin it interrupts the run."""
    if not step.transactional:
        yield None
        return
    with contextlib.ExitStack() as stack:
        try:
            opening = _provider(ex.store) if _provider is not None else None
            tx = stack.enter_context(opening if opening is not None else ex.store.step_transaction())
        except EverystepError as exc:
            # The database is away (the run is requeued), or the step cannot
            # run here (the run fails): either way no step starts.
            raise ex.interrupt_with(exc) from None
        token = _open.set(tx)
        tx.guard(True)
        own: BaseException | None = None
        try:
            yield tx
        except BaseException as exc:
            if exc is not tx.body_error:
                raise
            own = exc
        finally:
            _open.reset(token)
    if own is not None:
        # The step's own failure (its SQL's, say), recorded as such: raised
        # to the body past the store's choke point, which would have taken
        # a driver error of the step's for one of the engine's.
        raise own


def body_ended(tx: StepTransaction, error: Exception | None) -> Exception | None:
    """Once the body returned or raised: its error, or the one for a body
    that ended the transaction itself. A failed body's writes roll back
    now, before its failure is recorded (on its own, as any step's)."""
    tx.guard(False)
    if error is None and tx.ended_by_body():
        tx.open = False
        error = EverystepError(OWN_COMMIT)
    elif error is None and tx.failed_in_body():
        error = EverystepError(FAILED_INSIDE)
    if error is not None:
        tx.body_error = error
        tx.rollback()
    return error


def record(ex: Execution, ctx: Context, tx: StepTransaction, entry: NewStep,
           decoded: StepRecord, markers: Sequence[Marker] = ()) -> StepWrite | None:
    """Write the step's record (after ``markers``) in its transaction and
    commit all of it (``LOST`` or a racing execution's record: rolled back)."""
    write = tx.record(ex.claim, entry, decoded, markers)
    if write is None or not write.ours:
        return write
    _fault(ex, ctx, entry.step_id, "committing")
    tx.commit()
    _fault(ex, ctx, entry.step_id, "committed")
    return write


def _fault(ex: Execution, ctx: Context, step_id: str, phase: str) -> None:
    if commit_fault is None:
        return
    try:
        commit_fault(ctx, step_id, phase)
    except SimulatedCrash as crash:
        raise ex.interrupt_with(crash) from None


__all__ = ["TransactionProvider", "commit_fault", "set_transaction_provider", "step_connection"]
