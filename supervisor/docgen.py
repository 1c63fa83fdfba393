"""The supervisor's parts of the reference, rendered from its code: its
command line and ``ctl`` (the parsers), the control socket (its verbs,
``supervisor.verbs``, with their request and reply dataclasses), its exit
codes and the environment it reads. ``GENERATED`` is
``everystep.docgen.GENERATED`` and these: the documentation hook and the
tests use it.
"""

from __future__ import annotations

import dataclasses
import signal
import typing
from collections.abc import Callable
from typing import Any

from everystep import docgen
from everystep.docgen import code, table, text

from . import cli, protocol
from .startup import STOPPED_AT_START
from .states import ChildState
from .verbs import VERBS

#: Environment variables the supervisor reads (besides the library's).
ENVIRONMENT: tuple[docgen.Variable, ...] = (
    docgen.Variable("RUNTIME_DIRECTORY", "everystep-supervisor, its ctl",
                    "where the control socket goes by default (`everystep-supervisor.sock`; systemd's "
                    "`RuntimeDirectory=` sets it), else the working directory"),
    docgen.Variable("NOTIFY_SOCKET", "everystep-supervisor",
                    "systemd's notification socket (`Type=notify`): READY, STATUS, STOPPING and watchdog pings "
                    "go there; removed from the children's environment"),
    docgen.Variable("WATCHDOG_USEC", "everystep-supervisor",
                    "systemd's `WatchdogSec=`: the supervisor pings at half of it"),
    docgen.Variable("WATCHDOG_PID", "everystep-supervisor",
                    "the process systemd's watchdog is for; a watchdog meant for another process is ignored"),
)


def supervisor_cli() -> str:
    return docgen.cli_markdown(cli.build_parser(), heading=3)


def ctl_cli() -> str:
    return docgen.cli_markdown(cli.build_ctl_parser(), heading=3)


def _type_name(hint: Any) -> str:
    text_hint = str(hint).replace("typing.", "")
    return getattr(hint, "__name__", text_hint) if not typing.get_args(hint) else text_hint


def _fields(cls: type[Any]) -> list[tuple[str, str, str]]:
    hints = typing.get_type_hints(cls)
    rows = []
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            default = repr(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            default = repr(field.default_factory())
        else:
            default = ""
        rows.append((field.name, _type_name(hints[field.name]), default))
    return rows


def _fields_table(cls: type[Any]) -> str:
    return table(("Field", "Type", "Default"),
                 [(code(name), code(kind), code(default) if default else "required")
                  for name, kind, default in _fields(cls)])


def control_socket() -> str:
    """Every verb of the control socket (``verbs.VERBS``): what it does, its
    request and its reply."""
    out = []
    for command, verb in VERBS.items():
        request, reply = verb.request, verb.reply
        out.append(f"## {code(command)}")
        out.append(f"*{text(verb.summary)}*. {text(verb.description)}")
        out.append("Request fields (besides `\"cmd\": \"" + command + "\"`):" if _fields(request)
                   else "Request: `{\"cmd\": \"" + command + "\"}`, no other field.")
        if _fields(request):
            out.append(_fields_table(request))
        out.append("Reply fields (besides `\"ok\": true`):")
        out.append(_fields_table(reply))
        if any(name == "children" for name, _k, _d in _fields(reply)):
            out.append("Each of `children`:")
            out.append(_fields_table(protocol.ChildStatus))
            out.append("A child's `state`: " + ", ".join(code(state) for state in ChildState) + ".")
    out.append("## Errors")
    out.append("A refused or malformed request gets `{\"ok\": false, \"error\": \"one line\"}` "
               f"(fields: {', '.join(code(name) for name, _k, _d in _fields(protocol.ErrorReply))}). "
               f"A request line longer than {protocol.MAX_CONTROL_LINE:,} bytes is refused.")
    return "\n\n".join(out) + "\n"


def exit_codes() -> str:
    codes = {**cli.EXIT_CODES, STOPPED_AT_START[signal.SIGINT]: "interrupted (Ctrl-C) while starting (importing "
                                                                  "the app, waiting for the database), before "
                                                                  "anything started; TERM then exits 0"}
    return docgen.exit_codes_table(codes) + "\n"


def environment() -> str:
    return docgen.environment_table(ENVIRONMENT) + "\n"


#: Every placeholder of the reference: ``<!-- generated: NAME -->`` → its renderer.
GENERATED: dict[str, Callable[[], str]] = {
    **docgen.GENERATED,
    "supervisor-cli": supervisor_cli,
    "supervisor-ctl": ctl_cli,
    "control-socket": control_socket,
    "supervisor-exit-codes": exit_codes,
    "supervisor-environment": environment,
}
