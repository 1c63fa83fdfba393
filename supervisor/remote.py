"""Operator requests from the database, and what this supervisor publishes.

The control socket serves operators on this host. Operators elsewhere (the
console, ``everystep remote``) write a request row addressed to this
supervisor's name instead (see ``everystep.relay`` for the exchange); this
module takes those rows, passes each to the very function that answers the
control socket (``supervisor.verbs.handle``, given here as ``handle``)
and writes the reply back. It also publishes the supervisor's children (run,
workflow, step, since when) on its ``everystep_runner`` row, which is how
the console shows what every supervisor on every host is doing.

When it looks:

- on PostgreSQL, at once when the listener hears ``NOTIFY everystep_request``
  with this runner's name (``wake``);
- every ``POLL_EVERY`` seconds in any case (the only way on SQLite, and the
  fallback while the LISTEN connection is down): one indexed query on a tiny
  partial index of pending requests;
- it publishes the children every ``PUBLISH_EVERY`` seconds when something
  changed (a run or step started or ended, a child came or went), and at
  least every ``REFRESH_EVERY`` seconds for the memory and CPU figures.

Everything runs in the arbiter's loop, so a request is handled exactly like
a control-socket request, between two ticks. Database trouble is logged
once per outage and retried later; it never stops the loop. A request
older than ``relay.STALE_AFTER`` seconds when taken is answered with a
refusal instead of being acted on.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from everystep.errors import EverystepError, StoreUnavailable
from everystep.outage import OutageLog
from everystep.relay import STALE_AFTER, OperatorRequest
from everystep.store import Store

from .protocol import ErrorReply, ProtocolError, Reply, Request, StatusReply, StatusRequest, decode, frame, plain

logger = logging.getLogger("everystep.supervisor")

POLL_EVERY = 2.0
PUBLISH_EVERY = 2.0
REFRESH_EVERY = 15.0
BACKOFF = 5.0
BATCH = 10

__all__ = ["RemoteControl", "snapshot"]

Handler = Callable[[Request, str], Reply]


class RemoteControl:
    def __init__(self, store: Store, name: str, instance: str, handle: Handler,
                 outage: OutageLog | None = None, queues: list[str] | None = None) -> None:
        self.store = store
        self.name = name
        #: The queues this runner claims from (None: every queue), published
        #: so that operator commands know the names in use.
        self.queues = queues
        self.instance = instance
        self.handle = handle
        self.served = 0
        self._woken = True
        self._next_poll = 0.0
        self._next_publish = 0.0
        self._last_key: Any = None
        self._last_full = 0.0
        self._outage = outage or OutageLog(logger, f"everystep-supervisor {name}")
        self._last_error = ""

    def wake(self, payload: str | None = None) -> None:
        """A NOTIFY arrived; only those naming this runner matter."""
        if payload is None or payload == self.name:
            self._woken = True

    def tick(self, now: float) -> None:
        """Serve and publish when due; never raises. The database being away
        is logged once per outage; anything else once per distinct error."""
        touched = False  # only a real round trip may end an outage
        try:
            if self._woken or now >= self._next_poll:
                self._woken = False
                self._next_poll = now + POLL_EVERY
                touched = True
                self._serve()
            if now >= self._next_publish:
                self._next_publish = now + PUBLISH_EVERY
                touched = self._publish(now) or touched
        except StoreUnavailable as exc:
            self._outage.failed(exc, "operator requests")
            self._next_poll = self._next_publish = now + BACKOFF
        except EverystepError as exc:
            if str(exc) != self._last_error:
                self._last_error = str(exc)
                logger.error("everystep-supervisor %s: operator requests: %s", self.name, exc)
            self._next_poll = self._next_publish = now + BACKOFF
        else:
            if touched:
                self._outage.ok()
                self._last_error = ""

    # -- requests ---------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            requests = self.store.take_requests(self.name, BATCH)
            for request in requests:
                reply = self._answer(request)
                self.store.answer_request(request.id, reply)
                self.served += 1
                logger.info("everystep-supervisor %s: %s request %d from %s: %s", self.name, request.command,
                            request.id, request.requested_by, "ok" if reply.get("ok") else reply.get("error"),
                            extra={"event": "operator_request"})
            if len(requests) < BATCH:
                return

    def _answer(self, request: OperatorRequest) -> dict[str, Any]:
        """The reply, as the control socket would give it: the request goes
        through the same codec (validation) and the same handler."""
        age = request.age_seconds
        if age is not None and age > STALE_AFTER:
            return ErrorReply(f"request was {age:.0f}s old when taken (over {STALE_AFTER:g}s): "
                              "not acted on").wire()
        try:
            decoded = decode(frame({**request.args, Request.KEY: request.command})[:-1], Request.KEY)
        except ProtocolError as exc:
            return ErrorReply(str(exc)).wire()
        assert isinstance(decoded, Request)
        try:
            return self.handle(decoded, f"request {request.id} from {request.requested_by}").wire()
        except Exception as exc:  # the loop must survive any request
            logger.exception("everystep-supervisor %s: request %d failed", self.name, request.id)
            return ErrorReply(f"{type(exc).__name__}: {exc}").wire()

    # -- publishing ---------------------------------------------------------------------

    def _publish(self, now: float) -> bool:
        """Publish the children when they changed; True if the database was touched."""
        reply = self.handle(StatusRequest(), "status publication")
        if not isinstance(reply, StatusReply):
            return False
        detail = snapshot(plain(reply), self.instance, time.time())
        detail["queues"] = self.queues
        key = _structure(detail)
        if key == self._last_key and now < self._last_full + REFRESH_EVERY:
            return False
        if self.store.publish_runner_detail(self.name, self.instance, detail):
            self._last_key = key
            self._last_full = now
        return True


def snapshot(status: dict[str, Any], instance: str, wall: float) -> dict[str, Any]:
    """The published detail: the ``status`` reply with times made absolute
    (unix seconds), so a reader computes "time in step" whenever it reads."""
    children = []
    for child in status.get("children", []):
        step_seconds, run_seconds = child.get("step_seconds"), child.get("run_seconds")
        children.append({
            "slot": child.get("slot"),
            "pid": child.get("pid"),
            "state": child.get("state"),
            "run_id": child.get("run_id"),
            "workflow": child.get("workflow"),
            "step_id": child.get("step_id"),
            "step_name": child.get("step_name"),
            "steps_in_flight": child.get("steps_in_flight", 0),
            "step_since": round(wall - step_seconds, 3) if step_seconds is not None else None,
            "run_since": round(wall - run_seconds, 3) if run_seconds is not None else None,
            "rss": child.get("rss"),
            "uss": child.get("uss"),
            "pss": child.get("pss"),
            "cpu_percent": child.get("cpu_percent"),
            "runs_done": child.get("runs_done"),
        })
    return {
        "instance": instance,
        "published_at": round(wall, 3),
        "pid": status.get("pid", os.getpid()),
        "procs": status.get("procs"),
        "draining": bool(status.get("draining")),
        "uptime": status.get("uptime"),
        "runs": status.get("runs", {}),
        "restarts": status.get("restarts", {}),
        "children": children,
    }


def _structure(detail: dict[str, Any]) -> Any:
    """What makes a new publication worth writing at once."""
    return (
        detail["procs"], detail["draining"],
        tuple((c["slot"], c["pid"], c["state"], c["run_id"], c["step_id"], c["steps_in_flight"])
              for c in detail["children"]),
    )
