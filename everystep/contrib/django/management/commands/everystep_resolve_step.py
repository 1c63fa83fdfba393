"""``manage.py everystep_resolve_step RUN STEP --result JSON | --error MSG | --discard``."""

from __future__ import annotations

import argparse

from everystep.cli import runs

from ...commands import EverystepCommand


class Command(EverystepCommand):
    help = "Resolve the uncertain step of a blocked run (exactly as 'everystep resolve-step')."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_arguments(parser)
        runs.add_resolve_step_arguments(parser)

    def run(self, options: argparse.Namespace) -> None:
        from ...database import store

        with self.printing():
            runs.cmd_resolve_step(store(options.database), options)
