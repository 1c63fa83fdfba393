"""Take the console screenshots shown in the README and the docs.

    python docs/screenshots.py [--out docs/img]

Builds a throwaway SQLite database with runs of ``examples.app`` in every
state (completed, failed, blocked, one stopped part-way through a parallel
fork, some still queued), serves the console on a loopback port and has
Debian's Chromium (``/usr/bin/chromium``, driven by Playwright) photograph
the runs list and the run with the parallel fork, on a wide screen and on a
phone (390 px). Needs the ``ui`` and
``test`` extras.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import uvicorn  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from everystep import runner, schedule  # noqa: E402
from everystep.errors import SimulatedCrash  # noqa: E402
from everystep.store import Store, connect  # noqa: E402
from everystep.web import app as console_app  # noqa: E402
from everystep.web.serve import open_socket  # noqa: E402
from examples import app as examples  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def execute(store: Store, run_id: str, crash_after: str | None = None) -> None:
    """Claim and execute one run in this process, optionally dying (as a
    killed process would) right after one step's effect."""
    run = store.get_run(run_id)
    (claimed,) = [item for item in store.claim("web-1", 100, [run.name]) if item.id == run_id] or [None]
    assert claimed is not None

    def fault(ctx: object, step_id: str) -> None:
        if step_id == crash_after:
            runner.fault = None
            raise SimulatedCrash(step_id)

    runner.fault = fault if crash_after else None
    try:
        runner.execute(store, claimed, claimer="web-1")
    except SimulatedCrash:
        pass
    finally:
        runner.fault = None


def populate(store: Store) -> str:
    for n in (20_000, 30_000, 40_000):
        execute(store, schedule(examples.crunch, {"n": n}, database=store).id)
    execute(store, schedule(examples.aggregate, {"delay": 0.01}, database=store).id)
    execute(store, schedule(examples.checkout, {"order_id": "A-1017", "amount": 0}, database=store).id)
    blocked = schedule(examples.checkout, {"order_id": "A-1018", "amount": 120}, database=store).id
    execute(store, blocked, crash_after="2")
    store.requeue(store.get_run(blocked).claim_as("web-1"))
    execute(store, blocked)
    execute(store, schedule(examples.checkout, {"order_id": "A-1019", "amount": 45}, database=store).id)
    in_flight = schedule(examples.aggregate, {"delay": 0.05}, database=store).id
    execute(store, in_flight, crash_after="fanout.2.2")
    for n in (50_000, 60_000):
        schedule(examples.crunch, {"n": n}, database=store)
    store.register_runner("web-1", "screenshot", "supervisor", "web-1.internal", 4711, 60, vet=lambda holder: None)
    return in_flight


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "img"), help="directory for the PNG files")
    args = parser.parse_args()
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/screenshots.db"
        store = connect(url)
        in_flight = populate(store)
        app = console_app(url, app_modules="examples.app")
        sock = open_socket("127.0.0.1", 0)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", log_config=None))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
                page = browser.new_page(viewport={"width": 1360, "height": 760}, device_scale_factor=1)
                page.goto(base + "/")
                page.locator("#live[data-state=live]").wait_for()
                page.locator("tbody tr").first.wait_for()
                page.screenshot(path=str(out / "console-runs.png"))
                page.set_viewport_size({"width": 1360, "height": 900})
                page.goto(f"{base}/runs/{in_flight}#step=fanout.1.1")
                page.locator("button.node[data-step='fanout.1.1']").wait_for()
                page.locator(".panel h3").first.wait_for()
                page.screenshot(path=str(out / "console-run.png"))
                # The same two pages on a phone (390 px wide).
                phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=1,
                                         is_mobile=True, has_touch=True)
                phone.goto(base + "/")
                phone.locator("#live[data-state=live]").wait_for()
                phone.locator("tbody tr").first.wait_for()
                phone.screenshot(path=str(out / "console-phone-runs.png"))
                phone.goto(f"{base}/runs/{in_flight}")
                phone.locator("button.node[data-step='fanout.1.1']").wait_for()
                phone.screenshot(path=str(out / "console-phone-run.png"))
                browser.close()
        finally:
            app.console.watcher.stop()
            server.should_exit = True
            thread.join(timeout=30)
            sock.close()
            store.close()
    print(f"wrote console-runs.png, console-run.png, console-phone-runs.png and console-phone-run.png in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
