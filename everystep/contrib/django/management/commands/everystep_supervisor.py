"""``manage.py everystep_supervisor``: the prefork supervisor, on the project's database.

The parent has imported Django and the workflow modules once, so children
share them copy-on-write. Before every fork it closes Django's database
connections (``connections.close_all()``, a ``before_fork`` hook), so no
child inherits a socket the parent or a sibling also uses; each child opens
its own Django connection on its first ORM query.
"""

from __future__ import annotations

import argparse

from django.db import DatabaseError, connections

from everystep.cliutil import setup_logging
from everystep.errors import EverystepError
from supervisor import cli as supervisor_cli

from ...commands import EverystepCommand
from ...database import connection


class Command(EverystepCommand):
    help = "Run workflows in forked child processes (the flags of 'everystep-supervisor')."
    takes_apps = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_arguments(parser)
        supervisor_cli.add_arguments(parser)

    def run(self, options: argparse.Namespace) -> None:
        wrapper = connection(options.database)
        url = self.database_url(options)
        # Django's own connection must work too: the steps use it. Failing
        # here is one clear line instead of every run failing later.
        try:
            with wrapper.wrap_database_errors:
                wrapper.ensure_connection()
        except DatabaseError as exc:
            raise EverystepError(f"cannot connect to database {wrapper.alias!r}: {exc}") from exc
        setup_logging(options.log_level, options.log_format)
        config = supervisor_cli.config_from_args(options, app=self.app_modules(options), database=url)
        config.before_fork.append(connections.close_all)
        code = supervisor_cli.run(config)
        if code:
            raise SystemExit(code)
