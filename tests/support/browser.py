"""A real browser for tests: Playwright driving Debian's Chromium.

Playwright comes from PyPI; its own browser download is never used (it is
fetched from the internet, which this project does not do at test time):
the tests drive the distribution's ``chromium`` package, which ``.ci/run``
installs when it is missing. Without it the browser tests fail, loudly,
with the command that fixes it: a console whose pages were never opened in
a browser is not tested.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = os.environ.get("EVERYSTEP_TEST_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
]
#: Generous: the machine is slow and shared; these wait for conditions, they time nothing.
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium), "
                    "as .ci/run does", pytrace=False)
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=WAIT_MS)

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page_errors() -> list[str]:
    """JavaScript errors and console errors seen by a test's pages."""
    return []


def open_page(browser: Any, errors: list[str], **context_options: Any) -> Any:
    """A page in a context of its own (1400 by 1000 unless ``viewport`` says otherwise)."""
    context_options.setdefault("viewport", {"width": 1400, "height": 1000})
    context = browser.new_context(**context_options)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.on("console", lambda message: errors.append(f"console {message.type}: {message.text}")
            if message.type == "error" else None)
    return page
