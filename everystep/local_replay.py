"""Local replay: a recorded run, replayed in this process against its records.

``everystep replay RUN`` reads a run and its steps through a read-only store
(``connect(read_only=True)``: no migration, sessions the database holds
read-only, so a replica or a role granted SELECT only will do), then runs
the dry replay ``check-deploy`` uses (``dryrun.replay_here``) in this
thread, with the code on this machine. Each step is printed as it is met:
its recorded outcome returned, or where and why the code diverges (the step
id, the function recorded there, the function the code calls now). The
replay never executes a step and never writes: it stops before the first
step without a record, which is where a real execution would carry on.

``--pdb`` stops in the debugger, in the workflow's body at the step's call,
at the first divergence or at ``--until-step ID``; ``--until-step`` alone
ends the replay before that step. A user debugging a production failure
points it at a read replica with their working copy of the code.

Exit status: 0 when the code replays the records (to the end, to the first
unrecorded step, to ``--until-step``, or to the very failure the run
recorded); 1 when it diverges, the workflow is missing, or the body fails
otherwise than the run did.
"""

from __future__ import annotations

import json
import pdb
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any

from . import dryrun, registry, serde
from .models import FAILED, STEP_WAITING, STEP_DONE, Run, StepRecord
from .store import Store
from .waiting import describe_wait


class StopReplay(BaseException):
    """Ends a replay at ``--until-step`` (a ``BaseException``: the body's
    own ``except Exception`` cannot catch it)."""


@dataclass
class PrintingLog:
    """A ``ReplayLog`` that prints each step and may open the debugger."""

    run: Run
    out: IO[str]
    until: str | None = None
    debugger: bool = False
    diverged_at: list[str] = field(default_factory=list)

    def reaching(self, step_id: str, name: str) -> None:
        if step_id == self.until:
            self._say(step_id, name, "--until-step: the replay stops here")
            if self.debugger:
                self._debug()
            raise StopReplay(step_id)

    def matched(self, step_id: str, name: str, record: StepRecord) -> None:
        self._say(step_id, name, f"recorded {_outcome(record)}")

    def diverged(self, step_id: str, recorded: str, called: str) -> None:
        self._say(step_id, called, f"DIVERGES: the run recorded {recorded!r} here, the code now calls {called!r}")
        self.diverged_at.append(step_id)
        if self.debugger and len(self.diverged_at) == 1:
            self._debug()

    def unrecorded(self, step_id: str, name: str) -> None:
        self._say(step_id, name, "not recorded: a real execution would run it here; the replay stops")

    def _say(self, step_id: str, name: str, what: str) -> None:
        print(f"step {step_id:<10} {name:<32} {what}", file=self.out, flush=True)

    def _debug(self) -> None:
        """The debugger, in the workflow's body at the call being replayed."""
        frame = _body_frame(self.run)
        debugger = pdb.Pdb(nosigint=True)  # Ctrl-C ends the replay, as anywhere in the command
        debugger.reset()
        debugger.interaction(frame or sys._getframe(1), None)


def _body_frame(run: Run) -> FrameType | None:
    workflow = registry.get_workflow(run.name)
    code = getattr(getattr(workflow, "fn", None), "__code__", None)
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame


def _outcome(record: StepRecord) -> str:
    if record.status == STEP_DONE:
        text = json.dumps(serde.to_jsonable(record.result))
        return f"done -> {text if len(text) <= 60 else text[:57] + '...'}"
    if record.status == STEP_WAITING:
        return describe_wait(record)  # the replay stops there, as the run did
    if record.error:
        return f"{record.status}: {record.error.get('type')}: {record.error.get('message')}"
    return str(record.status)


def replay_run(store: Store, run_id: str, out: IO[str], *, until: str | None = None,
               debugger: bool = False) -> int:
    """Replay ``run_id`` here against its records; print each step and a
    verdict to ``out``. Returns the exit status (see the module)."""
    run = store.find_run(run_id)
    records = store.get_steps(run.id)
    print(f"replaying run {run.id} ({run.name}, {run.status}, version {run.app_version or '-'}) against "
          f"{len(records)} recorded step(s), with the code loaded here", file=out, flush=True)
    log = PrintingLog(run, out, until=until, debugger=debugger)
    verdict, raised = dryrun.replay_here(run, records, log)
    if isinstance(raised, StopReplay):
        print(f"stopped at step {until} (--until-step)", file=out)
        return 0
    if verdict.outcome == dryrun.Prediction.FAILS and _same_failure(run, raised):
        print(f"replays the failure the run recorded: {verdict.detail}", file=out)
        return 0
    word = "DIVERGES" if verdict.problem else "replays"
    print(f"{word}: {verdict.detail}", file=out)
    return 1 if verdict.problem else 0


def _same_failure(run: Run, raised: BaseException | None) -> bool:
    if run.status != FAILED or raised is None or not run.error:
        return False
    encoded: dict[str, Any] = serde.encode_exception(raised)
    return bool(encoded.get("type") == run.error.get("type") and encoded.get("message") == run.error.get("message"))


__all__ = ["PrintingLog", "StopReplay", "replay_run"]
