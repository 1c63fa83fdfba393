"""``everystep-supervisor ctl``: talk to a running supervisor's control socket.

What each verb sends and how its reply reads is the verb's (``verbs.VERBS``);
this is the exchange on the socket, the status table, and the exit codes.
"""

from __future__ import annotations

import argparse
import socket
from typing import Any

from everystep.cliutil import fail, format_table, print_json

from .protocol import (
    MAX_CONTROL_LINE,
    ErrorReply,
    LineReader,
    ProtocolError,
    Reply,
    Request,
    StatusReply,
    decode_reply,
    frame,
    parse,
)

PROG = "everystep-supervisor ctl"


def exchange(path: str, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """Send one request (a JSON object) on the control socket at ``path``
    and return the reply object. Raises ``OSError`` (no supervisor, refused,
    timed out) or ``ValueError`` (no reply, or one that is not a JSON object)."""
    reader = LineReader(MAX_CONTROL_LINE * 64)  # a status reply of 256 children is long
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    lines: list[bytes] = []
    try:
        sock.connect(path)
        sock.sendall(frame(message))
        while not lines:
            chunk = sock.recv(65536)
            if not chunk:
                break
            lines = reader.feed(chunk)
    finally:
        sock.close()
    if not lines:
        raise ValueError("the supervisor closed the connection without a reply")
    try:
        return parse(lines[0])
    except ProtocolError:
        raise ValueError("unexpected reply from the supervisor") from None


def request(path: str, message: Request, timeout: float = 10.0) -> tuple[Reply, dict[str, Any]]:
    """``exchange`` for the command line: the reply as its dataclass and as
    sent; failures become one line and exit 2."""
    try:
        raw = exchange(path, message.wire(), timeout)
        return decode_reply(message.TAG, raw), raw
    except FileNotFoundError:
        fail(f"no supervisor control socket at {path} (is it running? see --socket)", prog=PROG)
    except TimeoutError:
        fail(f"no reply from {path} within {timeout:g}s", prog=PROG)
    except OSError as exc:
        fail(f"cannot connect to {path}: {exc.strerror or exc}", prog=PROG)
    except (ValueError, ProtocolError) as exc:
        fail(f"{exc} ({path})", prog=PROG)


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}s"


def _megabytes(value: int | None) -> str:
    return "" if not value else f"{value / 1048576:.0f}M"


def render_status(reply: StatusReply) -> str:
    head = (f"supervisor {reply.name} pid {reply.pid}  procs {reply.procs}  "
            f"up {reply.uptime:.0f}s  {'DRAINING  ' if reply.draining else ''}{reply.database}")
    rows = []
    for kid in reply.children:
        step = kid.step_id or ""
        if kid.step_name:
            step = f"{step} {kid.step_name.rsplit('.', 1)[-1]}"
        cpu = "" if kid.cpu_percent is None else f"{kid.cpu_percent:.0f}%"
        rows.append((kid.slot, kid.pid, kid.state, kid.run_id or "", kid.workflow or "", step,
                     _seconds(kid.step_seconds), _seconds(kid.run_seconds), _megabytes(kid.uss),
                     _megabytes(kid.rss), cpu, kid.runs_done))
    table = format_table(("SLOT", "PID", "STATE", "RUN", "WORKFLOW", "STEP", "STEP FOR", "RUN FOR", "USS", "RSS",
                          "CPU", "DONE"), rows)
    unhealthy = f"UNHEALTHY: {reply.engine_errors}\n" if reply.engine_errors else ""
    return f"{head}\n{unhealthy}{table}"


def main(args: argparse.Namespace) -> int:
    """Send the request of ``args.verb`` (the ``verbs.Verb`` its subcommand
    declared: ``cli.build_ctl_parser``) and print its reply: the verb's
    line, or the raw JSON; a refusal exits 2."""
    verb = args.verb
    reply, raw = request(args.socket, verb.request_from(args), timeout=args.timeout)
    if args.json:
        print_json(raw)
        return 0 if raw.get("ok") else 2
    if isinstance(reply, ErrorReply):
        fail(reply.error, prog=PROG)
    print(verb.describe(reply))
    return 0
