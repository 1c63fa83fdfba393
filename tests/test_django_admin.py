"""Django admin: read-only runs and steps (lists, filters, search, details)
and the blocked-step resolve form and action, which refuse what
``everystep resolve-step`` refuses. A logged-in test client, real runs
executed in-process (one blocked by a crash inside its unsafe step), on
SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("django", reason="the django extra is not installed")

from django.test import Client  # noqa: E402
from django.urls import reverse  # noqa: E402

import everystep  # noqa: E402
from everystep.errors import SimulatedCrash  # noqa: E402
from everystep.models import BLOCKED, COMPLETED, SCHEDULED  # noqa: E402
from everystep.store import Store  # noqa: E402
from tests.support.django_project import Project, django_project, project, project_store  # noqa: E402,F401
from tests.support.runs import crash_at, execute_run, resume  # noqa: E402

# The Django integration supports PostgreSQL and SQLite, not MariaDB.
pytestmark = [pytest.mark.timeout(120), pytest.mark.backends("sqlite", "postgres")]


@pytest.fixture
def client(project: Project) -> Client:
    from django.contrib.auth.models import User

    if not User.objects.filter(username="root").exists():
        User.objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(User.objects.get(username="root"))
    return client


def place(sku: str) -> Any:
    from shop.models import Order
    from shop.workflows import fulfil_order

    order = Order.objects.create(sku=sku, quantity=1, amount="3.00")
    return order, everystep.schedule(fulfil_order, order.pk)


@pytest.fixture
def runs(project: Project, store: Store) -> dict[str, Any]:
    """A completed run, a blocked one (crashed inside its unsafe 'charge'
    step, then replayed) and a scheduled one."""
    done_order, done = place("done")
    assert execute_run(store, done.id) == COMPLETED
    blocked_order, blocked = place("blocked")
    crash_at("charge")
    with pytest.raises(SimulatedCrash):
        execute_run(store, blocked.id)
    assert resume(store, blocked.id) == BLOCKED
    _, waiting = place("waiting")
    return {"done": done, "blocked": blocked, "waiting": waiting, "blocked_order": blocked_order}


def url(name: str, *args: Any) -> str:
    return reverse(f"admin:everystep_{name}", args=[str(arg) for arg in args])


def text(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


# -- lists and details -----------------------------------------------------------------


def test_the_run_list_filters_by_status_and_searches_by_id(client: Client, runs: dict[str, Any]) -> None:
    ids = {key: runs[key].id for key in ("done", "blocked", "waiting")}
    page = text(client.get(url("run_changelist")))
    assert all(run_id in page for run_id in ids.values())
    assert "shop.workflows.fulfil_order" in page
    blocked_only = text(client.get(url("run_changelist"), {"status": "blocked"}))
    assert ids["blocked"] in blocked_only and ids["done"] not in blocked_only and ids["waiting"] not in blocked_only
    for term in (ids["done"], ids["done"].upper(), ids["done"][:23]):
        found = text(client.get(url("run_changelist"), {"q": term}))
        assert ids["done"] in found and ids["blocked"] not in found, term
    by_name = text(client.get(url("run_changelist"), {"q": "fulfil_order"}))
    assert all(run_id in by_name for run_id in ids.values())
    nothing = text(client.get(url("run_changelist"), {"q": "00000000-0000-7000-8000-000000000000"}))
    assert not any(run_id in nothing for run_id in ids.values())


def test_run_details_show_the_run_and_its_steps(client: Client, runs: dict[str, Any]) -> None:
    done = text(client.get(url("run_change", runs["done"].id)))
    assert runs["done"].id in done and "completed" in done
    assert "reserve_stock" in done and "charge_card" in done and "mark_paid" in done
    assert "ch_" in done  # the result, pretty-printed
    assert "Resolve blocked step" not in done
    blocked = text(client.get(url("run_change", runs["blocked"].id)))
    assert "EffectUncertain" in blocked and "started" in blocked
    assert url("run_resolve", runs["blocked"].id) in blocked
    assert client.get(url("run_change", "not-a-uuid")).status_code in (302, 404)


def test_runs_and_steps_are_read_only(client: Client, runs: dict[str, Any]) -> None:
    assert client.get(url("run_add")).status_code == 403
    assert client.get(url("run_delete", runs["done"].id)).status_code == 403
    posted = client.post(url("run_change", runs["done"].id), {"status": "failed"})
    assert posted.status_code == 403
    assert everystep.get_run(runs["done"].id).status == COMPLETED
    assert "delete_selected" not in text(client.get(url("run_changelist")))


def test_the_step_list_filters_searches_and_links_to_details(client: Client, runs: dict[str, Any]) -> None:
    from everystep.contrib.django.models import Step

    page = text(client.get(url("step_changelist")))
    assert "reserve_stock" in page and runs["blocked"].id in page
    started = text(client.get(url("step_changelist"), {"status": "started"}))
    assert runs["blocked"].id in started and runs["done"].id not in started
    of_run = text(client.get(url("step_changelist"), {"q": runs["done"].id}))
    assert runs["done"].id in of_run and runs["blocked"].id not in of_run
    step = Step.objects.get(run_id=runs["done"].id, step_id="charge")
    detail = text(client.get(url("step_change", step.pk)))
    assert "charge_card" in detail and url("run_change", runs["done"].id) in detail


def test_the_models_read_everysteps_rows(runs: dict[str, Any]) -> None:
    from everystep.contrib.django.models import Run

    run = Run.objects.get(pk=runs["done"].id)
    assert str(run.pk) == runs["done"].id and run.status == COMPLETED
    assert [step.step_id for step in run.steps.order_by("id")] == ["1", "charge", "3"]
    assert Run.objects.filter(id__startswith=runs["blocked"].id[:20]).get().status == BLOCKED
    assert Run.objects.filter(id__in=[runs["done"].id, runs["waiting"].id]).count() == 2
    assert run.created_at.tzinfo is not None
    with pytest.raises(TypeError, match="written by everystep only"):
        run.save()


# -- resolving a blocked run -------------------------------------------------------------


def test_resolving_with_a_result_reschedules_the_run(client: Client, runs: dict[str, Any], store: Store) -> None:
    blocked = runs["blocked"]
    form = text(client.get(url("run_resolve", blocked.id)))
    assert 'value="charge"' in form and "EffectUncertain" in form
    done = client.post(url("run_resolve", blocked.id), {"step_id": "charge", "outcome": "result",
                                                        "value": '"ch_manual"'})
    assert done.status_code == 302 and done["Location"] == url("run_change", blocked.id)
    assert everystep.get_run(blocked.id).status == SCHEDULED
    from django.contrib.admin.models import LogEntry

    assert LogEntry.objects.filter(object_id=blocked.id, change_message__contains="Resolved step charge").exists()
    assert execute_run(store, blocked.id) == COMPLETED
    assert everystep.get_run(blocked.id).result == {"sku": "blocked", "charge": "ch_manual"}
    runs["blocked_order"].refresh_from_db()
    assert runs["blocked_order"].charge_id == "ch_manual"


def test_resolving_with_discard_and_with_an_error(client: Client, runs: dict[str, Any], store: Store) -> None:
    blocked = runs["blocked"]
    assert client.post(url("run_resolve", blocked.id),
                       {"step_id": "charge", "outcome": "discard", "value": ""}).status_code == 302
    assert [step.step_id for step in everystep.get_steps(blocked.id)] == ["1"]
    # Block it again, and this time record the failure.
    crash_at("charge")
    with pytest.raises(SimulatedCrash):
        execute_run(store, blocked.id)
    assert resume(store, blocked.id) == BLOCKED
    assert client.post(url("run_resolve", blocked.id),
                       {"step_id": "charge", "outcome": "error", "value": "card declined"}).status_code == 302
    charge = {step.step_id: step for step in everystep.get_steps(blocked.id)}["charge"]
    assert charge.status == "failed" and charge.error["message"] == "card declined"


@pytest.mark.parametrize(("target", "data", "refusal"), [
    ("blocked", {"step_id": "nope", "outcome": "discard"}, "has no step &#x27;nope&#x27; (its started step: charge)"),
    ("blocked", {"step_id": "1", "outcome": "discard"}, "step 1 of run {id} is done, not started"),
    ("done", {"step_id": "charge", "outcome": "discard"}, "run {id} is completed, not blocked"),
    ("waiting", {"step_id": "charge", "outcome": "result", "value": "1"}, "run {id} is scheduled, not blocked"),
    ("blocked", {"step_id": "charge", "outcome": "result", "value": "{not json"}, "the result is not valid JSON"),
    ("blocked", {"step_id": "charge", "outcome": "error", "value": "  "}, "an error message is required"),
])
def test_resolving_refuses_what_the_command_refuses(
    client: Client, runs: dict[str, Any], target: str, data: dict[str, str], refusal: str
) -> None:
    run = runs[target]
    before = {key: everystep.get_run(runs[key].id).status for key in ("done", "blocked", "waiting")}
    page = text(client.post(url("run_resolve", run.id), {"value": "", **data}))
    assert refusal.format(id=run.id) in page
    assert {key: everystep.get_run(runs[key].id).status for key in before} == before
    assert [s.status for s in everystep.get_steps(runs["blocked"].id)] == ["done", "started"]


def test_the_resolve_action_opens_the_form_for_one_run(client: Client, runs: dict[str, Any]) -> None:
    one = client.post(url("run_changelist"), {"action": "resolve_blocked_step",
                                              "_selected_action": [runs["blocked"].id]})
    assert one.status_code == 302 and one["Location"] == url("run_resolve", runs["blocked"].id)
    two = client.post(url("run_changelist"), {"action": "resolve_blocked_step",
                                              "_selected_action": [runs["blocked"].id, runs["done"].id]},
                      follow=True)
    assert "Select exactly one run to resolve." in text(two)


def test_resolving_needs_the_resolve_permission(project: Project, runs: dict[str, Any]) -> None:
    from django.contrib.auth.models import Permission, User

    viewer, _ = User.objects.get_or_create(username="viewer", defaults={"is_staff": True})
    viewer.user_permissions.set([Permission.objects.get(codename="view_run")])
    client = Client()
    client.force_login(viewer)
    assert "resolve_blocked_step" not in text(client.get(url("run_changelist")))
    assert url("run_resolve", runs["blocked"].id) not in text(client.get(url("run_change", runs["blocked"].id)))
    assert client.post(url("run_resolve", runs["blocked"].id),
                       {"step_id": "charge", "outcome": "discard"}).status_code == 403
    assert everystep.get_run(runs["blocked"].id).status == BLOCKED

    operator, _ = User.objects.get_or_create(username="operator", defaults={"is_staff": True})
    operator.user_permissions.set(Permission.objects.filter(codename__in=["view_run", "resolve_step"]))
    client.force_login(operator)
    assert client.post(url("run_resolve", runs["blocked"].id),
                       {"step_id": "charge", "outcome": "discard"}).status_code == 302
    assert everystep.get_run(runs["blocked"].id).status == SCHEDULED
