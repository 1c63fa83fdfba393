"""What a command of ``everystep`` is, and the pieces several commands share.

A ``Command`` carries everything about one subcommand: its name and help,
the arguments it adds to its parser, and the handler that runs it. The
parser (``parser.COMMANDS``) and the dispatcher (``main``) both read the
one list, so a new command is one ``Command`` in the module of what it acts
on and one entry in that list.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import serde
from ..errors import EverystepError
from ..store import Store


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """A command that takes only the common options."""


@dataclass(frozen=True)
class Command:
    """One subcommand: ``summary`` is its line in ``everystep --help``,
    ``description`` the head of its own ``--help``."""

    name: str
    summary: str
    description: str
    handler: Callable[[Store, argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments
    #: Opens the database read-only (``replay``: a read replica will do).
    read_only: bool = False


def add_run_argument(parser: argparse.ArgumentParser, what: str = "the run") -> None:
    """The ``RUN`` argument of every command that acts on one run: an id or
    a unique prefix of it, which the command resolves with ``Store.find_run``
    before anything else (one resolver, so every command takes what ``show``
    takes)."""
    parser.add_argument("run_id", metavar="RUN", help=f"{what}: its id, or a unique prefix of it (like git)")


def add_json_flag(parser: argparse.ArgumentParser, default: str = "a table") -> None:
    parser.add_argument("--json", action="store_true", help=f"print JSON (default: {default})")


def parse_json(text: str, what: str) -> Any:
    try:
        return serde.from_jsonable(json.loads(text))
    except (ValueError, EverystepError) as exc:
        raise EverystepError(f"{what} is not valid JSON: {exc}") from None


__all__ = ["Command", "add_json_flag", "add_run_argument", "parse_json"]
