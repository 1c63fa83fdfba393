"""Prometheus metrics in the process that executes runs, as a host
application (a web app calling ``runner.execute``) sees them in its own
registry: ``metrics.refresh_queue_gauges`` reads the queue from the
database, and run and step counters move by status (completed, failed,
stopped, blocked; a requeue after a drain and a simulated crash are not
terminal and count nothing).

The workflows are ``tests/support/outcomes.py``'s, executed in-process.
"""

from __future__ import annotations

import threading

import pytest
from prometheus_client import REGISTRY

from everystep import metrics, runner, schedule
from everystep.models import BLOCKED, COMPLETED, FAILED, STOPPED, Outcome
from tests.support.outcomes import (  # noqa: F401 - reset_probes is an autouse fixture
    PROBE, charging, draining, failing, make_blocked, reset_probes, stopping, t_boom, t_branch, traced,
)
from tests.support.runs import claim_run, execute_run
from tests.support.scrape import wait_for

pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_refresh_queue_gauges_reads_the_database_for_a_host_app(store):
    blocked = make_blocked(store, "gauges")
    held = schedule(traced, "held", database=store)
    claim_run(store, held.id)  # running, not executed
    for n in range(3):
        schedule("no.such.workflow", n, database=store)
    wait_for(lambda: store.queue_stats()["oldest_pending_age_seconds"] > 0, "a measurable queue age")

    metrics.refresh_queue_gauges(store)

    assert sample("everystep_workflows_pending") == 3
    assert sample("everystep_workflows_running") == 1
    assert sample("everystep_workflows_blocked") == 1
    assert sample("everystep_workflows_oldest_pending_age_seconds") > 0
    assert store.get_run(blocked).status == BLOCKED

    # Refreshed again after the database changed, not accumulated.
    schedule("no.such.workflow", 4, database=store)
    metrics.refresh_queue_gauges(store)
    assert sample("everystep_workflows_pending") == 4
    assert sample("everystep_workflows_running") == 1


def test_run_and_step_counters_by_status_in_process(store):
    def counts() -> dict[str, float]:
        return {
            "completed": sample("everystep_workflow_runs_total", workflow=traced.name, status=COMPLETED),
            "failed": sample("everystep_workflow_runs_total", workflow=failing.name, status=FAILED),
            "stopped": sample("everystep_workflow_runs_total", workflow=stopping.name, status=STOPPED),
            "blocked": sample("everystep_workflow_runs_total", workflow=charging.name, status=BLOCKED),
            "charging-failed": sample("everystep_workflow_runs_total", workflow=charging.name, status=FAILED),
            "boom": sample("everystep_step_runs_total", workflow=failing.name, step=t_boom.name, status="failed"),
            "branches": sample("everystep_step_runs_total", workflow=traced.name, step=t_branch.name, status="done"),
            "draining": sample("everystep_workflow_runs_total", workflow=draining.name, status="requeued"),
        }

    before = counts()
    assert execute_run(store, schedule(traced, "count", database=store).id) == COMPLETED
    assert execute_run(store, schedule(failing, "count", database=store).id) == FAILED
    assert execute_run(store, schedule(stopping, "count", database=store).id) == STOPPED
    make_blocked(store, "count")
    PROBE["draining"] = threading.Event()
    assert execute_run(store, schedule(draining, "count", database=store).id,
                       draining=PROBE["draining"]) == Outcome.REQUEUED
    after = counts()

    assert after["completed"] - before["completed"] == 1
    assert after["failed"] - before["failed"] == 1
    assert after["stopped"] - before["stopped"] == 1
    assert after["blocked"] - before["blocked"] == 1
    assert after["charging-failed"] == before["charging-failed"], "a simulated crash is not a failure"
    assert after["boom"] - before["boom"] == 1
    assert after["branches"] - before["branches"] == 2
    assert after["draining"] == before["draining"] == 0, "requeued is not a terminal status"
