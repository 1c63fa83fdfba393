"""The console's side of waits, over HTTP: a run page says what the run
waits for, lists its children (each with its status), the events it
published and the messages sent to it, links a child to its parent, marks
a child's start in the step graph; the send form's endpoint delivers a
message and refuses, like the CLI, a run that no longer receives any."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import everystep
from everystep import schedule
from everystep.runner import Outcome
from everystep.store import Store
from tests.apps import waits as apps
from tests.support.console import ConsoleServer, serve
from tests.support.runs import execute_run

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def console(db_url: str) -> Iterator[ConsoleServer]:
    yield from serve(db_url, app_modules="tests.apps.waits")


@pytest.fixture
def client(console: ConsoleServer) -> Iterator[Any]:
    with console.client() as session:
        session.load_page()
        yield session


def _nodes(graph: Any) -> Iterator[dict[str, Any]]:
    if isinstance(graph, dict):
        if "kind" in graph:
            yield graph
        for value in graph.values():
            yield from _nodes(value)
    elif isinstance(graph, list):
        for item in graph:
            yield from _nodes(item)


def test_a_waiting_run_page_and_the_send_form(store: Store, client: Any) -> None:
    run = schedule(apps.checkout, "c-1", database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    page = client.get(f"/api/runs/{run.id}").json()
    assert page["run"]["waiting"] == 'waiting for message "paid"'
    assert page["events"][0]["key"] == "payment_url" and page["send"] is True
    sent = client.act(f"/api/runs/{run.id}/send", {"topic": "paid", "payload": '{"amount": 12}', "key": "p-1"})
    assert sent.status_code == 200, sent.text
    assert sent.json()["stored"] is True and sent.json()["message"].startswith("message ")
    again = client.act(f"/api/runs/{run.id}/send", {"topic": "paid", "payload": "0", "key": "p-1"})
    assert again.json()["message_id"] == sent.json()["message_id"] and again.json()["stored"] is False
    assert again.json()["message"] == (f"already sent as message {sent.json()['message_id']} (same key 'p-1'); "
                                       "nothing stored")
    assert execute_run(store, run.id) == Outcome.COMPLETED
    page = client.get(f"/api/runs/{run.id}").json()
    assert [(m["topic"], m["payload"], m["consumed_step"]) for m in page["messages"]] == [("paid", {"amount": 12}, "2")]
    assert page["send"] is False
    refused = client.act(f"/api/runs/{run.id}/send", {"topic": "paid", "payload": "1"})
    assert refused.status_code == 409 and "is completed" in refused.json()["error"]
    bad = client.act(f"/api/runs/{run.id}/send", {"topic": "paid", "payload": "{not json"})
    assert bad.status_code == 400


def test_parent_and_children_link_both_ways(store: Store, client: Any) -> None:
    parent = schedule(apps.parent_calls, database=store)
    assert execute_run(store, parent.id) == Outcome.RELEASED
    [child] = store.children(parent.id)
    page = client.get(f"/api/runs/{parent.id}").json()
    assert page["run"]["waiting"] == f"waiting for child {child.id}"
    assert [(c["id"], c["status"]) for c in page["children"]] == [(child.id, "scheduled")]
    # The start and the wait for the child's end both name it, and link to it.
    named = [(node["kind"], node["child"]) for node in _nodes(page["graph"]) if node.get("child")]
    assert named == [(kind, {"id": child.id, "name": apps.child_double.name, "status": "scheduled"})
                     for kind in ("step", "wait")]
    assert client.get(f"/api/runs/{child.id}").json()["run"]["parent_id"] == parent.id


def test_the_runs_list_filters_waiting_runs_and_says_what_they_wait_for(store: Store, client: Any) -> None:
    forever = schedule(apps.approval, "no timeout", database=store)
    timed = schedule(apps.approval_with_timeout, 3600, database=store)
    due = schedule(apps.approval, "due now, not waiting", database=store)
    done = schedule(apps.child_double, 2, database=store)
    assert execute_run(store, forever.id) == execute_run(store, timed.id) == Outcome.RELEASED
    assert execute_run(store, done.id) == Outcome.COMPLETED

    listed = client.get("/api/runs", params={"status": "waiting"}).json()
    assert [(run["id"], run["status"]) for run in listed["runs"]] == [(timed.id, "scheduled"), (forever.id, "scheduled")]
    assert listed["runs"][1]["waiting"] == 'waiting for message "approved"'
    assert listed["runs"][0]["waiting"].startswith('waiting for message "approved" until ')
    first = client.get("/api/runs", params={"status": "waiting", "limit": 1}).json()
    rest = client.get("/api/runs", params={"status": "waiting", "limit": 1, "before": first["older"]}).json()
    assert [run["id"] for run in first["runs"] + rest["runs"]] == [timed.id, forever.id] and rest["older"] is None
    everything = {run["id"]: run["waiting"] for run in client.get("/api/runs").json()["runs"]}
    assert everything[due.id] is None and everything[done.id] is None and everything[forever.id]
    statuses = next(f for f in client.get("/api/meta").json()["filters"] if f["name"] == "status")["options"]
    assert statuses[:3] == ["scheduled", "waiting", "running"]

    # A wait without a timeout has no time to show (its not-before is a far-off sentinel).
    page = client.get(f"/api/runs/{forever.id}").json()["run"]
    assert page["not_before"] is None and page["waiting"] == 'waiting for message "approved"'
    assert client.get(f"/api/runs/{timed.id}").json()["run"]["not_before"] == store.get_run(timed.id).not_before.isoformat()


def test_the_cancel_action_counts_the_children_it_cancelled(store: Store, client: Any) -> None:
    parent = schedule(apps.parent_of_waiters, 2, database=store)
    assert execute_run(store, parent.id) == Outcome.RELEASED
    answer = client.act(f"/api/runs/{parent.id}/cancel")
    assert answer.status_code == 200, answer.text
    assert answer.json()["message"] == f"run {parent.id} cancelled, and its 2 unfinished children"
