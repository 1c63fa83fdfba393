"""Streams over HTTP and in the console: the server-sent events endpoint
(``GET /api/runs/<id>/streams/<key>``) over real HTTP (uvicorn, httpx): every
value an event with its position as ``id``, ``Last-Event-ID`` resuming, an
``end`` event at the close or the run's end, one-line refusals, behind the
console's token; and the run page in a real browser showing a stream as a
live log while the run is in flight, without reloading."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from everystep import schedule
from everystep.runner import Outcome
from tests.apps import streams as apps
from tests.support.browser import browser, open_page, page_errors  # noqa: F401
from tests.support.console import ConsoleServer, serve
from tests.support.runs import execute_run

pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres", "mariadb")]

TOKEN = "t0ken-for-streams"


@pytest.fixture
def console(db_url: str) -> Iterator[ConsoleServer]:
    yield from serve(db_url, app_modules="tests.apps.streams", auth_token=TOKEN)


def authorized(console: ConsoleServer) -> httpx.Client:
    return httpx.Client(base_url=console.url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)


def events(response: httpx.Response) -> Iterator[tuple[str, str | None, str]]:
    """(event, id, data) of each event of an SSE body, as they come."""
    kind, ident, data = "message", None, ""
    for line in response.iter_lines():
        if line.startswith("event:"):
            kind = line.split(":", 1)[1].strip()
        elif line.startswith("id:"):
            ident = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            data = line.split(":", 1)[1].strip()
        elif line == "" and data:
            yield kind, ident, data
            kind, ident, data = "message", None, ""


def test_values_come_as_events_with_their_position_and_the_stream_ends(console: ConsoleServer) -> None:
    run = schedule(apps.reporter, 3, database=console.store)
    assert execute_run(console.store, run.id) == Outcome.COMPLETED
    with authorized(console) as client, client.stream("GET", f"/api/runs/{run.id}/streams/progress") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        got = list(events(response))
    assert got == [("value", "1", '{"done":1,"of":3}'), ("value", "2", '{"done":2,"of":3}'),
                   ("value", "3", '{"done":3,"of":3}'), ("end", "4", "{}")]

    with authorized(console) as client, client.stream("GET", f"/api/runs/{run.id}/streams/progress",
                                                      headers={"last-event-id": "2"}) as response:
        assert [ident for _, ident, _ in events(response)] == ["3", "4"]


def test_a_reader_sees_values_of_a_run_in_flight(console: ConsoleServer) -> None:
    run = schedule(apps.producing, 40, database=console.store)
    got: list[tuple[str, str | None, str]] = []
    with authorized(console) as client, client.stream("GET", f"/api/runs/{run.id}/streams/lines") as response:
        assert response.status_code == 200
        reading = threading.Thread(target=lambda: got.extend(events(response)))
        reading.start()
        assert execute_run(console.store, run.id) == Outcome.COMPLETED
        reading.join(60)
        assert not reading.is_alive()
    assert [json.loads(data) for kind, _, data in got if kind == "value"] == list(range(40))
    assert got[-1][0] == "end"


def test_refusals_are_one_line_and_the_token_is_required(console: ConsoleServer) -> None:
    run = schedule(apps.reporter, 1, database=console.store)
    with httpx.Client(base_url=console.url, timeout=30) as anonymous:
        assert anonymous.get(f"/api/runs/{run.id}/streams/progress").status_code == 401
    with authorized(console) as client:
        unknown = client.get("/api/runs/00000000-0000-0000-0000-00000000abcd/streams/k")
        assert unknown.status_code == 404 and "no run" in unknown.json()["error"]
        bad = client.get(f"/api/runs/{run.id}/streams/progress", headers={"last-event-id": "x"})
        assert bad.status_code == 400 and "\n" not in bad.json()["error"]
        assert client.get(f"/api/runs/{run.id}/streams/progress", params={"after": "-3"}).status_code == 400


@pytest.mark.backends("sqlite", "postgres")
def test_the_run_page_shows_a_stream_live_while_the_run_is_in_flight(
        db_url: str, browser: Any, page_errors: list[str]) -> None:
    for server in serve(db_url, app_modules="tests.apps.streams"):
        store = server.store
        run = schedule(apps.slow_lines, 30, 0.1, database=store)
        page = open_page(browser, page_errors)
        page.goto(server.url + f"/runs/{run.id}")
        page.evaluate("window.__loadedOnce = 'yes'")
        executing = threading.Thread(target=lambda: execute_run(store, run.id))
        executing.start()
        log = page.locator("pre.stream-log[data-stream='log']")
        expect(log).to_contain_text("line 3", timeout=30_000)  # shown while the run is in flight
        assert store.get_run(run.id).status == "running"
        expect(page.locator(".stream .stream-state")).to_have_text("live")
        executing.join(60)
        expect(page.locator(".stream[data-key='log']")).to_have_attribute("data-ended", "yes", timeout=30_000)
        expect(log.locator(".stream-line")).to_have_count(30)
        assert log.locator(".stream-line").nth(29).inner_text().strip() == "line 30"
        assert page.evaluate("window.__loadedOnce") == "yes"
        assert [error for error in page_errors if "favicon" not in error] == []
