"""Prometheus metrics of a live supervisor, scraped over real HTTP.

An ``everystep-supervisor --metrics-port`` whose children execute runs of
``tests/apps/observed.py`` (each step returns the pid that ran it) is
scraped while runs execute and after: counters written by both children
add up, queue gauges are read from the database at scrape time, a child
killed -9 is counted as a crash without losing what it counted, restarts
are counted by reason (timeout, kill, recycle), control requests by
command, and no label ever carries a run id.

Every wait polls with a generous deadline; nothing asserts on timing.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from everystep import schedule
from everystep.models import COMPLETED, FAILED
from everystep.store import Store
from tests.apps import observed
from tests.apps.observed import APP
from tests.support.scrape import free_port, metrics_args, scrape, scrape_until
from tests.support.supervisor import supervisors, wait_for_pids_gone, wait_run  # noqa: F401 - supervisors is a fixture

pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]

THREE_STEPS = observed.three_steps.name
STEP_NAMES = [observed.rendezvous.name, observed.held.name, observed.finish.name]


def step_pids(store: Store, run_ids: list[str]) -> set[int]:
    return {record.result for run_id in run_ids for record in store.get_steps(run_id)}


def test_supervisor_metrics_aggregate_both_children_and_the_queue(db_url, store, supervisors, tmp_path):
    port = free_port()
    began = time.time()
    sup = supervisors(db_url, procs=2, app=APP, args=metrics_args(port)).start()
    name = sup.name
    children = {child["pid"] for child in sup.status()["children"]}
    assert len(children) == 2

    # Ten runs; each waits at its first step until both children hold one,
    # then at its second step until the gate opens.
    work = {"dir": str(tmp_path), "children": 2, "gate": "go"}
    runs = [schedule(observed.three_steps, work, database=store) for _ in range(10)]
    run_ids = [run.id for run in runs]
    sup.wait_status(lambda s: sorted(c["step_id"] or "" for c in s["children"]) == ["2", "2"],
                    "both children held in step 2")

    # While runs execute in both children.
    during = scrape_until(port, lambda s: s.value("everystep_worker_inflight", runner=name) == 2,
                          "two runs in flight", log=sup.log)
    assert during.value("everystep_step_runs_total", workflow=THREE_STEPS, step=STEP_NAMES[0], status="done") == 2
    assert during.value("everystep_workflows_running") == 2
    assert during.value("everystep_workflows_pending") == 8
    # Every (workflow, status) series exists from the start, at 0 until a run ends.
    assert {sample.value for sample in during.matching("everystep_workflow_runs_total", workflow=THREE_STEPS)} == {0}

    (tmp_path / "go").touch()
    for run_id in run_ids:
        assert wait_run(store, run_id, (COMPLETED, FAILED), supervisor=sup).status == COMPLETED
    after = scrape_until(
        port, lambda s: s.value("everystep_workflow_runs_total", workflow=THREE_STEPS, status=COMPLETED) == 10
        and s.value("everystep_worker_inflight", runner=name) == 0,
        "ten completed runs counted and nothing in flight", log=sup.log)

    # Both children executed steps, and each step was counted exactly once.
    assert step_pids(store, run_ids) == children
    assert after.total("everystep_workflow_runs_total") == 10
    for step_name in STEP_NAMES:
        assert after.value("everystep_step_runs_total", workflow=THREE_STEPS, step=step_name, status="done") == 10
        assert after.value("everystep_step_duration_seconds_count", workflow=THREE_STEPS, step=step_name) == 10
        assert after.value("everystep_step_duration_seconds_bucket",
                           workflow=THREE_STEPS, step=step_name, le="+Inf") == 10
    assert after.total("everystep_step_runs_total") == 30
    assert after.type_of("everystep_workflow_duration_seconds") == "histogram"
    assert after.type_of("everystep_step_duration_seconds") == "histogram"
    assert after.value("everystep_workflow_duration_seconds_count", workflow=THREE_STEPS, status=COMPLETED) == 10
    # Durations are real seconds (a timezone slip would make them hours).
    elapsed = time.time() - began
    assert 0 < after.value("everystep_workflow_duration_seconds_sum", workflow=THREE_STEPS,
                           status=COMPLETED) <= 10 * elapsed
    assert 0 < after.total("everystep_step_duration_seconds_sum") <= 30 * elapsed
    assert after.value("everystep_worker_pool_size", runner=name) == 2
    assert after.value("everystep_worker_claims_total", runner=name) == 10
    # The claim after the last run finished found nothing, and says so.
    scrape_until(port, lambda s: (s.value("everystep_worker_empty_claims_total", runner=name) or 0) >= 1,
                 "an empty claim counted", log=sup.log)
    assert began - 5 <= after.value("everystep_worker_started_at_seconds", runner=name) <= time.time()
    assert after.value("everystep_supervisor_children", runner=name) == 2
    assert after.value("everystep_workflows_running") == 0
    assert after.value("everystep_workflows_blocked") == 0

    # Queue gauges are read from the database at scrape time: runs of a
    # workflow nobody serves stay pending.
    waiting = [schedule("no.such.workflow", {"n": n}, database=db_url).id for n in range(3)]
    queued = scrape_until(port, lambda s: s.value("everystep_workflows_pending") == 3
                          and s.value("everystep_workflows_oldest_pending_age_seconds") > 0,
                          "three pending runs with an age", log=sup.log)
    assert queued.value("everystep_workflows_running") == 0
    assert queued.value("everystep_workflows_blocked") == 0
    waiting += [schedule("no.such.workflow", {"n": n}, database=db_url).id for n in range(3, 5)]
    assert scrape(port).value("everystep_workflows_pending") == 5

    # A child killed -9 is replaced and counted as a crash; the counters it
    # wrote survive its death.
    victim = sorted(children)[0]
    os.kill(victim, signal.SIGKILL)
    wait_for_pids_gone([victim])
    sup.wait_status(lambda s: len(s["children"]) == 2 and victim not in {c["pid"] for c in s["children"]}
                    and all(c["state"] == "idle" for c in s["children"]), "a replacement child")
    restarted = scrape_until(
        port, lambda s: s.value("everystep_supervisor_child_restarts_total", runner=name, reason="crash") == 1
        and s.value("everystep_supervisor_children", runner=name) == 2,
        "the crash counted and two children alive again", log=sup.log)
    assert restarted.total("everystep_supervisor_child_restarts_total") == 1
    assert restarted.value("everystep_workflow_runs_total", workflow=THREE_STEPS, status=COMPLETED) == 10
    assert restarted.total("everystep_step_runs_total") == 30

    # Control requests by command; an unknown command is "invalid", never
    # the string the client sent.
    before = scrape(port)
    for _ in range(2):
        assert sup.ctl({"cmd": "scale", "procs": 2})["ok"]
    assert not sup.ctl({"cmd": "kill", "run": "no-such-run"})["ok"]
    for junk in ("frobnicate", f"shutdown-{run_ids[0]}", "x" * 500):
        assert not sup.ctl({"cmd": junk})["ok"]
    counted = scrape(port)

    def delta(command: str) -> float:
        labels = {"runner": name, "command": command}
        return (counted.value("everystep_supervisor_control_requests_total", **labels) or 0) - (
            before.value("everystep_supervisor_control_requests_total", **labels) or 0)

    assert delta("scale") == 2
    assert delta("kill") == 1
    assert delta("invalid") == 3
    assert counted.value("everystep_supervisor_control_requests_total", runner=name, command="status") >= 1
    commands = {sample.labels["command"] for sample in counted.matching("everystep_supervisor_control_requests_total")}
    assert commands <= {"status", "kill", "scale", "reload", "drain", "invalid"}, commands

    # Labels never carry run ids.
    assert not counted.label_values() & set(run_ids + waiting)
    assert sup.stop() == 0, sup.log()


def test_supervisor_counts_timeouts_and_restarts_by_reason(db_url, store, supervisors, tmp_path):
    port = free_port()
    sup = supervisors(db_url, procs=1, app=APP, args=metrics_args(port)).start()
    name = sup.name
    work = {"dir": str(tmp_path), "children": 1}

    timed_out = schedule(observed.sleepy_flow, work, database=store)
    assert wait_run(store, timed_out.id, (COMPLETED, FAILED), supervisor=sup).status == FAILED

    killed = schedule(observed.three_steps, {**work, "gate": "never-opened"}, database=store)
    busy = sup.busy_child(killed.id, "2")
    assert sup.ctl({"cmd": "kill", "run": killed.id})["ok"]
    assert wait_run(store, killed.id, (COMPLETED, FAILED), supervisor=sup).status == FAILED
    wait_for_pids_gone([busy["pid"]])

    idle = sup.wait_idle()["children"][0]["pid"]
    assert sup.ctl({"cmd": "reload"})["ok"]
    wait_for_pids_gone([idle])
    sup.wait_idle()

    page = scrape_until(
        port, lambda s: s.value("everystep_supervisor_child_restarts_total", runner=name, reason="recycle") == 1,
        "the reload counted as a recycle", log=sup.log)
    assert page.value("everystep_supervisor_child_restarts_total", runner=name, reason="timeout") == 1
    assert page.value("everystep_supervisor_child_restarts_total", runner=name, reason="kill") == 1
    assert page.total("everystep_supervisor_child_restarts_total") == 3
    assert page.value("everystep_supervisor_step_timeouts_total", runner=name) == 1
    assert page.value("everystep_workflow_runs_total", workflow=observed.sleepy_flow.name, status=FAILED) == 1
    assert page.value("everystep_workflow_runs_total", workflow=THREE_STEPS, status=FAILED) == 1
    assert page.value("everystep_supervisor_children", runner=name) == 1
    assert not page.label_values() & {timed_out.id, killed.id}
    assert sup.stop() == 0, sup.log()


def test_supervisor_counts_a_run_its_child_requeued_at_a_step_boundary(db_url, store, supervisors, tmp_path):
    port = free_port()
    sup = supervisors(db_url, procs=1, app=APP, args=metrics_args(port)).start()
    run = schedule(observed.three_steps, {"dir": str(tmp_path), "children": 1, "gate": "go"}, database=store)
    busy = sup.busy_child(run.id, "2")
    assert sup.ctl({"cmd": "reload"})["ok"]  # the busy child drains: requeue after step 2
    (tmp_path / "go").touch()
    assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup).status == COMPLETED
    pids = [record.result for record in sorted(store.get_steps(run.id), key=lambda r: r.step_id)]
    assert pids[:2] == [busy["pid"]] * 2 and pids[2] != busy["pid"], "requeued, then resumed in a new child"
    page = scrape_until(port, lambda s: s.value("everystep_workflow_runs_total", workflow=THREE_STEPS,
                                                status=COMPLETED) == 1, "the completed run", log=sup.log)
    assert page.value("everystep_worker_requeued_total", runner=sup.name) == 1
