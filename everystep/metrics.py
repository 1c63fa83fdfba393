"""Prometheus metrics (prometheus_client, default registry); no-ops without it.

prometheus_client is imported on first use, not at import time, because its
multiprocess mode is chosen by ``PROMETHEUS_MULTIPROC_DIR`` when it is first
imported: the supervisor sets that variable (to a private directory) before
anything touches the library, so the children's values land in files the
parent aggregates.

Labels never carry run ids: ``workflow`` and ``step`` are function names,
bounded by the code base.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from . import wait_kinds
from .history_bound import NOTED_FROM
from .models import EXECUTION_ENDS, STEP_DONE, STEP_FAILED, STEP_RETRYING
from .context import Observer
from .store import utcnow
from .vocabulary import INVALID_COMMAND, Command, RestartReason

if TYPE_CHECKING:
    # Types only: importing prometheus_client here would fix its multiprocess
    # mode before the supervisor sets PROMETHEUS_MULTIPROC_DIR.
    from prometheus_client import Counter, Gauge, Histogram

    from .context import Context
    from .models import Run
    from .store import Store

logger = logging.getLogger("everystep")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Label values made known at start, from the one vocabulary (``everystep.vocabulary``).
SUPERVISOR_COMMANDS: tuple[str, ...] = tuple(Command)
RESTART_REASONS: tuple[str, ...] = tuple(RestartReason)
#: Buckets of the step cost histograms: CPU seconds, and bytes of peak RSS growth.
CPU_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, float("inf"))
RSS_BUCKETS = tuple(float(1 << shift) for shift in (16, 20, 22, 24, 26, 28, 30, 32)) + (float("inf"),)
#: ``everystep_supervisor_memory_bytes``: whose memory (the parent, its
#: children added up, the child owning most), and which measure: USS (the
#: pages only that process holds), PSS (those plus its share of shared
#: pages: adds up to what the tree holds) and RSS (every resident page, the
#: app's shared ones included).
MEMORY_PROCESSES = ("parent", "children", "largest_child")
MEMORY_MEASURES = ("uss", "pss", "rss")


@dataclass(frozen=True)
class Metrics:
    workflow_runs: Counter
    workflow_duration: Histogram
    step_runs: Counter
    step_duration: Histogram
    pool_size: Gauge
    inflight: Gauge
    claims: Counter
    requeued: Counter
    started_at: Gauge
    pending: Gauge
    running: Gauge
    blocked: Gauge
    oldest_pending_age: Gauge
    children: Gauge
    memory: Gauge
    child_restarts: Counter
    step_timeouts: Counter
    control_requests: Counter
    empty_claims: Counter
    step_retries: Counter
    waiting: Gauge
    waiting_by_kind: Gauge
    step_cpu: Histogram
    step_peak_rss: Histogram
    queue_pending: Gauge
    queue_waiting: Gauge
    queue_running: Gauge
    queue_blocked: Gauge
    queue_oldest_pending_age: Gauge
    queue_paused: Gauge
    engine_errors: Counter
    largest_history: Gauge
    #: The queues this process has set gauges for: one that no longer has
    #: runs or settings is set to zero rather than left at its last value.
    queues_seen: set[str] = field(default_factory=set)


_create_lock = threading.Lock()
_created = False
_metrics: Metrics | None = None


def get() -> Metrics | None:
    """The metric objects, created once per process; None without prometheus_client."""
    global _created, _metrics
    if not _created:
        # Not just functools.cache: parallel branches finishing their first
        # steps together would both register the metrics, and the loser
        # would fail with DuplicateTimeseries.
        with _create_lock:
            if not _created:
                _metrics = _create()
                _created = True  # after _metrics: a reader seeing True sees the metrics
    return _metrics


def _create() -> Metrics | None:
    try:
        from prometheus_client import Counter, Gauge, Histogram
    except ImportError:
        return None
    # Final keeps the literal types Gauge's multiprocess_mode is declared with.
    live: Final = "livesum"
    latest: Final = "livemax"
    return Metrics(
        workflow_runs=Counter("everystep_workflow_runs_total", "Runs that reached a terminal status",
                              ["workflow", "status"]),
        workflow_duration=Histogram("everystep_workflow_duration_seconds", "From claim to terminal status",
                                    ["workflow", "status"],
                                    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, float("inf"))),
        step_runs=Counter("everystep_step_runs_total", "Executed steps by outcome", ["workflow", "step", "status"]),
        step_duration=Histogram("everystep_step_duration_seconds", "Step execution time", ["workflow", "step"]),
        pool_size=Gauge("everystep_worker_pool_size", "Threads or child processes executing runs", ["runner"],
                        multiprocess_mode=live),
        inflight=Gauge("everystep_worker_inflight", "Runs being executed", ["runner"], multiprocess_mode=live),
        claims=Counter("everystep_worker_claims_total", "Runs claimed", ["runner"]),
        requeued=Counter("everystep_worker_requeued_total", "Runs given back to the queue", ["runner"]),
        started_at=Gauge("everystep_worker_started_at_seconds", "Runner start time (unix seconds)", ["runner"],
                         multiprocess_mode=latest),
        pending=Gauge("everystep_workflows_pending", "Scheduled runs due now, waiting to be claimed", multiprocess_mode=latest),
        running=Gauge("everystep_workflows_running", "Claimed runs", multiprocess_mode=latest),
        blocked=Gauge("everystep_workflows_blocked", "Runs blocked on an uncertain effect", multiprocess_mode=latest),
        oldest_pending_age=Gauge("everystep_workflows_oldest_pending_age_seconds",
                                 "Age of the oldest scheduled run", multiprocess_mode=latest),
        children=Gauge("everystep_supervisor_children", "Child processes alive", ["runner"], multiprocess_mode=live),
        memory=Gauge("everystep_supervisor_memory_bytes",
                     "Memory of the supervisor's processes, read when scraped: uss is what a process owns, pss "
                     "adds its share of shared pages, rss counts every resident page (the app's shared ones too)",
                     ["runner", "process", "measure"], multiprocess_mode=latest),
        child_restarts=Counter("everystep_supervisor_child_restarts_total", "Children replaced, by reason",
                               ["runner", "reason"]),
        step_timeouts=Counter("everystep_supervisor_step_timeouts_total", "Steps killed past their timeout",
                              ["runner"]),
        control_requests=Counter("everystep_supervisor_control_requests_total", "Control-socket requests",
                                 ["runner", "command"]),
        empty_claims=Counter("everystep_worker_empty_claims_total",
                             "Claim statements that found nothing to claim", ["runner"]),
        step_retries=Counter("everystep_step_retries_total", "Failed step attempts that will be retried",
                             ["workflow", "step"]),
        waiting=Gauge("everystep_workflows_waiting",
                      "Scheduled runs not yet due (delayed, sleeping, waiting to retry)", multiprocess_mode=latest),
        waiting_by_kind=Gauge("everystep_workflows_waiting_by_kind",
                              "Scheduled runs not yet due, by what they wait for (message, child, several, time)",
                              ["kind"], multiprocess_mode=latest),
        step_cpu=Histogram("everystep_step_cpu_seconds", "CPU seconds (user + system) a step used, where measured",
                           ["workflow", "step"], buckets=CPU_BUCKETS),
        step_peak_rss=Histogram("everystep_step_peak_rss_bytes",
                                "How far a step raised its process's peak RSS, where measured",
                                ["workflow", "step"], buckets=RSS_BUCKETS),
        queue_pending=Gauge("everystep_queue_pending", "Scheduled runs due now, by queue", ["queue"],
                            multiprocess_mode=latest),
        queue_waiting=Gauge("everystep_queue_waiting", "Scheduled runs not yet due, by queue", ["queue"],
                            multiprocess_mode=latest),
        queue_running=Gauge("everystep_queue_running", "Claimed runs, by queue", ["queue"], multiprocess_mode=latest),
        queue_blocked=Gauge("everystep_queue_blocked", "Blocked runs, by queue", ["queue"], multiprocess_mode=latest),
        queue_oldest_pending_age=Gauge("everystep_queue_oldest_pending_age_seconds",
                                       "Age of the oldest due run, by queue", ["queue"], multiprocess_mode=latest),
        queue_paused=Gauge("everystep_queue_paused", "1 while the queue is paused", ["queue"],
                           multiprocess_mode=latest),
        engine_errors=Counter("everystep_engine_errors_total",
                              "Statements of everystep's own the database refused (not an outage), by the driver's "
                              "name for the error; a run meeting one goes back to the queue", ["kind"]),
        largest_history=Gauge("everystep_workflows_largest_history",
                              "Step records of the longest history among unfinished runs (scheduled, running, "
                              f"blocked), as its last execution left it; noted from {NOTED_FROM:,} records on "
                              "(0: none that long). Past --history-warning, continue_as_new", multiprocess_mode=latest),
    )


def record(update: Callable[[Metrics], object]) -> None:
    """Apply ``update`` to the metrics, if prometheus_client is there (its result is ignored)."""
    metrics = get()
    if metrics is not None:
        update(metrics)




def refresh_queue_gauges(store: Store) -> None:
    """Set the queue gauges from the database. Call it before rendering
    ``/metrics`` in a host application; the supervisor and the worker do it
    on every scrape."""
    metrics = get()
    if metrics is None:
        return
    stats = store.queue_stats()
    metrics.pending.set(stats["pending"])
    metrics.waiting.set(stats["waiting"])
    metrics.running.set(stats["running"])
    metrics.blocked.set(stats["blocked"])
    metrics.oldest_pending_age.set(stats["oldest_pending_age_seconds"])
    by_kind = store.waiting_counts()
    for kind in wait_kinds.GAUGE_LABELS:
        metrics.waiting_by_kind.labels(kind).set(by_kind.get(kind, 0))
    metrics.largest_history.set(store.largest_history())
    queues = store.queues()
    gone = metrics.queues_seen - {queue.name for queue in queues}
    for queue in queues:
        metrics.queue_pending.labels(queue.name).set(queue.pending)
        metrics.queue_waiting.labels(queue.name).set(queue.waiting)
        metrics.queue_running.labels(queue.name).set(queue.running)
        metrics.queue_blocked.labels(queue.name).set(queue.blocked)
        metrics.queue_oldest_pending_age.labels(queue.name).set(queue.oldest_pending_age_seconds)
        metrics.queue_paused.labels(queue.name).set(1 if queue.settings.paused else 0)
        metrics.queues_seen.add(queue.name)
    for name in gone:
        for gauge in (metrics.queue_pending, metrics.queue_waiting, metrics.queue_running, metrics.queue_blocked,
                      metrics.queue_oldest_pending_age, metrics.queue_paused):
            gauge.labels(name).set(0)


def control_command_label(command: object) -> str:
    """Hostile clients choose the command string: keep the label bounded."""
    return command if isinstance(command, str) and command in SUPERVISOR_COMMANDS else INVALID_COMMAND


class MetricsObserver(Observer):
    """Counts runs and steps as the runner reports them.

    Labelled children are cached: ``labels()`` is the expensive part of a
    metric update and a runner repeats the same few label sets all day.
    """

    def __init__(self) -> None:
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}

    def _child(self, metric_name: str, *labels: str) -> Any:
        key = (metric_name, labels)
        child = self._children.get(key)
        if child is None:
            metrics = get()
            if metrics is None:
                return None
            child = self._children[key] = getattr(metrics, metric_name).labels(*labels)
        return child

    def run_finished(self, run: Run, ctx: Context, status: str, error: BaseException | None, token: Any) -> None:
        if status not in EXECUTION_ENDS or get() is None:
            return
        self._child("workflow_runs", run.name, status).inc()
        claimed = run.claimed_at or utcnow()
        self._child("workflow_duration", run.name, status).observe(max((utcnow() - claimed).total_seconds(), 0.0))

    def step_started(self, ctx: Context, step_id: str, name: str, timeout: float | None, unsafe: bool) -> Any:
        return time.perf_counter()

    def step_finished(self, ctx: Context, step_id: str, name: str, status: str,
                      error: BaseException | None, token: Any) -> None:
        if status == STEP_RETRYING and get() is not None:
            self._child("step_retries", ctx.workflow_name, name).inc()
        if status not in (STEP_DONE, STEP_FAILED) or get() is None:
            return
        self._child("step_runs", ctx.workflow_name, name, status).inc()
        if token is not None:
            self._child("step_duration", ctx.workflow_name, name).observe(time.perf_counter() - token)


# -- exposition ------------------------------------------------------------------


def render(store: Store | None) -> tuple[bytes, str]:
    """The text exposition: this process's registry, or the aggregate of
    every process when ``PROMETHEUS_MULTIPROC_DIR`` is set."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

    if store is not None:
        try:
            refresh_queue_gauges(store)
        except Exception as exc:
            # /healthz says the database is away; one line per scrape would not help.
            logger.debug("everystep: queue gauges not refreshed: %s", exc)
    path = os.environ.get(MULTIPROC_ENV)
    if path:
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=path)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def health(store: Store) -> tuple[bool, str]:
    """(ok, one-line reason) for ``/healthz``: can we reach the database?"""
    try:
        store.ping()
    except Exception as exc:
        return False, f"database unreachable: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return True, "ok"


def mark_process_dead(pid: int) -> None:
    """Drop a dead child's live gauges from the aggregate."""
    path = os.environ.get(MULTIPROC_ENV)
    if not path:
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, path)


def runner_started(runner: str, pool_size: int, kind: str = "worker", workflows: Sequence[str] = ()) -> None:
    """Announce a runner, and create every labelled series whose labels are
    known now at 0, so ``rate()`` and alerts work before the first event."""
    metrics = get()
    if metrics is None:
        return
    metrics.pool_size.labels(runner).set(pool_size)
    metrics.started_at.labels(runner).set(time.time())
    metrics.inflight.labels(runner).set(0)
    for counter in (metrics.claims, metrics.requeued, metrics.empty_claims):
        counter.labels(runner)
    for workflow in workflows:
        for status in EXECUTION_ENDS:
            metrics.workflow_runs.labels(workflow, status)
    if kind == "supervisor":
        metrics.children.labels(runner).set(0)
        metrics.step_timeouts.labels(runner)
        for reason in RESTART_REASONS:
            metrics.child_restarts.labels(runner, reason)
        for command in (*SUPERVISOR_COMMANDS, INVALID_COMMAND):
            metrics.control_requests.labels(runner, command)
