"""The console in a real browser (Playwright driving Debian's Chromium).

What an operator does, end to end: watch a run complete on the runs page
without reloading; open a blocked run, resolve it on its uncertain node and
watch it resume; keep working when the live stream is cut (polling); scale
and kill on a real supervisor from the runners page. And what an attacker
tries: a run whose arguments and error carry markup, and a console bound
beyond loopback without a token, or reached without credentials.

Each page gets a marker in ``window`` at load; it is still there at the end
of a test, which proves the page was updated live and never reloaded.
"""

from __future__ import annotations

import re
import subprocess
import time
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from playwright.sync_api import Error as PlaywrightError  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

from everystep import admin, schedule  # noqa: E402
from everystep.errors import SimulatedCrash  # noqa: E402
from everystep.models import BLOCKED, COMPLETED, FAILED, STEP_DONE  # noqa: E402
from everystep.store import NewStep, utcnow  # noqa: E402
from tests.apps import shapes, supervised  # noqa: E402
from tests.support.browser import browser, open_page, page_errors  # noqa: E402,F401
from tests.support.console import ConsoleServer, serve  # noqa: E402
from tests.support.runs import crash_at, execute_run  # noqa: E402
from tests.support.supervisor import supervisors  # noqa: E402,F401
from tests.support.waiting import wait_until  # noqa: E402

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]


@pytest.fixture
def console(db_url: str) -> Iterator[ConsoleServer]:
    yield from serve(db_url, app_modules="tests.apps.shapes")


def mark(page: Any) -> None:
    page.evaluate("window.__loadedOnce = 'yes'")


def assert_not_reloaded(page: Any) -> None:
    assert page.evaluate("window.__loadedOnce") == "yes", "the page was reloaded"


def real_errors(errors: list[str]) -> list[str]:
    return [error for error in errors if "favicon" not in error]


def test_watch_a_run_complete_on_the_runs_page(console: ConsoleServer, browser: Any, page_errors: list[str]) -> None:
    run = schedule(shapes.linear, "watch me", database=console.store)
    page = open_page(browser, page_errors)
    page.goto(console.url + "/")
    row = page.locator(f"tr[data-run='{run.id}']")
    expect(row.locator(".badge")).to_have_text("scheduled")
    expect(page.locator("#live")).to_have_text("live")
    mark(page)
    scheduled = page.locator(".count.status-scheduled .count-value")
    expect(scheduled).to_have_text("1")

    assert execute_run(console.store, run.id) == COMPLETED

    expect(row.locator(".badge")).to_have_text("completed")
    expect(page.locator(".count.status-completed .count-value")).to_have_text("1")
    expect(scheduled).to_have_text("0")
    another = schedule(shapes.linear, "and another", database=console.store)
    expect(page.locator(f"tr[data-run='{another.id}'] .badge")).to_have_text("scheduled")
    assert_not_reloaded(page)

    # Filters and the id search narrow the list (and the URL says so).
    page.locator(".count.status-completed").click()
    expect(page.locator("tbody tr")).to_have_count(1)
    expect(page.locator(f"tr[data-run='{run.id}']")).to_be_visible()
    assert "status=completed" in page.url
    assert real_errors(page_errors) == []


def test_resolve_a_blocked_run_on_its_node_and_watch_it_resume(console: ConsoleServer, browser: Any,
                                                                page_errors: list[str]) -> None:
    store = console.store
    run = schedule(shapes.payment, 7, database=store)
    crash_at("1")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == BLOCKED

    page = open_page(browser, page_errors)
    page.goto(console.url + "/blocked")
    expect(page.locator(f"tr[data-run='{run.id}'] .uncertain")).to_contain_text(shapes.charge.name)
    page.locator(f"tr[data-run='{run.id}'] a.resolve-link").click()
    expect(page.locator(".run-title .badge")).to_have_text("blocked")
    mark(page)
    node = page.locator("button.node[data-step='1']")
    expect(node).to_have_attribute("data-state", "started")
    node.click()
    form = page.locator("form.resolve-form")
    expect(form).to_be_visible()
    # The CLI line is wrapped inside the panel, whole, with a copy button.
    command = f"everystep resolve-step {run.id} 1 --result JSON | --error MESSAGE | --discard"
    cli = form.locator(".command code")
    expect(cli).to_have_text(command)
    assert cli.evaluate("el => el.scrollWidth <= el.clientWidth + 1")
    panel_box, cli_box = page.locator("aside.panel").bounding_box(), cli.bounding_box()
    assert cli_box["x"] + cli_box["width"] <= panel_box["x"] + panel_box["width"]
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=console.url)
    form.locator(".command button.copy").click()
    expect(form.locator(".command button.copy")).to_have_text("copied")
    assert page.evaluate("navigator.clipboard.readText()") == command
    form.locator("textarea").fill('{"charged": 7}')
    form.locator("button[type=submit]").click()

    expect(page.locator(".run-title .badge")).to_have_text("scheduled")
    expect(node).to_have_attribute("data-state", "done")
    assert store.get_steps(run.id)[0].result == {"charged": 7}

    assert execute_run(store, run.id) == COMPLETED
    expect(page.locator(".run-title .badge")).to_have_text("completed")
    expect(page.locator("button.node[data-step='2']")).to_have_attribute("data-state", "done")
    assert_not_reloaded(page)
    assert real_errors(page_errors) == []


def test_markup_in_user_data_stays_text(console: ConsoleServer, browser: Any, page_errors: list[str]) -> None:
    store = console.store
    evil = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">"
    run = schedule(shapes.exploding, evil, database=store)
    assert execute_run(store, run.id) == FAILED
    page = open_page(browser, page_errors)
    page.goto(console.url + "/")
    row = page.locator(f"tr[data-run='{run.id}']")
    expect(row.locator(".error-cell")).to_contain_text("<script>window.__pwned = 1</script>")
    page.goto(console.url + f"/runs/{run.id}")
    expect(page.locator("section.args pre")).to_contain_text(evil.replace('"', '\\"'))
    expect(page.locator("section.error .error-message")).to_have_text(evil)
    page.locator("button.node[data-step='1']").click()
    expect(page.locator(".panel .error-message")).to_have_text(evil)
    assert page.evaluate("window.__pwned") is None
    assert page.locator("img[src='x']").count() == 0
    assert page.locator("main script").count() == 0
    assert real_errors(page_errors) == []


def test_the_page_keeps_updating_when_the_stream_is_cut(console: ConsoleServer, browser: Any,
                                                         page_errors: list[str]) -> None:
    page = open_page(browser, page_errors)
    page.route("**/api/stream**", lambda route: route.abort())
    page.goto(console.url + "/")
    expect(page.locator("#live")).to_have_text("polling")
    mark(page)
    run = schedule(shapes.linear, "polled", database=console.store)
    expect(page.locator(f"tr[data-run='{run.id}'] .badge")).to_have_text("scheduled")
    execute_run(console.store, run.id)
    expect(page.locator(f"tr[data-run='{run.id}'] .badge")).to_have_text("completed")
    page.unroute("**/api/stream**")
    expect(page.locator("#live")).to_have_text("live")
    assert_not_reloaded(page)


def test_scale_and_kill_a_real_supervisor_from_the_runners_page(pg_url: str, browser: Any, page_errors: list[str],
                                                                supervisors: Any, tmp_path: Any) -> None:
    for console in serve(pg_url):
        sup = supervisors(pg_url, procs=1).start()
        page = open_page(browser, page_errors)
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(console.url + "/runners")
        section = page.locator(f"section.runner[data-runner='{sup.name}']")
        expect(section.locator("table.children tbody tr")).to_have_count(1)
        # The page re-renders on every update: what is typed must survive
        # one (it used to be reset to the published count, so a slow click
        # scaled from 1 to 1).
        rendered = section.element_handle()
        section.locator("input.procs").fill("2")
        page.wait_for_function("section => !section.isConnected", arg=rendered, timeout=60_000)
        expect(section.locator("input.procs")).to_have_value("2")
        section.locator("form.scale button").click()
        expect(page.locator(".toast-ok")).to_contain_text(f"{sup.name}: ok")
        expect(section.locator("table.children tbody tr")).to_have_count(2)
        sup.wait_idle(procs=2)

        run = schedule(supervised.gated_flow, {"dir": str(tmp_path), "gate": "never"}, database=console.store)
        busy = section.locator(f"table.children tr[data-run='{run.id}']")
        expect(busy).to_contain_text("gated")
        busy.locator("button.danger").click()
        expect(page.locator(".toast-ok").last).to_contain_text("in-flight step recorded as StepKilled")
        wait_until(lambda: console.store.get_run(run.id).status == FAILED, "the killed run to fail")
        page.goto(console.url + f"/runs/{run.id}")
        expect(page.locator("button.node[data-step='2']")).to_have_attribute("data-state", "failed")
        expect(page.locator("button.node[data-step='2'] .node-error")).to_contain_text("StepKilled")
        assert real_errors(page_errors) == []


def test_authentication(db_url: str, browser: Any, page_errors: list[str], subprocess_env: dict[str, str]) -> None:
    command = [sys.executable, "-m", "everystep.cli", "ui", "--database", db_url]
    exposed = subprocess.run([*command, "--bind", "0.0.0.0", "--port", "0"], env=subprocess_env,
                             capture_output=True, text=True, timeout=60)
    assert exposed.returncode == 2
    assert exposed.stderr.strip().splitlines() == [
        "everystep: error: --bind 0.0.0.0 would expose the console beyond this host: set --auth-token "
        "(or EVERYSTEP_UI_AUTH_TOKEN), or bind 127.0.0.1 and use a proxy that authenticates"]
    assert exposed.stdout == ""

    env = {**subprocess_env, "EVERYSTEP_UI_AUTH_TOKEN": "t0ken-for-tests"}
    server = subprocess.Popen([*command, "--bind", "127.0.0.1", "--port", "0"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        first = server.stdout.readline()
        assert first.startswith("everystep console on http://127.0.0.1:"), first
        url = first.split()[3]
        for credentials in (None, {"username": "eve", "password": "guess"}):
            # Refused with a basic-auth challenge, which the headless browser
            # cannot answer (or answers wrongly): it gives up on the page.
            refused = open_page(browser, page_errors, http_credentials=credentials)
            statuses: list[int] = []
            refused.on("response", lambda response: statuses.append(response.status))
            try:
                assert refused.goto(url).status == 401  # wrong credentials: the 401 page
            except PlaywrightError as exc:  # none at all: Chromium gives up on the challenge
                assert "ERR_INVALID_AUTH_CREDENTIALS" in str(exc)
            assert statuses and set(statuses) == {401}
            direct = refused.request.get(url + "api/runs")
            assert direct.status == 401 and direct.headers["www-authenticate"].startswith("Basic")
        allowed_errors: list[str] = []
        allowed = open_page(browser, allowed_errors, http_credentials={"username": "ops", "password": "t0ken-for-tests"})
        assert allowed.goto(url).status == 200
        expect(allowed.locator("h1")).to_have_text("Runs")
        expect(allowed.locator("#live")).to_have_text("live")
        assert real_errors(allowed_errors) == []
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if server.stdout is not None:
            server.stdout.close()


def test_a_scale_typed_in_survives_the_page_updating(console: ConsoleServer, browser: Any,
                                                     page_errors: list[str]) -> None:
    # The runners page is rebuilt whenever the runner table changes (every
    # heartbeat, every child that boots); the number typed must survive it.
    store = console.store
    store.register_runner("sup-typed", "inst-1", "supervisor", "host-a", 4242, 60, vet=lambda holder: None)

    def publish(state: str) -> None:
        store.publish_runner_detail("sup-typed", "inst-1", {
            "instance": "inst-1", "published_at": time.time(), "procs": 1,
            "children": [{"slot": 1, "pid": 99, "state": state, "run_id": None}]})

    publish("booting")
    page = open_page(browser, page_errors)
    page.goto(console.url + "/runners")
    section = page.locator("section.runner[data-runner='sup-typed']")
    expect(section.locator("table.children .badge")).to_have_text("booting")
    section.locator("input.procs").fill("2")
    publish("idle")
    expect(section.locator("table.children .badge")).to_have_text("idle")
    expect(section.locator("input.procs")).to_have_value("2")
    section.locator("form.scale button").click()
    taken: list[Any] = []
    wait_until(lambda: bool(taken.extend(store.take_requests("sup-typed")) or taken), "the scale request")
    assert [request.args for request in taken] == [{"procs": 2}]
    # The supervisor's answer, by hand: a sentence, not the reply's fields.
    store.answer_request(taken[0].id, {"ok": True, "procs": 2, "previous": 1})
    expect(page.locator(".toast-ok .toast-text")).to_have_text("sup-typed: ok, scaled from 1 to 2 children.")
    assert real_errors(page_errors) == []


def test_an_untaken_handler_has_no_step_number_of_its_own(console: ConsoleServer, browser: Any,
                                                          page_errors: list[str]) -> None:
    run = schedule(shapes.guarded, {}, database=console.store)
    assert execute_run(console.store, run.id) == COMPLETED
    page = open_page(browser, page_errors)
    page.goto(console.url + f"/runs/{run.id}")
    expect(page.locator("button.node[data-step='3']")).to_have_attribute("data-state", "done")
    handler = page.locator(".handlers button.node")
    expect(handler).to_have_attribute("data-state", "skipped")
    expect(handler.locator(".node-id")).to_have_text("–")
    numbers = page.locator("button.node .node-id").all_text_contents()
    assert sorted(numbers) == ["1", "2", "3", "–"]
    # Its execution time, and the time it waited in the queue apart.
    expect(page.locator(".summary dt:text-is('Took') + dd")).to_have_text(re.compile(r"^(<1 ms|\d+ ms|[\d.]+ s)$"))
    expect(page.locator(".summary dt:text-is('Queued') + dd")).to_have_text(
        re.compile(r"^(<1 ms|\d+ ms|[\d.]+ s|\d+ min \d+ s) before its first claim$"))
    assert real_errors(page_errors) == []


def test_a_sleeping_run_shows_its_wait_and_the_step_after_it(console: ConsoleServer, browser: Any,
                                                             page_errors: list[str]) -> None:
    run = schedule(shapes.napping, {"seconds": 3600}, database=console.store)
    execute_run(console.store, run.id)
    assert console.store.get_run(run.id).status == "scheduled"
    page = open_page(browser, page_errors)
    page.goto(console.url + f"/runs/{run.id}")
    wait = page.locator("button.node.wait[data-step='2']")
    expect(wait).to_have_attribute("data-state", "waiting")
    expect(wait.locator(".wait-kind")).to_have_text("sleep")
    expect(wait.locator(".node-meta")).to_contain_text(re.compile(r"^wakes in \d+ min, 20\d\d-"))
    after = page.locator("button.node[data-step='3']")
    expect(after).to_have_attribute("data-state", "pending")
    expect(after.locator(".node-label")).to_have_text("store_it")
    expect(page.locator(".node.state-diverged")).to_have_count(0)
    # A time to come reads as one: "in 59 min", never "0 s ago".
    not_before = page.locator(".summary dt:text-is('Not before') + dd time")
    expect(not_before).to_have_text(re.compile(r"^in \d+ min$"))
    wait.click()
    expect(page.locator(".panel .badge")).to_have_text("waiting")
    expect(page.locator(".panel dd time")).to_have_text(re.compile(r"^in \d+ min$"))
    assert real_errors(page_errors) == []


def test_the_live_graph_marks_the_steps_in_flight_and_the_runner_line_follows_the_run(
        console: ConsoleServer, browser: Any, page_errors: list[str]) -> None:
    store = console.store
    run = schedule(shapes.fanout, {}, database=store)
    # Held by "tester", with steps 1 and 2.0.1 recorded done: its other lanes are under way.
    (claimed,) = store.claim("tester", 1, [shapes.fanout.name])
    for step_id, step in (("1", shapes.fetch), ("2.0.1", shapes.transform)):
        assert store.record_step(claimed.claim_as("tester"), NewStep(step_id, step.name, "[]", "{}", utcnow(),
                                                                     status=STEP_DONE, result_json='"x"'))
    store.register_runner("tester", "inst-1", "supervisor", "host-a", 4242, 60, vet=lambda holder: None)
    # What the supervisor last published: its child in step 2.0.1, since recorded done.
    store.publish_runner_detail("tester", "inst-1", {
        "instance": "inst-1", "published_at": time.time(), "procs": 1,
        "children": [{"slot": 1, "pid": 99, "state": "busy", "run_id": run.id, "workflow": run.name,
                      "step_id": "2.0.1", "step_name": shapes.transform.name, "step_since": time.time() - 4.8}]})
    page = open_page(browser, page_errors)
    page.goto(console.url + f"/runs/{run.id}")
    expect(page.locator(".run-title .badge")).to_have_text("running")
    mark(page)
    for step_id in ("2.1.1", "2.2.1"):
        expect(page.locator(f"button.node[data-step='{step_id}']")).to_have_attribute("data-state", "running")
        expect(page.locator(f"button.node[data-step='{step_id}'] .node-meta")).to_have_text("in flight")
    expect(page.locator("button.node[data-step='2.2.2']")).to_have_attribute("data-state", "pending")
    expect(page.locator(".block.fork.state-running")).to_have_count(1)
    runner_line = page.locator(".summary dt:text-is('Runner') + dd")
    expect(runner_line).to_contain_text("child 1 pid 99")
    expect(runner_line).not_to_contain_text("in step")

    admin.cancel(store, run.id)
    expect(page.locator(".run-title .badge")).to_have_text("cancelled")
    expect(runner_line).not_to_contain_text("child")
    expect(page.locator("button.node[data-state='running']")).to_have_count(0)
    assert_not_reloaded(page)
    assert real_errors(page_errors) == []


def test_the_runs_list_and_a_run_fit_a_phone(console: ConsoleServer, browser: Any, page_errors: list[str],
                                             tmp_path: Any) -> None:
    store = console.store
    done = schedule(shapes.linear, "on a phone", database=store)
    assert execute_run(store, done.id) == COMPLETED
    assert execute_run(store, schedule(shapes.exploding, "a long error message " * 4, database=store).id) == FAILED
    run = schedule(shapes.fanout, {}, database=store)
    (claimed,) = store.claim("tester", 1, [shapes.fanout.name])
    assert store.record_step(claimed.claim_as("tester"), NewStep("1", shapes.fetch.name, "[]", "{}", utcnow(),
                                                                 status=STEP_DONE, result_json='"x"'))
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.on("pageerror", lambda exc: page_errors.append(f"page error: {exc}"))

    def fits(name: str) -> None:
        page.screenshot(path=str(tmp_path / f"{name}-390.png"), full_page=True)
        widths = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert widths[0] <= widths[1] == 390, f"{name}: the document is {widths[0]} px wide on a 390 px screen"
        live = page.locator("#live").bounding_box()
        assert live is not None and live["x"] + live["width"] <= 390, f"{name}: the header overflows"

    page.goto(console.url + "/")
    row = page.locator(f"tr[data-run='{run.id}']")
    expect(row.locator(".badge")).to_have_text("running")
    expect(page.locator("#live")).to_have_text("live")
    fits("runs")
    box = row.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
    # One compact card per run: id and status on one line, three more at most.
    status, run_id = row.locator("td.status").bounding_box(), row.locator("td.run-id").bounding_box()
    assert status is not None and run_id is not None and abs(status["y"] - run_id["y"]) < run_id["height"]
    assert box["height"] < 8 * run_id["height"]

    row.locator("td.run-id a").click()
    expect(page.locator(".run-title .badge")).to_have_text("running")
    expect(page.locator("button.node[data-step='2.2.2']")).to_have_attribute("data-state", "pending")
    fits("run")
    graph = page.locator(".graph-box").bounding_box()
    for lane in page.locator(".fork-lanes > .lane").all():
        lane_box = lane.bounding_box()
        assert lane_box is not None and graph is not None
        assert lane_box["x"] + lane_box["width"] <= graph["x"] + graph["width"], "a fork's lane leaves its card"
    context.close()
    assert real_errors(page_errors) == []


def test_a_run_waiting_for_a_message_is_drawn_as_a_wait_and_woken_from_its_page(db_url: str, browser: Any,
                                                                                page_errors: list[str]) -> None:
    from tests.apps import waits as waiting

    for console in serve(db_url, app_modules="tests.apps.waits"):
        store = console.store
        run = schedule(waiting.checkout, "o-7", database=store)
        assert execute_run(store, run.id) == "released"
        page = open_page(browser, page_errors)
        page.goto(console.url + f"/runs/{run.id}")
        mark(page)
        # The event it published is a step; the recv is a wait, never a divergence.
        expect(page.locator("button.node[data-step='1']")).to_have_attribute("data-state", "done")
        wait = page.locator("button.node.wait[data-wait='message']")
        expect(wait).to_have_attribute("data-state", "waiting")
        expect(wait).to_contain_text('message "paid"')
        expect(page.locator("button.node[data-state='diverged']")).to_have_count(0)

        form = page.locator("form.send-form")
        form.locator("input[name=topic]").fill("paid")
        form.locator("textarea[name=payload]").fill('{"amount": 7}')
        form.locator("button[type=submit]").click()
        wait_until(lambda: [m.topic for m in store.messages(run.id)] == ["paid"], "the message sent from the page")
        assert execute_run(store, run.id) == COMPLETED
        expect(wait).to_have_attribute("data-state", "done")
        expect(page.locator(".run-title .badge")).to_have_text("completed")
        assert_not_reloaded(page)
        assert store.get_run(run.id).result == {"amount": 7}
        assert real_errors(page_errors) == []


def test_forking_an_unfinished_run_asks_first_and_says_why(db_url: str, browser: Any,
                                                           page_errors: list[str]) -> None:
    """Fork on a run still waiting: the console asks whether to make a
    second live run beside it; declined, nothing is forked; confirmed, the
    fork is sent forced and the page moves to the new run."""
    from tests.apps import waits as waiting

    for console in serve(db_url, app_modules="tests.apps.waits"):
        store = console.store
        run = schedule(waiting.checkout, "o-8", database=store)
        assert execute_run(store, run.id) == "released"
        page = open_page(browser, page_errors)
        page.goto(console.url + f"/runs/{run.id}")
        expect(page.locator(".run-title .badge")).to_have_text("scheduled")
        dialogs: list[tuple[str, str]] = []

        def answer(dialog: Any, confirm: bool) -> None:
            dialogs.append((dialog.type, dialog.message))
            if dialog.type == "prompt":
                dialog.accept("1")
            elif confirm:
                dialog.accept()
            else:
                dialog.dismiss()

        page.once("dialog", lambda dialog: answer(dialog, confirm=False))
        page.locator("button.action-fork").click()
        wait_until(lambda: len(dialogs) == 1, "the confirmation")
        assert dialogs[0][0] == "confirm"
        assert "not finished (scheduled)" in dialogs[0][1] and "second live run" in dialogs[0][1]
        assert store.forks_of(run.id) == []

        page.on("dialog", lambda dialog: answer(dialog, confirm=True))
        page.locator("button.action-fork").click()
        page.wait_for_url(re.compile(r"/runs/(?!" + run.id + r")[0-9a-f-]+$"), timeout=60_000)
        assert [kind for kind, _ in dialogs] == ["confirm", "confirm", "prompt"]
        (fork,) = store.forks_of(run.id)
        assert page.url.endswith(f"/runs/{fork.id}")
        assert store.get_run(run.id).status == "scheduled"  # the source goes on waiting
        assert real_errors(page_errors) == []
