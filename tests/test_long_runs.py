"""Reading a long history a page at a time, on every backend: the pages of
a run laid end to end are its whole history, a page decodes only its own
rows, a body's paged read is recorded like any read, and the outline the
step graph is drawn from holds no arguments, results or errors."""

from __future__ import annotations

import asyncio

import pytest

import everystep
from everystep import EverystepError, schedule
from everystep.store import borrowed, step_pages
from everystep.models import COMPLETED, StepOutline, StepRecord
from everystep.patches import PATCH_STEP, marker_id
from everystep.runner import Outcome
from everystep.store import Store
from everystep.store.base import StoreCore
from tests.apps import long_runs
from tests.support.long_runs import ticks, write_history
from tests.support.rawdb import reader
from tests.support.runs import execute_run, expire_wait


def pages(store: Store, run_id: str, size: int) -> list[list[StepRecord]]:
    out: list[list[StepRecord]] = []
    after = None
    while True:
        page = everystep.get_steps(run_id, database=store, after=after, limit=size)
        out.append(page)
        if len(page) < size:
            return out
        after = page[-1].step_id


def test_the_pages_of_a_run_laid_end_to_end_are_its_whole_history(store: Store) -> None:
    run = schedule(long_runs.mixed, 12, database=store)
    assert execute_run(store, run.id) == COMPLETED
    whole = everystep.get_steps(run.id, database=store)
    # The branches' steps in the order they happened to be recorded.
    assert [step.step_id for step in whole[:2]] == ["1", "charge"]
    assert {step.step_id for step in whole[2:5]} == {"3.0.1", "3.0.2", "3.1.1"}
    assert [step.step_id for step in whole[5:]] == [str(n) for n in range(4, 16)]
    for size in (1, 2, 5, 16, 17, 100):
        laid = [step for page in pages(store, run.id, size) for step in page]
        assert laid == whole, size
    page = step_pages.read_page(store, run.id, after=whole[4].step_id, limit=5)
    assert page.steps == whole[5:10] and page.total == 17 and page.next_after == whole[9].step_id
    last = step_pages.read_page(store, run.id, after=whole[-3].step_id, limit=5)
    assert last.steps == whole[-2:] and last.next_after is None
    assert everystep.get_steps(run.id, database=store, after=whole[-1].step_id) == []


def test_a_page_of_a_long_history_decodes_its_rows_only(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    run = schedule(long_runs.ticker, 5000, database=store)
    write_history(store, run.id, ticks(5000))
    decoded: list[str] = []
    original = StoreCore._step.__func__  # type: ignore[attr-defined]

    def counting(cls: type[StoreCore], row: object) -> StepRecord:
        record: StepRecord = original(cls, row)
        decoded.append(record.step_id)
        return record

    monkeypatch.setattr(StoreCore, "_step", classmethod(counting))
    first = everystep.get_steps(run.id, database=store, limit=50)
    assert [step.step_id for step in first] == [str(n) for n in range(1, 51)]
    assert [step.result for step in first[:3]] == [0, 1, 2] and first[0].name == long_runs.tick.name
    assert sorted(decoded, key=int) == [str(n) for n in range(1, 51)]
    tail = step_pages.read_page(store, run.id, after="4990", limit=50)
    assert [step.step_id for step in tail.steps] == [str(n) for n in range(4991, 5001)]
    assert tail.total == 5000 and tail.next_after is None
    assert len(decoded) == 60


@pytest.mark.parametrize(("after", "limit", "says"), [
    ("99", None, "has no step '99'"), (None, 0, "limit= takes a number of steps, 1 or more, not 0"),
    (None, True, "not True"), (3, None, "after= takes a step id (a string), not 3"),
])
def test_a_page_that_is_no_page_is_refused_in_one_line(store: Store, after: object, limit: object,
                                                       says: str) -> None:
    run = schedule(long_runs.ticker, 3, database=store)
    assert execute_run(store, run.id) == COMPLETED
    with pytest.raises(EverystepError) as refused:
        everystep.get_steps(run.id, database=store, after=after, limit=limit)  # type: ignore[arg-type]
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_a_bodys_paged_read_is_recorded_and_replays_the_pages_it_first_read(store: Store) -> None:
    target = schedule(long_runs.ticker, 100, database=store)
    write_history(store, target.id, ticks(25))
    reader_run = schedule(long_runs.pages_through, target.id, 10, database=store)
    assert execute_run(store, reader_run.id) == Outcome.RELEASED
    reads = [step for step in store.get_steps(reader_run.id) if step.name == "everystep.get_steps"]
    assert [step.args for step in reads] == [[target.id, None, 10], [target.id, "10", 10], [target.id, "20", 10]]
    write_history(store, target.id, ticks(10, first=26))  # the target goes on while the reader sleeps
    expire_wait(store, reader_run.id, "4")
    assert execute_run(store, reader_run.id) == COMPLETED
    first = [str(n) for n in range(1, 11)]
    assert store.get_run(reader_run.id).result == [first, [str(n) for n in range(11, 21)],
                                                   [str(n) for n in range(21, 26)]]


def test_a_page_through_a_callers_own_connection(store: Store) -> None:
    run = schedule(long_runs.ticker, 30, database=store)
    write_history(store, run.id, ticks(30))
    with reader(store.url) as conn:
        page = borrowed.get_steps(conn, run.id, after="5", limit=3)
        whole = borrowed.get_steps(conn, run.id)
    assert [step.step_id for step in page] == ["6", "7", "8"] and page == whole[5:8]


def test_an_async_page(store: Store) -> None:
    run = schedule(long_runs.ticker, 30, database=store)
    write_history(store, run.id, ticks(30))
    page = asyncio.run(everystep.get_steps_async(run.id, database=store, after="28", limit=5))
    assert [step.step_id for step in page] == ["29", "30"]


def test_the_outline_is_every_step_id_function_and_status_and_a_patch_answer(store: Store) -> None:
    run = schedule(long_runs.mixed, 2, database=store)
    assert execute_run(store, run.id) == COMPLETED
    write_history(store, run.id, [(marker_id("tax"), PATCH_STEP, True)])
    whole = store.get_steps(run.id)
    outline = store.step_outline(run.id, PATCH_STEP)
    assert outline == [StepOutline(run.id, s.step_id, s.name, s.status, True if s.name == PATCH_STEP else None)
                       for s in whole]
    assert outline[-1].result is True
