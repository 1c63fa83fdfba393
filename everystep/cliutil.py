"""Command-line plumbing shared by ``everystep`` and ``everystep-supervisor``:
exit codes, one-line errors, validated option types, tables, logging.

Exit codes (``EXIT_CODES`` says them to ``--help`` and to the reference, docs/reference/exit-codes.md):

- 0: done;
- 1: the command ran and has bad news (``check-deploy`` found runs that
  would fail, ``remote`` got no reply or a refusal);
- 2: bad input or a refused request (one line on stderr says why), and a
  database that refuses the configuration (``StoreMisconfigured``: no such
  database or role, a bad password or connection option);
- 3: the database could not be reached.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .errors import EverystepError
from .queues import parse_queue_list

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3

#: What each exit code of ``everystep`` means: its ``--help`` epilog and the
#: reference (``everystep.docgen``) both read this table.
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "done",
    EXIT_FAILED: "the command ran and reports a problem (check-deploy, remote)",
    EXIT_USAGE: "bad input or a refused request, including a database that refuses the configuration (no "
                "such database or role, a bad password or option)",
    EXIT_UNAVAILABLE: "the database is unreachable",
}


def exit_codes_epilog(codes: dict[int, str], separator: str = "; ") -> str:
    """``Exit codes: 0 done; 1 …`` for a ``--help`` epilog."""
    return "Exit codes: " + separator.join(f"{code} {meaning}" for code, meaning in codes.items()) + "."

LOG_LEVELS = ("debug", "info", "warning", "error")


def version() -> str:
    try:
        from importlib.metadata import version as installed

        return installed("everystep")
    except Exception:  # not installed (run from a checkout)
        from . import __version__

        return __version__


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit 2."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see {self.prog} --help)", prog=self.prog.split()[0])


def fail(message: str, prog: str = "everystep", code: int = EXIT_USAGE) -> NoReturn:
    first = str(message).strip().splitlines()[0] if str(message).strip() else "failed"
    print(f"{prog}: error: {first}", file=sys.stderr)
    raise SystemExit(code)


def number(kind: Callable[[str], float], minimum: float | None = None, maximum: float | None = None,
           what: str = "a number") -> Callable[[str], Any]:
    """An argparse type: ``kind`` (int or float) within [minimum, maximum],
    finite, with a one-line refusal naming the bounds."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not {what}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not {what}")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            bounds = (f"between {_plain(minimum)} and {_plain(maximum)}"
                      if minimum is not None and maximum is not None
                      else f"at least {_plain(minimum)}" if minimum is not None else f"at most {_plain(maximum)}")
            raise argparse.ArgumentTypeError(f"{text[:40]} is out of range: must be {bounds}")
        return value

    parse.__name__ = what  # argparse names the type in its messages
    return parse


def _plain(bound: float | None) -> str:
    """A bound as people write it: 1000000, 0.01, never 1e+06."""
    if bound is not None and float(bound).is_integer():
        return str(int(bound))
    return f"{bound}"


def seconds(minimum: float = 0.0, maximum: float = 365 * 86400.0) -> Callable[[str], Any]:
    return number(float, minimum, maximum, "a number of seconds")


def count(minimum: int = 0, maximum: int = 1_000_000) -> Callable[[str], Any]:
    return number(int, minimum, maximum, "a whole number")


PORT = number(int, 0, 65535, "a TCP port")


def queue_list(text: str) -> list[str]:
    """An argparse type for ``--queues NAME[,NAME]`` (one-line refusal)."""
    try:
        return parse_queue_list(text)
    except EverystepError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--queues ")) from None


queue_list.__name__ = "a list of queue names"


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-l", "--log-level", default="info", choices=LOG_LEVELS, metavar="LEVEL",
                        help=f"one of {', '.join(LOG_LEVELS)} (default info)")
    parser.add_argument("--log-format", default="text", choices=("text", "json"), metavar="FORMAT",
                        help="text, or json: one object per line for log shippers (default text)")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(header) for header in headers]] + [["" if cell is None else str(cell) for cell in row] for row in rows]
    widths = [max(len(row[index]) for row in cells) for index in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """Configure the ``everystep`` logger for a command-line process: one
    line per record, whatever the message or exception holds."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class OneLineFormatter(logging.Formatter):
    """Text records on one line each (journald and grep treat every line as
    a record): newlines in a message become " | ", and a traceback is
    written inline, innermost frame last."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return " | ".join(part for part in text.splitlines() if part.strip())

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's naming
        return " | ".join(line.strip() for line in super().formatException(ei).splitlines() if line.strip())


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        for key in ("run_id", "workflow", "child_pid", "step_id", "event"):
            value = getattr(record, key, None)
            if value is not None:
                data[key] = value
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)
