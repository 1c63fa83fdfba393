"""Command-line plumbing shared by ``everystep`` and ``everystep-supervisor``:
one-line errors with exit code 2, tables, logging setup."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit 2."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see {self.prog} --help)", prog=self.prog.split()[0])


def fail(message: str, prog: str = "everystep") -> NoReturn:
    first = str(message).strip().splitlines()[0] if str(message).strip() else "failed"
    print(f"{prog}: error: {first}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(header) for header in headers]] + [["" if cell is None else str(cell) for cell in row] for row in rows]
    widths = [max(len(row[index]) for row in cells) for index in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """Configure the ``everystep`` logger for a command-line process."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


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
