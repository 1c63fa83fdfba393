"""The control verbs: what an operator may ask a running supervisor, each
declared once.

A ``Verb`` is all of one ``ctl`` command: the request it sends and the
reply it gets (dataclasses of ``protocol``, which owns the wire format and
pairs them in ``protocol.CONTROL``), its arguments on the ``ctl`` command
line, what it means (the summary and description shown by ``ctl --help``
and the reference), the handler that carries it out on the arbiter (seen as
``view.Operable``), and the line ``ctl`` prints for its reply. Every list of
verbs walks ``VERBS``: the ``ctl`` parser (``cli.build_ctl_parser``), the
one dispatcher (``handle``) behind the control socket (``control.py``) and
the requests relayed through the database (``remote.py``), and the
control-socket reference (``docgen``). Its name is a member of
``everystep.vocabulary.Command``, because the library speaks it too (the
relay accepts it, ``everystep remote`` offers it, the metrics count it).

A new verb: its ``Command`` member, its request and reply in ``protocol``
(a line of ``CONTROL``), and its ``Verb`` here, in ``VERBS``;
``tests/test_verbs.py`` fails while one of those is missing.

Every request gets a reply saying what happened (an ``ErrorReply`` with one
line for anything absurd: killing an unknown run, scaling to 10,000), and
every action that changes something is logged with who asked for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from everystep import metrics

from .config import MAX_PROCS
from .ctl import render_status
from .fencing import executing
from .protocol import (
    REPLIES,
    DrainReply,
    DrainRequest,
    ErrorReply,
    KillReply,
    KillRequest,
    ReloadReply,
    ReloadRequest,
    Reply,
    Request,
    ScaleReply,
    ScaleRequest,
    StatusReply,
    StatusRequest,
)
from .reload import reload
from .reporting import busy, plural, status
from .states import KillReason
from .view import Operable

logger = logging.getLogger("everystep.supervisor")

Q = TypeVar("Q", bound=Request)
P = TypeVar("P", bound=Reply)


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ctl`` arguments of a verb that takes none."""


@dataclass(frozen=True)
class Verb(Generic[Q, P]):
    """One control verb (see the module's docstring)."""

    request: type[Q]
    #: One line: ``ctl --help`` lists the verbs with it.
    summary: str
    #: What it does and what it changes: ``ctl VERB --help`` and the reference.
    description: str
    #: Carries the request out; ``str`` is who asked, for the log. Returns
    #: the verb's reply, or an ``ErrorReply`` saying why not.
    handle: Callable[[Operable, Q, str], Reply]
    #: The line (or table) ``ctl`` prints for the verb's reply.
    describe: Callable[[P], str]
    #: Adds the verb's ``ctl`` arguments, each named (``dest``) after the
    #: request field it fills.
    arguments: Callable[[argparse.ArgumentParser], None] = no_arguments

    @property
    def command(self) -> str:
        return self.request.TAG

    @property
    def reply(self) -> type[Reply]:
        return REPLIES[self.command]

    def request_from(self, args: argparse.Namespace) -> Q:
        """The request a ``ctl`` command line asks for: each of the
        request's fields from the argument of the same name."""
        given = vars(args)
        return self.request(**{spec.name: given[spec.name] for spec in dataclasses.fields(self.request)
                               if spec.name in given})


# -- status ---------------------------------------------------------------------------


def _status(arbiter: Operable, request: StatusRequest, who: str) -> Reply:
    return status(arbiter)


STATUS: Verb[StatusRequest, StatusReply] = Verb(
    StatusRequest, "children, their runs and steps",
    "The supervisor's children: state, run, workflow, step, time in step, memory (USS: what the child owns, at "
    "most 5 s old; RSS: resident pages, the app's shared ones included), CPU.",
    handle=_status, describe=render_status,
)


# -- kill -------------------------------------------------------------------------------


def _kill_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="the run's id")
    parser.add_argument("--requeue", action="store_true",
                        help="requeue the run instead of recording its step as failed (default: off)")


def _kill(arbiter: Operable, request: KillRequest, who: str) -> Reply:
    if not request.run:
        return ErrorReply('kill needs "run": RUN_ID')
    found = [(kid, run) for kid, run in executing(arbiter.children.values(), settling=True) if run.id == request.run]
    if not found:
        return ErrorReply(f"run {request.run} is not executing in this supervisor")
    kid, _ = max(found, key=lambda pair: pair[1].claim_epoch)  # the current execution
    kid.kill(KillReason.KILL_REQUEUE if request.requeue else KillReason.KILL)
    action = "requeued" if request.requeue else "in-flight step recorded as StepKilled"
    logger.warning("%s: killing child %d (pid %d) running %s: %s (%s)", arbiter.who, kid.slot, kid.pid,
                   request.run, action, who)
    return KillReply(run=request.run, pid=kid.pid, slot=kid.slot, action=action)


def _killed(reply: KillReply) -> str:
    return f"killed child {reply.slot} (pid {reply.pid}) running {reply.run}: {reply.action}"


KILL: Verb[KillRequest, KillReply] = Verb(
    KillRequest, "kill the child running RUN",
    "SIGKILL the child executing RUN; its step in flight is recorded as failed (StepKilled), or, with "
    "--requeue, the run goes back to the queue.",
    handle=_kill, describe=_killed, arguments=_kill_arguments,
)


# -- scale ------------------------------------------------------------------------------


def _scale_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("procs", type=int, metavar="N", help=f"0 to {MAX_PROCS}")


def _scale(arbiter: Operable, request: ScaleRequest, who: str) -> Reply:
    if not 0 <= request.procs <= MAX_PROCS:
        return ErrorReply(f'scale needs "procs": an integer from 0 to {MAX_PROCS}')
    if arbiter.stopping:
        return ErrorReply("the supervisor is stopping")
    previous = arbiter.scale(request.procs, who)
    return ScaleReply(procs=arbiter.procs, previous=previous)


def _scaled(reply: ScaleReply) -> str:
    return f"scaled from {reply.previous} to {reply.procs} children"


SCALE: Verb[ScaleRequest, ScaleReply] = Verb(
    ScaleRequest, "set the number of children",
    f"Set the number of children, 0 to {MAX_PROCS}; busy ones leave after their run.",
    handle=_scale, describe=_scaled, arguments=_scale_arguments,
)


# -- reload -----------------------------------------------------------------------------


def _reload(arbiter: Operable, request: ReloadRequest, who: str) -> Reply:
    return reload(arbiter, who)


def _reloaded(reply: ReloadReply) -> str:
    modules = ", ".join(reply.modules) or "no modules"
    return f"reloaded {modules}; replacing {plural(reply.replacing, 'child', 'children')}"


RELOAD: Verb[ReloadRequest, ReloadReply] = Verb(
    ReloadRequest, "re-import the app and replace every child (like SIGHUP)",
    "Re-import the --app modules and replace every child; the reply says whether the import worked (exit 2 "
    "with the failing file and line if not).",
    handle=_reload, describe=_reloaded,
)


# -- drain ------------------------------------------------------------------------------


def _drain(arbiter: Operable, request: DrainRequest, who: str) -> Reply:
    if not arbiter.stopping:
        logger.info("%s: draining (%s)", arbiter.who, who)
    arbiter.begin_drain()
    return DrainReply(busy=busy(arbiter))


def _draining(reply: DrainReply) -> str:
    return f"draining: {plural(reply.busy, 'busy child', 'busy children')} finish their step, then it stops"


DRAIN: Verb[DrainRequest, DrainReply] = Verb(
    DrainRequest, "stop gracefully (like SIGTERM)",
    "Stop claiming; each child finishes its step and requeues its run, then the supervisor exits.",
    handle=_drain, describe=_draining,
)


#: Every verb by its command, in the order ``ctl --help`` and the reference list them.
VERBS: dict[str, Verb[Any, Any]] = {verb.command: verb for verb in (STATUS, KILL, SCALE, RELOAD, DRAIN)}


def handle(arbiter: Operable, request: Request, who: str) -> Reply:
    """Carry out ``request`` with its verb's handler; ``who`` asked (a ctl
    client's pid and uid, or an operator request relayed through the
    database)."""
    verb = VERBS.get(request.TAG)
    if verb is None:
        return ErrorReply(f"unsupported command {request.TAG!r}")
    return verb.handle(arbiter, request, who)


def count(supervisor: str, command: str) -> None:
    """Count a control request under its command's label (bounded)."""
    label = metrics.control_command_label(command)
    metrics.record(lambda m: m.control_requests.labels(supervisor, label).inc())
