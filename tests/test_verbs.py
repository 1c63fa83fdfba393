"""Every control verb is whole: a ``Command`` member with a request and a
reply on the wire, a ``ctl`` subcommand whose command line builds exactly
its request, a handler that answers it with its reply, a line for that
reply, its section of the reference, and its name wherever the library
speaks of the supervisor's commands. The registry (``supervisor.verbs.VERBS``)
is walked, so a verb added half-way fails here, naming what it lacks."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import time
import typing
from collections.abc import Iterator
from typing import Any

import pytest
import setproctitle

from everystep import cli as everystep_cli
from everystep import metrics, relay
from everystep.models import RUNNING, Run
from everystep.store import Store
from everystep.vocabulary import Command
from supervisor import docgen
from supervisor.arbiter import Arbiter
from supervisor.children import Child
from supervisor.cli import build_ctl_parser
from supervisor.config import Config
from supervisor.protocol import REPLIES, REQUESTS, ErrorReply, Request, decode, decode_reply, encode, parse
from supervisor.verbs import VERBS, Verb, handle

# Processes (a child's stand-in to kill) but no backend's own behaviour.
pytestmark = [pytest.mark.timeout(120), pytest.mark.backends("sqlite", "postgres")]

RUN_ID = "0193a7c4-0000-7000-8000-0000000000a1"
#: A value per field type, for a request drawn on the command line.
SAMPLES: dict[Any, Any] = {str: RUN_ID, int: 3, bool: True, float: 1.5}


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (actions,) = (action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return dict(actions.choices)


def summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    (actions,) = (action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return {choice.dest: choice.help or "" for choice in actions._choices_actions}


def sample_request(verb: Verb[Any, Any]) -> tuple[Request, list[str]]:
    """A request of ``verb`` with a sample in every field, and the ``ctl``
    command line that asks for it; fails naming a field no argument fills."""
    sub = subcommands(build_ctl_parser())[verb.command]
    by_dest = {action.dest: action for action in sub._actions}
    hints = typing.get_type_hints(verb.request)
    values: dict[str, Any] = {}
    argv = [verb.command]
    for spec in dataclasses.fields(verb.request):
        action = by_dest.get(spec.name)
        assert action is not None, f"{verb.command}: request field {spec.name!r} has no ctl argument of that dest"
        assert action.help and action.help.strip(), f"{verb.command} {spec.name}: no help"
        values[spec.name] = SAMPLES[hints[spec.name]]
        if not action.option_strings:
            argv.append(str(values[spec.name]))
        elif isinstance(action, argparse._StoreTrueAction):
            argv.extend(action.option_strings[-1:] if values[spec.name] else [])
        else:
            argv.extend([action.option_strings[-1], str(values[spec.name])])
    return verb.request(**values), argv


def test_every_command_is_one_verb_with_one_request_and_one_reply() -> None:
    assert set(VERBS) == set(Command) == set(REQUESTS) == set(REPLIES)
    for command, verb in VERBS.items():
        assert verb.command == command and verb.request is REQUESTS[command] and verb.reply is REPLIES[command]
        assert verb.request.TAG == command


@pytest.mark.parametrize("command", list(VERBS))
def test_the_ctl_command_line_asks_for_exactly_the_verbs_request(command: str) -> None:
    verb = VERBS[command]
    parser = build_ctl_parser()
    assert summaries(parser)[command] == verb.summary and verb.summary.strip()
    assert subcommands(parser)[command].description == verb.description and verb.description.strip()
    request, argv = sample_request(verb)
    args = parser.parse_args([*argv, "--socket", "/nowhere.sock"])
    assert args.verb is verb
    assert verb.request_from(args) == request
    assert decode(encode(request)[:-1], Request.KEY) == request  # and it travels


@pytest.mark.parametrize("command", list(VERBS))
def test_every_verb_is_documented_and_spoken_by_the_library(command: str) -> None:
    verb = VERBS[command]
    reference = docgen.control_socket()
    section = reference.split(f"## `{command}`\n", 1)[1].split("\n## ", 1)[0]
    assert verb.summary in section and verb.description in section
    for spec in (*dataclasses.fields(verb.request), *dataclasses.fields(verb.reply)):
        assert f"`{spec.name}`" in section, f"{command}: field {spec.name} is not in the reference"
    assert f"### {command}\n" in docgen.ctl_cli()
    # The library's lists of the supervisor's commands: the relay accepts it,
    # the metric counts it under its own label, ``everystep remote`` offers it.
    assert command in relay.COMMANDS and metrics.control_command_label(command) == command
    remote = subcommands(everystep_cli.build_parser())["remote"]
    choices = next(action.choices for action in remote._actions if action.dest == "remote_command")
    assert choices is not None and command in choices and command in (remote.description or "")


@pytest.fixture
def arbiter(store: Store, tmp_path: Any) -> Iterator[Arbiter]:
    """A real arbiter, not started, with one busy child: a real process
    (its own process group) executing the run ``RUN_ID``."""
    title = setproctitle.getproctitle()  # a drain names the process as a draining master
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    config = Config(name="sup-verbs", procs=2, socket=str(tmp_path / "ctl.sock"), cgroups=False)
    arbiter = Arbiter(config, store)
    kid = Child(slot=1, pid=sleeper.pid, channel=None)  # type: ignore[arg-type]
    kid.ready()
    kid.hand(Run(id=RUN_ID, name="app.flow", args=[], status=RUNNING, claimed_by="sup-verbs", claim_epoch=1),
             time.monotonic())
    arbiter.children[kid.slot] = kid
    try:
        yield arbiter
    finally:
        sleeper.kill()
        sleeper.wait(timeout=30)
        setproctitle.setproctitle(title)


@pytest.mark.parametrize("command", list(VERBS))
def test_every_verb_is_answered_by_its_handler_with_its_reply(command: str, arbiter: Arbiter) -> None:
    """The request as the control socket reads it, through the one
    dispatcher, to the verb's handler; its reply as ``ctl`` reads it back,
    and the line ``ctl`` prints for it."""
    verb = VERBS[command]
    request, _argv = sample_request(verb)
    received = decode(encode(request)[:-1], Request.KEY)
    assert isinstance(received, Request)
    reply = handle(arbiter, received, "test_verbs")
    assert not isinstance(reply, ErrorReply), reply
    assert type(reply) is verb.reply
    assert decode_reply(command, parse(encode(reply)[:-1])) == reply
    line = verb.describe(reply)
    assert isinstance(line, str) and line.strip()
