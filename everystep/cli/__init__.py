"""The ``everystep`` command: migrate, schedule, inspect, resolve, run a worker.

Every command takes ``--database URL`` (else ``EVERYSTEP_DATABASE_URL``, else
``sqlite:///everystep.db``) and ``--app MODULE[,MODULE]`` to import the
user's workflows, before the command or after it. Bad input prints one line on stderr and exits 2.

One module per job: ``command`` (what a command is), ``parser`` (the
command line, built from ``parser.COMMANDS``), and the commands by what
they act on: ``runs``, ``show``, ``queues``, ``deploy`` (check-deploy,
replay, fork), ``operations`` (migrate, schedules, runners, remote, prune)
and ``serve`` (worker, ui). ``main`` is the console script.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from .. import registry
from ..cliutil import EXIT_UNAVAILABLE, fail
from ..errors import EverystepError, StoreMisconfigured, StoreUnavailable
from ..store import connect
from .parser import COMMANDS, build_parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        registry.import_apps(args.app)
        command = next(command for command in COMMANDS if command.name == args.command)
        if command.read_only:
            return command.handler(connect(args.database, read_only=True), args)
        return command.handler(connect(args.database, listen_url=getattr(args, "listen_database", None)), args)
    except StoreMisconfigured as exc:
        fail(str(exc))  # no waiting fixes it: a bad command line, in effect
    except StoreUnavailable as exc:
        fail(str(exc), code=EXIT_UNAVAILABLE)
    except EverystepError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


__all__ = ["build_parser", "main"]
