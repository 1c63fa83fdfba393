"""What the ``everystep_*`` management commands share.

Each command declares the options of its ``everystep`` / ``everystep-
supervisor`` counterpart with the very builders those commands use, so the
flags cannot drift apart. Two differ, the Django way: ``--database`` names a
``DATABASES`` alias (default ``EVERYSTEP["DATABASE"]``), whose URL is derived
from Django's settings, and ``--app`` adds modules to ``EVERYSTEP["APPS"]``.
everystep's refusals become ``CommandError`` with exit code 2, as the
``everystep`` command exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from everystep import registry
from everystep.cliutil import EXIT_USAGE
from everystep.errors import EverystepError
from everystep.context import Observer

from . import conf, database


class EverystepCommand(BaseCommand):
    #: Whether the command takes ``--app`` (the runners do).
    takes_apps = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--database", metavar="ALIAS", default=None,
                            help="the DATABASES alias everystep lives in (default: EVERYSTEP['DATABASE'])")
        if self.takes_apps:
            parser.add_argument("--app", metavar="MODULE[,MODULE]", default="",
                                help="workflow modules to import besides EVERYSTEP['APPS']")

    def handle(self, *args: Any, **options: Any) -> str | None:
        try:
            if self.takes_apps:
                registry.import_apps(options["app"])
            return self.run(argparse.Namespace(**options))
        except EverystepError as exc:
            raise CommandError(str(exc).strip().splitlines()[0], returncode=EXIT_USAGE) from exc

    def run(self, options: argparse.Namespace) -> str | None:
        raise NotImplementedError

    def database_url(self, options: argparse.Namespace) -> str:
        return database.database_url(database.connection(options.database))

    def app_modules(self, options: argparse.Namespace) -> list[str]:
        extra = [module.strip() for module in options.app.split(",") if module.strip()]
        return [*conf.get().apps, *extra]

    @contextlib.contextmanager
    def printing(self) -> Iterator[None]:
        """``print`` from the shared ``everystep`` command functions goes to
        this command's stdout (so ``call_command(stdout=...)`` captures it)."""
        with contextlib.redirect_stdout(_Raw(self.stdout)):
            yield


class _Raw:
    """A file-like view of Django's OutputWrapper that adds no line endings."""

    def __init__(self, wrapper: Any) -> None:
        self.wrapper = wrapper

    def write(self, text: str) -> int:
        self.wrapper.write(text, ending="")
        return len(text)

    def flush(self) -> None:
        self.wrapper.flush()


class DjangoConnections(Observer):
    """For the threaded worker: each run is treated like a request, so a
    step's ORM queries never use a connection the database dropped or one
    past ``CONN_MAX_AGE``."""

    def run_started(self, run: Any, ctx: Any) -> None:
        close_old_connections()

    def run_finished(self, run: Any, ctx: Any, status: str, error: Any, token: Any) -> None:
        close_old_connections()
