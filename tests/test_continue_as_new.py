"""continue_as_new: a run ends ``continued`` and its successor takes over,
in one transaction: arguments, queue, priority, concurrency key, parent,
deadline and idempotency key carried over, unconsumed messages moved,
events copied; lineage both ways; waits, sends and a parent's wait follow
the chain. On every backend."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

import everystep
from everystep import EverystepError, schedule
from everystep.models import COMPLETED, CONTINUED, FAILED, SCHEDULED
from everystep.runner import Outcome
from everystep.store import Store, utcnow
from everystep.store.base import core
from tests.apps import continuing as apps
from everystep.web.views import Views
from tests.support.cli import run_in_process
from tests.support.runs import execute_run
from tests.support.refusals import guarded, quick_backoff, refuse  # noqa: F401 - the fixture


def _chain(store: Store, run_id: str) -> list[Any]:
    runs = [store.get_run(run_id)]
    while runs[-1].continued_as:
        runs.append(store.get_run(runs[-1].continued_as))
    return runs


def test_a_looping_run_continues_and_no_message_is_lost_or_delivered_twice(store: Store) -> None:
    first = schedule(apps.subscription, 0, 3, -1, database=store)
    for n in range(1, 8):  # sent before it runs: some are consumed by each run of the chain
        everystep.send(first.id, "add", n, database=store)
    everystep.send(first.id, "add", -1, database=store)
    for _ in range(10):
        newest = _chain(store, first.id)[-1]
        if newest.status != SCHEDULED:
            break
        execute_run(store, newest.id)
    runs = _chain(store, first.id)
    assert [run.status for run in runs] == [CONTINUED, CONTINUED, COMPLETED]
    assert runs[-1].result == sum(range(1, 8))
    assert [run.args for run in runs] == [[0, 3, -1], [6, 3, -1], [21, 3, -1]]
    assert [run.continued_from for run in runs] == [None, runs[0].id, runs[1].id]
    consumed = [(m.payload, run.id) for run in runs for m in store.messages(run.id) if m.consumed_step]
    assert sorted(payload for payload, _ in consumed) == [-1, 1, 2, 3, 4, 5, 6, 7]
    assert all(m.consumed_step for run in runs for m in store.messages(run.id))
    assert [len(store.get_steps(run.id)) for run in runs] == [7, 7, 4]  # each run's own history only
    assert store.get_event(runs[-1].id, "total").value == 21


def test_the_successor_inherits_placement_parent_deadline_and_idempotency_key(store: Store) -> None:
    deadline = utcnow() + dt.timedelta(hours=1)
    first = schedule(apps.continues_once, 0, database=store, queue="slow", priority=5, concurrency_key="acct-1",
                     deadline=deadline, idempotency_key="job-1")
    assert execute_run(store, first.id) == Outcome.CONTINUED
    old, new = _chain(store, first.id)
    assert (old.status, old.continued_as, old.idempotency_key) == (CONTINUED, new.id, None)
    assert (new.status, new.args, new.continued_from) == (SCHEDULED, [1], old.id)
    assert (new.queue, new.priority, new.concurrency_key, new.idempotency_key) == ("slow", 5, "acct-1", "job-1")
    assert store.links(new.id).deadline == store.links(old.id).deadline
    again = schedule(apps.continues_once, 0, database=store, idempotency_key="job-1")
    assert again.id == new.id  # the key reaches the chain's newest run


def test_wait_and_send_on_the_old_id_reach_the_newest_run(store: Store) -> None:
    first = schedule(apps.subscription, 0, 1, -1, database=store)
    everystep.send(first.id, "add", 4, database=store)
    assert execute_run(store, first.id) == Outcome.CONTINUED
    newest = _chain(store, first.id)[-1]
    everystep.send(first.id, "add", -1, database=store)  # to the old id
    assert [m.payload for m in store.messages(newest.id)] == [-1]
    assert execute_run(store, newest.id) == Outcome.COMPLETED
    ended = everystep.wait(first.id, timeout=10, database=store)
    assert (ended.id, ended.status, ended.result) == (newest.id, COMPLETED, 4)
    assert everystep.get_run(first.id, database=store).continued_as == newest.id


def test_a_parent_waits_through_its_child_s_continuation(store: Store) -> None:
    parent = schedule(apps.parent_of_a_continuing_child, database=store)
    assert execute_run(store, parent.id) == Outcome.RELEASED
    [child] = store.children(parent.id)
    assert execute_run(store, child.id) == Outcome.CONTINUED
    successor = store.get_run(child.id).continued_as
    assert store.get_run(successor).status == SCHEDULED
    assert store.links(successor).parent_id == parent.id  # still the parent's child
    assert execute_run(store, parent.id) == Outcome.RELEASED  # woken; waits for the successor now
    assert store.links(parent.id).wait_key == f"child:{successor}"
    assert execute_run(store, successor) == Outcome.COMPLETED
    assert execute_run(store, parent.id) == Outcome.COMPLETED
    assert store.get_run(parent.id).result == "continued with 1"


def test_a_failed_continuation_writes_nothing_and_the_run_is_given_back(store: Store, quick_backoff: None) -> None:
    first = schedule(apps.continues_once, 0, database=store)
    refuse({"insert_continuation"})
    try:
        assert guarded(store, first.id) == Outcome.DEFERRED
    finally:
        core.statement_fault = None
    run = store.get_run(first.id)
    assert (run.status, run.continued_as) == (SCHEDULED, None)
    assert store.list_runs(name=apps.continues_once.name) == [run]


@pytest.mark.parametrize("workflow, where", [
    (apps.continues_in_a_branch, "in a parallel branch"),
    (apps.calls_a_continuing_step, "in a step's own code"),
    (apps.continues_with_too_many, "cannot take 2 argument(s)"),
    (apps.continues_with_an_unstorable, "cannot be stored"),
    (apps.continues_with_a_keyword_only, "a run's arguments are positional, and mode cannot be given by position"),
    (apps.continues_with_an_unknown_keyword, "got an unexpected keyword argument 'colour'"),
])
def test_a_continuation_in_the_wrong_place_or_with_bad_arguments_fails_the_run_and_starts_nothing(
        store: Store, workflow: Any, where: str) -> None:
    takes_one = (apps.continues_with_too_many, apps.continues_with_an_unstorable, apps.continues_with_a_keyword_only,
                 apps.continues_with_an_unknown_keyword)
    run = schedule(workflow, *([1] if workflow in takes_one else []), database=store)
    assert execute_run(store, run.id) == Outcome.FAILED
    ended = store.get_run(run.id)
    assert ended.status == FAILED and where in ended.error["message"]
    assert ended.continued_as is None and len(store.list_runs(name=workflow.name)) == 1


def test_keyword_arguments_are_placed_by_the_workflow_s_signature(store: Store) -> None:
    first = schedule(apps.continues_by_keyword, 0, database=store)
    assert execute_run(store, first.id) == Outcome.CONTINUED
    old, new = _chain(store, first.id)
    assert new.args == [1, "plain", 5]  # the default before a keyword filled in
    assert execute_run(store, new.id) == Outcome.COMPLETED and store.get_run(new.id).result == [1, "plain", 5]


def test_outside_a_workflow_continue_as_new_says_where_it_belongs() -> None:
    with pytest.raises(EverystepError, match="called outside a workflow: it may only be called in a workflow's body"):
        everystep.continue_as_new(1)


def test_show_and_the_console_link_a_chain_both_ways(store: Store, db_url: str, tmp_path: Path,
                                                    subprocess_env: dict[str, str]) -> None:
    first = schedule(apps.continues_once, 0, database=store)
    assert execute_run(store, first.id) == Outcome.CONTINUED
    old, new = _chain(store, first.id)
    shown = run_in_process(["show", old.id, "--database", db_url], subprocess_env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f"continued  as {new.id}" in shown.stdout and "status     continued" in shown.stdout
    shown = run_in_process(["show", new.id, "--json", "--database", db_url], subprocess_env, tmp_path)
    assert json.loads(shown.stdout)["run"]["continued_from"] == old.id
    views = Views(store)
    assert views.run(old.id)["run"]["continued_as"] == new.id
    assert views.run(new.id)["run"]["continued_from"] == old.id
