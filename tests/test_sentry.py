"""Sentry reports of failed runs, and of nothing else.

In-process, through a capturing transport: a failed run is reported once
with its everystep context; stops, blocks, drains and simulated crashes are
not reported; without ``sentry_sdk.init`` reporting is a quiet no-op; an
engine-level failure carries the runner and leaks no scope. Across the
supervisor's process hop, through the file ``tests/apps/observed.py`` writes
events to when the test sets ``EVERYSTEP_TEST_SENTRY``: a step's failure is
reported by the child, a crashed child by the parent.

Every wait polls with a generous deadline; nothing asserts on timing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sentry_sdk
from sentry_sdk.transport import Transport

from everystep import schedule, sentry
from everystep.errors import ChildCrashed, SimulatedCrash
from everystep.models import BLOCKED, COMPLETED, FAILED, STOPPED, Outcome
from tests.apps import observed
from tests.apps.observed import APP, read_lines
from tests.support.outcomes import (  # noqa: F401 - reset_probes is an autouse fixture
    CALLS, PROBE, draining, failing, make_blocked, reset_probes, stopping, traced,
)
from tests.support.runs import crash_at, execute_run
from tests.support.scrape import free_port, metrics_args, scrape, wait_for
from tests.support.supervisor import supervisors, wait_run  # noqa: F401 - supervisors is a fixture

pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]


class CapturingTransport(Transport):
    """Keeps every envelope in memory instead of sending it."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.envelopes: list[Any] = []

    def capture_envelope(self, envelope: Any) -> None:
        self.envelopes.append(envelope)

    def events(self) -> list[dict[str, Any]]:
        return [event for envelope in self.envelopes for item in envelope.items
                if (event := item.get_event()) is not None]


@contextlib.contextmanager
def sentry_capturing() -> Iterator[CapturingTransport]:
    # A release given: sentry_sdk would otherwise ask git for one, in a subprocess.
    sentry_sdk.init(dsn="https://public@o0.ingest.sentry.io/0", transport=CapturingTransport, release="tests")
    client = sentry_sdk.get_client()
    transport = client.transport
    assert isinstance(transport, CapturingTransport)
    try:
        yield transport
    finally:
        client.close()
        sentry_sdk.get_global_scope().set_client(None)
        assert not sentry_sdk.get_client().is_active()


@pytest.fixture
def sentry_events() -> Iterator[CapturingTransport]:
    with sentry_capturing() as transport:
        yield transport


def exception_types(event: dict[str, Any]) -> list[str]:
    return [value["type"] for value in event.get("exception", {}).get("values", [])]


def test_sentry_captures_a_failed_run_with_its_everystep_context(store, sentry_events):
    run = schedule(failing, "sentry", database=store)
    assert execute_run(store, run.id) == FAILED

    events = sentry_events.events()
    assert len(events) == 1, events
    event = events[0]
    assert event["contexts"]["everystep"] == {"run_id": run.id, "workflow": failing.name}
    assert event["tags"]["everystep.workflow"] == failing.name
    assert exception_types(event)[-1] == "ValueError"
    assert "boom: sentry" in event["exception"]["values"][-1]["value"]


def test_sentry_hears_nothing_of_stops_blocks_drains_or_simulated_crashes(store, sentry_events):
    assert execute_run(store, schedule(stopping, "stop", database=store).id) == STOPPED
    blocked = make_blocked(store, "block")  # a SimulatedCrash, then a blocked replay
    PROBE["draining"] = threading.Event()
    drained = schedule(draining, "drain", database=store)
    assert execute_run(store, drained.id, draining=PROBE["draining"]) == Outcome.REQUEUED
    crashed = schedule(traced, "crash", database=store)
    crash_at("1")
    with pytest.raises(SimulatedCrash):
        execute_run(store, crashed.id)

    assert store.get_run(blocked).status == BLOCKED
    assert CALLS.count("drain:first") == 1 and "drain:second" not in CALLS, "drained after its first step"
    assert sentry_events.events() == []
    assert sentry_events.envelopes == []


def test_sentry_not_initialised_is_a_quiet_no_op(store):
    assert not sentry_sdk.get_client().is_active()
    run = schedule(failing, "no-sentry", database=store)
    assert execute_run(store, run.id) == FAILED
    sentry.report_failure(ValueError("nobody listens"), run.id, failing.name)


def test_report_failure_carries_engine_level_failures(sentry_events):
    crash = ChildCrashed("the process running this run died 3 times; last: killed by SIGKILL")
    sentry.report_failure(crash, "run-123", "app.flows.provision", runner="sup-a")

    [event] = sentry_events.events()
    assert event["contexts"]["everystep"] == {"run_id": "run-123", "workflow": "app.flows.provision",
                                              "runner": "sup-a"}
    assert exception_types(event)[-1] == "ChildCrashed"
    # The scope is per report: nothing leaks into the next event.
    sentry_sdk.capture_message("unrelated")
    assert "everystep" not in sentry_events.events()[-1].get("contexts", {})


def test_supervisor_reports_child_and_engine_failures_to_sentry(db_url, store, supervisors, subprocess_env,
                                                                 tmp_path):
    events_file = tmp_path / "sentry.jsonl"
    env = {**subprocess_env, observed.SENTRY_ENV: str(events_file)}
    port = free_port()
    sup = supervisors(db_url, procs=1, app=APP, env=env, args=["--max-crashes", "1", *metrics_args(port)]).start()
    work = {"dir": str(tmp_path)}
    failed = schedule(observed.fails, work, database=store)
    stopped = schedule(observed.stops, work, database=store)
    crashed = schedule(observed.suicide_flow, work, database=store)
    assert wait_run(store, failed.id, (COMPLETED, FAILED, STOPPED), supervisor=sup).status == FAILED
    assert wait_run(store, stopped.id, (COMPLETED, FAILED, STOPPED), supervisor=sup).status == STOPPED
    dead = wait_run(store, crashed.id, (COMPLETED, FAILED, STOPPED), supervisor=sup)
    assert dead.status == FAILED and dead.error["type"] == "everystep.errors.ChildCrashed"

    lines = wait_for(lambda: (lambda found: found if len(found) >= 2 else None)(read_lines(events_file)),
                     "two Sentry events", detail=lambda: f"\n--- log ---\n{sup.log()}")
    sup.wait_idle()
    lines = read_lines(events_file)
    by_run = {line["event"]["contexts"]["everystep"]["run_id"]: line for line in lines}
    assert len(lines) == 2 and set(by_run) == {failed.id, crashed.id}, lines
    child_report = by_run[failed.id]
    assert child_report["pid"] != sup.pid, "a failure inside the runner is reported by the child"
    assert child_report["event"]["contexts"]["everystep"]["workflow"] == observed.fails.name
    assert exception_types(child_report["event"])[-1] == "ValueError"
    engine_report = by_run[crashed.id]
    assert engine_report["pid"] == sup.pid, "a crash is reported by the parent"
    assert engine_report["event"]["contexts"]["everystep"] == {
        "run_id": crashed.id, "workflow": observed.suicide_flow.name, "runner": sup.name}
    assert exception_types(engine_report["event"])[-1] == "ChildCrashed"
    # The parent counts the run it failed; the child counted the others.
    page = scrape(port)
    assert page.value("everystep_workflow_runs_total", workflow=observed.suicide_flow.name, status=FAILED) == 1
    assert page.value("everystep_workflow_runs_total", workflow=observed.fails.name, status=FAILED) == 1
    assert page.value("everystep_workflow_runs_total", workflow=observed.stops.name, status=STOPPED) == 1
    assert page.value("everystep_supervisor_child_restarts_total", runner=sup.name, reason="crash") == 1
    assert sup.stop() == 0, sup.log()
