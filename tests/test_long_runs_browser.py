"""A run of 100,000 steps opened in a real browser (Playwright driving
Debian's Chromium): its page lists the first hundred steps and fetches
more on demand, and its step graph is a summary (the first and last ten
iterations around a box counting the rest), not 100,000 nodes. Nothing
here is timed: how fast the page opens is measured by ``bench/long_history.py``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from everystep import schedule
from tests.apps import long_runs
from tests.support.browser import browser, open_page, page_errors  # noqa: F401
from tests.support.console import ConsoleServer, serve
from tests.support.long_runs import ticks, write_history

pytestmark = [pytest.mark.timeout(600), pytest.mark.backends("sqlite", "postgres")]

STEPS = 100_000


@pytest.fixture
def console(db_url: str) -> Iterator[ConsoleServer]:
    yield from serve(db_url, app_modules="tests.apps.long_runs")


def test_a_run_of_100000_steps_opens_with_a_page_of_steps_and_a_summarised_graph(
        console: ConsoleServer, browser: Any, page_errors: list[str]) -> None:
    run = schedule(long_runs.ticker, STEPS, database=console.store)
    write_history(console.store, run.id, ticks(STEPS))
    page = open_page(browser, page_errors)
    page.goto(console.url + f"/runs/{run.id}")

    rows = page.locator("table.steps tbody tr")
    expect(rows).to_have_count(100)
    expect(rows.first).to_have_attribute("data-step", "1")
    expect(page.locator(".steps-count")).to_have_text("the first 100 of 100,000 recorded steps")

    loop = page.locator(".block.loop")
    expect(loop).to_have_attribute("data-iterations", "100000")
    expect(loop.locator(".block-head .hint")).to_have_text("100,000 iterations")
    collapsed = loop.locator(".collapsed")
    expect(collapsed).to_have_attribute("data-count", "99980")
    expect(collapsed.locator(".collapsed-count")).to_have_text("99,980 iterations not drawn")
    expect(collapsed.locator(".collapsed-states")).to_have_text("99,980 recorded steps: 99,980 done")
    expect(collapsed.locator(".collapsed-functions")).to_have_text("tick × 99,980")
    expect(page.locator("button.node[data-step='10']")).to_be_visible()
    expect(page.locator("button.node[data-step='11']")).to_have_count(0)
    last = page.locator("button.node[data-step='100000']")
    expect(last).to_be_visible()
    assert page.locator("button.node").count() < 40

    last.click()  # the panel shows the record, read in full for the node drawn
    expect(page.locator(".panel pre.json").nth(1)).to_have_text("99999")  # tick(99999), the last iteration

    page.locator("button.more-steps").click()
    expect(rows).to_have_count(200)
    expect(rows.last).to_have_attribute("data-step", "200")
    expect(page.locator(".steps-count")).to_have_text("the first 200 of 100,000 recorded steps")
    assert [error for error in page_errors if "favicon" not in error] == []
