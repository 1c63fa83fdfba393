"""Control requests, validated by the codec, carried out on the arbiter.

Every request gets a reply saying what happened (an ``ErrorReply`` with one
line for anything absurd: killing an unknown run, scaling to 10,000), and
every action that changes something is logged with who asked for it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .config import MAX_PROCS
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

if TYPE_CHECKING:
    from .arbiter import Arbiter

logger = logging.getLogger("everystep.supervisor")


def handle(arbiter: Arbiter, request: Request, who: str) -> Reply:
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
        return arbiter.reload(who)
    if isinstance(request, DrainRequest):
        if not arbiter.stopping:
            logger.info("%s: draining (%s)", arbiter.who, who)
        arbiter.begin_drain()
        from .reporting import busy

        return DrainReply(busy=busy(arbiter))
    return ErrorReply(f"unsupported command {request.TAG!r}")


def _kill(arbiter: Arbiter, request: KillRequest, who: str) -> Reply:
    if not request.run:
        return ErrorReply('kill needs "run": RUN_ID')
    kid = arbiter.kill_run(request.run, request.requeue)
    if kid is None:
        return ErrorReply(f"run {request.run} is not executing in this supervisor")
    action = "requeued" if request.requeue else "in-flight step recorded as StepKilled"
    logger.warning("%s: killing child %d (pid %d) running %s: %s (%s)", arbiter.who, kid.slot, kid.pid,
                   request.run, action, who)
    return KillReply(run=request.run, pid=kid.pid, slot=kid.slot, action=action)
