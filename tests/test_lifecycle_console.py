"""The run lifecycle in the console's API over real HTTP, on both backends:
a retried step's attempts, what a scheduled run waits for, a step whose
effect is uncertain after a cancel, and the cancel action with the CLI's
rules and refusals."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from everystep import runner, schedule
from everystep.models import CANCELLED, SCHEDULED
from everystep.runner import Outcome
from tests.support.console import ConsoleServer, serve
from tests.support.runs import claim_run
from tests.test_lifecycle import retrying_flow, sleeps

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def console(db_url: str) -> Iterator[ConsoleServer]:
    yield from serve(db_url, app_modules="tests.test_lifecycle")


@pytest.fixture
def client(console: ConsoleServer) -> Iterator[Any]:
    with console.client() as session:
        session.load_page()
        yield session


def test_a_retried_step_shows_its_attempts(console: ConsoleServer, client: Any) -> None:
    store = console.store
    run = schedule(retrying_flow, f"console-{store.backend}", 2, database=store)
    for _ in range(2):
        runner.execute(store, claim_run(store, run.id), claimer="tester")
    page = client.get(f"/api/runs/{run.id}").json()
    [step] = page["steps"]
    assert (step["status"], step["attempt"]) == ("done", 2)
    assert [(a["attempt"], a["error"]["message"]) for a in step["attempts"]] == [(1, "attempt 1")]
    assert step["effect_uncertain"] is False


def test_a_sleeping_run_says_so_and_can_be_cancelled(console: ConsoleServer, client: Any,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    store = console.store
    run = schedule(sleeps, 3600, database=store)
    assert runner.execute(store, claim_run(store, run.id), claimer="tester") == Outcome.RELEASED
    page = client.get(f"/api/runs/{run.id}").json()
    assert page["run"]["status"] == SCHEDULED and page["run"]["waiting"].startswith("sleeping until ")
    assert page["run"]["not_before"] is not None
    assert "cancel" in [action["name"] for action in page["actions"]]
    with caplog.at_level(logging.INFO, logger="everystep.console"):
        answer = client.act(f"/api/runs/{run.id}/cancel", {"reason": "changed my mind"})
    assert answer.status_code == 200, answer.text
    cancelled = store.get_run(run.id)
    assert (cancelled.status, cancelled.error["message"]) == (CANCELLED, "changed my mind")
    assert any(f"cancelled run {run.id}" in record.getMessage() for record in caplog.records)
    page = client.get(f"/api/runs/{run.id}").json()
    assert "cancel" not in [action["name"] for action in page["actions"]] and page["run"]["waiting"] is None
    refused = client.act(f"/api/runs/{run.id}/cancel")
    assert refused.status_code == 409
    assert refused.json()["error"] == (f"run {run.id} is cancelled: only scheduled, running or blocked runs "
                                       "can be cancelled")


def test_a_delayed_run_waits_and_a_cancel_without_reason_names_who(console: ConsoleServer, client: Any) -> None:
    store = console.store
    run = schedule(sleeps, 0, database=store, delay=600)
    assert client.get(f"/api/runs/{run.id}").json()["run"]["waiting"].startswith("delayed until ")
    assert client.act(f"/api/runs/{run.id}/cancel").status_code == 200
    assert store.get_run(run.id).error["message"].startswith("cancelled from the console by ")
