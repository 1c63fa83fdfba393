"""Operators reaching a supervisor through the database (request row plus
NOTIFY), for real: the supervisor takes the request, runs it through the
same handler as its control socket, and writes the reply; it publishes its
children on its runner row. Plus the pieces on their own: the request loop
against a real store, and the listener hearing the NOTIFY on PostgreSQL."""

from __future__ import annotations

import dataclasses
import selectors
import time
from pathlib import Path
from typing import Any

import pytest

from everystep import relay, schedule
from everystep.models import FAILED, STEP_FAILED
from everystep.relay import RequestStatus
from everystep.listener import Listener
from supervisor.protocol import (
    DrainReply, KillReply, KillRequest, Reply, Request, ScaleRequest, StatusReply, StatusRequest,
)
from supervisor.remote import RemoteControl, snapshot
from tests.apps import supervised
from tests.support.supervisor import error_type, supervisors, wait_run  # noqa: F401
from tests.support.waiting import wait_until

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(180), pytest.mark.backends("sqlite", "postgres")]


def spec(directory: Path, **extra: Any) -> dict[str, Any]:
    return {"dir": str(directory), **extra}


# -- the request loop on its own ------------------------------------------------------


def test_remote_control_answers_with_the_handler_and_refuses_stale_requests(store):
    seen: list[tuple[Request, str]] = []

    def handle(request: Request, who: str) -> Reply:
        seen.append((request, who))
        if isinstance(request, StatusRequest):
            return StatusReply(pid=42, name="sup-x", procs=1, draining=False, uptime=1.0, database="db", ready=0,
                               runs={}, restarts={}, children=[])
        if isinstance(request, ScaleRequest):
            raise RuntimeError("boom")
        assert isinstance(request, KillRequest)
        return KillReply(run=request.run, pid=7, slot=1, action="requeued" if request.requeue else "killed")

    store.register_runner("sup-x", "inst", "supervisor", "host", 42, 60, vet=lambda holder: None)
    remote = RemoteControl(store, "sup-x", "inst", handle)
    kill = relay.submit(store, "sup-x", "kill", {"run": "r1", "requeue": True}, "test")
    broken = relay.submit(store, "sup-x", "scale", {"procs": 2}, "test")
    invalid = relay.submit(store, "sup-x", "kill", {"run": 5}, "test")
    other = relay.submit(store, "sup-y", "drain", {}, "test")
    remote.tick(time.monotonic())

    answered = store.get_request(kill.id)
    assert answered.status == RequestStatus.ANSWERED
    assert answered.reply == {"ok": True, "run": "r1", "pid": 7, "slot": 1, "action": "requeued"}
    failed = store.get_request(broken.id)
    assert failed.reply == {"ok": False, "error": "RuntimeError: boom"}  # the loop survives
    # The same codec as the control socket validates what arrives.
    assert store.get_request(invalid.id).reply == {"ok": False, "error": '"run" of kill must be a string'}
    assert store.get_request(other.id).status == RequestStatus.PENDING
    assert store.runner_details()["sup-x"]["pid"] == 42  # published with the same tick

    stale = dataclasses.replace(answered, age_seconds=relay.STALE_AFTER + 1)
    reply = remote._answer(stale)
    assert reply["ok"] is False and "not acted on" in reply["error"]
    assert [type(request) for request, _ in seen].count(KillRequest) == 1
    assert (KillRequest(run="r1", requeue=True), f"request {kill.id} from test") in seen


def test_remote_control_rides_out_an_unreachable_database():
    from everystep.store.postgres import PostgresStore

    store = PostgresStore("postgresql://nobody@127.0.0.1:1/nothing", statement_timeout=1)
    remote = RemoteControl(store, "sup", "inst", lambda request, who: DrainReply())
    remote.tick(time.monotonic())  # logged once, not raised
    assert remote._outage.failing


def test_snapshot_makes_times_absolute():
    status = {"pid": 7, "procs": 2, "draining": False, "children": [
        {"slot": 1, "pid": 8, "state": "busy", "run_id": "r", "workflow": "w", "step_id": "2",
         "step_name": "s", "step_seconds": 1.5, "run_seconds": 3.0, "steps_in_flight": 1},
        {"slot": 2, "pid": 9, "state": "idle", "run_id": None, "step_seconds": None, "run_seconds": None},
    ]}
    detail = snapshot(status, "inst", 1000.0)
    assert detail["instance"] == "inst" and detail["published_at"] == 1000.0
    assert detail["children"][0]["step_since"] == 998.5 and detail["children"][0]["run_since"] == 997.0
    assert detail["children"][1]["step_since"] is None


def test_the_listener_hears_requests_for_this_runner_on_postgres(pg_url):
    from everystep.store import connect

    store = connect(pg_url)
    selector = selectors.DefaultSelector()
    heard: list[str] = []

    def on_notify(channel: str, payload: str) -> None:
        if channel == relay.REQUEST_CHANNEL:
            heard.append(payload)

    listener = Listener(store, selector, on_notify, "test")
    try:
        assert listener.open()
        relay.submit(store, "sup-z", "status", {}, "test")

        def pump() -> bool:
            for key, mask in selector.select(0.1):
                key.data(mask)
            return bool(heard)

        wait_until(pump, "the NOTIFY of the request")
        assert heard == ["sup-z"]
    finally:
        listener.close()
        selector.close()
        store.close()


# -- a real supervisor ------------------------------------------------------------------


def test_kill_and_scale_through_the_database(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    run = schedule(supervised.gated_flow, spec(tmp_path, gate="never"), database=store)

    # The supervisor publishes which child runs which step.
    def published_child() -> dict[str, Any] | None:
        detail = store.runner_details().get(sup.name)
        for child in (detail or {}).get("children", []):
            if child["run_id"] == run.id and child["step_id"] == "2":
                return child
        return None

    child = wait_until(published_child, "the child running step 2 in the published detail",
                       detail=lambda: "\n" + sup.log())
    assert child["workflow"] == supervised.gated_flow.name and child["step_since"] is not None

    request = relay.submit(store, sup.name, "kill", {"run": run.id}, "test operator")
    answer = relay.wait_reply(store, request.id, timeout=60)
    assert answer.status == RequestStatus.ANSWERED, answer
    assert answer.reply["ok"] is True and answer.reply["pid"] == child["pid"], answer.reply
    finished = wait_run(store, run.id, (FAILED,), supervisor=sup)
    step = {record.step_id: record for record in store.get_steps(run.id)}["2"]
    assert step.status == STEP_FAILED and error_type(step.error) == "everystep.errors.StepKilled"
    assert finished.status == FAILED

    request = relay.submit(store, sup.name, "scale", {"procs": 3}, "test operator")
    answer = relay.wait_reply(store, request.id, timeout=60)
    assert answer.reply == {"ok": True, "procs": 3, "previous": 2}
    sup.wait_idle(procs=3)
    wait_until(lambda: len((store.runner_details().get(sup.name) or {}).get("children", [])) == 3,
               "3 children in the published detail")

    refused = relay.wait_reply(store, relay.submit(store, sup.name, "scale", {"procs": -1}, "t").id, timeout=60)
    assert refused.reply["ok"] is False and "integer from 0" in refused.reply["error"]
    assert "test operator" in sup.log()  # who asked is logged


def remote(db_url: str, env: dict[str, str], *args: str) -> Any:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "everystep.cli", "remote", "--database", db_url, *args],
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_remote_command(db_url, store, supervisors, subprocess_env, tmp_path):
    sup = supervisors(db_url, procs=1).start()
    scaled = remote(db_url, subprocess_env, sup.name, "scale", "2")
    assert scaled.returncode == 0 and scaled.stdout.startswith("ok"), scaled
    sup.wait_idle(procs=2)
    import json

    status = json.loads(remote(db_url, subprocess_env, sup.name, "status", "--json").stdout)
    assert status["status"] == "answered" and status["reply"]["name"] == sup.name
    table = remote(db_url, subprocess_env, sup.name, "status")  # as ctl status shows it, not a Python dict
    head, columns, *rows = table.stdout.splitlines()
    assert table.returncode == 0 and head.startswith(f"supervisor {sup.name} pid {sup.pid}  procs 2"), table
    assert columns.split()[:3] == ["SLOT", "PID", "STATE"] and len(rows) == 2, table.stdout
    assert all(row.split()[2] == "idle" for row in rows) and "<" not in table.stdout, table.stdout
    idle = store.schedule("nowhere.unregistered", "[]")  # no supervisor here claims it
    refused = remote(db_url, subprocess_env, sup.name, "kill", idle.id[:23])  # a unique prefix, as show takes
    assert refused.returncode == 1 and f"refused: run {idle.id} is not executing" in refused.stdout
    unknown = remote(db_url, subprocess_env, sup.name, "kill", "not-a-run")  # refused here, nothing relayed
    assert unknown.returncode == 2 and "no run with id 'not-a-run'" in unknown.stderr, unknown
    nobody = remote(db_url, subprocess_env, "nobody-here", "status")  # refused at once, not at the timeout
    assert nobody.returncode == 2 and len(nobody.stderr.splitlines()) == 1, nobody
    assert "no live supervisor is named 'nobody-here'" in nobody.stderr and sup.name in nobody.stderr
    usage = remote(db_url, subprocess_env, sup.name, "scale")
    assert usage.returncode == 2 and "needs N" in usage.stderr
