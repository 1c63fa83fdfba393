"""Dry replay: would the code deployed now carry on each unfinished run?

Before rolling out new workflow code, ``everystep check-deploy`` replays the
body of every ``scheduled``, ``running`` and ``blocked`` run against its
recorded steps, exactly as the next claim would, except that it never
executes a step: the replay stops before the first step that is not
recorded (``Execution.dry_run``, checked by the runner). Replaying what is
recorded is what breaks when code changes under a run: a step id now
calling another function (``WorkflowCodeError``), code between steps that
no longer copes with the recorded results, or a workflow that no longer
exists. Those runs are reported; the others resume, complete, stay blocked
or stop exactly as before.

The same replay, run in the foreground with a ``ReplayLog`` told of each
step (``replay_here``), is ``everystep replay`` (``everystep.local_replay``).
A verdict also carries the branch the run takes at each patch and how this
code asks about them (``everystep.patches``), for check-deploy's per-patch
advice: the branch it recorded, or, for a patch it has not recorded, the one
the replay decided, exactly as its next claim will (a run waiting in ``recv``
past a new patch point takes the old branch when it resumes).

Nothing is written: the replay gets no Store (any attempt to use one is a
bug and reported as such), no observers, no telemetry. Code between steps
does run, as it does on every replay; it is meant to be deterministic and
quick, and a replay that has not stopped after ``timeout`` seconds is
reported rather than waited for (its thread is abandoned, as a daemon).
"""

from __future__ import annotations

import ctypes
import enum
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from . import loops, patches, registry
from .context import Context, Execution, ReplayLog, SCOPE
from .errors import EffectUncertain, EverystepError, Suspended, Terminal, WorkflowCodeError
from .models import Outcomes, ACTIVE_STATUSES, WAIT_FOREVER, Run, StepRecord
from .observer import Observers
from .recording import StopBeforeStep
from .store import Store

DEFAULT_TIMEOUT = 5.0
#: How long an abandoned replay's thread gets to unwind once told to stop.
STOP_GRACE = 1.0


class ReplayAbandoned(BaseException):
    """Raised inside a dry replay that ran past its time, to end its thread:
    a body looping between steps would otherwise spin on for the life of the
    process (``check-deploy`` exits, but the console asks again on every
    page view)."""
BATCH = 500




class Prediction(str, enum.Enum):
    """What a dry replay against this code says a run would do when it
    resumes (or why it cannot say). Not a run's ``models.Outcome``: no
    execution happened; check-deploy reports it as a verdict's ``outcome``."""

    RESUMES = "resumes"  # replays its records, then would execute the next step
    COMPLETES = "completes"  # every step it needs is recorded: it would finish
    BLOCKED = "blocked"  # stays blocked on its uncertain step, waiting for resolve-step
    STOPS = "stops"  # replays a recorded Terminal
    CODE_ERROR = "code_error"  # WorkflowCodeError: the code diverged from the records
    MISSING = "missing"  # the workflow is not registered by this code
    FAILS = "fails"  # another exception escapes the body on replay
    TIMEOUT = "timeout"  # the replay did not stop in time


PROBLEMS = (Prediction.CODE_ERROR, Prediction.MISSING, Prediction.FAILS, Prediction.TIMEOUT)


@dataclass(frozen=True)
class Verdict:
    run_id: str
    workflow: str
    status: str
    outcome: Prediction
    detail: str
    next_step: str | None = None
    #: The branch the run takes at each patch it reached (True: the new
    #: one), recorded or decided by this replay.
    patches: dict[str, bool] = field(default_factory=dict)
    #: The patches this code asked about in the replay (``patched``/``deprecated``).
    patch_calls: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def problem(self) -> bool:
        return self.outcome in PROBLEMS

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "workflow": self.workflow, "status": self.status,
            "outcome": self.outcome.value, "problem": self.problem, "detail": self.detail,
            "next_step": self.next_step, "patches": dict(self.patches),
        }


class _NoStore:
    """Stands in for the Store: a dry replay must never reach one."""

    def __getattr__(self, name: str) -> Any:
        raise EverystepError(f"a dry replay tried to use the database (Store.{name}); nothing was written")


def _execution(run: Run, records: list[StepRecord], log: ReplayLog | None = None) -> Execution:
    """What a dry replay of ``run`` executes in: its records, no store."""
    return Execution(run=run, store=_NoStore(), claimer="check-deploy",  # type: ignore[arg-type]
                     outcomes=Outcomes.of(records), observer=Observers([]),
                     dry_run=True, replay_log=log)


def _body(workflow: Any, run: Run, ctx: Context, box: dict[str, Any]) -> None:
    """The body over its records, in this thread: what it returned or raised goes in ``box``."""
    token = SCOPE.set(ctx)
    try:
        box["value"] = loops.call_body(workflow.fn, run.args)  # an async body on a loop of its own
    except BaseException as exc:  # judged by the caller
        box["error"] = exc
    finally:
        SCOPE.reset(token)


def replay(run: Run, records: list[StepRecord], timeout: float = DEFAULT_TIMEOUT) -> Verdict:
    """Dry-replay ``run`` over ``records`` with the code loaded now."""
    workflow = registry.get_workflow(run.name)
    if workflow is None:
        return _verdict(run, Prediction.MISSING, f"workflow {run.name!r} is not registered by this code")
    ex = _execution(run, records)
    ctx = Context(ex)
    box: dict[str, Any] = {}
    thread = threading.Thread(target=_body, args=(workflow, run, ctx, box), name=f"everystep-dryrun-{run.id}",
                              daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        _abandon(thread)
        return _verdict(run, Prediction.TIMEOUT, f"the replay had not stopped after {timeout:g}s "
                                                 "(code between steps that waits or loops?)")
    verdict = _judge(run, ex.interrupt or box.get("error"))
    return _with_patches(verdict, ex)


def replay_here(run: Run, records: list[StepRecord], log: ReplayLog) -> tuple[Verdict, BaseException | None]:
    """Dry-replay ``run`` in this thread, telling ``log`` of each step
    (``everystep replay``: a debugger may stop in it, so no timeout). Returns
    the verdict and what the body raised, if anything."""
    workflow = registry.get_workflow(run.name)
    if workflow is None:
        return _verdict(run, Prediction.MISSING, f"workflow {run.name!r} is not registered by this code"), None
    ex = _execution(run, records, log)
    box: dict[str, Any] = {}
    _body(workflow, run, Context(ex), box)
    raised = ex.interrupt or box.get("error")
    return _with_patches(_judge(run, raised), ex), raised


def _with_patches(verdict: Verdict, ex: Execution) -> Verdict:
    """``verdict`` with the branch the run takes at each patch: its
    outcomes hold the markers it recorded and those the replay decided
    (``Execution.decide_marker`` keeps them there, writing nothing)."""
    taken = patches.recorded_patches(list(ex.outcomes.values()))
    return replace(verdict, patches=taken, patch_calls=dict(ex.patch_calls))


def _abandon(thread: threading.Thread) -> None:
    """Raise ``ReplayAbandoned`` in the replay's thread at its next bytecode
    and give it ``STOP_GRACE`` to unwind. Code blocked inside C (a sleep, a
    socket) only sees it when it returns; the thread is a daemon either way."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(ReplayAbandoned))
        thread.join(STOP_GRACE)


def _judge(run: Run, outcome: BaseException | None) -> Verdict:
    if isinstance(outcome, Suspended) and outcome.what is not None:
        until = f" until {outcome.wake_at.isoformat()}" if outcome.wake_at < WAIT_FOREVER else ""
        return _verdict(run, Prediction.RESUMES, f"replays its recorded steps, then waits for {outcome.what}{until}")
    if isinstance(outcome, Suspended):
        return _verdict(run, Prediction.RESUMES, f"replays its recorded steps, then waits until "
                                                 f"{outcome.wake_at.isoformat()} (a sleep or a retry's backoff)")
    if isinstance(outcome, StopBeforeStep):
        once = "; exactly once: a transactional step" if outcome.name in registry.transactional_steps() else ""
        return _verdict(run, Prediction.RESUMES, f"replays its recorded steps, then runs step {outcome.step_id} "
                                                 f"({outcome.name}{once})", outcome.step_id)
    if isinstance(outcome, WorkflowCodeError):
        return _verdict(run, Prediction.CODE_ERROR, str(outcome))
    if isinstance(outcome, EffectUncertain):
        return _verdict(run, Prediction.BLOCKED, "stays blocked on its uncertain step until it is resolved")
    if isinstance(outcome, Terminal):
        return _verdict(run, Prediction.STOPS, f"replays its recorded Terminal: {outcome}")
    if outcome is not None:
        return _verdict(run, Prediction.FAILS, f"{type(outcome).__name__} escapes the body on replay: {outcome}")
    return _verdict(run, Prediction.COMPLETES, "every step it needs is recorded: it would complete")


def _verdict(run: Run, outcome: Prediction, detail: str, next_step: str | None = None) -> Verdict:
    return Verdict(run.id, run.name, run.status, outcome, detail, next_step)


def unfinished_runs(store: Store, batch: int = BATCH) -> Iterator[tuple[Run, list[StepRecord]]]:
    """Every unfinished run with its records, oldest first per status, read
    in batches along the status index (a run moving between statuses while
    this reads may be seen twice or not at all: it is moving anyway)."""
    for status in ACTIVE_STATUSES:
        cursor = None
        while True:
            runs = store.page_runs(status=status, newer_than=cursor, limit=batch)
            if not runs:
                break
            steps = store.steps_of_runs([run.id for run in runs])
            for run in reversed(runs):  # oldest first
                yield run, steps.get(run.id, [])
            cursor = (runs[0].created_at, runs[0].id)
            if len(runs) < batch:
                break


def check_deploy(store: Store, timeout: float = DEFAULT_TIMEOUT) -> Iterator[Verdict]:
    """A verdict for every unfinished run."""
    for run, records in unfinished_runs(store):
        yield replay(run, records, timeout)


__all__ = ["Prediction", "PROBLEMS", "StopBeforeStep", "Verdict", "check_deploy", "replay", "replay_here",
           "unfinished_runs"]
