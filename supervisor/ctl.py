"""``everystep-supervisor ctl``: talk to a running supervisor's control socket."""

from __future__ import annotations

import json
import socket
from typing import Any

from everystep.cliutil import fail, format_table, print_json

PROG = "everystep-supervisor ctl"


def exchange(path: str, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """Send one request on the control socket at ``path`` and return the
    reply. Raises ``OSError`` (no supervisor, refused, timed out) or
    ``ValueError`` (no reply, or one that is not a JSON object)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        sock.sendall((json.dumps(message) + "\n").encode())
        buffer = b""
        while b"\n" not in buffer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buffer += chunk
    finally:
        sock.close()
    if not buffer.strip():
        raise ValueError("the supervisor closed the connection without a reply")
    reply = json.loads(buffer.split(b"\n", 1)[0])
    if not isinstance(reply, dict):
        raise ValueError("unexpected reply from the supervisor")
    return reply


def request(path: str, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """``exchange`` for the command line: failures become one line and exit 2."""
    try:
        return exchange(path, message, timeout)
    except FileNotFoundError:
        fail(f"no supervisor control socket at {path} (is it running? see --socket)", prog=PROG)
    except TimeoutError:
        fail(f"no reply from {path} within {timeout:g}s", prog=PROG)
    except OSError as exc:
        fail(f"cannot connect to {path}: {exc.strerror or exc}", prog=PROG)
    except ValueError as exc:
        fail(f"{exc} ({path})", prog=PROG)


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}s"


def _megabytes(value: int | None) -> str:
    return "" if not value else f"{value / 1048576:.0f}M"


def render_status(reply: dict[str, Any]) -> str:
    head = (f"supervisor {reply['name']} pid {reply['pid']}  procs {reply['procs']}  "
            f"up {reply['uptime']:.0f}s  {'DRAINING  ' if reply['draining'] else ''}{reply['database']}")
    rows = []
    for kid in reply["children"]:
        step = kid["step_id"] or ""
        if kid["step_name"]:
            step = f"{step} {kid['step_name'].rsplit('.', 1)[-1]}"
        cpu = "" if kid["cpu_percent"] is None else f"{kid['cpu_percent']:.0f}%"
        rows.append((kid["slot"], kid["pid"], kid["state"], kid["run_id"] or "", kid["workflow"] or "", step,
                     _seconds(kid["step_seconds"]), _seconds(kid["run_seconds"]), _megabytes(kid["rss"]), cpu,
                     kid["runs_done"]))
    table = format_table(("SLOT", "PID", "STATE", "RUN", "WORKFLOW", "STEP", "STEP FOR", "RUN FOR", "RSS", "CPU", "DONE"), rows)
    return f"{head}\n{table}"


def main(args: Any) -> int:
    message: dict[str, Any] = {"cmd": args.action}
    if args.action == "kill":
        message.update(run=args.run_id, requeue=args.requeue)
    elif args.action == "scale":
        message["procs"] = args.procs
    reply = request(args.socket, message, timeout=args.timeout)
    if args.json:
        print_json(reply)
        return 0 if reply.get("ok") else 2
    if not reply.get("ok"):
        fail(reply.get("error", "request failed"), prog=PROG)
    if args.action == "status":
        print(render_status(reply))
    elif args.action == "kill":
        print(f"killed child {reply['slot']} (pid {reply['pid']}) running {reply['run']}: {reply['action']}")
    elif args.action == "scale":
        print(f"scaled from {reply['previous']} to {reply['procs']} children")
    elif args.action == "reload":
        print("reloading: children are being replaced")
    elif args.action == "drain":
        print("draining: the supervisor stops once its runs are requeued or finished")
    return 0
