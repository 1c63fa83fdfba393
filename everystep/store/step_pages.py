"""A run's steps a page at a time, whatever the length of its history.

``get_steps(run_id)`` reads a whole history, every argument and result
decoded: fine for a run of a hundred steps, seconds for one of a hundred
thousand. A page (``get_steps(run_id, after=STEP_ID, limit=N)``,
``everystep show --after/--limit``, the console's "more steps") reads less:

1. the run's step ids in the order first recorded (``Store.step_ids``:
   one short column, no argument, result or error read or decoded);
2. of them, the ``limit`` recorded after step ``after`` (None: from the
   first);
3. the rows of those ids only (``Store.steps_by_id``).

A page is a slice of the whole ``get_steps``: the same order, so the
pages of a run laid end to end are its whole history, named steps where
they ran and a fork's branches as they were recorded. Its cursor is the
last step id of the page: step ids are unique in a run and a step keeps
its place in that order once recorded, so the pages are stable while the
run records more (the new steps come after the last page). A cursor that
is no step of the run (a typo, a step discarded by ``resolve-step``) is
refused, never read as "nothing after it".

The cost of a page is the run's step ids (the ``(workflow_id, step_id)``
index, with the row's id for the order: about 100 ms for 100,000 steps)
plus the page's rows, against seconds for the whole history.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import EverystepError
from ..models import StepRecord
from .base import Store


@dataclass(frozen=True)
class StepPage:
    """One page of a run's steps, in the order first recorded; ``total``:
    the steps the run has; ``next_after``: the ``after=`` of the next page
    (None when this one reaches the end)."""

    steps: list[StepRecord]
    total: int
    next_after: str | None


def check_page(after: object, limit: object) -> None:
    """Refuse a page that is no page (``EverystepError``, one line)."""
    if after is not None and not isinstance(after, str):
        raise EverystepError(f"after= takes a step id (a string), not {after!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise EverystepError(f"limit= takes a number of steps, 1 or more, not {limit!r}")


def page_of(run_id: str, step_ids: Sequence[str], after: str | None,
            limit: int | None) -> tuple[Sequence[str], bool]:
    """The ids of a page of ``step_ids`` (the run's, in the order first
    recorded): those after ``after`` (None: from the first), at most
    ``limit`` of them (None: all); and whether more follow."""
    start = 0
    if after is not None:
        try:
            start = step_ids.index(after) + 1
        except ValueError:
            raise EverystepError(f"run {run_id} has no step {after!r}: after= takes the id of one of its steps "
                                 "(the last of the page before)") from None
    end = len(step_ids) if limit is None else min(start + limit, len(step_ids))
    return step_ids[start:end], end < len(step_ids)


def in_order(steps: Iterable[StepRecord], step_ids: Iterable[str]) -> list[StepRecord]:
    """``steps`` in the order of ``step_ids`` (an id with no step is left out)."""
    found = {step.step_id: step for step in steps}
    return [found[step_id] for step_id in step_ids if step_id in found]


def read_page(store: Store, run_id: str, after: str | None = None, limit: int | None = None) -> StepPage:
    """A page of the run's steps (see the module); a run without steps has
    an empty page, and so has one read after its last step."""
    check_page(after, limit)
    step_ids = store.step_ids(run_id)
    chosen, more = page_of(run_id, step_ids, after, limit)
    steps = in_order(store.steps_by_id(run_id, chosen), chosen) if chosen else []
    return StepPage(steps, len(step_ids), chosen[-1] if more and chosen else None)


__all__ = ["StepPage", "check_page", "in_order", "page_of", "read_page"]
