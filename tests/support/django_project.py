"""The example Django project (``examples/django_app``) under test.

Django's settings can be configured once per process, and the whole suite
runs in one pytest process. So Django is configured once, lazily, from the
example project's settings with no database at all, and each test module
borrows it through ``django_configured``: that context points ``DATABASES``
and ``EVERYSTEP`` at the module's own databases (resetting Django's
connection handler, as Django itself does for ``CACHES``), re-runs the
everystep AppConfig's ``ready()``, and on exit closes every connection, puts
the empty settings back and removes the connection provider, so nothing
Django-shaped is left for the rest of the suite.

Subprocesses (``manage``) run the real ``manage.py`` with a settings module
written into a temporary directory: ``from shopsite.settings import *`` plus
the test's ``DATABASES``, as a project's own settings overlay would.

The ``django_project`` fixture (import it into a test module) yields one
``Project`` per backend, with a fresh, migrated database: a SQLite file, or a
database created on the throwaway PostgreSQL cluster and dropped afterwards.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from everystep.store import Store, connect
from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE = ROOT / "examples" / "django_app"
MANAGE = EXAMPLE / "manage.py"
EVERYSTEP_SETTINGS = {"DATABASE": "default", "APPS": ["shop.workflows"]}


def sqlite_database(path: Path) -> dict[str, Any]:
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}


def postgres_database(url: str) -> dict[str, Any]:
    info = conninfo_to_dict(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": info.get("dbname", ""),
        "USER": info.get("user", ""),
        "PASSWORD": info.get("password", ""),
        "HOST": info.get("host", ""),
        "PORT": str(info.get("port", "")),
    }


def _ensure_configured() -> None:
    import django
    from django.conf import settings

    if settings.configured:
        return
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    import shopsite.settings as example

    base = {name: getattr(example, name) for name in dir(example) if name.isupper()}
    base["DATABASES"] = {}
    base["EVERYSTEP"] = {"DATABASE": "default", "APPS": [], "MIGRATE": False}
    settings.configure(**base)
    django.setup()
    from everystep.provider import set_connection_provider
    from everystep.transactional import set_transaction_provider

    set_connection_provider(None)
    set_transaction_provider(None)


def _reset_connections() -> None:
    from asgiref.local import Local
    from django.db import connections

    connections.close_all()
    connections._settings = connections.settings = connections.configure_settings(None)  # type: ignore[misc]
    connections._connections = Local(connections.thread_critical)


@contextlib.contextmanager
def django_configured(databases: dict[str, Any], everystep: dict[str, Any] | None = None) -> Iterator[None]:
    """Django configured for ``databases`` (a DATABASES dict) until exit."""
    _ensure_configured()
    from django.apps import apps
    from django.conf import settings
    from django.test.utils import setup_test_environment, teardown_test_environment

    from everystep.provider import set_connection_provider
    from everystep.transactional import set_transaction_provider

    saved = settings.DATABASES, settings.EVERYSTEP
    previous_provider = set_connection_provider(None)
    previous_steps = set_transaction_provider(None)
    settings.DATABASES = databases
    settings.EVERYSTEP = dict(everystep or EVERYSTEP_SETTINGS)
    _reset_connections()
    setup_test_environment()
    try:
        apps.get_app_config("everystep").ready()
        yield
    finally:
        teardown_test_environment()
        settings.DATABASES, settings.EVERYSTEP = saved
        _reset_connections()
        set_connection_provider(previous_provider)
        set_transaction_provider(previous_steps)


def write_settings(directory: Path, databases: dict[str, Any], extra: str = "") -> str:
    """A settings module overlaying the example's; returns its module name."""
    name = f"es_settings_{uuid.uuid4().hex[:8]}"
    (directory / f"{name}.py").write_text(
        f"from shopsite.settings import *  # noqa\n\nDATABASES = {databases!r}\n{extra}", encoding="utf-8"
    )
    return name


def manage_env(settings_dir: Path, settings_module: str, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(base if base is not None else os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(settings_dir), str(ROOT), str(EXAMPLE)])
    env["DJANGO_SETTINGS_MODULE"] = settings_module
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("EVERYSTEP_DATABASE_URL", None)
    return env


def manage(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120.0,
           prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python manage.py ARGS`` (``prefix`` goes between python and manage.py)."""
    return subprocess.run(
        [sys.executable, *(prefix or []), str(MANAGE), *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
    )


@dataclass
class Project:
    """One backend's database, configured in this process and for manage.py."""

    backend: str
    databases: dict[str, Any]
    url: str  # everystep's URL for the same database
    directory: Path
    settings_module: str
    env: dict[str, str] = field(default_factory=dict)

    def manage(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return manage(list(args), self.env, self.directory, timeout)


@contextlib.contextmanager
def project_for(backend: str, directory: Path, pg_server: Any = None) -> Iterator[Project]:
    """A fresh database of ``backend`` with Django configured on it and
    everything migrated (``manage.py migrate``, in-process)."""
    from django.core.management import call_command
    from django.db import connections

    from everystep.store import close_default_stores

    if backend == "sqlite":
        path = directory / "shop.sqlite3"
        databases = {"default": sqlite_database(path)}
        url = f"sqlite:///{path}"
        dropper = None
    else:
        url = pg_server.create_database("everystep_django")
        databases = {"default": postgres_database(url)}
        dropper = pg_server.drop_database
    settings_module = write_settings(directory, databases)
    project = Project(backend, databases, url, directory, settings_module,
                      env=manage_env(directory, settings_module))
    try:
        with django_configured(databases):
            call_command("migrate", verbosity=0)
            yield project
            connections.close_all()
            close_default_stores()
    finally:
        if dropper is not None:
            dropper(url)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def django_project(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    directory = tmp_path_factory.mktemp(f"django-{request.param}")
    pg_server = request.getfixturevalue("pg_server") if request.param == "postgres" else None
    with project_for(request.param, directory, pg_server) as project:
        yield project


@pytest.fixture
def project(django_project: Project) -> Project:
    """The module's project, its tables emptied for this test."""
    empty_tables(django_project)
    return django_project


@pytest.fixture(name="store")
def project_store(project: Project) -> Iterator[Store]:
    """``store`` in a Django test module: everystep's own store on the
    project's database (import ``project_store`` to use it)."""
    store = connect(project.url)
    try:
        yield store
    finally:
        store.close()


def empty_tables(project: Project) -> None:
    """Between tests: no runs, no steps, no orders (users stay)."""
    statements = ["DELETE FROM everystep_step", "DELETE FROM everystep_message", "DELETE FROM everystep_event",
                  "DELETE FROM everystep_workflow", "DELETE FROM everystep_runner",
                  "DELETE FROM shop_order"]
    if project.backend == "postgres":
        with psycopg.connect(project.url, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)
        return
    import sqlite3

    with contextlib.closing(sqlite3.connect(project.databases["default"]["NAME"], isolation_level=None)) as conn:
        for statement in statements:
            conn.execute(statement)
