"""Scheduling from async code: ``schedule_async(conn=AsyncConnection)``
joins the caller's transaction on PostgreSQL (a Starlette handler's
rollback leaves no run); without a connection every backend schedules in a
worker thread; ``get_run_async``, ``wait_async`` and ``send_async``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import everystep
from everystep import EverystepError
from everystep.models import COMPLETED, SCHEDULED
from everystep.runner import Outcome
from everystep.store import Store, connect
from tests.apps import async_steps as app
from tests.support.runs import execute_run

pytestmark = pytest.mark.timeout(120)


def test_schedule_async_without_a_connection_runs_in_a_thread(store: Store) -> None:
    async def client() -> Any:
        run = await everystep.schedule_async(app.mixed_async, 7, database=store)
        seen = await everystep.get_run_async(run.id, database=store)
        return run, seen

    run, seen = asyncio.run(client())
    assert (seen.id, seen.status, seen.args) == (run.id, SCHEDULED, [7])
    assert execute_run(store, run.id) == COMPLETED
    done = asyncio.run(everystep.wait_async(run.id, timeout=30, database=store))
    assert done.status == COMPLETED


def test_send_async_wakes_a_receiving_run(store: Store) -> None:
    run = everystep.schedule(app.receives, database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    asyncio.run(everystep.send_async(run.id, "greeting", "from async", database=store))
    assert execute_run(store, run.id) == COMPLETED
    assert store.get_run(run.id).result == "fetched got from async"


def test_schedule_async_checks_arguments_before_writing(store: Store) -> None:
    with pytest.raises(everystep.WorkflowArgumentsError):
        asyncio.run(everystep.schedule_async(app.mixed_async, 1, 2, database=store))
    assert store.list_runs(name=app.mixed_async.name) == []


# -- a caller's AsyncConnection (PostgreSQL) ------------------------------------


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[Store]:
    opened = connect(pg_url)
    try:
        yield opened
    finally:
        opened.close()


def test_schedule_async_joins_the_callers_transaction(pg_url: str, pg_store: Store) -> None:
    async def client() -> tuple[str, str]:
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            async with conn.transaction():
                kept = await everystep.schedule_async(app.mixed_async, 1, conn=conn, idempotency_key="kept")
                seen = await everystep.get_run_async(kept.id, conn=conn)
                assert seen.status == SCHEDULED
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    gone = await everystep.schedule_async(app.mixed_async, 2, conn=conn)
                    raise RuntimeError("the handler failed")
            return kept.id, gone.id

    kept, gone = asyncio.run(client())
    assert pg_store.get_run(kept).status == SCHEDULED
    with pytest.raises(everystep.RunNotFound):
        pg_store.get_run(gone)


def test_send_async_on_a_connection_delivers_on_commit_only(pg_url: str, pg_store: Store) -> None:
    run = everystep.schedule(app.receives, database=pg_store)
    assert execute_run(pg_store, run.id) == Outcome.RELEASED

    async def client() -> None:
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    await everystep.send_async(run.id, "greeting", "rolled back", conn=conn)
                    raise RuntimeError("no")
            async with conn.transaction():
                await everystep.send_async(run.id, "greeting", "committed", conn=conn)

    asyncio.run(client())
    assert execute_run(pg_store, run.id) == COMPLETED
    assert pg_store.get_run(run.id).result == "fetched got committed"


def test_a_sync_connection_is_refused_by_the_async_forms(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn, pytest.raises(EverystepError, match="AsyncConnection"):
        asyncio.run(everystep.schedule_async(app.mixed_async, 1, conn=conn))


def test_a_starlette_handler_schedules_inside_its_transaction(pg_url: str, pg_store: Store) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    async def order(request: Request) -> JSONResponse:
        body = await request.json()
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            async with conn.transaction():
                run = await everystep.schedule_async(app.mixed_async, body["n"], conn=conn)
                if body.get("fail"):
                    raise RuntimeError(f"order {body['n']} failed after scheduling run {run.id}")
        return JSONResponse({"run": run.id})

    web = Starlette(routes=[Route("/orders", order, methods=["POST"])])
    with TestClient(web, raise_server_exceptions=False) as client:
        ok = client.post("/orders", json={"n": 1})
        failed = client.post("/orders", json={"n": 2, "fail": True})
    assert ok.status_code == 200 and failed.status_code == 500
    runs = pg_store.list_runs(name=app.mixed_async.name)
    assert [(run.id, run.args) for run in runs] == [(ok.json()["run"], [1])]
