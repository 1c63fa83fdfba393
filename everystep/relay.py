"""Operator requests relayed to a supervisor through the database.

The control socket reaches a supervisor on its own host. From any other host
(the console, ``everystep remote``) an operator reaches it through the
database instead: a request row addressed to the runner's name, plus a
NOTIFY so the supervisor hears of it at once::

    requester (any host)                database                 supervisor holding the name
    ────────────────────                ────────                 ───────────────────────────
    submit(runner, command, args) ──▶  INSERT pending     ──▶   NOTIFY everystep_request
                                                                 (or its poll, every 2 s)
                                       pending → taken    ◀──   take_requests(name)
                                                                 handle() — the same function
                                                                 that answers the control socket
    wait_reply(id) polls       ◀────   taken → answered   ◀──   answer_request(id, reply)
    gives up: expire(id)       ──▶     pending → expired        (only if nobody took it)

Every transition is a compare-and-set on ``status``, so a request is acted on
at most once: an expired request can no longer be taken, and a supervisor
that comes back after a long outage finds its stale requests expired, or
refuses those older than ``STALE_AFTER`` itself. A request that was taken
but never answered (the supervisor died while handling it) stays ``taken``;
the requester reports that it got no reply.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .cliutil import format_table
from .errors import EverystepError
# The request row and its statuses live with the other rows (``models``), so
# the store reads them without importing this module.
from .models import OperatorRequest, RequestStatus
# The NOTIFY channel of new requests (PostgreSQL), named with the others.
from .store.channels import REQUEST_CHANNEL
from .vocabulary import Command

if TYPE_CHECKING:
    from .store import Store


#: Commands a supervisor accepts through the database: the verbs of its
#: control socket (``supervisor.verbs``), which validate their arguments.
COMMANDS: tuple[str, ...] = tuple(Command)

#: How long a requester waits for a reply before expiring its request.
REPLY_TIMEOUT = 15.0

#: A supervisor refuses (answers, without acting) requests older than this.
STALE_AFTER = 60.0

MAX_REQUESTED_BY = 200


def submit(store: Store, runner: str, command: str, args: dict[str, Any], requested_by: str) -> OperatorRequest:
    """Queue ``command`` for the runner named ``runner``; returns the request."""
    if command not in COMMANDS:
        raise EverystepError(f"unknown supervisor command {command!r}; expected one of: {', '.join(COMMANDS)}")
    if not isinstance(args, dict):
        raise EverystepError("request arguments must be a JSON object")
    if not runner:
        raise EverystepError("a request needs a runner name")
    return store.submit_request(runner, command, args, requested_by[:MAX_REQUESTED_BY] or "unknown")


def wait_reply(store: Store, request_id: int, timeout: float = REPLY_TIMEOUT, poll: float = 0.1) -> OperatorRequest:
    """Wait until the request is answered; past ``timeout`` expire it if it is
    still pending (the supervisor will then never act on it) and return it as
    it stands: ``expired``, or ``taken`` with no reply (it was being handled)."""
    deadline = time.monotonic() + timeout
    while True:
        request = store.get_request(request_id)
        if request is None:
            raise EverystepError(f"no request with id {request_id}")
        if request.done:
            return request
        if time.monotonic() >= deadline:
            store.expire_request(request_id)
            again = store.get_request(request_id)
            return again if again is not None else request
        time.sleep(poll)


def describe_outcome(request: OperatorRequest) -> str:
    """One line for an operator: the reply, or why there is none."""
    if request.status == RequestStatus.ANSWERED and request.reply is not None:
        if request.reply.get("ok"):
            if request.command == Command.STATUS and isinstance(request.reply.get("children"), list):
                return describe_status(request.reply)
            details = ", ".join(f"{key} {_plain(value)}" for key, value in request.reply.items() if key != "ok")
            return "ok" + (f": {details}" if details else "")
        return f"refused: {request.reply.get('error', 'no reason given')}"
    if request.status == RequestStatus.EXPIRED:
        return f"no reply: supervisor {request.runner} not answering (request expired, it will not be acted on)"
    if request.status == RequestStatus.TAKEN:
        return f"no reply: supervisor {request.runner} took the request but has not answered"
    return f"no reply yet from supervisor {request.runner}"


def describe_status(reply: dict[str, Any]) -> str:
    """A supervisor's ``status`` reply as ``ctl status`` shows it: a head
    line, then a row per child."""
    head = (f"supervisor {reply.get('name')} pid {reply.get('pid')}  procs {reply.get('procs')}  "
            f"up {float(reply.get('uptime') or 0):.0f}s  {'DRAINING  ' if reply.get('draining') else ''}"
            f"{reply.get('database') or ''}").rstrip()
    rows = []
    for kid in reply["children"]:
        step = kid.get("step_id") or ""
        if kid.get("step_name"):
            step = f"{step} {str(kid['step_name']).rsplit('.', 1)[-1]}"
        rows.append((kid.get("slot"), kid.get("pid"), _plain(kid.get("state")), kid.get("run_id") or "",
                     kid.get("workflow") or "", step, _seconds(kid.get("step_seconds")),
                     _seconds(kid.get("run_seconds")), kid.get("runs_done", "")))
    table = format_table(("SLOT", "PID", "STATE", "RUN", "WORKFLOW", "STEP", "STEP FOR", "RUN FOR", "DONE"), rows)
    return f"{head}\n{table}"


def _plain(value: Any) -> Any:
    """An enum member as its value (a reply read back may hold them)."""
    return getattr(value, "value", value)


def _seconds(value: Any) -> str:
    return "" if value is None else f"{float(value):.1f}s"


__all__ = ["COMMANDS", "REQUEST_CHANNEL", "OperatorRequest", "RequestStatus", "REPLY_TIMEOUT", "STALE_AFTER",
           "describe_outcome", "describe_status", "submit", "wait_reply"]
