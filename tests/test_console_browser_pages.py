"""The console's pages in a real browser (Playwright driving Debian's
Chromium), for what a new user met: the documentation's own workflows
drawn whole, a child's start and wait each linking to the child, a wait
without a timeout shown without a far-off date, the waiting runs filtered
and saying what they wait for, every page fitting a 390 px phone, and the
small things (a runner's name on one line, the send form's placeholder
whole, a fork's copied steps marked, each fork's status)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

import everystep
from everystep import admin, schedule
from everystep.models import COMPLETED, FAILED, STEP_DONE
from everystep.store import NewStep, Store, utcnow
from tests.apps import shapes
from tests.apps import waits as apps
from tests.support.browser import browser, open_page, page_errors  # noqa: F401
from tests.support.console import ConsoleServer, serve
from tests.support.doc_workflows import PATCH_STEPS, load_example
from tests.support.runs import drain, execute_run, expire_wait, leave_blocked

pytestmark = [pytest.mark.timeout(300), pytest.mark.backends("sqlite", "postgres")]

PHONE = {"width": 390, "height": 844}
#: A runner named as a host: hyphens where a narrow column would break it.
HOST = "ip-10-0-3-17"


@pytest.fixture
def console(db_url: str) -> Iterator[ConsoleServer]:
    yield from serve(db_url, app_modules="tests.apps.shapes,tests.apps.waits")


def real_errors(errors: list[str]) -> list[str]:
    return [error for error in errors if "favicon" not in error]


def phone_page(browser: Any, errors: list[str]) -> Any:
    return open_page(browser, errors, viewport=PHONE, is_mobile=True, has_touch=True)


def lines_of(locator: Any) -> int:
    """How many lines the element's text is laid out on."""
    return int(locator.evaluate("""el => {
        const range = document.createRange(); range.selectNodeContents(el);
        return new Set([...range.getClientRects()].map((rect) => Math.round(rect.top))).size; }"""))


# -- item 7: the docs' patterns are drawn whole; a child's nodes link to it -------------------------


def test_the_docs_patterns_are_drawn_and_child_nodes_link_to_their_child(
        console: ConsoleServer, browser: Any, page_errors: list[str], tmp_path: Path) -> None:
    store = console.store
    children = load_example("how-to/children.md", "def publish", "docs_children_page", tmp_path)
    waiting = load_example("how-to/waiting.md", "def expense", "docs_waiting_page", tmp_path)
    patches = load_example("how-to/deploying-new-code.md", 'patched("tax")', "docs_patch_page", tmp_path, PATCH_STEPS)
    parent = schedule(children.publish, "cat.png", database=store)
    drain(store)
    assert store.get_run(parent.id).status == COMPLETED
    timed_out = schedule(waiting.expense, {"id": 8, "amount": 50}, database=store)
    assert execute_run(store, timed_out.id) == "released"
    expire_wait(store, timed_out.id, "3")
    patched = schedule(patches.order, {"sku": "A-1", "amount": 30}, database=store)
    assert execute_run(store, timed_out.id) == execute_run(store, patched.id) == COMPLETED

    page = open_page(browser, page_errors)
    page.goto(console.url + f"/runs/{parent.id}")
    expect(page.locator(".run-title .badge")).to_have_text("completed")
    expect(page.locator("button.node[data-step='6']")).to_have_attribute("data-state", "failed")
    expect(page.locator(".unplaced")).to_have_count(0)
    expect(page.locator(".loop.fan")).to_have_count(2)  # the starts, the waits: each a fan of iterations
    kids = {child.id: child for child in store.children(parent.id)}
    for step_id in ("4", "5", "6"):
        wait = page.locator(f"button.node.wait[data-step='{step_id}']")
        expect(wait.locator(".wait-kind")).to_have_text("child thumbnail")
        child_id = store.get_steps(parent.id)[int(step_id) - 1].args[0]
        link = page.locator(f".node-with-child:has(button[data-step='{step_id}']) a.child-link")
        expect(link).to_have_attribute("href", re.compile(f"/runs/{child_id}$"))
        expect(link.locator(".badge")).to_have_text(kids[child_id].status)
    expect(page.locator("a.child-link")).to_have_count(6)  # three starts, three waits
    page.locator(".node-with-child:has(button[data-step='6']) a.child-link").click()
    failed_child = store.get_steps(parent.id)[5].args[0]
    expect(page.locator("h1 .mono")).to_have_text(failed_child)
    expect(page.locator("a.parent-link")).to_have_text(parent.id)

    page.goto(console.url + f"/runs/{timed_out.id}")
    expect(page.locator(".run-title .badge")).to_have_text("completed")
    expect(page.locator(".block.try .hint")).to_have_text("caught by except RecvTimeout")
    expect(page.locator("button.node[data-step='4']")).to_have_attribute("data-state", "done")
    expect(page.locator(".unplaced")).to_have_count(0)

    page.goto(console.url + f"/runs/{patched.id}")
    patch = page.locator("button.node.patch")
    expect(patch).to_have_attribute("data-step", "@patch:tax")
    expect(patch.locator(".patch-answer")).to_have_text("new code")
    expect(page.locator("button.node[data-step='2'] .node-label")).to_have_text("add_tax")
    expect(page.locator(".unplaced")).to_have_count(0)
    assert real_errors(page_errors) == []


# -- item 8: a wait without a timeout ---------------------------------------------------------------


def test_a_wait_without_a_timeout_shows_what_ends_it_not_a_date(console: ConsoleServer, browser: Any,
                                                                  page_errors: list[str]) -> None:
    run = schedule(apps.approval, "no timeout", database=console.store)
    assert execute_run(console.store, run.id) == "released"
    page = open_page(browser, page_errors)
    page.goto(console.url + f"/runs/{run.id}")
    expect(page.locator(".run-title .waiting")).to_have_text('waiting for message "approved"')
    expect(page.locator(".summary dt:text-is('Waits') + dd")).to_have_text('for message "approved", with no timeout')
    expect(page.locator(".summary dt:text-is('Not before')")).to_have_count(0)
    text = page.locator("main").inner_text()
    assert "9000" not in text and " d " not in text, text
    assert real_errors(page_errors) == []


# -- item 20: the waiting runs, filtered ----------------------------------------------------------------


def test_the_runs_list_filters_the_waiting_runs(console: ConsoleServer, browser: Any,
                                                page_errors: list[str]) -> None:
    store = console.store
    message = schedule(apps.approval, "w", database=store)
    asleep = schedule(shapes.napping, {"seconds": 3600}, database=store)
    due = schedule(shapes.linear, "due now", database=store)
    assert execute_run(store, message.id) == execute_run(store, asleep.id) == "released"
    page = open_page(browser, page_errors)
    page.goto(console.url + "/")
    expect(page.locator(f"tr[data-run='{due.id}']")).to_have_count(1)
    expect(page.locator(f"tr[data-run='{message.id}'] .wait-note")).to_have_text('waiting for message "approved"')
    page.locator("select[name=status]").select_option("waiting")
    page.locator("form.filters button[type=submit]").click()
    expect(page.locator("tbody tr")).to_have_count(2)
    assert "status=waiting" in page.url
    expect(page.locator(f"tr[data-run='{asleep.id}'] .wait-note")).to_have_text(re.compile(r"^sleeping until 20"))
    expect(page.locator(f"tr[data-run='{due.id}']")).to_have_count(0)
    assert real_errors(page_errors) == []


# -- item 21: every page on a phone ----------------------------------------------------------------------


def busy_store(store: Store) -> dict[str, str]:
    """A run of every kind a page shows: a parent with children, events and
    messages; a child; a blocked run; a long failure; a fork and its source;
    a run held by a supervisor whose children are published."""
    parent = schedule(apps.parent_of_three, database=store)
    drain(store)
    checkout = schedule(apps.checkout, "o-" + "7" * 40, database=store)
    assert execute_run(store, checkout.id) == "released"
    everystep.send(checkout.id, "unrelated.topic.with.a.long.name", {"note": "x" * 120}, database=store)
    blocked = leave_blocked(store, shapes.payment, 7)
    failed = schedule(shapes.exploding, "a long error message " * 8, database=store)
    assert execute_run(store, failed.id) == FAILED
    source = schedule(shapes.guarded, {"fail_on": ["one", "two"]}, database=store)
    assert execute_run(store, source.id) == COMPLETED
    fork, _ = admin.fork(store, source.id, "2")
    held = schedule(shapes.fanout, {}, database=store)
    (claimed,) = store.claim(HOST, 1, [shapes.fanout.name])
    assert store.record_step(claimed.claim_as(HOST), NewStep("1", shapes.fetch.name, "[]", "{}", utcnow(),
                                                             status=STEP_DONE, result_json='"x"'))
    store.register_runner(HOST, "inst-1", "supervisor", HOST, 4242, 60, vet=lambda holder: None)
    store.publish_runner_detail(HOST, "inst-1", {
        "instance": "inst-1", "published_at": utcnow().timestamp(), "procs": 1,
        "children": [{"slot": 1, "pid": 99, "state": "busy", "run_id": held.id, "workflow": held.name,
                      "step_id": "2.2.1", "step_name": shapes.fetch.name, "step_since": utcnow().timestamp()}]})
    child = store.children(parent.id)[0]
    return {"parent": parent.id, "child": child.id, "checkout": checkout.id, "blocked": blocked,
            "failed": failed.id, "source": source.id, "fork": fork.id, "held": held.id}


def test_no_page_scrolls_sideways_on_a_phone(console: ConsoleServer, browser: Any, page_errors: list[str],
                                             tmp_path: Path) -> None:
    runs = busy_store(console.store)
    page = phone_page(browser, page_errors)
    paths = {"runs": "/", "blocked": "/blocked", "runners": "/runners",
             **{name: f"/runs/{run_id}" for name, run_id in runs.items()}, "waiting": "/?status=waiting"}
    for name, path in paths.items():
        page.goto(console.url + path)
        expect(page.locator("#live")).to_have_text("live")
        expect(page.locator("main h1")).to_be_visible()
        if path.startswith("/runs/"):
            expect(page.locator("table.steps tbody tr").first).to_be_visible()
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(tmp_path / f"{name}-390.png"), full_page=True)
        widths = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert widths[0] <= widths[1] == PHONE["width"], f"{name}: the page is {widths[0]} px wide on a 390 px phone"

    # A recorded step is a card of a few lines on the screen, not a tall row
    # whose outcome is off to the right; so is a child.
    page.goto(console.url + f"/runs/{runs['parent']}")
    expect(page.locator("table.steps tbody tr")).to_have_count(7)
    line = page.evaluate("parseFloat(getComputedStyle(document.body).lineHeight)")
    for row in page.locator("table.steps tbody tr").all():
        box = row.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], box
        assert box["height"] <= 6 * line, f"step {row.get_attribute('data-step')}: {box['height']} px tall"
    child = page.locator(f"table.children tr[data-child='{runs['child']}']")
    expect(child.locator(".badge")).to_have_text("completed")
    box = child.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    assert real_errors(page_errors) == []


# -- item 22: the small things ----------------------------------------------------------------------------


def test_a_runner_name_stays_on_one_line(console: ConsoleServer, browser: Any, page_errors: list[str]) -> None:
    store = console.store
    run = schedule(shapes.linear, "an argument long enough to fill the last column " * 6, database=store)
    store.claim(HOST, 1, [shapes.linear.name])
    page = open_page(browser, page_errors)
    for width in (1400, 1000):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(console.url + "/")
        cell = page.locator(f"tr[data-run='{run.id}'] td.runner")
        expect(cell).to_have_text(HOST)
        assert lines_of(cell) == 1, f"the runner's name wraps at {width} px"
    assert real_errors(page_errors) == []


def test_the_send_forms_placeholders_are_whole(console: ConsoleServer, browser: Any, page_errors: list[str]) -> None:
    run = schedule(apps.approval, "send", database=console.store)
    assert execute_run(console.store, run.id) == "released"
    for page in (open_page(browser, page_errors), phone_page(browser, page_errors)):
        page.goto(console.url + f"/runs/{run.id}")
        form = page.locator("form.send-form")
        expect(form).to_be_visible()
        for field in form.locator("input, textarea").all():
            room, needed = field.evaluate("""el => {
                const style = getComputedStyle(el), canvas = document.createElement("canvas").getContext("2d");
                canvas.font = `${style.fontStyle} ${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
                return [el.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight),
                        canvas.measureText(el.placeholder).width]; }""")
            assert needed <= room, f"{field.get_attribute('name')}: {needed:.0f} px of placeholder in {room:.0f} px"
    assert real_errors(page_errors) == []


def test_a_forks_copied_steps_are_marked_and_forks_show_their_status(console: ConsoleServer, browser: Any,
                                                                     page_errors: list[str]) -> None:
    store = console.store
    source = schedule(shapes.guarded, {"fail_on": ["one", "two"]}, database=store)
    assert execute_run(store, source.id) == COMPLETED
    fork, copied = admin.fork(store, source.id, "2")
    assert copied == 1
    assert execute_run(store, fork.id) == COMPLETED  # step 2 is the fork's own
    other, _ = admin.fork(store, source.id, "1")  # nothing copied; left scheduled

    page = open_page(browser, page_errors)
    page.goto(console.url + f"/runs/{fork.id}")
    expect(page.locator(".run-title .badge")).to_have_text("completed")
    expect(page.locator("tr[data-step='1'] .tag.copied")).to_have_text("copied")
    expect(page.locator("tr[data-step='2'] .tag.copied")).to_have_count(0)
    expect(page.locator("button.node[data-step='1'] .tag.copied")).to_have_count(1)
    expect(page.locator("button.node[data-step='2'] .tag.copied")).to_have_count(0)
    expect(page.locator(".summary dt:text-is('Forked from') + dd")).to_contain_text("1 step copied from it")

    page.goto(console.url + f"/runs/{source.id}")
    forks = page.locator(".summary dt:text-is('Forks') + dd")
    expect(forks.locator(f"li[data-fork='{fork.id}'] .badge")).to_have_text("completed")
    expect(forks.locator(f"li[data-fork='{other.id}'] .badge")).to_have_text("scheduled")
    assert execute_run(store, other.id) == COMPLETED
    expect(forks.locator(f"li[data-fork='{other.id}'] .badge")).to_have_text("completed")
    assert real_errors(page_errors) == []
