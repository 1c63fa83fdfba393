"""Django: ``everystep.schedule()`` runs on Django's own connection, inside
the caller's ``transaction.atomic()``; the URL everystep's processes derive
from ``DATABASES``; the ``EVERYSTEP`` setting and its system checks. On
SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

pytest.importorskip("django", reason="the django extra is not installed")

from django.core import checks  # noqa: E402
from django.db import connections, transaction  # noqa: E402
from django.db.transaction import TransactionManagementError  # noqa: E402
from django.db.utils import ConnectionHandler  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

import everystep  # noqa: E402
from everystep.errors import RunNotFound  # noqa: E402
from everystep.models import SCHEDULED  # noqa: E402
from everystep.store import connect  # noqa: E402
from tests.support.django_project import Project, django_project, project  # noqa: E402,F401
from tests.support.pgserver import PgServer  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def runs_seen_by_everystep(project: Project) -> list[tuple[str, Any]]:
    """(id, args) of every committed run, read on a connection of our own
    (a plain reader: on SQLite a Store would first take the write lock to
    check its schema, and wait for the test's open transaction)."""
    sql = "SELECT id, args FROM everystep_workflow ORDER BY created_at"
    if project.backend == "postgres":
        with psycopg.connect(project.url, autocommit=True) as conn:
            return [(str(row[0]), row[1]) for row in conn.execute(sql)]
    with contextlib.closing(sqlite3.connect(project.databases["default"]["NAME"])) as conn:
        return [(row[0], json.loads(row[1])) for row in conn.execute(sql)]


def fulfil_order() -> Any:
    from shop.workflows import fulfil_order

    return fulfil_order


# -- schedule() in Django's transaction --------------------------------------------------


def test_a_run_scheduled_in_a_rolled_back_atomic_block_never_existed(project: Project) -> None:
    from shop.models import Order

    with pytest.raises(RuntimeError):
        with transaction.atomic():
            order = Order.objects.create(sku="mug", quantity=1, amount="5.00")
            run = everystep.schedule(fulfil_order(), order.pk)
            assert run.status == SCHEDULED and run.args == [order.pk]
            # The same transaction reads its own run; everystep's own
            # connection cannot see it before the commit.
            assert everystep.get_run(run.id).id == run.id
            assert runs_seen_by_everystep(project) == []
            raise RuntimeError("payment form invalid")
    assert runs_seen_by_everystep(project) == []
    assert not Order.objects.exists()
    with pytest.raises(RunNotFound):
        everystep.get_run(run.id)


def test_a_committed_atomic_block_makes_the_run_claimable(project: Project) -> None:
    with transaction.atomic():
        run = everystep.schedule(fulfil_order(), 7, idempotency_key="order-7")
        assert everystep.schedule(fulfil_order(), 7, idempotency_key="order-7").id == run.id
    assert runs_seen_by_everystep(project) == [(run.id, [7])]
    assert run.created_at is not None and run.created_at.tzinfo is not None
    assert everystep.get_steps(run.id) == []


def test_a_savepoint_rolled_back_takes_only_its_own_run(project: Project) -> None:
    with transaction.atomic():
        kept = everystep.schedule(fulfil_order(), 1)
        try:
            with transaction.atomic():  # a savepoint
                everystep.schedule(fulfil_order(), 2)
                raise ValueError("inner")
        except ValueError:
            pass
    assert runs_seen_by_everystep(project) == [(kept.id, [1])]


def test_outside_atomic_the_run_commits_at_once(project: Project) -> None:
    run = everystep.schedule(fulfil_order(), 3)
    assert runs_seen_by_everystep(project) == [(run.id, [3])]
    assert connections["default"].get_autocommit()


def test_a_transaction_marked_for_rollback_refuses_to_schedule(project: Project) -> None:
    with transaction.atomic():
        transaction.set_rollback(True)
        with pytest.raises(TransactionManagementError):
            everystep.schedule(fulfil_order(), 4)
    assert runs_seen_by_everystep(project) == []


def test_no_second_connection_is_opened(project: Project) -> None:
    """schedule() uses the connection Django already has for this thread."""
    wrapper = connections["default"]
    wrapper.ensure_connection()
    raw = wrapper.connection
    with transaction.atomic():
        everystep.schedule(fulfil_order(), 5)
        assert wrapper.connection is raw
        if project.backend == "postgres":
            assert raw.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        else:
            assert raw.in_transaction


def test_the_example_view_places_an_order_and_its_run_together(project: Project) -> None:
    from shop.models import Order

    client = Client()
    placed = client.post("/orders/", json.dumps({"sku": "tea", "quantity": 2, "amount": "7.25"}),
                         content_type="application/json")
    assert placed.status_code == 201, placed.content
    order = Order.objects.get(pk=placed.json()["order"])
    assert str(order.run_id) == placed.json()["run"]
    assert client.get(f"/orders/{order.pk}/").json() == {"order": order.pk, "status": "new", "run": "scheduled"}
    refused = client.post("/orders/", json.dumps({"sku": "tea"}), content_type="application/json")
    assert refused.status_code == 400
    assert len(runs_seen_by_everystep(project)) == 1


def test_the_connection_provider_is_gone_once_the_module_is_done(project: Project) -> None:
    """While Django is configured, schedule() goes through Django; the
    fixture removes the provider on exit (checked by the next module's
    tests, which run without Django, and here by the installed value)."""
    from everystep.contrib.django.provider import django_connection
    from everystep.provider import connection_provider

    assert connection_provider() is django_connection


# -- the URL everystep's processes derive ------------------------------------------------
# (These need Django's settings, so they run under each backend's module setup.)


def wrapper_for(settings_dict: dict[str, Any]) -> Any:
    return ConnectionHandler({"default": settings_dict})["default"]


def test_the_derived_url_reaches_the_same_database(project: Project) -> None:
    from everystep.contrib.django.database import database_url

    url = database_url(connections["default"])
    store = connect(url)
    try:
        run = everystep.schedule(fulfil_order(), 6)
        assert store.get_run(run.id).args == [6]
    finally:
        store.close()
    if project.backend == "sqlite":
        assert url == f"sqlite:///{Path(project.databases['default']['NAME']).resolve()}"


PASSWORD = "p@ss:w/rd?#%&= é+'\"\\"


def test_postgres_url_keeps_special_characters_and_options(project: Project) -> None:
    from everystep.contrib.django.database import database_url

    url = database_url(wrapper_for({
        "ENGINE": "django.db.backends.postgresql", "NAME": "shop db/1", "USER": "shop user@x",
        "PASSWORD": PASSWORD, "HOST": "db.example.com", "PORT": "6543",
        "OPTIONS": {"sslmode": "require", "options": "-c search_path=a,b", "server_side_binding": True,
                    "isolation_level": 2, "application_name": "web&co"},
    }))
    assert url.startswith("postgresql://") and PASSWORD not in url
    assert conninfo_to_dict(url) == {
        "dbname": "shop db/1", "user": "shop user@x", "password": PASSWORD, "host": "db.example.com",
        "port": "6543", "sslmode": "require", "options": "-c search_path=a,b", "application_name": "web&co",
        "client_encoding": "UTF8",
    }
    assert PASSWORD not in connect(url).describe()


@pytest.mark.parametrize(("host", "port", "expected"), [
    ("/var/run/postgresql", "", {"host": "/var/run/postgresql"}),
    ("::1", "5433", {"host": "::1", "port": "5433"}),
    ("", "5433", {"port": "5433"}),
    ("a.example,b.example", "5432,5433", {"host": "a.example,b.example", "port": "5432,5433"}),
])
def test_postgres_url_hosts(project: Project, host: str, port: str, expected: dict[str, str]) -> None:
    from everystep.contrib.django.database import database_url

    url = database_url(wrapper_for({"ENGINE": "django.db.backends.postgresql", "NAME": "shop",
                                    "HOST": host, "PORT": port}))
    assert conninfo_to_dict(url) == {"dbname": "shop", "client_encoding": "UTF8", **expected}


def test_postgres_url_with_a_special_password_really_connects(project: Project, pg_server: PgServer) -> None:
    """A role whose name and password need escaping logs in with the derived
    URL (password authentication is enforced for this role only when the
    server asks for one; the URL must at least carry both intact)."""
    from everystep.contrib.django.database import database_url

    role = "es user@django"
    admin = conninfo_to_dict(pg_server.admin_url)
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("DROP ROLE IF EXISTS {}").format(psycopg.sql.Identifier(role)))
        conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            psycopg.sql.Identifier(role), psycopg.sql.Literal(PASSWORD)))
    try:
        url = database_url(wrapper_for({
            "ENGINE": "django.db.backends.postgresql", "NAME": admin.get("dbname", "postgres"),
            "USER": role, "PASSWORD": PASSWORD, "HOST": admin.get("host", ""), "PORT": str(admin.get("port", "")),
        }))
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT current_user").fetchone()[0] == role
    finally:
        with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("DROP ROLE IF EXISTS {}").format(psycopg.sql.Identifier(role)))


def test_sqlite_urls(project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from everystep.contrib.django.conf import UnsupportedDatabase
    from everystep.contrib.django.database import database_url

    monkeypatch.chdir(tmp_path)
    assert database_url(wrapper_for({"ENGINE": "django.db.backends.sqlite3", "NAME": "rel.db"})) == \
        f"sqlite:///{tmp_path / 'rel.db'}"
    assert database_url(wrapper_for({"ENGINE": "django.db.backends.sqlite3", "NAME": tmp_path / "p.db"})) == \
        f"sqlite:///{tmp_path / 'p.db'}"
    assert database_url(wrapper_for({"ENGINE": "django.db.backends.sqlite3",
                                     "NAME": f"file:{tmp_path / 'u%20ri.db'}?mode=rwc"})) == \
        f"sqlite:///{tmp_path / 'u ri.db'}"
    for memory in (":memory:", "file:memorydb_default?mode=memory&cache=shared"):
        with pytest.raises(UnsupportedDatabase, match="in-memory SQLite database"):
            database_url(wrapper_for({"ENGINE": "django.db.backends.sqlite3", "NAME": memory}))
    sqlite3.connect(tmp_path / "rel.db").close()
    connect(f"sqlite:///{tmp_path / 'rel.db'}").close()  # the URL opens


def test_an_unsupported_backend_is_refused_by_name() -> None:
    """Django's MySQL backend needs a driver this machine lacks, so a stand-in
    carries just what the check reads (vendor and alias)."""
    from everystep.contrib.django.conf import UnsupportedDatabase
    from everystep.contrib.django.database import database_url

    class MySQLConnection:
        vendor, alias = "mysql", "legacy"

    with pytest.raises(UnsupportedDatabase, match="'legacy' uses Django's mysql backend"):
        database_url(MySQLConnection())


# -- the EVERYSTEP setting ---------------------------------------------------------------


def everystep_errors() -> list[str]:
    return [message.id for message in checks.run_checks() if message.id and message.id.startswith("everystep.")]


def test_system_checks_pass_for_the_example(project: Project) -> None:
    assert everystep_errors() == []


@pytest.mark.parametrize(("value", "error"), [
    ({"DATABASE": "nope"}, "everystep.E002"),
    ({"DATABSE": "default"}, "everystep.E001"),
    ({"APPS": "shop.workflows"}, "everystep.E001"),
    ([], "everystep.E001"),
])
def test_system_checks_report_a_bad_setting(project: Project, value: Any, error: str) -> None:
    with override_settings(EVERYSTEP=value):
        assert everystep_errors() == [error]


def test_schedule_with_a_bad_alias_says_so(project: Project) -> None:
    from everystep.contrib.django.conf import UnsupportedDatabase

    with override_settings(EVERYSTEP={"DATABASE": "other"}):
        with pytest.raises(UnsupportedDatabase, match="'other', which is not in settings.DATABASES"):
            everystep.schedule(fulfil_order(), 1)
