"""The history bound: a run whose history grows long is said once, and the
longest history among unfinished runs is a gauge.

Every resume replays a run's history from the top, so a run that loops
for months (a subscription, a chat, a device's twin) resumes slower with
every message it handles. ``everystep.continue_as_new(...)`` ends such a
run and goes on in a new run of the same workflow with a fresh history:
this module says when a run needs it.

Where the check lives: at the end of each execution (``HistoryBound``, an
observer's ``run_finished``), never on a step. An execution knows its
history for nothing: the records it loaded at its claim (the outcomes its
replay reads, counted at ``run_started``) and those it holds when it ends
(a wait's row written as the run is released is the next one's to count).
The cost is a ``len()`` and a comparison per execution; an execution that
leaves a run unfinished (waiting, requeued, blocked) with at least
``NOTED_FROM`` records (or the threshold, when lower) also notes that
number on the run's row, one ``UPDATE`` conditional
on its claim, after the execution's own writes (``Store.note_history``).
That column is what the gauge ``everystep_workflows_largest_history``
reads at each scrape (``Store.largest_history``: the unfinished runs' rows,
never a step counted). A run with a shorter history costs nothing more.

Once per run: the warning is logged by the execution that takes the
history from below the threshold to at or past it. A run's executions are
one after another (each claim fences the one before), and its history only
grows (a record is removed from an unfinished run only by an operator's
``resolve-step --discard`` of its one uncertain step), so across processes
and hosts one execution crosses the threshold; a run that starts past it
(a fork that copied a long history) is said at its first execution. What
is accepted rather than guaranteed: if the process of the crossing
execution dies before that execution ends, no line is logged for the run
(the gauge still shows it); a threshold lowered below histories that have
already passed it says nothing of them; a discarded record crossed again
says it again.

The threshold is ``--history-warning`` (``everystep worker``,
``everystep-supervisor``), ``Worker(history_warning=...)``, else
``$EVERYSTEP_HISTORY_WARNING``, else 10,000 records (Temporal's warning,
at about a quarter of a second of replay per resume here); 0 turns the
warning off (histories are still noted for the gauge).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from .errors import STORE_FAILURES, EverystepError
from .models import Outcome
from .context import Observer

if TYPE_CHECKING:
    from .context import Context
    from .models import Run

logger = logging.getLogger("everystep")

ENV_VAR = "EVERYSTEP_HISTORY_WARNING"
DEFAULT = 10_000
#: Histories are noted on their run's row from this many records on (or
#: from the threshold, when it is lower): below it a run costs nothing.
NOTED_FROM = 1_000
#: ``--history-warning``'s help (``everystep worker``, ``everystep-supervisor``).
OPTION_HELP = (f"log one line when a run's history passes N step records, pointing at continue_as_new "
               f"(default: ${ENV_VAR}, else {DEFAULT}; 0: never)")


def threshold(option: int | None = None) -> int:
    """The warning threshold: ``option`` when given, else the environment's,
    else ``DEFAULT``; a bad value is one line (``EverystepError``)."""
    if option is None:
        text = os.environ.get(ENV_VAR, "").strip()
        if not text:
            return DEFAULT
        try:
            option = int(text)
        except ValueError:
            raise EverystepError(f"${ENV_VAR} must be a whole number of step records (0: never warn), "
                                 f"not {text!r}") from None
    if option < 0:
        raise EverystepError(f"the history warning must be 0 (never) or more step records, not {option}")
    return option


class HistoryBound(Observer):
    """Notes long histories and warns once when one passes ``warn_at``
    records (see the module). Never raises into a run: a note the database
    refuses is logged in one line and changes nothing else."""

    def __init__(self, warn_at: int) -> None:
        self.warn_at = warn_at
        self.noted_from = min(NOTED_FROM, warn_at) if warn_at else NOTED_FROM

    def run_started(self, run: Run, ctx: Context) -> Any:
        return len(ctx.execution.outcomes)

    def run_finished(self, run: Run, ctx: Context, status: str, error: BaseException | None, token: Any) -> None:
        records = len(ctx.execution.outcomes)
        if records < self.noted_from or not isinstance(token, int) or status not in LIVES_ON:
            return
        if self.warn_at and records >= self.warn_at and (token < self.warn_at or run.claim_epoch <= 1):
            logger.warning(
                "everystep %s: run %s (%s) holds %d step records, past the history warning at %d: every resume "
                "replays them all; end it with everystep.continue_as_new(...) to go on in a new run with a fresh "
                "history (pid %d)", ctx.execution.claimer, run.id, run.name, records, self.warn_at, os.getpid())
        try:
            ctx.execution.store.note_history(ctx.execution.claim, records)
        except STORE_FAILURES as exc:  # the gauge misses this note; the run is not concerned
            logger.warning("everystep %s: run %s: its history of %d records was not noted (%s)",
                           ctx.execution.claimer, run.id, records, exc)


#: How an execution leaves a run that goes on, its records written: the
#: histories the bound is about (a run that ended replays no more).
LIVES_ON = frozenset({Outcome.RELEASED, Outcome.REQUEUED, Outcome.BLOCKED})


__all__ = ["DEFAULT", "ENV_VAR", "LIVES_ON", "HistoryBound", "NOTED_FROM", "OPTION_HELP", "threshold"]
