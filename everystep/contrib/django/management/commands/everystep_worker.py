"""``manage.py everystep_worker``: the threaded worker, on the project's database."""

from __future__ import annotations

import argparse

from everystep.cli import serve
from everystep.store import connect

from ...commands import DjangoConnections, EverystepCommand


class Command(EverystepCommand):
    help = "Run a threaded everystep worker (the flags of 'everystep worker')."
    takes_apps = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_arguments(parser)
        serve.add_worker_arguments(parser)

    def run(self, options: argparse.Namespace) -> None:
        store = connect(self.database_url(options))
        code = serve.cmd_worker(store, options, observer=DjangoConnections())
        if code:
            raise SystemExit(code)
