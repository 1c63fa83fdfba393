"""Exceptions raised by everystep.

Every class here can be stored on a run or a step row and rebuilt by
``everystep.serde.decode_exception``, so constructors keep their arguments
in ``args`` (the encoder stores ``args`` and the decoder calls the class with
them).
"""

from __future__ import annotations

import importlib
import os
import traceback
from typing import Any

from .body_rules import BodyRule, declare


@declare(BodyRule.PLAIN, "An exception type: raising, catching or building one reaches nothing.")
class EverystepError(Exception):
    """Base class for everystep errors."""


class WorkflowCodeError(EverystepError):
    """The workflow body no longer matches what its run recorded.

    Raised when the function now called at a step id differs from the one
    recorded there, or when a run names a workflow this process does not
    know. Replaying would execute the wrong work, so the run fails loudly;
    deploy code that matches the recorded steps, or start a new run.
    """


class EffectUncertain(EverystepError):
    """A step marked unsafe to repeat may already have performed its effect.

    The step's ``started`` row has no outcome: a process died in the effect
    window, or another claimant holds the step. The engine will not run the
    effect a second time; it ends the run ``blocked``, a holding state that is
    not a failure. Check the external system, then resolve the step with
    ``everystep resolve-step RUN STEP --result JSON | --error MSG | --discard``,
    which puts the run back to ``scheduled``.
    """


class StepFailure(EverystepError):
    """A recorded step failure whose original exception type is unavailable.

    ``type_name`` holds the dotted name that was recorded, so callers can
    still branch on it.
    """

    def __init__(self, message: str = "", type_name: str | None = None) -> None:
        super().__init__(message)
        self.type_name = type_name


class SimulatedCrash(EverystepError):
    """Raised by a test fault hook to simulate a process death mid-step.

    The runner writes nothing more once it sees this, so the database holds
    exactly what a killed process would have left behind.
    """


class DrainOrphan(EverystepError):
    """Raised at a step boundary while the runner drains after a stop signal.

    The step in flight finished and was recorded; no new step starts. The
    runner requeues the run so any runner can resume it from its records.
    """


class ClaimLost(EverystepError):
    """This process no longer owns the run it is executing.

    Another runner requeued or re-claimed it (a drain deadline, an operator,
    an expired lease). Nothing more is written for the run by this process;
    its current owner carries on from the recorded steps.
    """


class WorkflowArgumentsError(EverystepError, TypeError):
    """``schedule()`` was given arguments the workflow's signature cannot
    take; nothing was scheduled (the run would only fail with TypeError
    once claimed)."""


class NameInUse(EverystepError):
    """Another live runner holds the runner name this one was started under.

    Runs are claimed under a runner's name, so two live runners sharing one
    would fence each other's work. Give each runner its own ``--name``; if
    the holder is gone for good but its heartbeat still looks fresh (a frozen
    VM), start with ``--takeover``, which fences everything it held.
    """


class RunNotFound(EverystepError, LookupError):
    """No run has the given id."""


class StoreUnavailable(EverystepError):
    """The database could not be reached or refused the operation."""


class StoreMisconfigured(StoreUnavailable):
    """The database refused this configuration: no such database or role, a
    rejected password, an invalid connection option (``sslmode=bogus``).

    Waiting does not fix it, so a command, or a runner that is starting,
    stops at once (exit 2) with the server's message. It remains a kind of
    ``StoreUnavailable``: a runner already running treats it as an outage,
    as it would a database being restored from a backup.
    """


class StoreError(EverystepError):
    """The database refused one of everystep's statements with an error of
    its own (not a lost connection: that is ``StoreUnavailable``), such as
    a prepared statement a connection pooler lost, a permission revoked, a
    constraint or a bug.

    Raised to a caller of the client API as any ``EverystepError``. Met by
    a runner executing a run, it never fails the run: the run goes back to
    the queue after a growing backoff (its ``error`` says why meanwhile),
    the runner logs it once per run, counts it in
    ``everystep_engine_errors_total{kind}`` and reports itself unhealthy
    (``/healthz``, ``ctl status``) while its statements keep failing.
    ``kind`` is the driver's name for the error (``UndefinedTable``,
    ``InvalidSqlStatementName``…); ``given_back`` how many times the run
    was given back for it so far.
    """

    def __init__(self, message: str = "", kind: str = "", given_back: int = 0) -> None:
        super().__init__(message, kind, given_back)
        self.kind = kind
        self.given_back = given_back

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


#: What the engine's own statements raise when the database fails them: met
#: while executing a run, either one interrupts it (the run is given back,
#: never failed by it). One tuple, so no call site catches one and not the other.
STORE_FAILURES: tuple[type[EverystepError], ...] = (StoreUnavailable, StoreError)


class SchemaMissing(EverystepError):
    """The database has no everystep tables yet: run ``everystep migrate``."""


class StepTimeout(EverystepError):
    """A step ran past its timeout and its process was killed.

    Recorded as the step's failure, so the workflow body sees it at the call
    site like any other step exception and durable cleanup runs.
    """


class StepKilled(EverystepError):
    """An operator killed the step's process through the supervisor."""


class StepResourceExceeded(EverystepError):
    """A step used more memory or CPU than its budget allows.

    The budget is the step's own (``@step(memory_limit="512M", cpu_limit=30)``)
    or the supervisor's default (``--step-memory-limit``, ``--step-cpu-limit``);
    a step whose process the kernel killed for lack of memory fails with it
    too, limit or not. It is recorded as the step's failure, so the body sees
    it at the call site like any step exception, and the run goes on in a
    fresh process when the old one was killed. ``resource`` is ``"memory"``
    or ``"cpu"``; ``limit`` (bytes or CPU seconds) is None when the step had
    none; ``peak`` is how far the step got (memory above its start, or CPU
    seconds), when it is known.
    """

    def __init__(self, message: str = "", resource: str | None = None, limit: float | None = None,
                 peak: float | None = None) -> None:
        super().__init__(message, resource, limit, peak)
        self.resource = resource
        self.limit = limit
        self.peak = peak

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ChildCrashed(EverystepError):
    """The process executing a run died too many times while running it."""


class Cancelled(EverystepError):
    """An operator cancelled the run (``everystep cancel RUN``).

    The run's error, with the operator's reason; a step the cancel cut off
    (its process was killed) is recorded as failed with it too. Final: a
    cancelled run is never resumed, and this is never retried. An
    unsafe-to-repeat step cut off mid-effect keeps its ``started`` row: its
    effect is uncertain, and ``everystep show`` says so.
    """


class WaitTimeout(EverystepError):
    """A durable wait (``recv``, a child's ``result``) ran out of time.

    Recorded as the failure of the waiting step, so the body's try/except
    sees it on every replay; catching it is how a workflow handles "no
    answer in time" (``RecvTimeout``, ``ChildTimeout``)."""


class RecvTimeout(WaitTimeout):
    """``everystep.recv(topic, timeout=...)``: no message on the topic came
    in time. The run goes on from the body's ``except RecvTimeout``; a
    message sent afterwards stays for the next ``recv`` on its topic."""


class ChildTimeout(WaitTimeout):
    """``handle.result(timeout=...)``: the child run did not end in time.
    The child is not touched: it runs on, and a later ``result()`` (a new
    step) may wait for it again."""


class ChildFailed(EverystepError):
    """A child run ended without a result: ``failed``, ``stopped`` (a step
    raised ``Terminal``) or ``cancelled``. Raised by ``handle.result()`` in
    the parent, as the failure of that step.

    ``child_id`` and ``status`` say which child and how it ended; ``error``
    is its encoded error (``everystep.serde``) and ``cause`` the exception
    rebuilt from it (``Terminal``, ``Cancelled``, the original type, or
    ``StepFailure``)."""

    def __init__(self, message: str, child_id: str = "", status: str = "", error: Any = None,
                 cause: BaseException | None = None) -> None:
        super().__init__(message, child_id, status, error)
        self.child_id = child_id
        self.status = status
        self.error = error
        #: Rebuilt from ``error`` where the exception is made (``waits``) or
        #: read back (``serde.decode_exception``): these types know no codec.
        self.cause = cause

    def __str__(self) -> str:
        return str(self.args[0])


class SendRefused(EverystepError):
    """``everystep.send`` to a run that is unknown, finished or cancelled:
    nothing was stored. Send to a run that is still scheduled, running or
    blocked (``everystep show RUN`` says which)."""


class StreamRefused(EverystepError):
    """A stream write was refused and nothing was written: its value is
    past the size bound of one value, its stream past the bound of values
    it may hold (``EVERYSTEP_STREAM_MAX_VALUE_BYTES``,
    ``EVERYSTEP_STREAM_MAX_VALUES``), or it was closed. In a workflow body
    the refusal is recorded as the write's outcome, so every replay raises
    it again; from a step's code it is that attempt's exception."""


class BodyCallRefused(EverystepError):
    """A function a workflow body must not call was called from one: it
    would repeat on every replay, or hold the run's process. Nothing was
    written; the message names the call to use instead (see "What a body
    may call" in the reference)."""


class Suspended(BaseException):
    """Control flow, not an error: the run waits until ``wake_at``.

    Raised where a workflow calls ``everystep.sleep`` or a step failed and
    will be retried after a backoff. It unwinds the scope that waits (the
    body, or one parallel branch); once every other branch has settled or
    waits too, the runner releases the run until the earliest wake time. A
    ``BaseException``, so the workflow's ``except Exception`` clauses let it
    through; never catch it. Never stored.
    """

    def __init__(self, wake_at: Any, what: str | None = None) -> None:
        super().__init__(wake_at)
        self.wake_at = wake_at
        #: What the scope waits for besides the clock (``message "approved"``,
        #: ``child 01a2…``); None for a sleep or a retry's backoff.
        self.what = what


class ContinuedAsNew(BaseException):
    """Control flow, not an error: the body called ``continue_as_new``.

    It unwinds the body; the runner then ends the run ``continued`` and
    starts its successor with ``args_json``, in one transaction. A
    ``BaseException``, so the workflow's ``except Exception`` clauses let
    it through; never catch it. Never stored."""

    def __init__(self, args_json: str) -> None:
        super().__init__(args_json)
        self.args_json = args_json


class Terminal(EverystepError):
    """Raised from a step to stop its workflow deliberately.

    The step is recorded as failed with this exception, no further step
    starts and the run ends ``stopped``: not a failure, never reported as one.
    The caller reads ``reason`` and ``payload`` back from ``run.error`` with
    ``everystep.serde.decode_exception`` and takes over.
    """

    def __init__(self, reason: Any, payload: Any = None) -> None:
        super().__init__(reason, payload)
        self.reason = reason
        self.payload = payload

    def __str__(self) -> str:
        return str(self.reason)


def _in_importlib(filename: str) -> bool:
    return os.path.dirname(os.path.abspath(filename)) == _IMPORTLIB_DIR


_IMPORTLIB_DIR = os.path.dirname(os.path.abspath(importlib.__file__))


def describe(exc: BaseException) -> str:
    """``Type: message (file:line)`` on one line, the line being where the
    failure happened (the deepest frame, or a SyntaxError's own position):
    what an operator needs when an app module fails to import."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        text = exc.msg
        where = f"{exc.filename}:{exc.lineno}"
    else:
        # The import machinery's own frames (<frozen importlib._bootstrap>)
        # say nothing about the app: name the deepest frame of real code.
        frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
                  if not frame.filename.startswith("<") and not _in_importlib(frame.filename)]
        if frames:
            where = f"{frames[-1].filename}:{frames[-1].lineno}"
    return f"{type(exc).__name__}: {text}" + (f" ({where})" if where else "")


__all__ = [
    "Cancelled",
    "ChildCrashed",
    "ClaimLost",
    "DrainOrphan",
    "EffectUncertain",
    "EverystepError",
    "NameInUse",
    "RunNotFound",
    "SchemaMissing",
    "SimulatedCrash",
    "StepFailure",
    "StepKilled",
    "StepResourceExceeded",
    "StepTimeout",
    "StoreError",
    "StoreMisconfigured",
    "StoreUnavailable",
    "Suspended",
    "Terminal",
    "WorkflowArgumentsError",
    "WorkflowCodeError",
]
