"""Control requests, validated by the codec, carried out on the arbiter.

The one handler for both ways an operator reaches a supervisor: the control
socket (``control.py``) and requests relayed through the database
(``remote.py``). Apart from the arbiter because it is about operators, not
processes: it checks what was asked, has the arbiter's children scaled,
drained, replaced or killed, and says what happened.

Every request gets a reply saying what happened (an ``ErrorReply`` with one
line for anything absurd: killing an unknown run, scaling to 10,000), and
every action that changes something is logged with who asked for it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from everystep import metrics

from .config import MAX_PROCS
from .fencing import executing
from .protocol import (
    DrainReply,
    DrainRequest,
    ErrorReply,
    KillReply,
    KillRequest,
    ReloadRequest,
    Reply,
    Request,
    ScaleReply,
    ScaleRequest,
    StatusRequest,
)
from .reload import reload
from .states import KillReason

if TYPE_CHECKING:
    from .view import Operable

logger = logging.getLogger("everystep.supervisor")


def handle(arbiter: Operable, request: Request, who: str) -> Reply:
    """Carry out ``request``; ``who`` asked (a ctl client's pid and uid, or
    an operator request relayed through the database)."""
    if isinstance(request, StatusRequest):
        from .reporting import status

        return status(arbiter)
    if isinstance(request, KillRequest):
        return _kill(arbiter, request, who)
    if isinstance(request, ScaleRequest):
        if not 0 <= request.procs <= MAX_PROCS:
            return ErrorReply(f'scale needs "procs": an integer from 0 to {MAX_PROCS}')
        if arbiter.stopping:
            return ErrorReply("the supervisor is stopping")
        previous = arbiter.scale(request.procs, who)
        return ScaleReply(procs=arbiter.procs, previous=previous)
    if isinstance(request, ReloadRequest):
        return reload(arbiter, who)
    if isinstance(request, DrainRequest):
        if not arbiter.stopping:
            logger.info("%s: draining (%s)", arbiter.who, who)
        arbiter.begin_drain()
        from .reporting import busy

        return DrainReply(busy=busy(arbiter))
    return ErrorReply(f"unsupported command {request.TAG!r}")


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


def count(supervisor: str, command: str) -> None:
    """Count a control request under its command's label (bounded)."""
    label = metrics.control_command_label(command)
    metrics.record(lambda m: m.control_requests.labels(supervisor, label).inc())
