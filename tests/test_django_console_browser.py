"""The console mounted in the example Django project, in a real browser,
served by real Django server processes on PostgreSQL.

Under ASGI (uvicorn): an operator is sent to Django's login page, logs in,
lands on the console, watches a run complete live over the stream, and
resolves a blocked run on its node (a POST carrying Django's CSRF token).
Under WSGI (``runserver``, default settings): a viewer's pages poll, keep
current without reloading, offer no action, and the server refuses a POST
made behind the page's back.

Playwright's sync API keeps an event loop running in the test's thread,
where Django refuses ORM calls: the ORM work of these tests (users, orders,
executing runs whose steps use the ORM) runs on one thread of its own
(``orm``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django", reason="the django extra is not installed")

from playwright.sync_api import expect  # noqa: E402

import everystep  # noqa: E402
from everystep.errors import SimulatedCrash  # noqa: E402
from everystep.models import BLOCKED, COMPLETED, SCHEDULED  # noqa: E402
from everystep.store import Store, connect  # noqa: E402
from tests.support.browser import browser, open_page, page_errors  # noqa: E402,F401
from tests.support.django_project import Project, empty_tables, project_for  # noqa: E402
from tests.support.django_server import django_server  # noqa: E402
from tests.support.runs import crash_at, execute_run, resume  # noqa: E402

pytestmark = pytest.mark.timeout(240)

PASSWORD = "console-pw"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, pg_server: Any) -> Iterator[Project]:
    with project_for("postgres", tmp_path_factory.mktemp("django-console"), pg_server) as project:
        yield project


@pytest.fixture(scope="module")
def orm(project: Project) -> Iterator[Callable[..., Any]]:
    """``orm(fn, *args)``: ``fn(*args)`` on the module's ORM thread."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="orm") as thread:
        yield lambda fn, *args: thread.submit(fn, *args).result()
        from django.db import connections

        thread.submit(connections.close_all).result()


@pytest.fixture
def store(project: Project) -> Iterator[Store]:
    empty_tables(project)
    store = connect(project.url)
    try:
        yield store
    finally:
        store.close()


def user(name: str, *codenames: str) -> None:
    from django.contrib.auth.models import Permission, User

    found = User.objects.filter(username=name).first() or User.objects.create_user(name, password=PASSWORD,
                                                                                   is_staff=True)
    found.user_permissions.set(Permission.objects.filter(content_type__app_label="everystep",
                                                         codename__in=codenames))


def place(sku: str) -> Any:
    from shop.models import Order
    from shop.workflows import fulfil_order

    order = Order.objects.create(sku=sku, quantity=1, amount="3.00")
    return everystep.schedule(fulfil_order, order.pk)


def log_in(page: Any, url: str, name: str, errors: list[str]) -> None:
    """Open the console as a visitor: Django's login page comes first
    (its own styles are not served here: its errors are forgotten)."""
    page.goto(url + "/everystep/")
    expect(page.locator("#id_username")).to_be_visible()
    assert "/admin/login/?next=/everystep/" in page.url
    page.locator("#id_username").fill(name)
    page.locator("#id_password").fill(PASSWORD)
    page.locator("input[type=submit]").click()
    expect(page.locator("body")).to_have_attribute("data-page", "runs")
    assert page.url == url + "/everystep/"
    errors.clear()


def blocked(store: Store) -> Any:
    """A run blocked at its unsafe 'charge' step (crashed inside it, replayed)."""
    run = place("stuck")
    crash_at("charge")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert resume(store, run.id) == BLOCKED
    return run


def mark(page: Any) -> None:
    page.evaluate("window.__loadedOnce = 'yes'")


def assert_not_reloaded(page: Any) -> None:
    assert page.evaluate("window.__loadedOnce") == "yes", "the page was reloaded"


def test_an_operator_watches_and_resolves_under_asgi(project: Project, store: Store, orm: Any, browser: Any,
                                                     page_errors: list[str]) -> None:
    orm(user, "operator", "view_run", "operate_console")
    run = orm(place, "live")
    with django_server(project, "asgi") as url:
        page = open_page(browser, page_errors)
        log_in(page, url, "operator", page_errors)
        row = page.locator(f"tr[data-run='{run.id}']")
        expect(row.locator(".badge")).to_have_text("scheduled")
        expect(page.locator("#live")).to_have_text("live")
        mark(page)
        assert orm(execute_run, store, run.id) == COMPLETED
        expect(row.locator(".badge")).to_have_text("completed")
        assert_not_reloaded(page)

        stuck = orm(blocked, store)
        page.goto(url + f"/everystep/runs/{stuck.id}")
        expect(page.locator(".run-title .badge")).to_have_text("blocked")
        expect(page.locator("#live")).to_have_text("live")
        node = page.locator("button.node[data-step='charge']")
        expect(node).to_have_attribute("data-state", "started")
        node.click()
        form = page.locator("form.resolve-form")
        form.locator("textarea").fill('"ch_from_the_browser"')
        form.locator("button[type=submit]").click()
        expect(page.locator(".run-title .badge")).to_have_text("scheduled")
        expect(node).to_have_attribute("data-state", "done")
        assert store.get_run(stuck.id).status == SCHEDULED
        assert {step.step_id: step.result for step in store.get_steps(stuck.id)}["charge"] == "ch_from_the_browser"
    assert [error for error in page_errors if "favicon" not in error] == []


def test_a_viewer_under_wsgi_polls_and_cannot_act(project: Project, store: Store, orm: Any, browser: Any,
                                                  page_errors: list[str]) -> None:
    orm(user, "viewer", "view_run")
    run = orm(place, "polled")
    stuck = orm(blocked, store)
    with django_server(project, "wsgi") as url:
        page = open_page(browser, page_errors)
        log_in(page, url, "viewer", page_errors)
        row = page.locator(f"tr[data-run='{run.id}']")
        expect(row.locator(".badge")).to_have_text("scheduled")
        expect(page.locator("#live")).to_have_text("polling")
        mark(page)
        assert orm(execute_run, store, run.id) == COMPLETED
        expect(row.locator(".badge")).to_have_text("completed")
        assert_not_reloaded(page)

        page.goto(url + f"/everystep/runs/{stuck.id}")
        expect(page.locator(".run-title .badge")).to_have_text("blocked")
        expect(page.locator(".banner.blocked")).to_contain_text("everystep resolve-step")
        page.locator("button.node[data-step='charge']").click()
        expect(page.locator(".panel")).to_contain_text("charge_card")
        assert page.locator("form.resolve-form").count() == 0
        assert page.locator(".actions button").count() == 0
        status = page.evaluate("""async (runId) => {
            const body = document.body.dataset;
            const response = await fetch(`${body.root}/api/runs/${runId}/cancel`, {
                method: "POST", headers: { [body.csrfHeader]: body.csrf, "content-type": "application/json" },
                body: "{}" });
            return response.status;
        }""", stuck.id)
        assert status == 403
        assert store.get_run(stuck.id).status == BLOCKED
    assert [error for error in page_errors if "favicon" not in error and "403" not in error] == []


def test_the_example_project_mounts_the_console(project: Project) -> None:
    urls = Path(__file__).resolve().parent.parent / "examples" / "django_app" / "shopsite" / "urls.py"
    assert 'path("everystep/", include("everystep.contrib.django.console"))' in urls.read_text()
