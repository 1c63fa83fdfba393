"""What each console page shows, as JSON-ready dicts (the browser draws them).

Every function here reads the database through the Store and returns plain
data; the same dicts answer the JSON API, feed the live stream and fill the
polling fallback, so all three always agree. Nothing here renders HTML: the
browser builds the page with DOM text nodes, which is what keeps user data
(arguments, results, errors) inert wherever it appears.

A run's page reads its history once (``RunHistory``): the outline of every
step (no argument, result or error: ``Store.step_outline``), from which
the step graph is drawn and summarised (``everystep.graph``), the first
``STEPS_PAGE`` steps in full (more come a page at a time from ``steps``),
and the few rows that say what it waits for. That reading is reused while
the run's row is unchanged and the reading is younger than ``REUSE`` times
what it cost: a run of a hundred steps is read again every tick, one of
100,000 every few seconds, and never sent whole to the browser.

Filters: ``RunFilter`` holds what the runs list can be narrowed by (status,
or ``waiting``: the scheduled runs not due yet; workflow, queue, id prefix).
A filter is a field here, a condition in the ``page_runs`` statements and
an entry in ``FILTERS``; the browser builds its filter bar from ``FILTERS``
(served by ``/api/meta``).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import dryrun, registry, serde
from ..errors import EverystepError
from ..graph import analyse, build_graph, recorded_graph
from ..graph.drawn import Recorded
from ..graph.plan import Plan
from ..models import (ACTIVE_STATUSES, BLOCKED, CANCELLABLE_STATUSES, COMPLETED, RUN_FILTERS, RUN_STATUSES, RUNNING,
                      STEP_DONE, STEP_FAILED, STEP_STARTED, STEP_WAITING_STATUSES, WAIT_FOREVER, Run, StepOutline,
                      StepRecord)
from ..patches import PATCH_STEP
from ..queues import queue_name
from ..waiting import effect_uncertain, waiting_for, waits_of
from ..waits import CHILD_STEP, START_STEP
from ..store import Store, step_pages, utcnow
from ..store.base import MAX_UUID, MIN_UUID, id_prefix_range
from . import actions
from .counts import StatusCounts

DEFAULT_PAGE = 50
MAX_PAGE = 500
PREVIEW_CHARS = 160
VERDICT_TIMEOUT = 3.0
#: The steps a run's page lists at first; more come ``STEPS_PAGE`` at a time.
STEPS_PAGE = 100
#: A history longer than this is not dry-replayed for the page's
#: check-deploy verdict (``everystep check-deploy`` still judges it).
VERDICT_MAX_STEPS = 10_000
#: A run's history, once read, is reused while its row is unchanged for
#: this many times as long as the reading took.
REUSE = 5.0
#: Runs whose reading is kept.
HISTORIES_KEPT = 32

_PREFIX = re.compile(r"^[0-9a-fA-F-]{1,36}$")


class BadRequest(EverystepError):
    """A request the console cannot serve as asked (HTTP 400)."""


#: The runs list's filters, as the browser builds them.
FILTERS: list[dict[str, Any]] = [
    {"name": "status", "label": "Status", "kind": "select", "options": list(RUN_FILTERS)},
    {"name": "workflow", "label": "Workflow", "kind": "text", "placeholder": "module.workflow"},
    {"name": "queue", "label": "Queue", "kind": "text", "placeholder": "default"},
    {"name": "q", "label": "Run id", "kind": "text", "placeholder": "id prefix"},
]


@dataclass(frozen=True)
class RunFilter:
    status: str | None = None
    workflow: str | None = None
    id_prefix: str | None = None
    queue: str | None = None

    @classmethod
    def parse(cls, params: Any) -> RunFilter:
        status = (params.get("status") or "").strip() or None
        if status is not None and status not in RUN_FILTERS:
            raise BadRequest(f"unknown status {status[:40]!r}; expected one of: {', '.join(RUN_FILTERS)}")
        workflow = (params.get("workflow") or "").strip() or None
        prefix = (params.get("q") or "").strip().lower() or None
        if prefix is not None and not _PREFIX.match(prefix):
            raise BadRequest(f"{prefix[:40]!r} is not a run id prefix (hexadecimal digits and dashes)")
        queue = (params.get("queue") or "").strip() or None
        if queue is not None:
            try:
                queue_name(queue)
            except EverystepError as exc:
                raise BadRequest(str(exc)) from None
        return cls(status, workflow[:300] if workflow else None, prefix, queue)

    def id_range(self) -> tuple[str, str]:
        """The ids starting with the prefix, as an inclusive range (so the
        primary key answers a prefix search)."""
        if not self.id_prefix:
            return MIN_UUID, MAX_UUID
        return id_prefix_range(self.id_prefix)


def encode_cursor(run: Run) -> str:
    return f"{run.created_at.isoformat() if run.created_at else ''}~{run.id}"


def decode_cursor(text: str) -> tuple[dt.datetime | None, str]:
    at, sep, run_id = text.partition("~")
    try:
        when = dt.datetime.fromisoformat(at) if at else None
        if not sep or not run_id:
            raise ValueError
        return when, run_id
    except ValueError:
        raise BadRequest(f"bad page cursor {text[:80]!r}") from None


def _seconds(later: dt.datetime | None, earlier: dt.datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return max((later - earlier).total_seconds(), 0.0)


def timings(run: Run) -> dict[str, float | None]:
    """A run's times, in seconds: ``duration`` is its execution time, from
    its first claim to its end (None while it has not ended, or if it was
    claimed before runs recorded their first claim); ``queued`` the time
    before that first claim, waiting in its queue (a delayed start
    included; None while it was never claimed). Neither counts the other,
    so a run held 10 s by a rate limit shows a duration of its own work."""
    return {"duration": _seconds(run.completed_at, run.first_claimed_at),
            "queued": _seconds(run.first_claimed_at, run.created_at)}


def _preview(value: Any) -> str:
    text = json.dumps(serde.to_jsonable(value), ensure_ascii=False, default=str)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def error_line(error: dict[str, Any] | None) -> str | None:
    if not error:
        return None
    message = str(error.get("message", "")).strip().splitlines()
    return f"{error.get('type', '?')}: {message[0] if message else ''}"[:300]


def run_summary(run: Run, waiting: str | None = None) -> dict[str, Any]:
    """A run as a list shows it; ``waiting``: what it waits for, if it does."""
    return {
        "id": run.id,
        "name": run.name,
        "status": run.status,
        "created_at": _iso(run.created_at),
        "claimed_by": run.claimed_by,
        "claimed_at": _iso(run.claimed_at),
        "completed_at": _iso(run.completed_at),
        "first_claimed_at": _iso(run.first_claimed_at),
        **timings(run),
        "error": error_line(run.error),
        "args_preview": _preview(run.args),
        "queue": run.queue,
        "priority": run.priority,
        "concurrency_key": run.concurrency_key,
        "waiting": waiting,
    }


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@dataclass(frozen=True)
class RunHistory:
    """What a run's page shows of its history, as one reading found it:
    how many steps, the first page of them (``steps``, JSON-ready, and the
    cursor of the next), the step graph (summarised, its copied steps
    marked), how many steps a fork copied, what the run waits for, its
    uncertain steps, and its last record (the verdict's key)."""

    total: int
    steps: list[dict[str, Any]]
    next_after: str | None
    graph: dict[str, Any]
    copied: int
    waiting: str | None
    uncertain: list[StepOutline]
    last: StepOutline | None
    read_at: float
    cost: float


class Views:
    """The console's reads, with the caches that keep them cheap."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.counts = StatusCounts(store)
        self._plans: dict[tuple[str, int], Plan] = {}
        self._verdicts: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()
        self._histories: OrderedDict[str, tuple[tuple[Any, ...], RunHistory]] = OrderedDict()
        self._lock = threading.Lock()

    # -- meta ----------------------------------------------------------------------------

    def meta(self) -> dict[str, Any]:
        return {
            "statuses": list(RUN_STATUSES),
            "workflows": registry.workflow_names(),
            "filters": FILTERS,
            "backend": self.store.backend,
            "database": self.store.describe(),
            "code_loaded": bool(registry.workflow_names()),
        }

    # -- runs ------------------------------------------------------------------------------

    def runs(self, params: Any, with_counts: bool = True) -> dict[str, Any]:
        run_filter = RunFilter.parse(params)
        limit = _limit(params.get("limit"))
        before, after = params.get("before"), params.get("after")
        if before and after:
            raise BadRequest("give one of before= and after=, not both")
        older = decode_cursor(before) if before else None
        newer = decode_cursor(after) if after else None
        runs = self.store.page_runs(status=run_filter.status, name=run_filter.workflow, queue=run_filter.queue,
                                    id_range=run_filter.id_range(), older_than=older, newer_than=newer,
                                    limit=limit + 1)
        if newer is not None:
            more_newer, more_older = len(runs) > limit, True
            runs = runs[1:] if more_newer else runs
        else:
            more_older, more_newer = len(runs) > limit, older is not None
            runs = runs[:limit]
        waits = waits_of(self.store, runs)
        return {
            "runs": [run_summary(run, waits.get(run.id)) for run in runs],
            "counts": [count.to_dict() for count in self.counts.counts()] if with_counts else [],
            "older": encode_cursor(runs[-1]) if runs and more_older else None,
            "newer": encode_cursor(runs[0]) if runs and more_newer else None,
            "filter": {"status": run_filter.status, "workflow": run_filter.workflow, "q": run_filter.id_prefix,
                       "queue": run_filter.queue},
            "limit": limit,
        }

    def blocked(self, params: Any) -> dict[str, Any]:
        """Blocked runs with their uncertain steps and the command that resolves each."""
        data = self.runs({**dict(params), "status": BLOCKED}, with_counts=False)
        ids = [run["id"] for run in data["runs"]]
        steps = self.store.steps_of_runs(ids)
        for run in data["runs"]:
            started = [step for step in steps.get(run["id"], []) if step.status == STEP_STARTED]
            run["uncertain"] = [
                {**step.to_dict(), "command": resolve_command(run["id"], step.step_id)} for step in started
            ]
        return data

    # -- one run ---------------------------------------------------------------------------------

    def run(self, run_id: str) -> dict[str, Any]:
        run = self.store.get_run(run_id)
        history = self.history(run)
        runner = self._runner_of(run, lambda step_id: self._settled(run.id, step_id))
        data = run.to_dict()
        data.update({
            **timings(run),
            "error_line": error_line(run.error),
            # How many times the run was claimed, once runs count their claims.
            "attempts": getattr(run, "claim_epoch", None),
        })
        data["waiting"] = history.waiting
        if run.not_before is not None and run.not_before >= WAIT_FOREVER:
            data["not_before"] = None  # a wait without a timeout: due only when something ends it
        links = self.store.links(run.id)
        data["parent_id"] = links.parent_id
        data["deadline"] = _iso(links.deadline)
        data["copied_steps"] = history.copied
        children = self.store.children(run.id)
        graph = copy.deepcopy(history.graph)
        _annotate_nodes(graph, {child.id: child for child in children}, set())
        data["forks"] = [{"id": fork.id, "status": fork.status} for fork in self.store.forks_of(run.id)]
        return {
            "run": data,
            "children": [run_summary(child) for child in children],
            "events": [event.to_dict() for event in self.store.events(run.id)],
            "messages": [message.to_dict() for message in self.store.messages(run.id)],
            "streams": [summary.to_dict() for summary in self.store.streams_of(run.id)],
            "send": run.status in CANCELLABLE_STATUSES,
            "steps": history.steps,
            "steps_total": history.total,
            "steps_next": history.next_after,
            "graph": graph,
            "verdict": self.verdict(run, history),
            "runner": runner,
            "actions": actions.available(run, runner),
            "uncertain": [
                {"step_id": step.step_id, "name": step.name, "command": resolve_command(run.id, step.step_id)}
                for step in history.uncertain if run.status == BLOCKED
            ],
        }

    def steps(self, run_id: str, params: Any) -> dict[str, Any]:
        """A page of a run's steps (``after``: the last step id of the page
        before; ``limit``, at most ``MAX_PAGE``), as the run page lists them."""
        run = self.store.get_run(run_id)
        after = (params.get("after") or "").strip() or None
        limit = _limit(params.get("limit") or STEPS_PAGE)
        try:
            page = step_pages.read_page(self.store, run.id, after, limit)
        except EverystepError as exc:
            raise BadRequest(str(exc)) from None
        copied = self._copied(run)
        return {"steps": [_step_row(run, step, copied) for step in page.steps], "total": page.total,
                "next": page.next_after}

    def history(self, run: Run) -> RunHistory:
        """The run's history as its page shows it: read again when the run
        moved (its row changed) or when the last reading is older than
        ``REUSE`` times what it cost (see the module)."""
        key = (run.status, run.claim_epoch, run.not_before, run.completed_at, run.claimed_by,
               id(registry.get_workflow(run.name)))
        with self._lock:
            kept = self._histories.get(run.id)
        if kept is not None and kept[0] == key and time.monotonic() - kept[1].read_at < REUSE * kept[1].cost:
            return kept[1]
        history = self._read_history(run)
        with self._lock:
            self._histories[run.id] = (key, history)
            self._histories.move_to_end(run.id)
            while len(self._histories) > HISTORIES_KEPT:
                self._histories.popitem(last=False)
        return history

    def _read_history(self, run: Run) -> RunHistory:
        started = time.monotonic()
        outline = self.store.step_outline(run.id, PATCH_STEP)
        first = [step.step_id for step in outline[:STEPS_PAGE]]
        waits = [step.step_id for step in outline if step.status in STEP_WAITING_STATUSES]
        full = self._full(run.id, [*first, *waits])
        copied = self._copied(run)
        graph = self.graph(run, outline, lambda step_ids: self._full(run.id, step_ids))
        _annotate_nodes(graph, {}, copied)
        return RunHistory(
            total=len(outline),
            steps=[_step_row(run, full[step_id], copied) for step_id in first if step_id in full],
            next_after=first[-1] if len(outline) > len(first) else None,
            graph=graph, copied=len(copied),
            waiting=waiting_for(run, [full[step_id] for step_id in waits if step_id in full],
                                debounce=self.store.debounce_windows([run.id]).get(run.id)),
            uncertain=[step for step in outline if step.status == STEP_STARTED],
            last=outline[-1] if outline else None,
            read_at=time.monotonic(), cost=time.monotonic() - started)

    def _full(self, run_id: str, step_ids: list[str]) -> dict[str, StepRecord]:
        return {step.step_id: step for step in self.store.steps_by_id(run_id, step_ids)}

    def _settled(self, run_id: str, step_id: str) -> bool:
        """Whether the run's step ``step_id`` has its outcome recorded."""
        return any(step.status in (STEP_DONE, STEP_FAILED) for step in self.store.steps_by_id(run_id, [step_id]))

    def graph(self, run: Run, steps: Sequence[Recorded],
              details: Callable[[list[str]], Mapping[str, StepRecord]] | None = None) -> dict[str, Any]:
        """The run's step graph from its records (outlines, with ``details``
        reading the full records of the nodes drawn)."""
        workflow = registry.get_workflow(run.name)
        if workflow is None:
            reason = (f"workflow {run.name} is not registered in this console"
                      + ("" if registry.workflow_names() else " (start it with --app MODULE to read its source)"))
            return recorded_graph(steps, reason, details)
        key = (run.name, id(workflow))
        with self._lock:
            plan = self._plans.get(key)
        if plan is None:
            plan = analyse(workflow)
            with self._lock:
                self._plans[key] = plan
        graph = build_graph(plan, steps, active=run.status in ACTIVE_STATUSES, running=run.status == RUNNING,
                            completed=run.status == COMPLETED, details=details)
        if graph["file"]:
            relative = os.path.relpath(graph["file"])
            graph["file"] = relative if not relative.startswith("..") else graph["file"]
        return graph

    def _copied(self, run: Run) -> set[str]:
        """The steps a fork holds as copies of its source's records
        (``admin.fork``): rows with the source's step id, function and
        times. A source deleted since (retention) leaves the times: a copy
        was completed before the fork was made. (Both histories read whole:
        only for a fork.)"""
        if not run.forked_from:
            return set()
        steps = self.store.get_steps(run.id)
        source = {step.step_id: step for step in self.store.get_steps(run.forked_from)}
        if not source:
            return {step.step_id for step in steps if step.completed_at is not None and run.created_at is not None
                    and step.completed_at <= run.created_at}
        return {step.step_id for step in steps if (original := source.get(step.step_id)) is not None
                and (original.name, original.started_at, original.completed_at)
                == (step.name, step.started_at, step.completed_at)}

    def verdict(self, run: Run, history: RunHistory) -> dict[str, Any] | None:
        """check-deploy's verdict on an unfinished run, with the code loaded
        here (not for a history too long to replay on a page view)."""
        if run.status not in ACTIVE_STATUSES:
            return None
        if not registry.workflow_names():
            return {"outcome": None, "problem": False,
                    "detail": "no workflow code is loaded in this console (start it with --app MODULE)"}
        if history.total > VERDICT_MAX_STEPS:
            return {"outcome": None, "problem": False,
                    "detail": f"its {history.total:,} steps are more than a page view replays "
                              f"({VERDICT_MAX_STEPS:,}): everystep check-deploy judges it"}
        last = history.last
        key = (run.id, run.status, history.total, last.step_id if last else None, last.status if last else None,
               id(registry.get_workflow(run.name)))
        with self._lock:
            cached = self._verdicts.get(key)
        if cached is not None:
            return cached
        verdict = dryrun.replay(run, self.store.get_steps(run.id), timeout=VERDICT_TIMEOUT).to_dict()
        with self._lock:
            self._verdicts[key] = verdict
            while len(self._verdicts) > 2000:
                self._verdicts.popitem(last=False)
        return verdict

    # -- runners -------------------------------------------------------------------------------------

    def runners(self) -> dict[str, Any]:
        details = self.store.runner_details()
        now = utcnow().timestamp()
        out = []
        for info in self.store.list_runners():
            detail = details.get(info.name)
            entry = {
                "name": info.name, "kind": info.kind, "host": info.host, "pid": info.pid,
                "lease": info.lease_seconds, "started_at": _iso(info.started_at),
                "heartbeat_at": _iso(info.heartbeat_at), "expired": info.expired, "running": info.running,
                "detail": _detail(detail, now) if detail else None,
            }
            out.append(entry)
        return {"runners": out}

    def _runner_of(self, run: Run, settled: Callable[[str], bool]) -> dict[str, Any] | None:
        """The runner holding the run, and the child executing it. A child
        is shown only while the run is ``running`` (what a supervisor
        published lags by up to its publishing period: a run that ended or
        was cancelled has left its child even if the last publication still
        names it), and its step only while that step has no outcome
        recorded (else the child has moved past it since it published)."""
        if not run.claimed_by:
            return None
        for runner in self.runners()["runners"]:
            if runner["name"] == run.claimed_by:
                child = None
                if run.status == RUNNING:
                    for candidate in (runner["detail"] or {}).get("children", []):
                        if candidate.get("run_id") == run.id:
                            child = _current_step(candidate, settled)
                return {**runner, "child": child}
        return {"name": run.claimed_by, "kind": None, "expired": True, "detail": None, "child": None}


def _current_step(child: dict[str, Any], settled: Callable[[str], bool]) -> dict[str, Any]:
    """The published child, its step left out if that step is recorded
    settled (done, failed: the child has moved on since it published)."""
    step_id = child.get("step_id")
    if isinstance(step_id, str) and settled(step_id):
        return {**child, "step_id": None, "step_name": None, "step_seconds": None}
    return child


def _detail(detail: dict[str, Any], now: float) -> dict[str, Any]:
    """Published detail with its times turned into ages (seconds, by this
    console's clock against the publisher's: small skews show as such)."""
    children = []
    for child in detail.get("children", []):
        since = child.get("step_since")
        run_since = child.get("run_since")
        children.append({**child,
                         "step_seconds": max(now - since, 0.0) if isinstance(since, (int, float)) else None,
                         "run_seconds": max(now - run_since, 0.0) if isinstance(run_since, (int, float)) else None})
    published = detail.get("published_at")
    return {**detail, "children": children,
            "age": max(now - published, 0.0) if isinstance(published, (int, float)) else None}


def _annotate_nodes(graph: Any, children: dict[str, Run], copied: set[str]) -> None:
    """Give every node that recorded a child's start (``everystep.start``)
    or waited for a child's end the child it names (id, workflow, status),
    so the graph names the child and links to its page; mark the nodes
    whose records a fork copied from its source."""
    if isinstance(graph, dict):
        record = graph.get("record")
        if isinstance(record, dict):
            child = _child_of(record)
            if child is not None:
                known = children.get(child)
                graph["child"] = {"id": child, "name": known.name if known else None,
                                  "status": known.status if known else None}
            if record.get("step_id") in copied:
                graph["copied"] = True
        for key, value in graph.items():
            if key != "record" and isinstance(value, (dict, list)):  # a record holds user data, no node
                _annotate_nodes(value, children, copied)
    elif isinstance(graph, list):
        for item in graph:
            _annotate_nodes(item, children, copied)


def _child_of(record: dict[str, Any]) -> str | None:
    """The child run a step record names: the one a start made (its result),
    the one a wait waits for (its argument)."""
    if record.get("name") == START_STEP and record.get("status") == STEP_DONE:
        return str(record.get("result"))
    args = record.get("args")
    if record.get("name") == CHILD_STEP and isinstance(args, list) and args:
        return str(args[0])
    return None


def _step_row(run: Run, step: StepRecord, copied: set[str]) -> dict[str, Any]:
    """A step as the run page lists it."""
    return {**step.to_dict(), "effect_uncertain": effect_uncertain(run, step), "copied": step.step_id in copied}


def resolve_command(run_id: str, step_id: str) -> str:
    return f"everystep resolve-step {run_id} {step_id} --result JSON | --error MESSAGE | --discard"


def _limit(value: Any) -> int:
    if value in (None, ""):
        return DEFAULT_PAGE
    try:
        limit = int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"limit must be a number from 1 to {MAX_PAGE}") from None
    if not 1 <= limit <= MAX_PAGE:
        raise BadRequest(f"limit must be a number from 1 to {MAX_PAGE}")
    return limit


__all__ = ["BadRequest", "FILTERS", "RunFilter", "Views", "run_summary"]
