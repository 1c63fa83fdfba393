"""Control-socket requests: validate, then act on the arbiter.

Requests are ``{"cmd": NAME, ...}``; replies are ``{"ok": true, ...}`` or
``{"ok": false, "error": "one line"}``. Absurd but well-formed requests
(killing an unknown run, scaling to 10,000) get an error reply, never an
exception.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import MAX_PROCS

if TYPE_CHECKING:
    from .arbiter import Arbiter

COMMANDS = ("status", "kill", "scale", "reload", "drain")


def _error(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}


def handle(arbiter: Arbiter, request: dict[str, Any]) -> dict[str, Any]:
    cmd = request.get("cmd")
    if cmd == "status":
        return {"ok": True, **arbiter.status()}
    if cmd == "kill":
        run_id = request.get("run")
        if not isinstance(run_id, str) or not run_id:
            return _error('kill needs "run": RUN_ID')
        requeue = request.get("requeue", False)
        if not isinstance(requeue, bool):
            return _error('"requeue" must be true or false')
        kid = arbiter.kill_run(run_id, requeue)
        if kid is None:
            return _error(f"run {run_id} is not executing in this supervisor")
        action = "requeued" if requeue else "in-flight step recorded as StepKilled"
        return {"ok": True, "run": run_id, "pid": kid.pid, "slot": kid.slot, "action": action}
    if cmd == "scale":
        procs = request.get("procs")
        if not isinstance(procs, int) or isinstance(procs, bool) or not 0 <= procs <= MAX_PROCS:
            return _error(f'scale needs "procs": an integer from 0 to {MAX_PROCS}')
        if arbiter.stopping:
            return _error("the supervisor is stopping")
        previous = arbiter.procs
        arbiter.scale(procs)
        return {"ok": True, "procs": arbiter.procs, "previous": previous}
    if cmd == "reload":
        if arbiter.stopping:
            return _error("the supervisor is stopping")
        arbiter.request_reload()
        return {"ok": True, "reloading": True}
    if cmd == "drain":
        arbiter.begin_drain()
        return {"ok": True, "draining": True}
    return _error(f"unknown command {str(cmd)[:40]!r}; expected one of: {', '.join(COMMANDS)}")
