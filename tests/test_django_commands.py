"""Django management commands, as real ``manage.py`` processes where it
matters: ``everystep_supervisor --burst`` executes what a committed atomic
block scheduled (its children use the ORM on connections of their own, never
one inherited from the parent), ``everystep_worker`` runs and drains,
``everystep_runs``, ``everystep_schedule`` and ``everystep_resolve_step``
behave like their ``everystep`` counterparts, and the example project's own test suite passes
under Django's test runner. On SQLite and PostgreSQL."""

from __future__ import annotations

import io
import json
import shutil
import signal
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("django", reason="the django extra is not installed")

from django.core.management import CommandError, call_command  # noqa: E402
from django.db import transaction  # noqa: E402

import everystep  # noqa: E402
from everystep.errors import SimulatedCrash  # noqa: E402
from everystep.models import BLOCKED, COMPLETED, SCHEDULED  # noqa: E402
from everystep.store import connect, utcnow  # noqa: E402
from tests.apps import defaults  # noqa: E402
from tests.support.defaults import assert_defaults  # noqa: E402
from tests.support.django_project import MANAGE, Project, django_project, project  # noqa: E402,F401
from tests.support.runs import crash_at, execute_run, resume  # noqa: E402
from tests.support.supervisor import short_socket_dir  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

# The Django integration supports PostgreSQL and SQLite, not MariaDB.
pytestmark = [pytest.mark.timeout(180), pytest.mark.backends("sqlite", "postgres")]


def place_order(sku: str) -> tuple[Any, Any]:
    from shop.models import Order
    from shop.workflows import fulfil_order

    with transaction.atomic():
        order = Order.objects.create(sku=sku, quantity=1, amount="2.50")
        run = everystep.schedule(fulfil_order, order.pk)
    return order, run


def blocked_run(project: Project) -> Any:
    store = connect(project.url)
    try:
        _, run = place_order("blocked")
        crash_at("charge")
        with pytest.raises(SimulatedCrash):
            execute_run(store, run.id)
        assert resume(store, run.id) == BLOCKED
        return run
    finally:
        store.close()


def test_supervisor_burst_executes_what_a_committed_block_scheduled(project: Project) -> None:
    from shop.models import Order

    order, run = place_order("kettle")
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            Order.objects.create(sku="ghost", quantity=1, amount="1.00")
            everystep.schedule("shop.workflows.fulfil_order", 999)
            raise RuntimeError("rolled back")
    probes = [everystep.schedule("tests.apps.django_probe.probe").id for _ in range(3)]

    socket_dir = short_socket_dir()
    try:
        done = project.manage(
            "everystep_supervisor", "--burst", "--procs", "2", "--max-runs-per-child", "1",
            "--app", "tests.apps.django_probe", "--socket", str(socket_dir / "sup.sock"), "--name", "django-burst",
        )
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]

    finished = everystep.get_run(run.id)
    assert finished.status == COMPLETED, finished.error
    assert finished.result == {"sku": "kettle", "charge": f"ch_{order.pk}_2.50"}
    order.refresh_from_db()
    assert order.status == Order.Status.PAID  # written through the ORM in a child
    store = connect(project.url)
    try:
        assert sorted(run.args for run in store.list_runs()) == sorted([[order.pk], [], [], []])
    finally:
        store.close()

    results = [everystep.get_run(run_id) for run_id in probes]
    assert [result.status for result in results] == [COMPLETED] * 3, [result.error for result in results]
    seen = [result.result for result in results]
    assert len({item["ppid"] for item in seen}) == 1 and len({item["pid"] for item in seen}) == 3
    # The parent had Django's connection open (the command checks it), and
    # closed it before every fork: each child opened its own.
    assert not any(item["inherited_open"] for item in seen), seen
    assert all(item["orders"] == 1 for item in seen)


def test_supervisor_takes_the_clis_flags_and_refuses_bad_ones(project: Project) -> None:
    helped = project.manage("everystep_supervisor", "--help")
    assert helped.returncode == 0
    for flag in ("--procs", "--max-runs-per-child", "--step-timeout", "--burst", "--lease", "--metrics-port",
                 "--drain", "--socket", "--app", "--database"):
        assert flag in helped.stdout, flag
    bad = project.manage("everystep_supervisor", "--procs", "lots")
    assert bad.returncode == 2 and "--procs" in bad.stderr
    unknown = project.manage("everystep_supervisor", "--burst", "--database", "elsewhere")
    assert unknown.returncode == 2
    assert "'elsewhere', which is not in settings.DATABASES" in unknown.stderr


def test_worker_executes_runs_and_drains_on_sigterm(project: Project) -> None:
    order, run = place_order("teapot")
    worker = subprocess.Popen(
        [sys.executable, str(MANAGE), "everystep_worker", "--pool", "2", "--poll", "0.1", "--name", "django-worker"],
        env=project.env, cwd=project.directory, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_until(lambda: everystep.get_run(run.id).status == COMPLETED, "the worker to complete the run")
        later = everystep.schedule("shop.workflows.fulfil_order", order.pk, idempotency_key="again")
        wait_until(lambda: everystep.get_run(later.id).status == COMPLETED, "a second run")
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0, output[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    order.refresh_from_db()
    assert order.status == "paid"


def test_runs_lists_like_everystep_runs(project: Project) -> None:
    _, first = place_order("a")
    blocked = blocked_run(project)
    out = io.StringIO()
    call_command("everystep_runs", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["RUN", "STATUS", "WORKFLOW", "VERSION", "CLAIMED", "BY", "CREATED", "(UTC)"]
    assert {line.split()[0] for line in lines[1:]} == {first.id, blocked.id}
    # Django owns --version: the version filter is --app-version here.
    version = everystep.get_run(first.id).app_version
    assert version
    out = io.StringIO()
    call_command("everystep_runs", "--app-version", version, "--json", stdout=out)
    assert first.id in [item["id"] for item in json.loads(out.getvalue())]
    out = io.StringIO()
    call_command("everystep_runs", "--app-version", "no-such-version", "--json", stdout=out)
    assert json.loads(out.getvalue()) == []
    out = io.StringIO()
    call_command("everystep_runs", "--status", "blocked", "--json", stdout=out)
    assert [item["id"] for item in json.loads(out.getvalue())] == [blocked.id]
    listed = project.manage("everystep_runs", "--status", "scheduled")
    assert listed.returncode == 0 and first.id in listed.stdout and blocked.id not in listed.stdout
    assert project.manage("everystep_runs", "--status", "nonsense").returncode == 2


def test_schedule_applies_the_workflows_defaults_like_the_cli(project: Project) -> None:
    out = io.StringIO()
    before = utcnow()
    call_command("everystep_schedule", defaults.timed.name, "[1]", "--app", "tests.apps.defaults", stdout=out)
    after = utcnow()
    store = connect(project.url)
    try:
        assert_defaults(store, out.getvalue().strip(), before, after)
    finally:
        store.close()
    with pytest.raises(CommandError, match="cannot take 2 argument") as refused:
        call_command("everystep_schedule", defaults.timed.name, "[1, 2]", "--app", "tests.apps.defaults")
    assert refused.value.returncode == 2


def test_resolve_step_resolves_and_refuses_like_the_cli(project: Project) -> None:
    blocked = blocked_run(project)
    with pytest.raises(CommandError, match=f"run {blocked.id} has no step 'nope'") as refused:
        call_command("everystep_resolve_step", blocked.id, "nope", "--discard")
    assert refused.value.returncode == 2
    with pytest.raises(CommandError, match="is not valid JSON"):
        call_command("everystep_resolve_step", blocked.id, "charge", "--result", "{oops")
    out = io.StringIO()
    call_command("everystep_resolve_step", blocked.id, "charge", "--result", '"ch_by_hand"', stdout=out)
    assert out.getvalue() == f"run {blocked.id} resolved at step charge; now {SCHEDULED}\n"
    again = project.manage("everystep_resolve_step", blocked.id, "charge", "--discard")
    assert again.returncode == 2
    assert f"run {blocked.id} is scheduled, not blocked" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    neither = project.manage("everystep_resolve_step", blocked.id, "charge")
    assert neither.returncode == 2 and "--result" in neither.stderr


def test_the_example_projects_own_tests_pass_under_djangos_runner(project: Project) -> None:
    """``manage.py test``: Django creates a test database (in memory on
    SQLite), ``migrate`` gives it everystep's tables, and the shop's tests
    schedule runs in their transactions."""
    tested = project.manage("test", "shop", "--noinput", timeout=300)
    assert tested.returncode == 0, tested.stderr[-3000:]
    assert "Ran 3 tests" in tested.stderr and "OK" in tested.stderr
