"""The ``everystep`` command line: its top-level options and one
subparser per ``Command``, in the order ``--help`` lists them."""

from __future__ import annotations

import argparse

from ..cliutil import EXIT_CODES, LOG_LEVELS, OneLineParser, exit_codes_epilog, version
from . import deploy, operations, queues, runs, serve, show, streams
from .command import Command

#: Every command, in the order ``everystep --help`` and the reference list them.
COMMANDS: tuple[Command, ...] = (
    operations.MIGRATE, runs.SCHEDULE, queues.QUEUE, queues.QUEUES, runs.RUNS, show.SHOW, streams.STREAM, runs.SEND,
    runs.RESOLVE_STEP, deploy.FORK, deploy.REPLAY, runs.CANCEL, operations.SCHEDULES, runs.REQUEUE,
    operations.RUNNERS, deploy.CHECK_DEPLOY, operations.REMOTE, serve.UI, operations.PRUNE, serve.WORKER,
)

#: Options taken before the command as well as after it.
GLOBAL_OPTIONS = ("database", "app", "log_level")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database", metavar="URL",
                        help="database URL (default: $EVERYSTEP_DATABASE_URL, else sqlite:///everystep.db)")
    parser.add_argument("-A", "--app", metavar="MODULE[,MODULE]",
                        help="import these modules to register workflows (default: none)")


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="everystep", description="Durable workflows recorded step by step in SQL.",
        epilog=exit_codes_epilog(EXIT_CODES),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    # The options every command takes are accepted before the command too
    # (`everystep -A myapp runs`, as `celery -A proj worker`).
    _common(parser)
    parser.add_argument("-l", "--log-level", default="info", choices=LOG_LEVELS, metavar="LEVEL",
                        help=f"for worker and ui: one of {', '.join(LOG_LEVELS)} (default info)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    commands.required = True
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.summary, description=command.description)
        _common(sub)
        command.arguments(sub)
    _given_before_or_after(commands)
    return parser


def _given_before_or_after(commands: argparse._SubParsersAction[OneLineParser]) -> None:
    """A command's own copy of a global option must not reset what was
    given before the command: argparse copies every default of the
    command's parser over the values parsed before it. Without a default
    (SUPPRESS), an option given after the command still wins, one given
    before stays, and one given nowhere keeps the top-level default."""
    for parser in commands.choices.values():
        for action in parser._actions:
            if action.dest in GLOBAL_OPTIONS:
                action.default = argparse.SUPPRESS
            elif isinstance(action, argparse._SubParsersAction):
                _given_before_or_after(action)


__all__ = ["COMMANDS", "GLOBAL_OPTIONS", "build_parser"]
