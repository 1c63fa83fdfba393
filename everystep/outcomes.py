"""Settling a run or a step from outside its replay: the writes a runner
makes when an execution could not make them itself.

The runner records what a workflow body does as it runs. When the body
cannot (the process executing it was killed on a timeout or by an operator,
it crashed again and again, it crashed outside the runner, a drain hands it
back), the runner or the supervisor settles the run with one of these
functions. Each write carries the execution's ``Claim``, so it is refused if
the run moved on, and each keeps the metrics and Sentry in step with what
was written, in one place for the threaded worker, the supervisor parent
and its children alike.
"""

from __future__ import annotations

import datetime as dt
import logging

from . import metrics, sentry, serde
from .models import FAILED, STEP_FAILED, STEP_RETRYING, Claim, Outcome, Run
from .store import NewStep, Store, utcnow

logger = logging.getLogger("everystep")


def fail_step(store: Store, claim: Claim, workflow: str, step_id: str, step_name: str,
              exc: BaseException, attempt: int = 1, started_at: dt.datetime | None = None) -> bool:
    """Record attempt ``attempt`` of step ``step_id`` as failed with ``exc``
    (a ``StepTimeout``, ``StepKilled``, ``StepResourceExceeded``…), so the
    body's try/except sees it on replay like any step failure. False if the
    claim is gone or the step was recorded. (Its process is gone: nothing
    measured its cost.) ``started_at``: when the step started, as its
    executor saw it (else now: it then shows as taking no time)."""
    error = serde.dumps(serde.encode_exception(exc), "step error")
    write = store.record_step(claim, NewStep(step_id, step_name, None, None, started_at or utcnow(),
                                             status=STEP_FAILED, error_json=error, attempt=attempt))
    ours = write is not None and write.ours
    if ours:
        metrics.record(lambda m: m.step_runs.labels(workflow, step_name, STEP_FAILED).inc())
    return ours


def fail_run(store: Store, claim: Claim, run: Run, exc: BaseException) -> bool:
    """End the run ``failed`` with ``exc``, reported like any failed run.
    False if the claim is gone."""
    error = serde.dumps(serde.encode_exception(exc), "run error")
    if not store.finish_run(claim, FAILED, None, error):
        return False
    metrics.record(lambda m: m.workflow_runs.labels(run.name, FAILED).inc())
    sentry.report_failure(exc, run.id, run.name, runner=claim.claimer)
    # Warning, not error: it is reported to Sentry explicitly above, and
    # Sentry's logging integration would report an error line again.
    logger.warning("everystep %s: run %s (%s) failed: %s", claim.claimer, run.id, run.name, exc,
                   extra={"run_id": run.id, "workflow": run.name, "event": "run_failed"})
    return True


def retry_step(store: Store, claim: Claim, workflow: str, step_id: str, step_name: str, attempt: int,
               exc: BaseException, delay: float, started_at: dt.datetime | None = None) -> bool:
    """Record attempt ``attempt`` of step ``step_id`` as failed with ``exc``
    (a ``StepTimeout``) and to be retried ``delay`` seconds from now: the
    replay of the run finds the step ``retrying`` and waits for it. False if
    the claim is gone or the step was recorded."""
    now = utcnow()
    error = serde.dumps(serde.encode_exception(exc), "step error")
    write = store.record_attempt(claim, NewStep(step_id, step_name, None, None, started_at or now,
                                                status=STEP_RETRYING,
                                                error_json=error, attempt=attempt,
                                                wake_at=now + dt.timedelta(seconds=delay)))
    ours = write is not None and write.ours
    if ours:
        metrics.record(lambda m: m.step_retries.labels(workflow, step_name).inc())
    return ours


def fail_cancelled_step(store: Store, claim: Claim, workflow: str, step_id: str, step_name: str,
                        exc: BaseException, attempt: int = 1, started_at: dt.datetime | None = None) -> bool:
    """Record the step a cancel cut off (its process was killed) as failed
    with ``exc`` (``Cancelled``): the one write the holder of a cancelled
    claim may still make. False if the run was not cancelled under
    ``claim`` or the step has an outcome."""
    error = serde.dumps(serde.encode_exception(exc), "step error")
    written = store.record_cancelled_step(claim, NewStep(step_id, step_name, None, None, started_at or utcnow(),
                                                         status=STEP_FAILED, error_json=error, attempt=attempt))
    if written:
        metrics.record(lambda m: m.step_runs.labels(workflow, step_name, STEP_FAILED).inc())
    return written


def release(store: Store, claim: Claim, not_before: dt.datetime) -> bool:
    """Give the run back to the queue until ``not_before`` (it waits for a
    sleep or a retry). False if the claim is gone."""
    return store.release(claim, not_before)


def requeue(store: Store, claim: Claim) -> bool:
    """Give the run back to the queue (counted as a requeue of its runner).
    False if the claim is gone."""
    if not store.requeue(claim):
        return False
    metrics.record(lambda m: m.requeued.labels(claim.claimer).inc())
    return True


def log_outcome(log: logging.Logger, who: str, run: Run, outcome: Outcome, where: str = "", **fields: object) -> None:
    """One line per run that ended here, as loud as its outcome declares
    (``Outcome.log_level``): failures and blocks stand out (WARNING), the
    rest stay out of the way of a busy runner (DEBUG)."""
    detail = " (no longer held by this runner; it stopped without writing more)" if outcome == Outcome.LOST else ""
    log.log(outcome.log_level, "%s: run %s (%s) %s%s%s", who, run.id, run.name, outcome, where, detail,
            extra={"run_id": run.id, "workflow": run.name, "event": f"run_{outcome}", **fields})


__all__ = ["fail_cancelled_step", "fail_run", "fail_step", "log_outcome", "release", "requeue", "retry_step"]
