"""Messages, events, child runs and deadlines in-process, on every backend.

Each execution is driven by hand (claim, execute), so what is asserted is
what the database holds between executions: a waiting run is scheduled,
not claimable, its step ``waiting``; a send or a child's end makes it due;
a message is consumed exactly once, also across a crash on either side of
the consuming commit. Nothing waits on a clock: timeouts are moved into the
past in the database.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

import everystep
from everystep import EverystepError, SendRefused, admin, schedule
from everystep.errors import Cancelled
from everystep.models import (
    CANCELLED, COMPLETED, SCHEDULED, STEP_WAITING, STEP_DONE, STEP_FAILED, WAIT_FOREVER,
)
from everystep.runner import Outcome
from everystep.store import Store, utcnow
from tests.apps import waits as apps
from tests.support.pgbouncer import libpq_url
from tests.support.runs import crash_at, due_now, execute_run, expire_wait, resume

# The engine's own statements: also through PgBouncer in transaction mode.
pytestmark = pytest.mark.pooled


def test_recv_waits_holding_a_row_and_the_send_wakes_it(store: Store) -> None:
    run = schedule(apps.approval, "o-1", database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    waiting = store.get_run(run.id)
    assert waiting.status == SCHEDULED and waiting.not_before == WAIT_FOREVER
    [recv] = store.get_steps(run.id)
    assert (recv.name, recv.status, recv.args, recv.wake_at) == ("everystep.recv", STEP_WAITING, ["approved"], None)
    assert store.links(run.id).wait_key == "message:approved"
    assert store.claim("other", 10, [apps.approval.name]) == []
    everystep.send(run.id, "approved", {"by": "ada"}, database=store)
    assert due_now(store, run.id)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == {"order": "o-1", "decision": {"by": "ada"}}
    [message] = store.messages(run.id)
    assert message.consumed_step == "1"


def test_a_message_sent_before_the_recv_is_kept(store: Store) -> None:
    run = schedule(apps.approval, "o-2", database=store)
    everystep.send(run.id, "approved", "yes", database=store)
    everystep.send(run.id, "other-topic", "ignored", database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result["decision"] == "yes"
    assert [m.consumed_step for m in store.messages(run.id)] == ["1", None]


def test_two_messages_on_one_topic_are_consumed_in_send_order(store: Store) -> None:
    run = schedule(apps.two_in_order, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    everystep.send(run.id, "t", "first", database=store)
    everystep.send(run.id, "t", "second", database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == ["first", "second"]


def test_a_repeated_idempotency_key_stores_nothing_and_returns_the_first_id(store: Store) -> None:
    run = schedule(apps.two_in_order, database=store)
    first = everystep.send(run.id, "t", "a", idempotency_key="k", database=store)
    again = everystep.send(run.id, "t", "b", idempotency_key="k", database=store)
    assert first == again
    assert [m.payload for m in store.messages(run.id)] == ["a"]


def test_recv_times_out_and_the_body_catches_it(store: Store) -> None:
    run = schedule(apps.approval_with_timeout, 3600, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    [recv] = store.get_steps(run.id)
    assert recv.wake_at == store.get_run(run.id).not_before != WAIT_FOREVER
    expire_wait(store, run.id, "1")
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == "timed out"
    steps = store.get_steps(run.id)
    assert steps[0].status == STEP_FAILED and steps[0].error["type"] == "everystep.errors.RecvTimeout"


def test_sending_to_a_finished_unknown_or_cancelled_run_is_refused(store: Store) -> None:
    done = schedule(apps.child_double, 1, database=store)
    assert execute_run(store, done.id) == Outcome.COMPLETED
    with pytest.raises(SendRefused, match="is completed"):
        everystep.send(done.id, "t", 1, database=store)
    with pytest.raises(SendRefused, match="no run with id"):
        everystep.send("01a2c000-0000-7000-8000-000000000000", "t", 1, database=store)
    waiting = schedule(apps.approval, "o-3", database=store)
    admin.cancel(store, waiting.id)
    with pytest.raises(SendRefused, match="is cancelled"):
        everystep.send(waiting.id, "approved", 1, database=store)
    assert store.messages(done.id) == [] and store.messages(waiting.id) == []


def test_a_crash_before_the_consuming_commit_delivers_the_message_again(store: Store) -> None:
    run = schedule(apps.approval, "o-4", database=store)
    everystep.send(run.id, "approved", "once", database=store)
    crash_at("1")  # the recv's own fault point: before it consumes
    with pytest.raises(everystep.SimulatedCrash):
        execute_run(store, run.id)
    assert [m.consumed_step for m in store.messages(run.id)] == [None]
    assert resume(store, run.id) == Outcome.COMPLETED
    assert [m.consumed_step for m in store.messages(run.id)] == ["1"]
    assert store.get_run(run.id).result["decision"] == "once"


def test_a_crash_after_the_consuming_commit_replays_the_recorded_payload(store: Store, tmp_path: Any) -> None:
    effects = tmp_path / "effects.txt"
    run = schedule(apps.recv_then_effect, str(effects), database=store)
    everystep.send(run.id, "go", "m1", database=store)
    everystep.send(run.id, "go", "m2", database=store)
    crash_at("2")  # after the next step's effect: the recv's commit is behind
    with pytest.raises(everystep.SimulatedCrash):
        execute_run(store, run.id)
    assert [m.consumed_step for m in store.messages(run.id)] == ["1", None]
    assert resume(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == "m1"
    assert [m.consumed_step for m in store.messages(run.id)] == ["1", None]
    assert effects.read_text().splitlines() == ["got m1", "got m1"]  # the step is at-least-once, the message once


def test_events_are_published_once_and_overwritten_by_a_later_set(store: Store) -> None:
    run = schedule(apps.checkout, "o-5", database=store)
    with pytest.raises(TimeoutError):
        everystep.get_event(run.id, "payment_url", database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    assert everystep.get_event(run.id, "payment_url", database=store) == "https://pay.example/o-5"
    everystep.send(run.id, "paid", True, database=store)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert {e.key: e.value for e in store.events(run.id)} == {"payment_url": "https://pay.example/o-5",
                                                                 "state": "paid"}
    assert [s.name for s in store.get_steps(run.id)].count("everystep.set_event") == 2


def test_a_parent_waits_for_three_children_one_of_which_fails(store: Store) -> None:
    parent = schedule(apps.parent_of_three, database=store)
    assert execute_run(store, parent.id) == Outcome.RELEASED
    children = store.children(parent.id)
    assert len(children) == 3 and all(store.links(c.id).parent_id == parent.id for c in children)
    assert store.links(parent.id).wait_key == f"child:{children[0].id}"
    # A replay of the parent never schedules them again.
    assert execute_run(store, parent.id, claimer="again") == Outcome.RELEASED if due_now(store, parent.id) \
        else True
    assert len(store.children(parent.id)) == 3
    for child in children:
        execute_run(store, child.id)
    for _ in range(4):
        if not due_now(store, parent.id):
            break
        if execute_run(store, parent.id) == Outcome.COMPLETED:
            break
    result = store.get_run(parent.id).result
    assert result[0] == 2 and result[2] == 6
    assert result[1]["failed"] == children[1].id and result[1]["status"] == "failed"
    assert result[1]["cause"] == "boom"


def test_call_is_start_then_result(store: Store) -> None:
    parent = schedule(apps.parent_calls, database=store)
    assert execute_run(store, parent.id) == Outcome.RELEASED
    [child] = store.children(parent.id)
    assert execute_run(store, child.id) == Outcome.COMPLETED
    assert due_now(store, parent.id)
    assert execute_run(store, parent.id) == Outcome.COMPLETED
    assert store.get_run(parent.id).result == 42


def test_a_child_whose_last_write_carries_a_patch_marker_wakes_its_parent(store: Store) -> None:
    parent = schedule(apps.parent_calls_patched, database=store)
    assert execute_run(store, parent.id) == Outcome.RELEASED
    [child] = store.children(parent.id)
    assert execute_run(store, child.id) == Outcome.COMPLETED
    assert sorted(step.name for step in store.get_steps(child.id)) == ["everystep.patch", "tests.apps.waits.double"]
    assert due_now(store, parent.id) and store.links(parent.id).wait_key is None
    assert execute_run(store, parent.id) == Outcome.COMPLETED
    assert store.get_run(parent.id).result == 42


def test_cancelling_a_parent_cancels_its_unfinished_children_recursively(store: Store) -> None:
    top = schedule(apps.parent_of_waiters, 2, database=store)
    assert execute_run(store, top.id) == Outcome.RELEASED
    kids = store.children(top.id)
    for kid in kids:
        assert execute_run(store, kid.id) == Outcome.RELEASED
    admin.cancel(store, top.id)
    for kid in kids:
        cancelled = store.get_run(kid.id)
        assert cancelled.status == CANCELLED
        assert isinstance(cancelled.exception, Cancelled) and top.id in str(cancelled.exception)


def test_a_cancelled_child_raises_child_failed_in_its_parent(store: Store) -> None:
    parent = schedule(apps.parent_calls, database=store)
    assert execute_run(store, parent.id) == Outcome.RELEASED
    [child] = store.children(parent.id)
    admin.cancel(store, child.id, "not needed")
    assert due_now(store, parent.id)
    assert execute_run(store, parent.id) == Outcome.FAILED
    error = store.get_run(parent.id).exception
    assert isinstance(error, everystep.ChildFailed) and error.status == CANCELLED
    assert isinstance(error.cause, Cancelled)


def test_a_deadline_is_inherited_by_children_and_cancels_when_it_passes(store: Store) -> None:
    ends = utcnow() + dt.timedelta(hours=1)
    parent = schedule(apps.parent_calls, deadline=ends, database=store)
    assert execute_run(store, parent.id) == Outcome.RELEASED
    [child] = store.children(parent.id)
    assert store.links(child.id).deadline == store.links(parent.id).deadline
    assert store.expired_deadlines() == []
    past = utcnow() - dt.timedelta(seconds=1)
    value = past.isoformat() if store.backend == "sqlite" else past
    marker = "?" if store.backend == "sqlite" else "%s"
    with store.connection() as conn:
        conn.execute(f"UPDATE everystep_workflow SET deadline = {marker} WHERE id = {marker}", (value, parent.id))
    assert store.expired_deadlines() == [parent.id]
    admin.cancel(store, parent.id, "deadline")
    assert store.get_run(parent.id).status == CANCELLED
    assert store.get_run(child.id).status == CANCELLED


def test_deadline_and_timeout_options(store: Store) -> None:
    with pytest.raises(EverystepError, match="not both"):
        schedule(apps.spins, 1, deadline=utcnow(), timeout=3, database=store)
    run = schedule(apps.spins, 1, database=store)  # @workflow(timeout=3600)
    assert dt.timedelta(minutes=59) < store.links(run.id).deadline - utcnow() <= dt.timedelta(hours=1)
    run = schedule(apps.child_double, 1, timeout=60, database=store)
    assert store.links(run.id).deadline - utcnow() <= dt.timedelta(seconds=60)
    assert store.links(schedule(apps.child_double, 1, database=store).id).deadline is None


def test_waits_outside_a_workflow_are_refused() -> None:
    with pytest.raises(EverystepError, match="inside a running workflow"):
        everystep.recv("t")
    with pytest.raises(EverystepError, match="inside a running workflow"):
        everystep.set_event("k", 1)
    with pytest.raises(EverystepError, match="inside a running workflow"):
        everystep.start(apps.child_double, 1)


def test_the_waiting_gauge_counts_by_kind(store: Store) -> None:
    schedule(apps.approval, "g", database=store)
    parent = schedule(apps.parent_calls, database=store)
    for run in store.list_runs():
        execute_run(store, run.id)
    counts = store.waiting_counts()
    assert counts.get("message") == 1 and counts.get("child") == 1
    assert store.children(parent.id)[0].status == SCHEDULED
    assert COMPLETED not in counts and STEP_DONE not in counts


def _caller_connection(store: Store, db_url: str) -> Any:
    """A connection of the caller's own, outside everystep's pool, with a
    transaction to open (autocommit off)."""
    if store.backend == "sqlite":
        import sqlite3

        from everystep.store.sqlite import path_from_url

        return sqlite3.connect(path_from_url(db_url))
    if store.backend == "postgres":
        import psycopg

        return psycopg.connect(libpq_url(db_url))
    import pymysql

    from everystep.store.mariadb import connect_args

    return pymysql.connect(**connect_args(db_url), autocommit=False)


@pytest.mark.parametrize("outcome", ["rollback", "commit"])
def test_a_send_joins_the_callers_transaction(store: Store, db_url: str, outcome: str) -> None:
    run = schedule(apps.approval, "tx", database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    conn = _caller_connection(store, db_url)
    try:
        if store.backend == "mariadb":
            conn.begin()
        everystep.send(run.id, "approved", "in a transaction", conn=conn)
        assert not due_now(store, run.id)
        getattr(conn, outcome)()
    finally:
        conn.close()
    if outcome == "rollback":
        assert store.messages(run.id) == [] and not due_now(store, run.id)
        return
    assert due_now(store, run.id)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result["decision"] == "in a transaction"
