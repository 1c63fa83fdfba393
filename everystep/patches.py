"""Patches: changing a workflow's steps under runs already in flight.

A run replays its body from the top, so new code that adds, removes or
reorders steps would meet runs recorded by the old code at the wrong ids.
``patched(id)`` lets both versions live in one body::

    if everystep.patched("charge-v2"):
        charge_with_tax(order)        # the new path
    else:
        charge(order)                 # the path runs in flight already took

The first time a run reaches a patch id, the answer is decided and
recorded, durably, as one step row (name ``everystep.patch``, kind
``patch``, result ``true``/``false``) at the reserved id ``@patch:<id>``:

- ``False`` when the run's recorded steps already went past that point on
  the old code: its scope holds a recorded step this replay has not reached
  yet (a step id the scope has not handed out), which the old code recorded
  after the place the marker would be;
- ``True`` otherwise: a new run, or one that had not reached that point
  when the code changed.

Every replay returns the recorded answer. A marker takes no position in its
scope (step ids after it do not shift), and ``@`` cannot begin a step name,
so a marker never collides with a step. The answer is per run: the same id
asked again, in any scope, gets the same answer.

The marker is not written on its own: it is held by the execution and goes
with its next write (the next step's record, or the run's end) in that
write's transaction (``Store.record_step(markers=...)``), so a patch costs
no round trip of its own. A step recorded after the patch point is never
durable without the marker; a marker lost with nothing recorded after it is
decided again, the same way, on the next claim.

``deprecate_patch(id)`` replaces the ``if``/``else`` once no run in flight
takes the old branch (``everystep check-deploy`` says when: it counts the
branch each run recorded, or would decide on its next claim): it records
nothing and fails a run (``WorkflowCodeError``, as a divergence does) only if
that run recorded ``False``. Outside a workflow ``patched`` is ``True``
(unit tests run the new path) and ``deprecate_patch`` does nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from .body_rules import BodyRule, declare
from .context import Context, Execution, recording_context, validate_name
from .errors import WorkflowCodeError
from .models import STEP_DONE, StepOutline, StepRecord
from .store import Marker

#: The function name recorded for a patch marker's row.
PATCH_STEP = "everystep.patch"
#: What begins a marker's step id: no step name can begin with it.
MARKER_PREFIX = "@patch:"
#: A marker row's kind, as ``show`` and the console say it.
KIND_PATCH = "patch"
#: How the code asks about a patch (``check-deploy``).
PATCHED = "patched"
DEPRECATED = "deprecated"


def marker_id(patch_id: str) -> str:
    return MARKER_PREFIX + patch_id


def is_marker(record: StepRecord | StepOutline) -> bool:
    return record.name == PATCH_STEP and record.step_id.startswith(MARKER_PREFIX)


def patch_of(record: StepRecord | StepOutline) -> str:
    """The patch id of a marker row."""
    return record.step_id[len(MARKER_PREFIX):]


@declare(BodyRule.RECORDED, "Its answer is recorded with the run's next write; every replay gets the same answer.")
def patched(patch_id: str) -> bool:
    """Whether this run takes the new path at patch ``patch_id`` (see the module)."""
    step_id = _marker_ids.get(patch_id) or _checked(patch_id)
    ctx = recording_context()
    if ctx is None:
        return True
    ex = ctx.execution
    if ex.interrupt is not None:
        raise ex.interrupt
    if ex.dry_run:
        ex.patch_calls.setdefault(patch_id, PATCHED)
    recorded = ex.outcomes.get(step_id)
    if recorded is not None:
        if ex.replay_log is not None:
            ex.replay_log.matched(step_id, PATCH_STEP, recorded)
        return _answer(ex, step_id, recorded)
    answer = not (ex.replaying and went_past(ctx))
    marker, template = _decided(patch_id, answer)
    record = template.completed(None)
    record.__dict__["workflow_id"] = ex.run.id
    decided = ex.decide_marker(record, marker)
    return answer if decided is record else _answer(ex, step_id, decided)


#: Patch id → its marker's step id, for ids already checked.
_marker_ids: dict[str, str] = {}


def _checked(patch_id: str) -> str:
    validate_name(patch_id)
    step_id = _marker_ids[patch_id] = marker_id(patch_id)
    return step_id


@functools.cache
def _decided(patch_id: str, answer: bool) -> tuple[Marker, StepRecord]:
    """The marker row of ``answer`` at ``patch_id``, and the record a run
    keeps of it (copied per run: ``StepRecord.completed``). The same for
    every run, so made once."""
    step_id = marker_id(patch_id)
    # The id is a checked name: no character of it needs escaping in JSON.
    marker = Marker(step_id, PATCH_STEP, f'["{patch_id}"]', "true" if answer else "false")
    return marker, StepRecord(workflow_id="", step_id=step_id, name=PATCH_STEP, status=STEP_DONE, result=answer,
                              args=[patch_id])


@declare(BodyRule.PLAIN, "Reads the run's recorded answer at the patch and writes nothing.")
def deprecate_patch(patch_id: str) -> None:
    """The old branch of ``patch_id`` is gone: a run that recorded ``False``
    there cannot go on with this code (``WorkflowCodeError``); any other run
    goes on, and nothing is recorded."""
    step_id = _marker_ids.get(patch_id) or _checked(patch_id)
    ctx = recording_context()
    if ctx is None:
        return
    ex = ctx.execution
    ex.check_interrupt()
    if ex.dry_run:
        ex.patch_calls[patch_id] = DEPRECATED
    recorded = ex.outcomes.get(step_id)
    if recorded is not None and _answer(ex, step_id, recorded) is False:
        raise ex.interrupt_with(WorkflowCodeError(
            f"run {ex.run.id}: patch {patch_id!r} is deprecated but this run took its old branch "
            f"(recorded at {step_id}); the code diverged from the recorded run. Deploy code that still has "
            f"the old branch under patched({patch_id!r}), or fork the run: everystep fork {ex.run.id} "
            "--from-step STEP"
        ))


def went_past(ctx: Context) -> bool:
    """Whether the run's records go past the point this scope has reached:
    a recorded step of this scope (or nested under one of its forks) whose
    id the scope has not handed out yet in this replay."""
    if not ctx.execution.replaying:
        return False
    prefix = ctx.prefix
    start = len(prefix)
    for step_id, name in ctx.execution.outcomes.names():
        if name == PATCH_STEP or not step_id.startswith(prefix):
            continue
        dot = step_id.find(".", start)
        head = step_id if dot < 0 else step_id[:dot]
        if not ctx.allocated(head):
            return True
    return False


def _answer(ex: Execution, step_id: str, recorded: StepRecord) -> bool:
    if recorded.name != PATCH_STEP:
        raise ex.interrupt_with(WorkflowCodeError(
            f"run {ex.run.id}: step {step_id} recorded {recorded.name!r} but the workflow now asks for a patch "
            "marker there; the code diverged from the recorded run"
        ))
    return bool(recorded.result)


def recorded_patches(records: Iterable[StepRecord]) -> dict[str, bool]:
    """The patches a run recorded, with the branch each took (True: new)."""
    return {patch_of(record): bool(record.result) for record in records if is_marker(record)}


@dataclass
class PatchReport:
    """One patch across the runs in flight: how many take each branch
    (recorded, or decided by their dry replay as their next claim will), and
    how the code checked asks about it (``patched``, ``deprecated``, or
    None: not reached by any replay)."""

    patch_id: str
    new: int = 0
    old: int = 0
    in_code: str | None = None

    @property
    def advice(self) -> str:
        if self.in_code == DEPRECATED:
            if self.old:
                return (f"{self.old} run(s) in flight take the old branch and fail with this code: keep "
                        f"patched({self.patch_id!r}) until they finish (or fork them)")
            return "no run in flight takes the old branch: deprecate_patch() can be deleted"
        if self.old:
            return f"keep both branches: {self.old} run(s) in flight take the old one"
        return "no run in flight takes the old branch: can be deprecated (deprecate_patch)"

    def to_dict(self) -> dict[str, object]:
        return {"patch": self.patch_id, "new": self.new, "old": self.old, "in_code": self.in_code,
                "advice": self.advice}


def patch_reports(seen: Iterable[tuple[dict[str, bool], dict[str, str]]]) -> list[PatchReport]:
    """Per patch, from each run's (branch taken at each patch, patch calls of its dry replay)."""
    reports: dict[str, PatchReport] = {}
    for recorded, calls in seen:
        for patch_id, answer in recorded.items():
            report = reports.setdefault(patch_id, PatchReport(patch_id))
            if answer:
                report.new += 1
            else:
                report.old += 1
        for patch_id, how in calls.items():
            report = reports.setdefault(patch_id, PatchReport(patch_id))
            if report.in_code != DEPRECATED:
                report.in_code = how
    return sorted(reports.values(), key=lambda report: report.patch_id)


__all__ = ["DEPRECATED", "KIND_PATCH", "MARKER_PREFIX", "PATCHED", "PATCH_STEP", "PatchReport", "deprecate_patch",
           "is_marker", "marker_id", "patch_of", "patch_reports", "patched", "recorded_patches", "went_past"]
