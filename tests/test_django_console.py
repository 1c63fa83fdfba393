"""The console mounted in a Django project (``include()`` in urls.py),
through Django's test client on SQLite and PostgreSQL: pages and assets
under the prefix (and under others), the JSON API answered by the console's
own handlers, Django's permissions (redirect, 403), Django's CSRF on every
action, an operator's actions changing the database, and the live stream
under WSGI (bridged) or its absence (polling)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

pytest.importorskip("django", reason="the django extra is not installed")

from django.test import Client, override_settings  # noqa: E402

import everystep  # noqa: E402
from everystep.errors import SimulatedCrash  # noqa: E402
from everystep.models import BLOCKED, CANCELLED, COMPLETED, SCHEDULED  # noqa: E402
from everystep.store import Store  # noqa: E402
from tests.support.django_project import EVERYSTEP_SETTINGS, Project, django_project, project, project_store  # noqa: E402,F401
from tests.support.runs import crash_at, execute_run, resume  # noqa: E402

pytestmark = pytest.mark.timeout(120)

PREFIX = "/everystep"


def user(name: str, *codenames: str, superuser: bool = False) -> Any:
    from django.contrib.auth.models import Permission, User

    found, _ = User.objects.get_or_create(username=name, defaults={"is_staff": True, "is_superuser": superuser})
    found.user_permissions.set(Permission.objects.filter(content_type__app_label="everystep",
                                                         codename__in=codenames))
    return found


def logged_in(name: str, *codenames: str, **options: Any) -> Client:
    client = Client(**options)
    client.force_login(user(name, *codenames))
    return client


@pytest.fixture
def viewer(project: Project) -> Client:
    return logged_in("viewer", "view_run")


@pytest.fixture
def operator(project: Project) -> Client:
    return logged_in("operator", "view_run", "operate_console", enforce_csrf_checks=True)


def place(sku: str) -> Any:
    from shop.models import Order
    from shop.workflows import fulfil_order

    order = Order.objects.create(sku=sku, quantity=1, amount="3.00")
    return everystep.schedule(fulfil_order, order.pk)


def blocked(store: Store) -> str:
    run = place("blocked")
    crash_at("charge")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert resume(store, run.id) == BLOCKED
    return str(run.id)


def body_data(page: Any) -> dict[str, str]:
    assert page.status_code == 200, page.status_code
    tag = re.search(r"<body([^>]*)>", page.content.decode())
    assert tag is not None
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', tag.group(1)))


def act(client: Client, path: str, body: dict[str, Any], token: str | None) -> Any:
    headers = {"HTTP_X_CSRFTOKEN": token} if token is not None else {}
    return client.post(PREFIX + path, json.dumps(body), content_type="application/json", **headers)


# -- pages, assets, API ------------------------------------------------------------------


def test_pages_render_under_the_prefix_with_their_assets(viewer: Client, store: Store) -> None:
    run = place("page")
    data = body_data(viewer.get(PREFIX + "/"))
    assert data["page"] == "runs" and data["root"] == PREFIX and data["user"] == "viewer"
    assert data["csrf-header"] == "X-CSRFTOKEN" and data["csrf"]
    assert data["stream"] == "off"  # the test client is WSGI: pages poll by default
    assert data["operate"] == "no"
    page = viewer.get(f"{PREFIX}/runs/{run.id}")
    assert body_data(page)["run"] == run.id
    html = page.content.decode()
    assert f'src="{PREFIX}/static/js/main.js"' in html and f'href="{PREFIX}/static/console.css"' in html
    assert "script-src 'self'" in page["Content-Security-Policy"] and page["Cache-Control"] == "no-store"
    for name in ("blocked", "runners"):
        assert body_data(viewer.get(f"{PREFIX}/{name}"))["page"] == name
    script = viewer.get(PREFIX + "/static/js/api.js")
    assert script.status_code == 200 and "javascript" in script["Content-Type"]
    assert b"csrfHeader" in b"".join(script.streaming_content)
    assert Client().get(PREFIX + "/static/console.css").status_code == 200  # assets need no login
    assert viewer.get(PREFIX + "/static/js/nope.js").status_code == 404
    assert Client(raise_request_exception=False).get(PREFIX + "/static/../handlers.py").status_code == 400
    assert viewer.get(PREFIX + "/runs/not-a-uuid").status_code == 404


def test_the_api_answers_with_the_consoles_own_json(viewer: Client, store: Store) -> None:
    waiting = place("waiting")
    done = place("done")
    assert execute_run(store, done.id) == COMPLETED
    stuck = blocked(store)

    runs = viewer.get(PREFIX + "/api/runs").json()
    assert {run["id"] for run in runs["runs"]} == {waiting.id, done.id, stuck}
    assert {count["status"]: count["count"] for count in runs["counts"]}[COMPLETED] == 1
    only = viewer.get(PREFIX + "/api/runs", {"status": "completed"}).json()
    assert [run["id"] for run in only["runs"]] == [done.id]
    detail = viewer.get(f"{PREFIX}/api/runs/{done.id}").json()
    assert detail["run"]["status"] == COMPLETED
    assert [step["step_id"] for step in detail["steps"]] == ["1", "charge", "3"]
    assert detail["steps_total"] == 3 and detail["steps_next"] is None
    page = viewer.get(f"{PREFIX}/api/runs/{done.id}/steps", {"after": "1", "limit": "1"}).json()
    assert [step["step_id"] for step in page["steps"]] == ["charge"] and page["next"] == "charge"
    assert {node["function"] for node in detail["graph"]["nodes"] if node.get("function")} >= {
        "shop.workflows.charge_card"}
    assert viewer.get(PREFIX + "/api/blocked").json()["runs"][0]["uncertain"][0]["step_id"] == "charge"
    assert "shop.workflows.fulfil_order" in viewer.get(PREFIX + "/api/meta").json()["workflows"]
    assert viewer.get(PREFIX + "/api/runners").json() == {"runners": []}

    bad = viewer.get(PREFIX + "/api/runs", {"status": "nope"})
    assert bad.status_code == 400 and "unknown status 'nope'" in bad.json()["error"]
    missing = viewer.get(f"{PREFIX}/api/runs/00000000-0000-7000-8000-000000000000")
    assert missing.status_code == 404 and "error" in missing.json()
    assert viewer.get(PREFIX + "/api/requests/x").status_code == 400
    assert viewer.post(PREFIX + "/api/runs").status_code == 405


# -- who may -----------------------------------------------------------------------------


def test_anonymous_visitors_are_sent_to_log_in_and_the_api_refuses_them(project: Project) -> None:
    anonymous = Client()
    page = anonymous.get(PREFIX + "/blocked", {"status": "x"})
    assert page.status_code == 302
    assert page["Location"].startswith("/admin/login/?next=/everystep/blocked")
    api = anonymous.get(PREFIX + "/api/runs")
    assert api.status_code == 403 and "log in" in api.json()["error"]
    assert anonymous.get(PREFIX + "/api/stream", {"view": "runs"}).status_code == 403


def test_users_without_the_permissions_get_403(project: Project, store: Store) -> None:
    run = place("guarded")
    nobody = logged_in("nobody")
    assert nobody.get(PREFIX + "/").status_code == 403
    refused = nobody.get(PREFIX + "/api/runs")
    assert refused.status_code == 403 and "everystep.view_run" in refused.json()["error"]

    viewer = logged_in("viewer", "view_run", enforce_csrf_checks=True)
    token = body_data(viewer.get(PREFIX + "/"))["csrf"]
    cancel = act(viewer, f"/api/runs/{run.id}/cancel", {}, token)
    assert cancel.status_code == 403 and "everystep.operate_console" in cancel.json()["error"]
    assert act(viewer, "/api/runners/any/scale", {"procs": 2}, token).status_code == 403
    assert store.get_run(run.id).status == SCHEDULED


def test_actions_need_djangos_csrf_token(operator: Client, store: Store) -> None:
    run = place("csrf")
    assert act(operator, f"/api/runs/{run.id}/cancel", {}, None).status_code == 403
    assert act(operator, f"/api/runs/{run.id}/cancel", {}, "forged" * 6).status_code == 403
    assert store.get_run(run.id).status == SCHEDULED

    data = body_data(operator.get(PREFIX + "/"))
    assert data["operate"] == "yes"
    done = act(operator, f"/api/runs/{run.id}/cancel", {"reason": "customer left"}, data["csrf"])
    assert done.status_code == 200, done.content
    assert done.json()["run"]["status"] == CANCELLED
    cancelled = store.get_run(run.id)
    assert cancelled.status == CANCELLED and "customer left" in json.dumps(cancelled.error)


def test_an_operator_resolves_a_blocked_run_with_the_clis_rules(operator: Client, store: Store) -> None:
    stuck = blocked(store)
    token = body_data(operator.get(PREFIX + "/blocked"))["csrf"]
    refused = act(operator, f"/api/runs/{stuck}/resolve", {"step": "1", "discard": True}, token)
    assert refused.status_code == 409 and f"step 1 of run {stuck} is done, not started" in refused.json()["error"]
    assert store.get_run(stuck).status == BLOCKED
    resolved = act(operator, f"/api/runs/{stuck}/resolve", {"step": "charge", "result": '"ch_console"'}, token)
    assert resolved.status_code == 200, resolved.content
    assert store.get_run(stuck).status == SCHEDULED
    assert execute_run(store, stuck) == COMPLETED
    assert store.get_run(stuck).result == {"sku": "blocked", "charge": "ch_console"}
    again = act(operator, f"/api/runs/{stuck}/rerun", {}, token)
    assert again.status_code == 200 and store.get_run(again.json()["new_run"]).status == SCHEDULED
    assert act(operator, f"/api/runs/{stuck}/explode", {}, token).status_code == 404
    assert act(operator, "/api/runners/ghost/scale", {"procs": 2}, token).status_code == 409


# -- other prefixes --------------------------------------------------------------------------


@override_settings(ROOT_URLCONF="tests.support.django_urls")
def test_the_console_works_under_any_prefix(viewer: Client, store: Store) -> None:
    run = place("prefix")
    for prefix in ("/ops/console", "/tools/es"):
        data = body_data(viewer.get(prefix + "/"))
        assert data["root"] == prefix
        assert f'src="{prefix}/static/js/main.js"' in viewer.get(f"{prefix}/runs/{run.id}").content.decode()
        assert viewer.get(prefix + "/static/js/main.js").status_code == 200
        assert viewer.get(f"{prefix}/api/runs/{run.id}").json()["run"]["id"] == run.id
    assert viewer.get(PREFIX + "/").status_code == 404
    assert Client().get("/ops/console/runners")["Location"].startswith("/admin/login/?next=/ops/console/runners")


# -- the stream -----------------------------------------------------------------------------


def test_the_stream_under_wsgi_is_off_by_default_and_bridged_when_asked(viewer: Client, store: Store) -> None:
    run = place("stream")
    off = viewer.get(PREFIX + "/api/stream", {"view": "runs"})
    assert off.status_code == 404 and "CONSOLE_STREAM" in off.json()["error"]

    with override_settings(EVERYSTEP={**EVERYSTEP_SETTINGS, "CONSOLE_STREAM": True}):
        assert body_data(viewer.get(PREFIX + "/"))["stream"] == "on"
        assert viewer.get(PREFIX + "/api/stream", {"view": "nope"}).status_code == 400
        response = viewer.get(PREFIX + "/api/stream", {"view": "run", "id": run.id})
        assert response.status_code == 200 and response["Content-Type"].startswith("text/event-stream")
        chunks = iter(response.streaming_content)
        assert next(chunks).startswith(b"retry:")
        event = next(chunks).decode()
        assert event.startswith("event: update\n")
        assert json.loads(event.split("data: ", 1)[1])["run"]["status"] == SCHEDULED
        assert execute_run(store, run.id) == COMPLETED
        while True:  # the next update carries the change: the stream is live, not a snapshot
            event = next(chunks).decode()
            if event.startswith("event: update"):
                break
        assert json.loads(event.split("data: ", 1)[1])["run"]["status"] == COMPLETED
        response.close()


def test_a_runs_stream_is_served_where_the_console_streams(viewer: Client, store: Store) -> None:
    from tests.apps import streams as stream_apps

    run = everystep.schedule(stream_apps.reporter, 2, database=store)
    assert execute_run(store, run.id) == COMPLETED
    path = f"{PREFIX}/api/runs/{run.id}/streams/progress"
    off = viewer.get(path)
    assert off.status_code == 404 and "CONSOLE_STREAM" in off.json()["error"]
    with override_settings(EVERYSTEP={**EVERYSTEP_SETTINGS, "CONSOLE_STREAM": True}):
        assert viewer.get(f"{PREFIX}/api/runs/00000000-0000-0000-0000-00000000abcd/streams/k").status_code == 404
        response = viewer.get(path, HTTP_LAST_EVENT_ID="1")
        assert response.status_code == 200 and response["Content-Type"].startswith("text/event-stream")
        body = b"".join(response.streaming_content).decode()
        assert body.split("\n\n")[1:3] == ['id: 2\nevent: value\ndata: {"done":2,"of":2}', "id: 3\nevent: end\ndata: {}"]


# -- settings and permissions --------------------------------------------------------------


def test_the_stream_setting_is_validated(project: Project) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from everystep.contrib.django import conf

    for value in (None, True, False):
        with override_settings(EVERYSTEP={**EVERYSTEP_SETTINGS, "CONSOLE_STREAM": value}):
            assert conf.get().console_stream is value
    for bad in ("yes", 1):
        with override_settings(EVERYSTEP={**EVERYSTEP_SETTINGS, "CONSOLE_STREAM": bad}):
            with pytest.raises(ImproperlyConfigured, match=r"CONSOLE_STREAM'\] must be None"):
                conf.get()


def test_the_operate_permission_comes_from_a_migration(project: Project) -> None:
    from django.contrib.auth.models import Permission
    from django.core.management import call_command

    assert Permission.objects.filter(content_type__app_label="everystep", codename="operate_console").exists()
    call_command("makemigrations", "everystep", check=True, dry_run=True, verbosity=0)  # exits 1 on a model drift
