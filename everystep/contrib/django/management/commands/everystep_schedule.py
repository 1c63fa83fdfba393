"""``manage.py everystep_schedule WORKFLOW [ARGS_JSON] [options]``: ``everystep schedule`` on the project's database."""

from __future__ import annotations

import argparse

from everystep.cli import runs

from ...commands import EverystepCommand


class Command(EverystepCommand):
    help = "Schedule runs of a workflow (exactly as 'everystep schedule'): prints the run id."
    takes_apps = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_arguments(parser)
        runs.add_schedule_arguments(parser)

    def run(self, options: argparse.Namespace) -> None:
        from ...database import store

        with self.printing():
            runs.cmd_schedule(store(options.database), options)
