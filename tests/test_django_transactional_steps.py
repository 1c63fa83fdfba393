"""Transactional steps in a Django project: the ORM joins the step's transaction.

Under ``everystep.contrib.django`` a ``@step(transactional=True)`` runs in a
``transaction.atomic()`` block on Django's connection for the everystep
alias: its ORM writes (and savepoints of its own) commit with the step's
record, or not at all. On SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("django", reason="the django extra is not installed")

from django.db import connections, transaction  # noqa: E402

import everystep  # noqa: E402
from everystep import runner, step, step_connection, transactional, workflow  # noqa: E402
from everystep.errors import SimulatedCrash  # noqa: E402
from everystep.models import COMPLETED, STEP_DONE, STEP_FAILED, Outcome  # noqa: E402
from everystep.store import Store, connect  # noqa: E402
from tests.support.django_project import Project, django_project, project  # noqa: E402,F401
from tests.support.runs import execute_run, resume  # noqa: E402

pytestmark = pytest.mark.timeout(120)

SEEN: dict[str, Any] = {}


@pytest.fixture
def store(project: Project) -> Any:
    """everystep's store on the URL the integration derives from the alias
    (the one its supervisor and worker use)."""
    from everystep.contrib.django import database

    store = connect(database.database_url(database.connection()))
    try:
        yield store
    finally:
        store.close()
        transactional.commit_fault = None
        SEEN.clear()


def new_order(sku: str = "mug") -> Any:
    from shop.models import Order

    return Order.objects.create(sku=sku, quantity=1, amount="5.00")


@step(transactional=True)
def pay_through_the_orm(order_id: int, fail: bool) -> str:
    from shop.models import Order

    Order.objects.filter(pk=order_id).update(status=Order.Status.PAID, charge_id="ch_1")
    with transaction.atomic(using="default"):  # a savepoint inside the step's transaction
        Order.objects.filter(pk=order_id).update(quantity=2)
    SEEN["same connection"] = step_connection() is connections["default"].connection
    SEEN["in atomic"] = connections["default"].in_atomic_block
    if fail:
        raise ValueError("card declined")
    return "paid"


@workflow
def pay(order_id: int, fail: bool) -> str:
    try:
        return pay_through_the_orm(order_id, fail)
    except ValueError as exc:
        return f"caught: {exc}"


def order_state(order_id: int) -> tuple[str, int]:
    from shop.models import Order

    order = Order.objects.get(pk=order_id)
    return order.status, order.quantity


def test_orm_writes_commit_with_the_record(project: Project, store: Store) -> None:
    order = new_order()
    run = everystep.schedule(pay, order.pk, False)
    seen: list[Any] = []

    def committing(ctx: Any, step_id: str, phase: str) -> None:
        if phase == "committing":
            # The record is written, not committed: a connection of our own sees neither.
            seen.append(([s.step_id for s in store.get_steps(run.id)], _committed_status(project, order.pk)))

    transactional.commit_fault = committing
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert seen == [([], "new")]
    assert SEEN == {"same connection": True, "in atomic": True}
    assert order_state(order.pk) == ("paid", 2)
    assert store.get_run(run.id).result == "paid"
    assert [(s.step_id, s.status) for s in store.get_steps(run.id)] == [("1", STEP_DONE)]


def test_an_exception_rolls_the_orm_writes_back(project: Project, store: Store) -> None:
    order = new_order()
    run = everystep.schedule(pay, order.pk, True)
    assert execute_run(store, run.id) == Outcome.COMPLETED
    assert store.get_run(run.id).result == "caught: card declined"
    assert order_state(order.pk) == ("new", 1)  # the update and the savepoint's, rolled back
    assert [(s.step_id, s.status) for s in store.get_steps(run.id)] == [("1", STEP_FAILED)]


def test_a_crash_before_the_commit_leaves_neither_and_the_replay_pays_once(project: Project, store: Store) -> None:
    from shop.workflows import fulfil_order

    order = new_order()
    run = everystep.schedule(fulfil_order, order.pk)

    def crash(ctx: Any, step_id: str, phase: str) -> None:
        if phase == "committing":
            raise SimulatedCrash("dies with the order's update and the record uncommitted")

    transactional.commit_fault = crash
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    transactional.commit_fault = None
    assert order_state(order.pk)[0] == "reserved"
    assert "3" not in {s.step_id for s in store.get_steps(run.id)}
    assert not connections["default"].in_atomic_block  # Django's block was rolled back and closed

    assert resume(store, run.id) == Outcome.COMPLETED
    assert order_state(order.pk)[0] == "paid"
    assert store.get_run(run.id).status == COMPLETED


def test_a_run_of_another_database_keeps_everysteps_own_connection(project: Project, tmp_path: Any) -> None:
    other = connect(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        @step(transactional=True, name="tests.django.other_database")
        def other_database() -> bool:
            return step_connection() is connections["default"].connection

        @workflow(name="tests.django.elsewhere")
        def elsewhere(_: Any) -> bool:
            return other_database()

        run = everystep.schedule(elsewhere, None, database=other)
        assert execute_run(other, run.id) == Outcome.COMPLETED
        assert other.get_run(run.id).result is False
    finally:
        other.close()


def _committed_status(project: Project, order_id: int) -> str:
    if project.backend == "postgres":
        import psycopg

        with psycopg.connect(project.url, autocommit=True) as conn:
            return str(conn.execute("SELECT status FROM shop_order WHERE id = %s", (order_id,)).fetchone()[0])
    import contextlib
    import sqlite3

    with contextlib.closing(sqlite3.connect(project.databases["default"]["NAME"], timeout=30)) as conn:
        return str(conn.execute("SELECT status FROM shop_order WHERE id = ?", (order_id,)).fetchone()[0])


def test_a_transactional_step_refuses_to_start_inside_an_open_atomic_block(project: Project, store: Store) -> None:
    order = new_order()
    run = everystep.schedule(pay, order.pk, False)
    with transaction.atomic():
        assert execute_run(store, run.id) == Outcome.FAILED
    error = store.get_run(run.id).error
    assert "cannot run inside an open transaction.atomic() block" in error["message"]
    assert order_state(order.pk) == ("new", 1) and store.get_steps(run.id) == []
