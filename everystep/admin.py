"""Operator actions on runs, shared by the ``everystep`` CLI, the console
and the supervisor's control socket: resolve a blocked step, requeue, cancel.

Each action checks the run's state inside a transaction that holds the
run's row lock, and refuses with ``AdminError`` (a one-line explanation)
anything that does not fit, so a mistyped command can never corrupt a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import new_run, serde
from .context import step_sort_key
from .errors import Cancelled, EverystepError, StepFailure
from .models import (
    ACTIVE_STATUSES, BLOCKED, CANCELLABLE_STATUSES, RUNNING, STEP_DONE, STEP_FAILED, STEP_STARTED, Run, StepRecord,
)
from .store import RunnerInfo, Store
from .store.base.waits import Sent
from .patches import PATCH_STEP, is_marker
from .wait_kinds import CHILD
from .waiting import waiting_for
from .waits import EVENT_STEP, message_json

_MISSING: Any = object()


class AdminError(EverystepError):
    """An operator request that does not fit the run's current state."""


def resolve_step(
    store: Store,
    run_id: str,
    step_id: str,
    *,
    result: Any = _MISSING,
    error: str | None = None,
    discard: bool = False,
) -> Run:
    """Resolve the uncertain step of a ``blocked`` run, then reschedule it.

    Exactly one of: ``result`` (the effect happened; this value is recorded
    as the step's result), ``error`` (the effect happened and failed; replay
    raises ``StepFailure(error)`` at the call site, so durable cleanup runs),
    ``discard=True`` (the effect did not happen; the step runs again).
    """
    chosen = [result is not _MISSING, error is not None, bool(discard)]
    if sum(chosen) != 1:
        raise AdminError("choose exactly one of --result, --error or --discard")
    if result is not _MISSING:
        result_json = serde.dumps(result, "--result value")
    with store.locked_run(run_id) as (conn, run):
        if run.status != BLOCKED:
            raise AdminError(f"run {run.id} is {run.status}, not blocked: only blocked runs can be resolved")
        step = store.locked_step(conn, run.id, step_id)
        if step is None:
            raise AdminError(f"run {run.id} has no step {step_id!r}{_started_hint(store, run.id)}")
        if step.status != STEP_STARTED:
            raise AdminError(
                f"step {step_id} of run {run.id} is {step.status}, not started: only the started step "
                f"of a blocked run can be resolved{_started_hint(store, run.id)}"
            )
        if discard:
            store.execute_named(conn, "delete_step", run_id=run.id, step_id=step_id)
        elif error is not None:
            encoded = serde.encode_exception(StepFailure(error))
            store.execute_named(
                conn, "resolve_step_outcome", run_id=run.id, step_id=step_id, status=STEP_FAILED,
                result=None, error=serde.dumps(encoded, "--error"),
            )
        else:
            store.execute_named(
                conn, "resolve_step_outcome", run_id=run.id, step_id=step_id, status=STEP_DONE,
                result=result_json, error=None,
            )
        store.execute_named(conn, "reschedule", run_id=run.id, from_status=BLOCKED)
    return store.get_run(run_id)


def _started_hint(store: Store, run_id: str) -> str:
    started = [step.step_id for step in store.get_steps(run_id) if step.status == STEP_STARTED]
    return f" (its started step: {', '.join(started)})" if started else ""


def requeue_run(store: Store, run_id: str, *, force: bool = False) -> Run:
    """Put a run parked ``running`` (its runner died) back to ``scheduled``.

    A run whose holder is alive (its heartbeat is fresher than its lease) is
    refused: it is being executed, and requeueing it would let a second
    execution start beside the first. ``force=True`` requeues it anyway and
    bumps its claim epoch, so from that moment the stale execution's writes
    are refused; a supervisor holding it is told (NOTIFY on PostgreSQL, its
    next heartbeat elsewhere) and kills the stale child.
    """
    with store.locked_run(run_id) as (conn, run):
        if run.status != RUNNING:
            raise AdminError(f"run {run.id} is {run.status}, not running: only running runs can be requeued")
        holder = store.get_runner(run.claimed_by, conn) if run.claimed_by else None
        if holder is not None and not holder.expired and not force:
            raise AdminError(_live_holder_refusal(run, holder))
        store.execute_named(conn, "reschedule", run_id=run.id, from_status=RUNNING)
        if holder is not None and run.claimed_by:
            store.notify_fenced(conn, run.claimed_by, run.id)
    return store.get_run(run_id)


def _live_holder_refusal(run: Run, holder: RunnerInfo) -> str:
    where = f"{holder.kind} {holder.name!r} (pid {holder.pid} on {holder.host}, heartbeat {holder.silent_seconds:.0f}s ago)"
    if holder.kind == "supervisor":
        stop_it = f"everystep-supervisor ctl kill {run.id} --requeue on {holder.host}"
    else:
        stop_it = f"stop worker {holder.name!r} on {holder.host} (it requeues its runs as it drains)"
    return (f"run {run.id} is executing under live {where}; to take it back: {stop_it}, "
            f"or everystep requeue {run.id} --force (fences that execution)")


def cancel(store: Store, run_id: str, reason: str | None = None) -> Run:
    """Cancel a run that is not finished: it ends ``cancelled`` (a final
    status) with ``Cancelled(reason)`` as its error, at once, and so do its
    unfinished children and theirs (``cancel_counting`` says how many).

    A scheduled run (delayed, sleeping, waiting to retry) or a blocked one
    simply stops there. A running run's execution can write nothing more
    from this moment (its writes are conditional on ``running``); the
    supervisor holding it is told (NOTIFY on PostgreSQL, its next fence
    check elsewhere) and SIGKILLs the child, recording the step in flight
    as failed with ``Cancelled`` (an unsafe step keeps its ``started`` row:
    its effect is uncertain); a threaded worker stops at the next step
    boundary. A finished run is refused with ``AdminError``.
    """
    return cancel_counting(store, run_id, reason).run


@dataclass(frozen=True)
class Cancellation:
    """A cancelled run and the unfinished runs below it cancelled with it."""

    run: Run
    #: Its own children cancelled with it.
    children: int = 0
    #: Every run below it cancelled with it: its children, theirs, and so on.
    descendants: int = 0

    def cascade_phrase(self) -> str:
        """", and its 3 unfinished children" (what an operator is told
        beside the run itself), or nothing when it had none."""
        if not self.descendants:
            return ""
        if self.descendants == self.children:
            return f", and its {_children(self.children)}"
        return f", and {self.descendants} unfinished runs under it (its {_children(self.children)} and theirs)"


def _children(count: int) -> str:
    return f"{count} unfinished {'child' if count == 1 else 'children'}"


def cancel_counting(store: Store, run_id: str, reason: str | None = None) -> Cancellation:
    """``cancel``, returning how many runs below the run it cancelled too."""
    if reason is not None and (not isinstance(reason, str) or not reason.strip()):
        raise AdminError("the cancel reason must not be empty (leave it out for the default)")
    with store.locked_run(run_id) as (conn, run):
        if run.status not in CANCELLABLE_STATUSES:
            raise AdminError(f"run {run.id} is {run.status}: only scheduled, running or blocked runs can be "
                             "cancelled")
        error = Cancelled(reason.strip() if reason else "cancelled by an operator")
        store.execute_named(conn, "cancel_run", run_id=run.id, from_status=run.status,
                            error=serde.dumps(serde.encode_exception(error), "cancel reason"))
        if run.status == RUNNING and run.claimed_by:
            store.notify_fenced(conn, run.claimed_by, run.id)
        parent = store.links(run.id).parent_id
        if parent is not None:
            # A parent waiting for this child wakes to its end (ChildFailed).
            store.wake_waiter(parent, CHILD.key(run.id), conn)
    children, descendants = _cancel_children(store, run.id, error)
    return Cancellation(store.get_run(run_id), children, descendants)


def _cancel_children(store: Store, run_id: str, error: Cancelled) -> tuple[int, int]:
    """Cancel a cancelled run's unfinished children, and theirs, each in a
    transaction of its own (a child's own end locks child then parent:
    holding both here could deadlock with it). A child that ends meanwhile
    is left as it ended. Returns how many children, and how many runs in
    all below ``run_id``, this cancelled."""
    children = descendants = 0
    for child in store.active_children(run_id):
        try:
            below = cancel_counting(store, child, f"parent run {run_id} was cancelled ({error})")
        except AdminError:
            continue
        children += 1
        descendants += 1 + below.descendants
    return children, descendants


def send(store: Store, run_id: str, topic: str, payload: Any, key: str | None = None) -> tuple[Sent, str]:
    """``everystep send`` and the console's send form: store a message for
    ``run_id`` (``everystep.send``'s rules and refusals) and say what was
    done, in one line: sent, or already sent under the same key (the new
    payload is dropped, and the operator is told so)."""
    sent = store.deliver(run_id, topic, message_json(topic, payload, key), key)
    if sent.stored:
        return sent, f"message {sent.id} sent to run {run_id} on topic {topic!r}"
    return sent, f"already sent as message {sent.id} (same key {key!r}); nothing stored"


def fork(store: Store, run_id: str, from_step: str, *, args: Any = _MISSING,
         force: bool = False) -> tuple[Run, int]:
    """A new run of ``run_id``'s workflow that starts where ``run_id`` was at
    step ``from_step``: every step recorded before it is copied (its result
    or error replayed, never re-run), with the events its copied
    ``set_event`` steps published (``get_event`` on the fork answers as on
    the source did at that point), and everything from ``from_step`` on is
    executed by the code deployed now. The new run records ``forked_from``.
    ``args`` replaces the run's arguments (a list: the positional ones).

    How a run a bad deploy failed is repaired: fix the code, then fork the
    failed run from the step that failed. Refused (``AdminError``) when the
    run is unfinished (scheduled, waiting, running, blocked) unless
    ``force``: the fork would be a second live run beside it, acting on the
    same business object; when ``from_step`` is not a recorded step, or lies
    inside an unsafe step's uncertain effect window (a ``started`` row
    without outcome, recorded before it or at it: that effect may have
    happened, and the fork would repeat it or block on it; resolve it
    first). Arguments the workflow registered here cannot take are refused
    with ``WorkflowArgumentsError``, as ``schedule`` refuses them.
    Everything is written in one transaction. Returns the new run and how
    many steps were copied."""
    with store.locked_run(run_id) as (conn, run):
        steps = store.steps_in(conn, run.id)
        if run.status in ACTIVE_STATUSES and not force:
            raise AdminError(_unfinished_refusal(run, steps))
        cut = next((step for step in steps if step.step_id == from_step and not is_marker(step)), None)
        if cut is None:
            recorded = ", ".join(step.step_id for step in steps if not is_marker(step)) or "none"
            raise AdminError(f"run {run.id} has no recorded step {from_step!r} (its steps: {recorded})")
        window = [step for step in steps if step.status == STEP_STARTED
                  and (step is cut or (step.started_at is not None and cut.started_at is not None
                                       and step.started_at <= cut.started_at))]
        if window or cut.completed_at is None:
            uncertain = window[0].step_id if window else cut.step_id
            raise AdminError(
                f"step {from_step} of run {run.id} lies inside the uncertain effect window of unsafe step "
                f"{uncertain} (started, no outcome recorded): resolve it first "
                f"(everystep resolve-step {run.id} {uncertain} --result JSON | --error MESSAGE | --discard)")
        positional = list(run.args) if args is _MISSING else (args if isinstance(args, list) else [args])
        options = new_run.decide(run.name, positional, queue=run.queue, priority=run.priority,
                                 concurrency_key=run.concurrency_key, what="arguments of the fork")
        new, copied = store.fork_run(conn, run, cut, options.args_json, options.placement, options.app_version,
                                     options.deadline, PATCH_STEP)
        _publish_copied_events(store, conn, new.id)
    return new, copied


def _unfinished_refusal(run: Run, steps: list[StepRecord]) -> str:
    state = run.status + (f", {waiting}" if (waiting := waiting_for(run, steps)) else "")
    return (f"run {run.id} is not finished ({state}): a fork would be a second live run of {run.name} beside "
            f"it, both acting on the same objects; cancel it first if the fork replaces it (everystep cancel "
            f"{run.id}), or fork it anyway with --force")


def _publish_copied_events(store: Store, conn: Any, fork_id: str) -> None:
    """Publish on the fork, in its transaction, what its copied ``set_event``
    steps published on the source: each key's last value among them (a
    replay of those steps writes nothing, so nothing else would)."""
    published = sorted(((step.completed_at, step_sort_key(step.step_id), step) for step in store.steps_in(conn, fork_id)
                        if step.name == EVENT_STEP and step.status == STEP_DONE and step.completed_at is not None),
                       key=lambda entry: entry[:2])
    latest = {str(step.args[0]): step.args[1] for _at, _order, step in published}
    for key, value in latest.items():
        store.execute_named(conn, "put_event", run_id=fork_id, key=key,
                            value=serde.dumps(value, f"event {key!r}"))
