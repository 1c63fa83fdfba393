"""``manage.py everystep_runs``: ``everystep runs`` on the project's database."""

from __future__ import annotations

import argparse

from everystep.cli import runs

from ...commands import EverystepCommand


class Command(EverystepCommand):
    help = "List everystep runs, newest first."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_arguments(parser)
        runs.add_runs_arguments(parser, version_options=("--app-version",))  # --version is Django's own

    def run(self, options: argparse.Namespace) -> None:
        from ...database import store

        with self.printing():
            runs.cmd_runs(store(options.database), options)
