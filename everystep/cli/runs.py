"""The commands that act on runs: schedule, runs, send, resolve-step, cancel,
requeue (``show`` has a module of its own).

``schedule``, ``runs`` and ``resolve-step`` are also Django management
commands (``contrib/django/management``): their options are declared here
once (``add_*_arguments``) and shared with it.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Sequence
from typing import Any

from .. import admin, new_run, registry, retention
from ..cliutil import count, format_table, print_json, seconds
from ..errors import EverystepError, WorkflowArgumentsError
from ..models import RUN_FILTERS, RUNNING, WAITING, Run
from ..store import DebounceWindow, Store
from ..waiting import in_status, waiting_for, waits_of
from .command import Command, add_json_flag, add_run_argument, parse_json

MAX_COUNT = 1_000_000
DEFAULT_RUNS_LIMIT = 50
COUNT_CAP = 100_000


def add_schedule_arguments(parser: argparse.ArgumentParser) -> None:
    """``schedule``'s options (``manage.py everystep_schedule`` takes the same)."""
    parser.add_argument("workflow", metavar="WORKFLOW", help="registered workflow name (module.qualname)")
    parser.add_argument(  # not dest "args": Django's commands take their positionals under that name
        "args_json", nargs="?", default="[]", metavar="ARGS_JSON",
        help="a JSON array of positional arguments, or any other JSON value as the single argument (default: [])",
    )
    parser.add_argument("--idempotency-key", metavar="KEY",
                        help="schedule at most one run of this workflow with this key (default: none)")
    parser.add_argument("--count", type=count(1, MAX_COUNT), default=1, metavar="N",
                        help=f"schedule N identical runs, 1 to {MAX_COUNT:,} (default 1)")
    parser.add_argument("--json", action="store_true", help="print the ids as a JSON array (default: one line)")
    parser.add_argument("--app-version", metavar="V", default=None,
                        help="the code version the runs record (default: a hash of the workflow's code and steps)")
    parser.add_argument("--queue", metavar="NAME", help="the queue to put the runs in (default: the workflow's)")
    parser.add_argument("--priority", type=int, metavar="N",
                        help="larger is claimed first within the queue (default: the workflow's, else 0)")
    parser.add_argument("--concurrency-key", metavar="KEY",
                        help="the key its queue's --key-concurrency limits (default: none)")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--at", metavar="ISO8601",
                      help="not before this time, with its offset: 2030-01-01T09:00+01:00 (default: now)")
    when.add_argument("--in", dest="in_", metavar="DURATION",
                      help="not before this long from now: 90s, 10m, 2h, 30d (default: now)")
    parser.add_argument("--debounce", metavar="KEY:PERIOD[:MAX]",
                        help="fold this call into the run of KEY (per workflow) that waits for its window: the run "
                             "starts once KEY has had no call for PERIOD seconds, at most MAX seconds after the "
                             "window's first call (default: no bound); the last call's arguments win. The key is "
                             "what precedes the last one or two numbers (a key ending in :<number> needs MAX)")
    ends = parser.add_mutually_exclusive_group()
    ends.add_argument("--timeout", type=seconds(0.001), metavar="S",
                      help="cancel each run still unfinished S seconds after it is scheduled "
                           "(default: the workflow's @workflow(timeout=), else none)")
    ends.add_argument("--deadline", metavar="ISO8601",
                      help="cancel each run still unfinished at this time, with its offset: "
                           "2030-01-01T18:00+01:00 (default: as --timeout)")


def cmd_schedule(store: Store, args: argparse.Namespace) -> int:
    if registry.get_workflow(args.workflow) is None:
        known = ", ".join(registry.workflow_names()) or "none (pass --app MODULE)"
        raise EverystepError(f"unknown workflow {args.workflow!r}; registered: {known}")
    value = parse_json(args.args_json, "ARGS_JSON")
    positional = value if isinstance(value, list) else [value]
    if args.idempotency_key is not None:
        # An empty key is almost always an unset shell variable: it would
        # silently merge every run scheduled that way into the first one.
        if not args.idempotency_key:
            raise EverystepError("--idempotency-key must not be empty")
        if args.count > 1:
            raise EverystepError("--idempotency-key schedules one run; it cannot be combined with --count")
    debounce = parse_debounce(args.debounce) if args.debounce is not None else None
    if debounce is not None and args.count > 1:
        raise EverystepError("--debounce folds each call into one run; it cannot be combined with --count")
    if debounce is not None and args.idempotency_key is not None:
        raise EverystepError("--debounce cannot be combined with --idempotency-key (a debounce key already makes one "
                             "run per window)")
    if debounce is not None and (args.at is not None or args.in_ is not None):
        raise EverystepError("--debounce decides when the run starts; it cannot be combined with --at or --in")
    try:
        new = new_run.decide(args.workflow, positional, idempotency_key=args.idempotency_key,
                             run_at=_not_before(args.at, args.in_), queue=args.queue, priority=args.priority,
                             concurrency_key=args.concurrency_key, app_version=args.app_version or None,
                             deadline=_iso_time(args.deadline, "--deadline"), timeout=args.timeout, what="ARGS_JSON",
                             debounce=debounce)
    except WorkflowArgumentsError as exc:
        raise EverystepError(f"{exc} (ARGS_JSON is the JSON array of its positional arguments: "
                             "'[[1, 2]]' passes one list)") from None
    runs = [new_run.schedule(store, new) for _ in range(args.count)]
    if args.json:
        print_json([run.id for run in runs])
    elif debounce is not None:
        run = runs[0]
        window = DebounceWindow(debounce.key, run.debounce_calls or 1)
        print(f"{run.id} {waiting_for(run, [], debounce=window) or 'due now (its max_wait has passed)'}")
    elif len(runs) == 1:
        print(runs[0].id)
    else:
        print(f"scheduled {len(runs)} runs of {args.workflow} ({runs[0].id} … {runs[-1].id}; --json lists every id)")
    return 0


def parse_debounce(text: str) -> new_run.Debounce:
    """``--debounce KEY:PERIOD[:MAX]`` (seconds): the key is what precedes
    the last one or two numbers; checked whole by ``Debounce.checked``."""
    parts = text.rsplit(":", 2)
    numbers: list[float] = []
    for part in reversed(parts[1:]):
        try:
            numbers.insert(0, float(part))
        except ValueError:
            break
    if not numbers or len(numbers) == len(parts):
        raise EverystepError(f"--debounce {text!r}: give KEY:PERIOD[:MAX], PERIOD and MAX in seconds (e.g. "
                             "user-42:5:60)")
    key = ":".join(parts[:len(parts) - len(numbers)])
    if len(numbers) == 1:
        return new_run.Debounce(key, numbers[0]).checked()
    return new_run.Debounce(key, numbers[0], numbers[1]).checked()


def _not_before(at: str | None, within: str | None) -> dt.datetime | None:
    """``--at ISO8601`` (an offset is required) or ``--in DURATION``."""
    if within is not None:
        return dt.datetime.now(dt.timezone.utc) + retention.parse_duration(within)
    return _iso_time(at, "--at")


def _iso_time(text: str | None, option: str) -> dt.datetime | None:
    """An ISO 8601 time given on the command line, with its offset (required)."""
    if text is None:
        return None
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise EverystepError(f"{option} {text!r} is not an ISO 8601 time (e.g. 2030-01-01T09:00:00+01:00)") from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise EverystepError(f"{option} {text!r} has no time zone offset: add one (+01:00, Z), so it means one "
                             "moment")
    return when.astimezone(dt.timezone.utc)


def add_runs_arguments(parser: argparse.ArgumentParser, version_options: Sequence[str] = ("--version",)) -> None:
    """``runs``' options; a host whose parser has ``--version`` of its own
    (Django's commands) names the version filter otherwise."""
    # Plain strings: argparse lists the choices with repr() when refusing one.
    parser.add_argument("--status", choices=[str(status) for status in RUN_FILTERS], metavar="STATUS",
                        help=f"only runs in this status: {', '.join(RUN_FILTERS)} ({WAITING}: the scheduled runs "
                        "not due yet, waiting for a message, a child, a sleep, a retry, a debounce window or a "
                        "delayed start; "
                        "default: all)")
    parser.add_argument("--workflow", metavar="NAME", help="only runs of this workflow (default: all)")
    parser.add_argument("--parent", metavar="RUN",
                        help="only the child runs this run (its id or a unique prefix) started (default: all)")
    parser.add_argument(*version_options, dest="version", metavar="V", default=None,
                        help="only runs started under this code version (default: all)")
    parser.add_argument("--limit", type=count(1, 100_000), default=DEFAULT_RUNS_LIMIT, metavar="N",
                        help=f"show at most N runs (default {DEFAULT_RUNS_LIMIT})")
    add_json_flag(parser)


def _age(run: Run) -> str:
    return run.created_at.strftime("%Y-%m-%d %H:%M:%S") if run.created_at else ""


def cmd_runs(store: Store, args: argparse.Namespace) -> int:
    if getattr(args, "parent", None):
        parent = store.find_run(args.parent)
        now = dt.datetime.now(dt.timezone.utc)
        runs = [run for run in store.children(parent.id, limit=100_000)
                if (args.status is None or in_status(run, args.status, now))
                and (args.workflow is None or run.name == args.workflow)
                and (args.version is None or run.app_version == args.version)]
        truncated = False
        runs = runs[:args.limit]
    else:
        runs = store.list_runs(status=args.status, name=args.workflow, limit=args.limit + 1, version=args.version)
        truncated = len(runs) > args.limit
        runs = runs[:args.limit]
    waits = waits_of(store, runs)
    if args.json:
        print_json([{**run.to_dict(), "waiting": waits.get(run.id)} for run in runs])
        return 0
    rows = [(run.id, run.status + (f" ({waits[run.id]})" if run.id in waits else ""), run.name,
             run.app_version or "-", run.claimed_by or "", _age(run)) for run in runs]
    print(format_table(("RUN", "STATUS", "WORKFLOW", "VERSION", "CLAIMED BY", "CREATED (UTC)"), rows))
    if truncated:
        total = store.count_runs(args.status, args.workflow, cap=COUNT_CAP, version=args.version)
        of = f"more than {COUNT_CAP:,}" if total >= COUNT_CAP else f"{total:,}"
        print(f"showing the newest {len(runs)} of {of} runs (--limit N shows more)")
    return 0


def _send_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_argument(parser)
    parser.add_argument("topic", metavar="TOPIC", help="the topic recv waits on")
    parser.add_argument("payload", metavar="JSON", help="the message, any JSON value")
    parser.add_argument("--key", metavar="K",
                        help="idempotency key: a second send with it stores nothing (default: none)")


def cmd_send(store: Store, args: argparse.Namespace) -> int:
    run = store.find_run(args.run_id)
    payload = parse_json(args.payload, "the message")
    if args.key is not None and not args.key:
        raise EverystepError("--key must not be empty")
    _sent, line = admin.send(store, run.id, args.topic, payload, args.key)
    print(line)
    return 0


def add_resolve_step_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_argument(parser, "the blocked run")
    parser.add_argument("step_id", metavar="STEP", help="its started step (the id the block names)")
    choice = parser.add_mutually_exclusive_group(required=True)
    choice.add_argument("--result", metavar="JSON", help="the effect happened; record this JSON value as its result")
    choice.add_argument("--error", metavar="MESSAGE", help="the effect happened and failed; record this failure")
    choice.add_argument("--discard", action="store_true", help="the effect did not happen; run the step again")


def cmd_resolve_step(store: Store, args: argparse.Namespace) -> int:
    options: dict[str, Any] = {}
    if args.result is not None:
        options["result"] = parse_json(args.result, "--result")
    elif args.error is not None:
        options["error"] = args.error
    else:
        options["discard"] = True
    run = admin.resolve_step(store, store.find_run(args.run_id).id, args.step_id, **options)
    print(f"run {run.id} resolved at step {args.step_id}; now {run.status}")
    return 0


def _cancel_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_argument(parser)
    parser.add_argument("--reason", metavar="TEXT", help="why (stored as the run's error) (default: none)")


def cmd_cancel(store: Store, args: argparse.Namespace) -> int:
    before = store.find_run(args.run_id)
    done = admin.cancel_counting(store, before.id, args.reason)
    if before.status == RUNNING and before.claimed_by:
        print(f"run {done.run.id} cancelled{done.cascade_phrase()}; it was running under {before.claimed_by}: "
              "a supervisor kills its child now, a threaded worker stops at the next step boundary")
    else:
        print(f"run {done.run.id} cancelled (it was {before.status}){done.cascade_phrase()}")
    return 0


def _requeue_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_argument(parser)
    parser.add_argument("--force", action="store_true",
                        help="requeue even though its runner is alive; that execution is fenced (its writes are "
                             "refused) and a supervisor kills its child (default: off)")


def cmd_requeue(store: Store, args: argparse.Namespace) -> int:
    run = admin.requeue_run(store, store.find_run(args.run_id).id, force=args.force)
    print(f"run {run.id} is {run.status}")
    return 0


SCHEDULE = Command(
    "schedule", "schedule runs of a workflow",
    "Insert scheduled runs of WORKFLOW (committed at once); prints the run id, or every id with --json.",
    cmd_schedule, add_schedule_arguments)
RUNS = Command(
    "runs", "list runs, newest first",
    "List runs, newest first; says how many more match when the list is cut at --limit.",
    cmd_runs, add_runs_arguments)
SEND = Command(
    "send", "send a message to a run (everystep.recv receives it)",
    "Store a message for RUN on TOPIC; a run waiting in recv on that topic resumes. Refused, storing nothing, for a "
    "run that is unknown, finished or cancelled.",
    cmd_send, _send_arguments)
RESOLVE_STEP = Command(
    "resolve-step", "resolve the uncertain step of a blocked run",
    "Record what happened to the unsafe step a blocked run stopped at, and schedule the run again.",
    cmd_resolve_step, add_resolve_step_arguments)
CANCEL = Command(
    "cancel", "cancel a run that is not finished (it ends 'cancelled')",
    "Cancel a scheduled, sleeping, retry-waiting, blocked or running run: it ends 'cancelled' at once; a supervisor "
    "executing it kills its child within a second (a poll on SQLite).",
    cmd_cancel, _cancel_arguments)
REQUEUE = Command(
    "requeue", "put a run parked 'running' by a dead runner back in the queue",
    "Put a running run whose runner is dead back in the queue; a live runner's run only with --force.",
    cmd_requeue, _requeue_arguments)

__all__ = ["CANCEL", "REQUEUE", "RESOLVE_STEP", "RUNS", "SCHEDULE", "SEND", "add_resolve_step_arguments",
           "add_runs_arguments", "add_schedule_arguments", "cmd_resolve_step", "cmd_runs", "cmd_schedule"]
