"""What the supervisor says about itself: the ``status`` reply, the
systemd STATUS= line, the progress line and the summary at exit, the
process-tree gauges and the metrics port, and whether a ``--burst`` run is
over. Apart from the arbiter because none of it manages a process: it reads
the arbiter's state (``view.SupervisorView``) and says it."""

from __future__ import annotations

import logging
import os
import selectors
import time
from typing import TYPE_CHECKING

import psutil

from everystep import exposition, metrics
from everystep.errors import EverystepError
from everystep.metrics import MEMORY_MEASURES
from everystep.models import TERMINAL_STATUSES

from .control import ControlSocketError
from .http import LoopHTTPServer
from .memory import measure
from .protocol import ChildStatus, StatusReply
from .states import ChildState

if TYPE_CHECKING:
    from .view import SupervisorView
    from .children import Child
    from .sdnotify import Notifier

logger = logging.getLogger("everystep.supervisor")

PROGRESS_EVERY = 2.0
STATUS_EVERY = 5.0


def plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _child_status(kid: Child, now: float) -> ChildStatus:
    in_flight = kid.in_flight()
    step = in_flight[0] if in_flight else None  # the oldest
    usage = kid.usage()
    return ChildStatus(
        slot=kid.slot,
        pid=kid.pid,
        state=kid.state,
        run_id=kid.run.id if kid.run else None,
        workflow=kid.run.name if kid.run else None,
        step_id=step.step if step else None,
        step_name=step.name if step else None,
        step_seconds=round(max(now - step.started, 0.0), 3) if step else None,
        steps_in_flight=len(in_flight),
        run_seconds=round(now - kid.run_started, 3) if kid.run_started is not None else None,
        rss=int(usage["rss"] or 0),
        cpu_percent=usage["cpu_percent"],
        runs_done=kid.runs_done,
        uss=usage["uss"],
        pss=usage["pss"],
    )


def status(arbiter: SupervisorView) -> StatusReply:
    """The ``ctl status`` reply."""
    now = time.monotonic()
    return StatusReply(
        pid=os.getpid(),
        name=arbiter.name,
        procs=arbiter.procs,
        draining=bool(arbiter.stopping),
        uptime=round(now - arbiter.started, 3),
        database=arbiter.store.describe(),
        ready=len(arbiter.ledger.ready),
        runs={**{str(outcome): count for outcome, count in arbiter.ledger.counts.items()},
              "claimed": arbiter.loop.claimed, "claims": arbiter.loop.claims,
              "empty_claims": arbiter.loop.empty_claims},
        restarts={str(reason): count for reason, count in arbiter.restarts.items()},
        children=[_child_status(kid, now) for kid in sorted(arbiter.children.values(), key=lambda k: k.slot)],
        engine_errors=arbiter.loop.engine.failing(),
    )


def busy(arbiter: SupervisorView) -> int:
    return sum(1 for kid in arbiter.children.values() if kid.run is not None)


def finished(arbiter: SupervisorView) -> int:
    return sum(arbiter.ledger.counts[status] for status in TERMINAL_STATUSES)


def status_line(arbiter: SupervisorView) -> str:
    """For systemd's STATUS=."""
    return (f"{busy(arbiter)}/{arbiter.procs} busy, {plural(finished(arbiter), 'run', 'runs')} finished"
            + (", draining" if arbiter.stopping else ""))


def finished_summary(arbiter: SupervisorView) -> str:
    counts = arbiter.ledger.counts
    parts = [f"{counts[status]} {status}" for status in TERMINAL_STATUSES if counts[status]]
    return ", ".join(parts) or "nothing"


def progress_line(arbiter: SupervisorView, queued: int | None) -> str:
    return (f"progress: {finished(arbiter)} finished ({finished_summary(arbiter)}), {busy(arbiter)} running, "
            f"{'?' if queued is None else queued} queued")


def summary_line(arbiter: SupervisorView) -> str:
    elapsed = time.monotonic() - arbiter.started
    return (f"done: {plural(finished(arbiter), 'run', 'runs')} in {elapsed:.1f}s ({finished_summary(arbiter)}); "
            f"{plural(sum(arbiter.restarts.values()), 'child restart', 'child restarts')}")


def queued(arbiter: SupervisorView) -> int | None:
    """Runs waiting for this supervisor's workflows (None: the database is away)."""
    try:
        return arbiter.store.count_scheduled(arbiter.loop.names)
    except EverystepError:
        return None


def gauge_children(arbiter: SupervisorView) -> None:
    """The process-tree gauges (set when scraped and once a second)."""
    alive, running = len(arbiter.children), busy(arbiter)

    def update(m: metrics.Metrics) -> None:
        m.children.labels(arbiter.name).set(alive)
        m.inflight.labels(arbiter.name).set(running)
        m.pool_size.labels(arbiter.name).set(arbiter.procs)

    metrics.record(update)


def gauge_memory(arbiter: SupervisorView) -> None:
    """``everystep_supervisor_memory_bytes``: the parent's memory now, its
    children's as last sampled (``Child.usage``)."""
    try:
        parent = measure(psutil.Process())
    except (psutil.Error, OSError):
        return
    kids = [kid.usage() for kid in arbiter.children.values()]
    largest = max(kids, key=lambda usage: usage["uss"] or usage["rss"] or 0, default=None)
    values = {
        "parent": {"uss": parent.uss, "pss": parent.pss, "rss": parent.rss},
        "children": {kind: sum(usage[kind] or 0 for usage in kids) for kind in MEMORY_MEASURES},
        "largest_child": {kind: (largest[kind] or 0) if largest else 0 for kind in MEMORY_MEASURES},
    }

    def update(m: metrics.Metrics) -> None:
        for process, measures in values.items():
            for kind, value in measures.items():
                if value is not None:
                    m.memory.labels(arbiter.name, process, kind).set(value)

    metrics.record(update)


def metrics_server(arbiter: SupervisorView, selector: selectors.BaseSelector) -> LoopHTTPServer | None:
    """The metrics port, served from the arbiter's loop (``selector``), if configured."""
    config = arbiter.config
    if not config.metrics_port:
        return None
    try:
        http = LoopHTTPServer(config.metrics_bind, config.metrics_port, selector,
                              lambda path: respond_http(arbiter, path))
    except OSError as exc:
        raise ControlSocketError(exposition.bind_error(config.metrics_bind, config.metrics_port, exc)) from None
    logger.info("%s: metrics on http://%s:%d/metrics", arbiter.who, config.metrics_bind, http.port)
    return http


def respond_http(arbiter: SupervisorView, path: str) -> tuple[int, str, bytes]:
    """The metrics port's answer to ``path``."""
    gauge_children(arbiter)  # gauges of the process tree are read when scraped
    gauge_memory(arbiter)
    return exposition.respond(path, arbiter.store, arbiter.loop.engine)


class Progress:
    """Said now and then: systemd's STATUS= every ``STATUS_EVERY`` seconds
    and, with ``--progress``, the progress line every ``PROGRESS_EVERY``
    seconds when it changed."""

    def __init__(self, notifier: Notifier, show: bool) -> None:
        self.notifier = notifier
        self.show = show
        self._last_status = 0.0
        self._last_progress = 0.0
        self._last_line = ""

    def tick(self, arbiter: SupervisorView, now: float) -> None:
        if now - self._last_status >= STATUS_EVERY:
            self._last_status = now
            self.notifier.status(status_line(arbiter))
        if self.show and now - self._last_progress >= PROGRESS_EVERY:
            self._last_progress = now
            line = progress_line(arbiter, queued(arbiter))
            if line != self._last_line:
                self._last_line = line
                logger.info("%s: %s", arbiter.who, line)


def burst_over(arbiter: SupervisorView) -> bool:
    """``--burst``: nothing is left to claim and every child is idle (the
    arbiter then drains)."""
    if not arbiter.config.burst or arbiter.stopping or arbiter.ledger.ready:
        return False
    if arbiter.procs == 0:
        if queued(arbiter):
            logger.warning("%s: burst mode with --procs 0: runs are scheduled but no child will execute them",
                           arbiter.who)
    else:
        kids = list(arbiter.children.values())
        if not kids or any(kid.state != ChildState.IDLE for kid in kids) or arbiter.loop.due:
            return False
    logger.info("%s: burst mode: nothing left to run", arbiter.who)
    return True
