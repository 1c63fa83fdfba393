"""The console's JSON API over real HTTP, on both backends.

A real uvicorn serves ``everystep.web.app`` on a loopback port; runs are
made by really executing workflows in-process. Checked: pages and filters,
counts, a run's detail (graph, verdict, actions), the blocked and runners
views, every action with the CLI's rules and refusals, requests to
supervisors, CSRF, authentication, the Host check, the security headers,
and the live stream."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from everystep import schedule
from everystep.errors import SimulatedCrash
from everystep.models import BLOCKED, COMPLETED, RUNNING, SCHEDULED, STEP_DONE, STEP_FAILED
from everystep.store import NewStep, Store, utcnow
from tests.apps import shapes
from tests.support.console import ConsoleServer, serve
from tests.support.runs import claim_run, crash_at, execute_run, leave_blocked

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def console(db_url: str) -> Iterator[ConsoleServer]:
    yield from serve(db_url, app_modules="tests.apps.shapes")


@pytest.fixture
def client(console: ConsoleServer) -> Iterator[Any]:
    with console.client() as session:
        session.load_page()
        yield session


def blocked_run(store: Store) -> str:
    return leave_blocked(store, shapes.payment, 5)


def in_flight(store: Store, wf: Any, *args: Any, after: str) -> str:
    """A run left running under "tester" right after step ``after``'s effect."""
    run = schedule(wf, *args, database=store)
    crash_at(after)
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    return run.id


# -- pages of runs ------------------------------------------------------------------------


def test_runs_pages_filters_and_search(console: ConsoleServer, client: Any) -> None:
    store = console.store
    ids = [schedule(shapes.linear, f"k{i}", database=store).id for i in range(7)]
    done = schedule(shapes.named_steps, "n", database=store)
    assert execute_run(store, done.id) == COMPLETED

    first = client.get("/api/runs", params={"limit": 3}).json()
    assert [run["id"] for run in first["runs"]] == [done.id, ids[6], ids[5]]
    assert first["newer"] is None and first["older"]
    second = client.get("/api/runs", params={"limit": 3, "before": first["older"]}).json()
    assert [run["id"] for run in second["runs"]] == [ids[4], ids[3], ids[2]]
    back = client.get("/api/runs", params={"limit": 3, "after": second["newer"]}).json()
    assert [run["id"] for run in back["runs"]] == [done.id, ids[6], ids[5]]
    last = client.get("/api/runs", params={"limit": 3, "before": second["older"]}).json()
    assert [run["id"] for run in last["runs"]] == [ids[1], ids[0]] and last["older"] is None

    scheduled = client.get("/api/runs", params={"status": SCHEDULED, "limit": 4}).json()
    assert [run["id"] for run in scheduled["runs"]] == ids[::-1][:4]
    rest = client.get("/api/runs", params={"status": SCHEDULED, "limit": 4, "before": scheduled["older"]}).json()
    assert [run["id"] for run in rest["runs"]] == ids[::-1][4:]

    by_name = client.get("/api/runs", params={"workflow": shapes.named_steps.name}).json()
    assert [run["id"] for run in by_name["runs"]] == [done.id]
    assert by_name["runs"][0]["duration"] is not None and by_name["runs"][0]["args_preview"] == '["n"]'

    prefix = ids[3][:30]
    found = client.get("/api/runs", params={"q": prefix}).json()
    assert [run["id"] for run in found["runs"]] == [ids[3]]
    assert client.get("/api/runs", params={"q": ids[3].replace("-", "").upper()}).json()["runs"][0]["id"] == ids[3]

    counts = {c["status"]: c for c in first["counts"]}
    assert counts[SCHEDULED]["count"] == 7 and counts[SCHEDULED]["exact"]
    assert counts[COMPLETED]["count"] == 1


@pytest.mark.parametrize("params, message", [
    ({"status": "bogus"}, "unknown status"),
    ({"q": "not hex!"}, "not a run id prefix"),
    ({"before": "garbage"}, "bad page cursor"),
    ({"limit": "0"}, "limit must be"),
    ({"before": "x~y", "after": "x~y"}, "not both"),
])
def test_bad_filters_are_400_with_one_line(client: Any, params: dict[str, str], message: str) -> None:
    response = client.get("/api/runs", params=params)
    assert response.status_code == 400 and message in response.json()["error"]


# -- one run --------------------------------------------------------------------------------


def test_a_run_in_flight_with_its_graph_verdict_and_actions(console: ConsoleServer, client: Any) -> None:
    # Held by "tester" with step 1 and the first two lanes of fork 2 recorded
    # (written directly: a crash in one lane would race the other lanes' records).
    store = console.store
    run_id = schedule(shapes.fanout, {}, database=store).id
    (claimed,) = store.claim("tester", 1, [shapes.fanout.name])
    for step_id, step in (("1", shapes.fetch), ("2.0.1", shapes.transform), ("2.1.1", shapes.flaky)):
        assert store.record_step(claimed.claim_as("tester"), NewStep(step_id, step.name, "[]", "{}", utcnow(),
                                                                     status=STEP_DONE, result_json='"x"'))
    data = client.get(f"/api/runs/{run_id}").json()
    assert data["run"]["status"] == RUNNING and data["run"]["claimed_by"] == "tester"
    assert data["graph"]["mode"] == "source"
    fork = data["graph"]["nodes"][1]
    # The step the run was executing in the third lane is in flight; the one after it not reached yet.
    assert fork["kind"] == "fork" and fork["state"] == "running"
    assert [[n["state"] for n in lane["nodes"]] for lane in fork["lanes"]] == [
        ["done"], ["done"], ["running", "pending"]]
    assert data["verdict"]["outcome"] == "resumes" and data["verdict"]["next_step"] == "2.2.1"
    assert {action["name"] for action in data["actions"]} == {"requeue", "cancel", "rerun", "fork"}  # no live supervisor: no kill
    assert data["runner"]["name"] == "tester" and data["runner"]["kind"] is None
    assert [step["step_id"] for step in data["steps"]] == ["1", "2.0.1", "2.1.1"]


def test_duration_is_the_execution_time_and_the_queue_is_apart(console: ConsoleServer, client: Any) -> None:
    store = console.store
    run = schedule(shapes.linear, "q", database=store)
    waiting = client.get(f"/api/runs/{run.id}").json()["run"]
    assert waiting["duration"] is None and waiting["queued"] is None and waiting["first_claimed_at"] is None
    time.sleep(0.3)  # some time in the queue (a lower bound only)
    assert execute_run(store, run.id) == COMPLETED
    done = store.get_run(run.id)
    assert done.first_claimed_at is not None and done.completed_at is not None and done.created_at is not None
    for data in (client.get(f"/api/runs/{run.id}").json()["run"], client.get("/api/runs").json()["runs"][0]):
        assert data["duration"] == pytest.approx((done.completed_at - done.first_claimed_at).total_seconds())
        assert data["queued"] == pytest.approx((done.first_claimed_at - done.created_at).total_seconds())
        assert data["queued"] >= 0.3
        assert data["first_claimed_at"] == done.first_claimed_at.isoformat()


def test_a_finished_run_has_no_verdict_and_can_run_again(console: ConsoleServer, client: Any) -> None:
    run = schedule(shapes.guarded, {"fail_on": ["one"]}, database=console.store)
    assert execute_run(console.store, run.id) == COMPLETED
    data = client.get(f"/api/runs/{run.id}").json()
    assert data["verdict"] is None and [a["name"] for a in data["actions"]] == ["rerun", "fork"]
    again = client.act(f"/api/runs/{run.id}/rerun")
    assert again.status_code == 200, again.text
    new_id = again.json()["new_run"]
    new = console.store.get_run(new_id)
    assert new.status == SCHEDULED and new.args == [{"fail_on": ["one"]}] and new.name == run.name


def test_fork_from_the_console_and_both_runs_say_so(console: ConsoleServer, client: Any) -> None:
    run = schedule(shapes.guarded, {"fail_on": ["one"]}, database=console.store)
    assert execute_run(console.store, run.id) == COMPLETED
    first = console.store.get_steps(run.id)[0].step_id
    refused = client.act(f"/api/runs/{run.id}/fork", {"step": "no-such-step"})
    assert refused.status_code == 409 and "no recorded step" in refused.json()["error"]
    forked = client.act(f"/api/runs/{run.id}/fork", {"step": first})
    assert forked.status_code == 200, forked.text
    new_id = forked.json()["new_run"]
    assert client.get(f"/api/runs/{new_id}").json()["run"]["forked_from"] == run.id
    source = client.get(f"/api/runs/{run.id}").json()["run"]
    assert source["forks"] == [{"id": new_id, "status": SCHEDULED}] and source["app_version"] == run.app_version


def test_forking_an_unfinished_run_from_the_console_is_confirmed_and_forced(console: ConsoleServer,
                                                                           client: Any) -> None:
    run = schedule(shapes.guarded, {"fail_on": []}, database=console.store)
    (fork,) = [a for a in client.get(f"/api/runs/{run.id}").json()["actions"] if a["name"] == "fork"]
    assert "not finished (scheduled)" in fork["confirm"] and "second live run" in fork["confirm"]
    refused = client.act(f"/api/runs/{run.id}/fork", {"step": "1"})
    assert refused.status_code == 409 and "--force" in refused.json()["error"]
    assert execute_run(console.store, run.id) == COMPLETED
    (fork,) = [a for a in client.get(f"/api/runs/{run.id}").json()["actions"] if a["name"] == "fork"]
    assert fork["confirm"] is None  # a finished run forks without a question


def test_unknown_runs_are_404(client: Any) -> None:
    assert client.get("/api/runs/0190aaaa-0000-7000-8000-000000000000").status_code == 404
    assert client.get("/api/runs/not-a-uuid").status_code == 404
    assert client.get("/runs/not-a-uuid").status_code == 404
    assert client.act("/api/runs/0190aaaa-0000-7000-8000-000000000000/requeue").status_code == 404


def test_a_failed_run_shows_its_error_and_traceback(console: ConsoleServer, client: Any) -> None:
    run = schedule(shapes.fanout, {"fail_on": ["right"]}, database=console.store)
    execute_run(console.store, run.id)
    data = client.get(f"/api/runs/{run.id}").json()
    assert data["run"]["error_line"] == "builtins.ValueError: right failed"
    assert "Traceback" in data["run"]["error"]["traceback"] and "flaky" in data["run"]["error"]["traceback"]
    failed = data["graph"]["nodes"][1]["lanes"][1]["nodes"][0]
    assert failed["state"] == STEP_FAILED and failed["record"]["error"]["message"] == "right failed"


def test_user_data_is_data(console: ConsoleServer, client: Any) -> None:
    evil = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"
    run = schedule(shapes.linear, evil, database=console.store)
    assert execute_run(console.store, run.id) == COMPLETED
    listed = client.get("/api/runs").json()["runs"][0]
    assert evil in listed["args_preview"]  # JSON carries it as a string; the page renders text nodes
    page = client.get(f"/runs/{run.id}")
    assert page.status_code == 200 and "<script>document" not in page.text and "onerror" not in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["x-frame-options"] == "DENY"


# -- actions ----------------------------------------------------------------------------------


def test_resolve_with_the_cli_rules(console: ConsoleServer, client: Any) -> None:
    store = console.store
    run_id = blocked_run(store)
    data = client.get(f"/api/runs/{run_id}").json()
    assert data["uncertain"] == [{"step_id": "1", "name": shapes.charge.name,
                                  "command": f"everystep resolve-step {run_id} 1 --result JSON | --error MESSAGE | --discard"}]
    assert "resolve" in {a["name"] for a in data["actions"]} and data["verdict"]["outcome"] == "blocked"
    blocked = client.get("/api/blocked").json()["runs"]
    assert [run["id"] for run in blocked] == [run_id] and blocked[0]["uncertain"][0]["step_id"] == "1"

    refusals = [
        ({"step": "1"}, 409, "choose exactly one"),
        ({"step": "2", "discard": True}, 409, "has no step '2' (its started step: 1)"),
        ({"step": "1", "result": "{not json"}, 400, "not valid JSON"),
        ({"result": "1"}, 400, "needs \"step\""),
        ({"step": "1", "error": "  "}, 400, "must not be empty"),
    ]
    for body, status, message in refusals:
        response = client.act(f"/api/runs/{run_id}/resolve", body)
        assert response.status_code == status and message in response.json()["error"], (body, response.text)
    assert store.get_run(run_id).status == BLOCKED

    ok = client.act(f"/api/runs/{run_id}/resolve", {"step": "1", "result": '{"charged": 5}'})
    assert ok.status_code == 200 and ok.json()["message"] == f"run {run_id} resolved at step 1; now scheduled"
    assert store.get_steps(run_id)[0].status == STEP_DONE and store.get_steps(run_id)[0].result == {"charged": 5}
    again = client.act(f"/api/runs/{run_id}/resolve", {"step": "1", "discard": True})
    assert again.status_code == 409 and "is scheduled, not blocked" in again.json()["error"]
    assert execute_run(store, run_id) == COMPLETED
    assert store.get_run(run_id).result == f"stored:{ {'charged': 5} }".replace("'", "'")


@pytest.mark.parametrize("how, status", [({"error": "card declined"}, STEP_FAILED), ({"discard": True}, None)])
def test_resolve_with_an_error_or_discard(console: ConsoleServer, client: Any, how: dict[str, Any], status: Any) -> None:
    run_id = blocked_run(console.store)
    response = client.act(f"/api/runs/{run_id}/resolve", {"step": "1", **how})
    assert response.status_code == 200, response.text
    steps = console.store.get_steps(run_id)
    assert (steps[0].status if steps else None) == status


def test_requeue_follows_the_cli(console: ConsoleServer, client: Any, caplog: pytest.LogCaptureFixture) -> None:
    store = console.store
    finished = schedule(shapes.linear, "x", database=store)
    execute_run(store, finished.id)
    refused = client.act(f"/api/runs/{finished.id}/requeue")
    assert refused.status_code == 409
    assert refused.json()["error"] == f"run {finished.id} is completed, not running: only running runs can be requeued"
    parked = schedule(shapes.linear, "y", database=store)
    claim_run(store, parked.id)
    with caplog.at_level(logging.INFO, logger="everystep.console"):
        ok = client.act(f"/api/runs/{parked.id}/requeue")
    assert ok.status_code == 200 and store.get_run(parked.id).status == SCHEDULED
    assert any(f"local from 127.0.0.1 requeued run {parked.id}" in r.getMessage() for r in caplog.records)
    assert client.act(f"/api/runs/{parked.id}/explode").status_code == 404


def test_actions_need_the_csrf_token(console: ConsoleServer) -> None:
    run_id = blocked_run(console.store)
    with console.client() as fresh:
        assert fresh.post(f"/api/runs/{run_id}/resolve", json={"step": "1", "discard": True}).status_code == 403
        fresh.load_page()
        bad = fresh.post(f"/api/runs/{run_id}/resolve", json={"step": "1", "discard": True},
                         headers={"x-csrf-token": "0" * 64})
        assert bad.status_code == 403 and "CSRF" in bad.json()["error"]
        foreign = fresh.act(f"/api/runs/{run_id}/resolve", {"step": "1", "discard": True},
                            headers={"origin": "http://evil.example"})
        assert foreign.status_code == 403 and "cross-origin" in foreign.json()["error"]
        cross = fresh.act(f"/api/runs/{run_id}/resolve", {"step": "1", "discard": True},
                          headers={"sec-fetch-site": "cross-site"})
        assert cross.status_code == 403
        assert console.store.get_run(run_id).status == BLOCKED
        ok = fresh.act(f"/api/runs/{run_id}/resolve", {"step": "1", "discard": True},
                       headers={"origin": console.url})
        assert ok.status_code == 200


# -- authentication and hosts -----------------------------------------------------------------


def test_a_token_guards_everything(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    for server in serve(db_url, auth_token="s3cret-token"):
        run_id = blocked_run(server.store)
        with server.client() as anonymous:
            for path in ("/", "/api/runs", f"/runs/{run_id}", "/static/console.css", "/api/stream?view=runs"):
                response = anonymous.get(path)
                assert response.status_code == 401, path
                assert response.headers["www-authenticate"].startswith("Basic realm=")
        with server.client(auth=("alice", "wrong")) as wrong:
            assert wrong.get("/api/runs").status_code == 401
        with server.client(auth=("alice", "s3cret-token")) as alice:
            assert alice.load_page().status_code == 200
            with caplog.at_level(logging.INFO, logger="everystep.console"):
                assert alice.act(f"/api/runs/{run_id}/resolve", {"step": "1", "discard": True}).status_code == 200
            assert any("alice from 127.0.0.1 resolved step 1" in r.getMessage() for r in caplog.records)
        with server.client(headers={"authorization": "Bearer s3cret-token"}) as script:
            # A Bearer token is never sent by a browser on its own: no CSRF token needed.
            parked = schedule(shapes.linear, "z", database=server.store)
            claim_run(server.store, parked.id)
            assert script.post(f"/api/runs/{parked.id}/requeue", json={}).status_code == 200


def test_loopback_consoles_refuse_other_host_names(db_url: str) -> None:
    for server in serve(db_url, allowed_hosts=["127.0.0.1", "localhost"]):
        with server.client() as session:
            assert session.get("/api/meta").status_code == 200
            rebound = session.get("/api/meta", headers={"host": "attacker.example:8765"})
            assert rebound.status_code == 400 and "Host" in rebound.json()["error"]


# -- runners and supervisor requests ----------------------------------------------------------


def test_runners_show_published_children(console: ConsoleServer, client: Any) -> None:
    store = console.store
    store.register_runner("sup-1", "inst-1", "supervisor", "host-a", 4242, 60, vet=lambda holder: None)
    store.register_runner("wrk-1", "inst-2", "worker", "host-b", 4343, 60, vet=lambda holder: None)
    since = time.time() - 12.0
    store.publish_runner_detail("sup-1", "inst-1", {"instance": "inst-1", "published_at": time.time(), "procs": 1,
                                                   "children": [{"slot": 1, "pid": 99, "state": "busy",
                                                                 "run_id": "r", "workflow": "w", "step_id": "2",
                                                                 "step_name": "s", "step_since": since}]})
    runners = {r["name"]: r for r in client.get("/api/runners").json()["runners"]}
    assert runners["wrk-1"]["detail"] is None and runners["wrk-1"]["kind"] == "worker"
    child = runners["sup-1"]["detail"]["children"][0]
    assert child["step_id"] == "2" and child["step_seconds"] >= 12.0 and runners["sup-1"]["host"] == "host-a"


def test_supervisor_commands_become_requests(console: ConsoleServer, client: Any) -> None:
    store = console.store
    store.register_runner("sup-1", "inst-1", "supervisor", "host-a", 4242, 60, vet=lambda holder: None)
    store.register_runner("wrk-1", "inst-2", "worker", "host-b", 4343, 60, vet=lambda holder: None)
    refused = client.act("/api/runners/nobody/scale", {"procs": 2})
    assert refused.status_code == 409 and "not alive" in refused.json()["error"]
    worker = client.act("/api/runners/wrk-1/scale", {"procs": 2})
    assert worker.status_code == 409 and "not a supervisor" in worker.json()["error"]
    assert client.act("/api/runners/sup-1/scale", {"procs": -3}).status_code == 400
    assert client.act("/api/runners/sup-1/reload", {}).status_code == 400

    sent = client.act("/api/runners/sup-1/scale", {"procs": 3})
    assert sent.status_code == 202
    request = sent.json()["request"]
    assert request["status"] == "pending" and request["args"] == {"procs": 3}
    assert request["requested_by"] == "console local from 127.0.0.1"
    # The supervisor's side, by hand: take and answer.
    taken = store.take_requests("sup-1")
    store.answer_request(taken[0].id, {"ok": True, "procs": 3, "previous": 1})
    answer = client.get(f"/api/requests/{request['id']}").json()
    assert answer["done"] and answer["reply"]["procs"] == 3
    assert answer["outcome"] == "ok, scaled from 1 to 3 children."

    unanswered = client.act("/api/runners/sup-1/scale", {"procs": 1}).json()["request"]
    expired = client.act(f"/api/requests/{unanswered['id']}/expire").json()
    assert expired["expired"] and expired["status"] == "expired" and "not answering" in expired["outcome"]
    assert store.take_requests("sup-1") == []


def test_kill_is_sent_to_the_runner_holding_the_run(console: ConsoleServer, client: Any) -> None:
    store = console.store
    run_id = in_flight(store, shapes.linear, "k", after="2")
    store.register_runner("tester", "inst", "supervisor", "here", 1, 60, vet=lambda holder: None)
    response = client.act(f"/api/runs/{run_id}/kill", {"requeue": True})
    assert response.status_code == 202, response.text
    request = response.json()["request"]
    assert request["runner"] == "tester" and request["command"] == "kill"
    assert request["args"] == {"run": run_id, "requeue": True}
    finished = schedule(shapes.linear, "done", database=store)
    execute_run(store, finished.id)
    refused = client.act(f"/api/runs/{finished.id}/kill")
    assert refused.status_code == 409 and "not running" in refused.json()["error"]
    # The supervisor's answer, by hand, reads as a sentence.
    taken = store.take_requests("tester")
    store.answer_request(taken[0].id, {"ok": True, "run": run_id, "pid": 26026, "slot": 2, "action": "requeued"})
    answer = client.get(f"/api/requests/{request['id']}").json()
    assert answer["outcome"] == f"ok, killed child 2 (pid 26026) running run {run_id}; the run was requeued."


# -- the live stream -----------------------------------------------------------------------------


def read_events(response: httpx.Response, found: threading.Event, events: list[dict[str, Any]]) -> None:
    kind = None
    try:
        for line in response.iter_lines():
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and kind == "update":
                events.append(json.loads(line.split(":", 1)[1]))
                found.set()
    except (httpx.HTTPError, httpx.StreamClosed, ValueError):
        pass  # the test closed the stream


def test_the_stream_sends_changes(console: ConsoleServer, client: Any) -> None:
    store = console.store
    run = schedule(shapes.linear, "live", database=store)
    events: list[dict[str, Any]] = []
    found = threading.Event()
    with client.stream("GET", "/api/stream", params={"view": "runs"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        reader = threading.Thread(target=read_events, args=(response, found, events), daemon=True)
        reader.start()

        def statuses() -> dict[str, str]:
            return {r["id"]: r["status"] for event in events[-1:] for r in event["runs"]}

        deadline = time.monotonic() + 60
        while statuses().get(run.id) != SCHEDULED and time.monotonic() < deadline:
            found.wait(0.2)
        assert statuses().get(run.id) == SCHEDULED
        assert execute_run(store, run.id) == COMPLETED
        while statuses().get(run.id) != COMPLETED and time.monotonic() < deadline:
            found.wait(0.2)
        assert statuses().get(run.id) == COMPLETED
        newer = schedule(shapes.linear, "newer", database=store)
        while newer.id not in statuses() and time.monotonic() < deadline:
            found.wait(0.2)
        assert newer.id in statuses()
    counts = {c["status"]: c["count"] for c in events[-1]["counts"]}
    assert counts[SCHEDULED] == 1


def test_the_stream_refuses_unknown_views(client: Any) -> None:
    assert client.get("/api/stream", params={"view": "nope"}).status_code == 400
    assert client.get("/api/stream", params={"view": "runs", "status": "bogus"}).status_code == 400


def test_static_files_ship_in_the_package(client: Any) -> None:
    from importlib import resources

    folder = resources.files("everystep.web").joinpath("static")
    names = ["console.css"] + [f"js/{entry.name}" for entry in folder.joinpath("js").iterdir()]
    assert "js/main.js" in names
    for name in names:
        response = client.get(f"/static/{name}")
        assert response.status_code == 200, name
        expected = "text/css" if name.endswith(".css") else "javascript"
        assert expected in response.headers["content-type"]
    page = client.get("/").text
    assert 'src="/static/js/main.js"' in page and "http" not in page.split("<body")[0].replace('name="viewport"', "")
