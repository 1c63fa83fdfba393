"""The ``everystep`` command: migrate, schedule, inspect, resolve, run a worker.

Every command takes ``--database URL`` (else ``EVERYSTEP_DATABASE_URL``, else
``sqlite:///everystep.db``) and ``--app MODULE[,MODULE]`` to import the
user's workflows, before the command or after it. Bad input prints one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from . import (admin, dryrun, histories, history_bound, new_run, patches, queue_commands, registry, relay, resources,
               retention, serde, versions)
from .cliutil import (
    EXIT_CODES,
    EXIT_UNAVAILABLE,
    LOG_LEVELS,
    PORT,
    OneLineParser,
    add_logging_arguments,
    count,
    exit_codes_epilog,
    queue_list,
    fail,
    format_table,
    print_json,
    seconds,
    setup_logging,
    version,
)
from .context import step_sort_key
from .errors import EverystepError, StoreMisconfigured, StoreUnavailable, WorkflowArgumentsError
from .cron import CronSchedule
from .models import (
    PRUNABLE_STATUSES, RUN_FILTERS, RUNNING, STEP_AWAITING, STEP_DONE, STEP_RETRYING, STEP_SLEEPING, WAITING,
    Run, StepRecord,
)
from .observer import Observer
from .store import Store, connect
from .waiting import describe_wait, effect_uncertain, ended_wait, in_status, waiting_for, waits_of
from .lease import DEFAULT_LEASE
from .worker import Worker, refuse_step_limits

MAX_COUNT = 1_000_000
#: The runner kind a supervisor registers under: the only one that answers
#: ``remote`` requests.
SUPERVISOR = "supervisor"
DEFAULT_RUNS_LIMIT = 50


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database", metavar="URL",
                        help="database URL (default: $EVERYSTEP_DATABASE_URL, else sqlite:///everystep.db)")
    parser.add_argument("-A", "--app", metavar="MODULE[,MODULE]",
                        help="import these modules to register workflows (default: none)")


def _command(commands: Any, name: str, summary: str, description: str) -> OneLineParser:
    sub: OneLineParser = commands.add_parser(name, help=summary, description=description)
    _common(sub)
    return sub


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="everystep", description="Durable workflows recorded step by step in SQL.",
        epilog=exit_codes_epilog(EXIT_CODES),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    # The options every command takes are accepted before the command too
    # (`everystep -A myapp runs`, as `celery -A proj worker`).
    _common(parser)
    parser.add_argument("-l", "--log-level", default="info", choices=LOG_LEVELS, metavar="LEVEL",
                        help=f"for worker and ui: one of {', '.join(LOG_LEVELS)} (default info)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    commands.required = True

    _command(commands, "migrate", "create or upgrade the schema (idempotent)",
             "Apply the schema versions the database lacks; safe to run concurrently and again. "
             "A SQLite database migrates itself when first opened.")

    sub = _command(commands, "schedule", "schedule runs of a workflow",
                   "Insert scheduled runs of WORKFLOW (committed at once); prints the run id, or every id with "
                   "--json.")
    add_schedule_arguments(sub)

    queue_commands.add_parsers(commands, _command)

    sub = _command(commands, "runs", "list runs, newest first",
                   "List runs, newest first; says how many more match when the list is cut at --limit.")
    add_runs_arguments(sub)

    sub = _command(commands, "show", "show a run and its recorded steps",
                   "A run (args, result, error with its traceback) and its steps, a page at a time: --limit of "
                   "them in the order they were recorded, from the first or those after --after, listed in "
                   "step-id order.")
    add_run_argument(sub)
    sub.add_argument("--json", action="store_true", help="print JSON (default: text)")
    sub.add_argument("--limit", type=count(0, 1_000_000), default=SHOW_STEPS, metavar="N",
                     help=f"steps shown, 0 for all (default {SHOW_STEPS})")
    sub.add_argument("--after", metavar="STEP", default=None,
                     help="show the steps recorded after this one: the last of the page before (default: from "
                          "the first)")

    sub = _command(commands, "send", "send a message to a run (everystep.recv receives it)",
                   "Store a message for RUN on TOPIC; a run waiting in recv on that topic resumes. Refused, "
                   "storing nothing, for a run that is unknown, finished or cancelled.")
    add_run_argument(sub)
    sub.add_argument("topic", metavar="TOPIC", help="the topic recv waits on")
    sub.add_argument("payload", metavar="JSON", help="the message, any JSON value")
    sub.add_argument("--key", metavar="K",
                     help="idempotency key: a second send with it stores nothing (default: none)")

    sub = _command(commands, "resolve-step", "resolve the uncertain step of a blocked run",
                   "Record what happened to the unsafe step a blocked run stopped at, and schedule the run again.")
    add_resolve_step_arguments(sub)

    sub = _command(commands, "fork", "start a new run from a recorded step of a run, with the code in --app",
                   "A new run of RUN's workflow: the steps RUN recorded before --from-step are copied (their "
                   "results replayed, never re-run) and everything from that step on is executed by the code "
                   "deployed now. Repairs a run a bad deploy failed: fix the code, fork it from the failed step.")
    add_run_argument(sub, "the run to fork")
    sub.add_argument("--from-step", required=True, metavar="ID", help="the first step the fork executes")
    sub.add_argument("--args", metavar="JSON", default=None,
                     help="replace the run's arguments (a JSON list of positional arguments, or one value) "
                          "(default: RUN's own)")
    sub.add_argument("--force", action="store_true",
                     help="fork a run that is not finished (scheduled, waiting, running, blocked): the fork is a "
                          "second live run beside it (default: refused)")
    sub.add_argument("--json", action="store_true", help="print the new run as JSON (default: one line)")

    sub = _command(commands, "replay", "replay a recorded run here, against its records, writing nothing",
                   "Replay RUN's body in this process with the code in --app against its recorded steps, through "
                   "a read-only connection (a read replica will do), printing each step as it is matched: its "
                   "recorded outcome, or where and why the code diverges. Never executes a step. Exit 1 if the "
                   "code diverges from the records.")
    add_run_argument(sub)
    sub.add_argument("--pdb", action="store_true",
                     help="stop in the debugger at the first divergence, or at --until-step (default: off)")
    sub.add_argument("--until-step", metavar="ID", default=None,
                     help="stop the replay before step ID (in the debugger with --pdb) (default: replay it all)")

    sub = _command(commands, "cancel", "cancel a run that is not finished (it ends 'cancelled')",
                   "Cancel a scheduled, sleeping, retry-waiting, blocked or running run: it ends 'cancelled' at "
                   "once; a supervisor executing it kills its child within a second (a poll on SQLite).")
    add_run_argument(sub)
    sub.add_argument("--reason", metavar="TEXT", help="why (stored as the run's error) (default: none)")

    sub = _command(commands, "schedules", "list the periodic (cron) workflows in --app, their last and next tick",
                   "The periodic workflows the --app modules declare, with their last and next tick.")
    sub.add_argument("--json", action="store_true", help="print JSON (default: a table)")

    sub = _command(commands, "requeue", "put a run parked 'running' by a dead runner back in the queue",
                   "Put a running run whose runner is dead back in the queue; a live runner's run only with "
                   "--force.")
    add_run_argument(sub)
    sub.add_argument("--force", action="store_true",
                     help="requeue even though its runner is alive; that execution is fenced (its writes are "
                          "refused) and a supervisor kills its child (default: off)")

    sub = _command(commands, "runners", "list live runners, their heartbeats and what they hold",
                   "Every registered supervisor and worker: host, pid, heartbeat age, lease, runs held.")
    sub.add_argument("--json", action="store_true", help="print JSON (default: a table)")

    sub = _command(commands, "check-deploy", "dry-replay every unfinished run against the code in --app",
                   "Replay each unfinished run's body against its recorded steps with the code in --app, never "
                   "executing a step. Exit 1 if any would fail: code_error (a step id now calls another "
                   "function: WorkflowCodeError), missing (its workflow is gone), fails (code between steps "
                   "raises on the recorded results) or timeout (the replay did not stop within --timeout); "
                   "0 otherwise.")
    sub.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    sub.add_argument("--all", action="store_true",
                     help="list every run checked, not only those that would fail (default: off)")
    sub.add_argument("--timeout", type=seconds(0.01, 3600), default=dryrun.DEFAULT_TIMEOUT, metavar="S",
                     help=f"give up on one run's replay after S seconds (default {dryrun.DEFAULT_TIMEOUT:g})")

    sub = _command(commands, "remote", "send a command to a supervisor on any host, through the database",
                   f"Send {', '.join(relay.COMMANDS[:-1])} or {relay.COMMANDS[-1]} to the supervisor holding RUNNER, "
                   "through a request row (and NOTIFY on PostgreSQL), and print its reply.")
    sub.add_argument("runner", metavar="RUNNER", help="the supervisor's runner name (see 'everystep runners')")
    sub.add_argument("remote_command", metavar="COMMAND", choices=relay.COMMANDS,
                     help=f"one of: {', '.join(relay.COMMANDS)}")
    sub.add_argument("target", nargs="?", metavar="RUN|N",
                     help="kill: the run (its id or a unique prefix); scale: the number of children")
    sub.add_argument("--requeue", action="store_true", help="kill: put the run back in the queue (default: off)")
    sub.add_argument("--timeout", type=seconds(0.1, 3600), default=relay.REPLY_TIMEOUT, metavar="S",
                     help=f"how long to wait for the reply (default {relay.REPLY_TIMEOUT:g})")
    sub.add_argument("--json", action="store_true", help="print JSON (default: a line)")

    sub = _command(commands, "ui", "serve the operations console (needs the ui extra)",
                   "Serve the web console: runs, step graphs, runners, blocked runs and the operator's actions.")
    sub.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                     help="address to listen on (default 127.0.0.1; any other needs --auth-token)")
    sub.add_argument("--port", type=PORT, default=8765, metavar="PORT",
                     help="port, 0 to pick a free one (default 8765)")
    sub.add_argument("--auth-token", metavar="TOKEN", default=None,
                     help="require this token (Bearer, or as the basic-auth password) "
                          "(default: $EVERYSTEP_UI_AUTH_TOKEN, else none)")
    sub.add_argument("--read-database", metavar="URL", default=None,
                     help="a read replica the pages read from (read-only sessions); actions still go to "
                          "--database, the primary (default: --database)")
    sub.add_argument("-l", "--log-level", default="info", choices=LOG_LEVELS, metavar="LEVEL",
                     help=f"one of {', '.join(LOG_LEVELS)} (default info)")

    sub = _command(commands, "prune", "delete finished runs and their steps older than a duration",
                   "Delete finished runs (and their steps) in bounded batches; never a scheduled, running or "
                   "blocked run.")
    sub.add_argument("--older-than", required=True, metavar="DURATION",
                     help="runs finished longer ago than this: 90s, 10m, 2h, 30d (required)")
    sub.add_argument("--status", default=",".join(PRUNABLE_STATUSES), metavar="S[,S]",
                     help=f"which finished runs (default {','.join(PRUNABLE_STATUSES)}); "
                          "scheduled, running and blocked runs are never pruned")
    sub.add_argument("--batch", type=count(1, retention.MAX_BATCH), default=retention.DEFAULT_BATCH, metavar="N",
                     help=f"runs deleted per transaction, 1 to {retention.MAX_BATCH:,} "
                          f"(default {retention.DEFAULT_BATCH:,})")
    sub.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")

    sub = _command(commands, "worker", "run a threaded worker (embedded mode)",
                   "Claim runs and execute them on a thread pool in this process (the supervisor is the runner "
                   "for CPU-bound work and step timeouts).")
    add_worker_arguments(sub)
    _given_before_or_after(commands)
    return parser


#: Options taken before the command as well as after it.
GLOBAL_OPTIONS = ("database", "app", "log_level")


def _given_before_or_after(commands: argparse._SubParsersAction[OneLineParser]) -> None:
    """A command's own copy of a global option must not reset what was
    given before the command: argparse copies every default of the
    command's parser over the values parsed before it. Without a default
    (SUPPRESS), an option given after the command still wins, one given
    before stays, and one given nowhere keeps the top-level default."""
    for parser in commands.choices.values():
        for action in parser._actions:
            if action.dest in GLOBAL_OPTIONS:
                action.default = argparse.SUPPRESS
            elif isinstance(action, argparse._SubParsersAction):
                _given_before_or_after(action)


# The options of the commands a host framework also exposes (Django's
# management commands), declared once here and shared with it.


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
    ends = parser.add_mutually_exclusive_group()
    ends.add_argument("--timeout", type=seconds(0.001), metavar="S",
                      help="cancel each run still unfinished S seconds after it is scheduled "
                           "(default: the workflow's @workflow(timeout=), else none)")
    ends.add_argument("--deadline", metavar="ISO8601",
                      help="cancel each run still unfinished at this time, with its offset: "
                           "2030-01-01T18:00+01:00 (default: as --timeout)")


def add_runs_arguments(parser: argparse.ArgumentParser, version_options: Sequence[str] = ("--version",)) -> None:
    """``runs``' options; a host whose parser has ``--version`` of its own
    (Django's commands) names the version filter otherwise."""
    # Plain strings: argparse lists the choices with repr() when refusing one.
    parser.add_argument("--status", choices=[str(status) for status in RUN_FILTERS], metavar="STATUS",
                        help=f"only runs in this status: {', '.join(RUN_FILTERS)} ({WAITING}: the scheduled runs "
                        "not due yet, waiting for a message, a child, a sleep, a retry or a delayed start; "
                        "default: all)")
    parser.add_argument("--workflow", metavar="NAME", help="only runs of this workflow (default: all)")
    parser.add_argument("--parent", metavar="RUN",
                        help="only the child runs this run (its id or a unique prefix) started (default: all)")
    parser.add_argument(*version_options, dest="version", metavar="V", default=None,
                        help="only runs started under this code version (default: all)")
    parser.add_argument("--limit", type=count(1, 100_000), default=DEFAULT_RUNS_LIMIT, metavar="N",
                        help=f"show at most N runs (default {DEFAULT_RUNS_LIMIT})")
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")


def add_run_argument(parser: argparse.ArgumentParser, what: str = "the run") -> None:
    """The ``RUN`` argument of every command that acts on one run: an id or
    a unique prefix of it, which the command resolves with ``Store.find_run``
    before anything else (one resolver, so every command takes what ``show``
    takes)."""
    parser.add_argument("run_id", metavar="RUN", help=f"{what}: its id, or a unique prefix of it (like git)")


def add_resolve_step_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_argument(parser, "the blocked run")
    parser.add_argument("step_id", metavar="STEP", help="its started step (the id the block names)")
    choice = parser.add_mutually_exclusive_group(required=True)
    choice.add_argument("--result", metavar="JSON", help="the effect happened; record this JSON value as its result")
    choice.add_argument("--error", metavar="MESSAGE", help="the effect happened and failed; record this failure")
    choice.add_argument("--discard", action="store_true", help="the effect did not happen; run the step again")


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--pool", type=count(1, 1024), default=4, metavar="N",
                        help="threads executing runs, 1 to 1024 (default 4)")
    parser.add_argument("--async-runs", type=count(1, 100000), default=100, metavar="N",
                        help="async runs held at once on the worker's one event loop, beside the threads "
                             "(default 100)")
    parser.add_argument("--poll", type=seconds(0.01, 3600), default=0.2, metavar="S",
                        help="seconds between claims when idle; a fallback to LISTEN/NOTIFY on PostgreSQL "
                             "(default 0.2)")
    parser.add_argument("--listen-database", metavar="URL", default=None,
                        help="PostgreSQL URL to LISTEN on for new runs: a direct one when --database goes through "
                             "a transaction pooler (?pooler=transaction), which cannot carry LISTEN (default: "
                             "$EVERYSTEP_LISTEN_DATABASE_URL, else --database; behind a transaction pooler "
                             "without one, pickup is by polling)")
    parser.add_argument("-n", "--name", metavar="NAME",
                        help="runner name, stable across restarts; refused while a live runner holds it "
                             "(default: the hostname)")
    parser.add_argument("--queues", type=queue_list, default=None, metavar="NAME[,NAME]",
                        help="claim only from these queues (default: every queue)")
    parser.add_argument("--app-version", metavar="V", default=None,
                        help="the code version runs scheduled here record (periodic ticks) (default: a hash of "
                             "each workflow's code and steps)")
    parser.add_argument("--takeover", action="store_true",
                        help="take the runner name even though its holder looks alive (it is gone for good, "
                             "e.g. a frozen VM); its runs are fenced (default: off)")
    parser.add_argument("--drain", type=seconds(0), default=30.0, metavar="S",
                        help="seconds a stop waits for runs in flight (default 30)")
    parser.add_argument("--lease", type=seconds(1), default=DEFAULT_LEASE, metavar="S",
                        help="heartbeat lease: runners silent longer than S seconds have their runs requeued "
                             f"(default {DEFAULT_LEASE:g})")
    parser.add_argument("--metrics-port", type=PORT, default=0, metavar="PORT",
                        help="serve /metrics and /healthz on this port, 1 to 65535 (default 0: off)")
    parser.add_argument("--metrics-bind", default="0.0.0.0", metavar="ADDR",
                        help="address for --metrics-port (default 0.0.0.0)")
    parser.add_argument("--history-warning", type=count(0, 10**9), default=None, metavar="N",
                        help=history_bound.OPTION_HELP)
    add_logging_arguments(parser)
    # everystep-supervisor's options, refused here with the reason rather
    # than as unrecognized.
    for flag in WORKER_REFUSED:
        parser.add_argument(flag, default=None, help=argparse.SUPPRESS)


#: Options of everystep-supervisor the threaded worker cannot honour.
WORKER_REFUSED = ("--step-memory-limit", "--step-cpu-limit")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        registry.import_apps(args.app)
        return _dispatch(args)
    except StoreMisconfigured as exc:
        fail(str(exc))  # no waiting fixes it: a bad command line, in effect
    except StoreUnavailable as exc:
        fail(str(exc), code=EXIT_UNAVAILABLE)
    except EverystepError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "replay":
        return cmd_replay(connect(args.database, read_only=True), args)
    store = connect(args.database, listen_url=getattr(args, "listen_database", None))
    handler = {
        "migrate": cmd_migrate,
        "schedule": cmd_schedule,
        "runs": cmd_runs,
        "show": cmd_show,
        "send": cmd_send,
        "resolve-step": cmd_resolve_step,
        "cancel": cmd_cancel,
        "fork": cmd_fork,
        "schedules": cmd_schedules,
        "requeue": cmd_requeue,
        "runners": cmd_runners,
        "prune": cmd_prune,
        "worker": cmd_worker,
        "check-deploy": cmd_check_deploy,
        "remote": cmd_remote,
        "ui": cmd_ui,
        "queue": queue_commands.cmd_queue,
        "queues": queue_commands.cmd_queues,
    }[args.command]
    return handler(store, args)


def cmd_migrate(store: Store, args: argparse.Namespace) -> int:
    applied = store.migrate()
    version = store.schema_version()
    # A fresh SQLite file migrates itself when opened, so there may be
    # nothing left to apply here: say where the schema stands either way.
    print(f"applied {', '.join(applied)}; schema at version {version}" if applied
          else f"schema is up to date (version {version})")
    return 0


def parse_json(text: str, what: str) -> Any:
    try:
        return serde.from_jsonable(json.loads(text))
    except (ValueError, EverystepError) as exc:
        raise EverystepError(f"{what} is not valid JSON: {exc}") from None


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
    try:
        new = new_run.decide(args.workflow, positional, idempotency_key=args.idempotency_key,
                             run_at=_not_before(args.at, args.in_), queue=args.queue, priority=args.priority,
                             concurrency_key=args.concurrency_key, app_version=args.app_version or None,
                             deadline=_iso_time(args.deadline, "--deadline"), timeout=args.timeout, what="ARGS_JSON")
    except WorkflowArgumentsError as exc:
        raise EverystepError(f"{exc} (ARGS_JSON is the JSON array of its positional arguments: "
                             "'[[1, 2]]' passes one list)") from None
    runs = [new_run.schedule(store, new) for _ in range(args.count)]
    if args.json:
        print_json([run.id for run in runs])
    elif len(runs) == 1:
        print(runs[0].id)
    else:
        print(f"scheduled {len(runs)} runs of {args.workflow} ({runs[0].id} … {runs[-1].id}; --json lists every id)")
    return 0


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


def _age(run: Run) -> str:
    return run.created_at.strftime("%Y-%m-%d %H:%M:%S") if run.created_at else ""


COUNT_CAP = 100_000


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


def cmd_send(store: Store, args: argparse.Namespace) -> int:
    run = store.find_run(args.run_id)
    payload = parse_json(args.payload, "the message")
    if args.key is not None and not args.key:
        raise EverystepError("--key must not be empty")
    _sent, line = admin.send(store, run.id, args.topic, payload, args.key)
    print(line)
    return 0


def _describe_error(error: dict[str, Any] | None) -> str:
    if not error:
        return ""
    return f"{error.get('type', '?')}: {error.get('message', '')}"


#: The steps ``show`` lists unless --limit says otherwise.
SHOW_STEPS = 100


def cmd_show(store: Store, args: argparse.Namespace) -> int:
    run = store.find_run(args.run_id)
    page = histories.read_page(store, run.id, args.after, args.limit or None)
    steps = sorted(page.steps, key=lambda step: step_sort_key(step.step_id))
    waiting = waiting_for(run, store.steps_of_runs([run.id], waiting_only=True)[run.id])
    cost = store.run_cost(run.id)
    forks = store.forks_of(run.id)
    if args.json:
        links = store.links(run.id)
        print_json({"run": {**run.to_dict(), "waiting": waiting, "forks": [fork.id for fork in forks],
                            "parent_id": links.parent_id,
                            "deadline": links.deadline.isoformat() if links.deadline else None},
                    "children": [{"id": c.id, "status": c.status, "name": c.name} for c in store.children(run.id)],
                    "events": [event.to_dict() for event in store.events(run.id)],
                    "messages": [message.to_dict() for message in store.messages(run.id)],
                    "steps": [{**step.to_dict(), "effect_uncertain": effect_uncertain(run, step),
                               "wait_ended": ended_wait(run, step),
                               "kind": patches.KIND_PATCH if patches.is_marker(step) else "step"}
                              for step in steps],
                    "steps_total": page.total, "steps_next": page.next_after,
                    "cost": cost.to_dict() if cost is not None else None})
        return 0
    print(f"run        {run.id}")
    print(f"workflow   {run.name}")
    print(f"status     {run.status}" + (f" ({waiting})" if waiting else ""))
    print(f"args       {json.dumps(serde.to_jsonable(run.args))}")
    print(f"queue      {run.queue} (priority {run.priority}"
          + (f", concurrency key {run.concurrency_key})" if run.concurrency_key else ")"))
    if run.claimed_by:
        print(f"claimed by {run.claimed_by}")
    print(f"version    {run.app_version or '-'}")
    if run.forked_from:
        print(f"forked     forked from {run.forked_from}")
    for fork in forks:
        print(f"fork       {fork.id} ({fork.status})")
    links = store.links(run.id)
    if links.parent_id:
        print(f"parent     {links.parent_id}")
    if links.deadline:
        print(f"deadline   {links.deadline.isoformat()}")
    if run.result is not None:
        print(f"result     {json.dumps(serde.to_jsonable(run.result))}")
    if run.error:
        print(f"error      {_describe_error(run.error)}")
        for line in str(run.error.get("traceback") or "").rstrip().splitlines():
            print(f"           {line}")
    print(f"created    {run.created_at}")
    if run.completed_at:
        print(f"completed  {run.completed_at}")
    if cost is not None:
        print(f"cost       {resources.format_cpu(cost.cpu_seconds)} CPU in {cost.measured_steps} measured "
              f"step(s); largest peak RSS growth {resources.format_size(cost.peak_rss_bytes)}")
    if steps:
        print()
        rows = [_step_row(run, step) for step in steps]
        headers = ["STEP", "STATUS", "FUNCTION", "ATTEMPT", "CPU", "PEAK RSS", "OUTCOME"]
        keep = [True, True, True,
                any(step.attempt > 1 or step.status == STEP_RETRYING for step in steps),  # else 1 throughout
                cost is not None, cost is not None, True]
        print(format_table([header for header, shown in zip(headers, keep) if shown],
                           [[cell for cell, shown in zip(row, keep) if shown] for row in rows]))
        for step in steps:
            for attempt in step.attempts:
                retry = attempt.retry_at.isoformat() if attempt.retry_at else "?"
                print(f"  step {step.step_id} attempt {attempt.attempt} failed at "
                      f"{attempt.failed_at.isoformat() if attempt.failed_at else '?'}: "
                      f"{_describe_error(attempt.error)}; next attempt at {retry}")
    if len(steps) < page.total:
        print(f"{len(steps):,} of {page.total:,} steps"
              + (f", recorded after step {args.after}" if args.after else "")
              + (f"; the next ones: everystep show {run.id} --after {page.next_after}" if page.next_after else ""))
    _show_family(store, run.id)
    return 0


def _show_family(store: Store, run_id: str) -> None:
    """``show``'s sections on a run's children, events and messages."""
    children = store.children(run_id)
    if children:
        print()
        print(format_table(("CHILD", "STATUS", "WORKFLOW"), [(c.id, c.status, c.name) for c in children]))
    events = store.events(run_id)
    if events:
        print()
        print(format_table(("EVENT", "VALUE", "SET AT"), [
            (e.key, _short(json.dumps(serde.to_jsonable(e.value))), e.updated_at.isoformat() if e.updated_at else "")
            for e in events]))
    messages = store.messages(run_id)
    if messages:
        print()
        print(format_table(("MESSAGE", "TOPIC", "PAYLOAD", "CONSUMED BY STEP"), [
            (str(m.id), m.topic, _short(json.dumps(serde.to_jsonable(m.payload))), m.consumed_step or "(pending)")
            for m in messages]))


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _step_row(run: Run, step: StepRecord) -> tuple[str, str, str, str, str, str, str]:
    """STEP, STATUS, FUNCTION, ATTEMPT, CPU, PEAK RSS, OUTCOME."""
    status = str(step.status)
    if step.status == STEP_DONE:
        outcome = json.dumps(serde.to_jsonable(step.result))
        outcome = outcome if len(outcome) <= 60 else outcome[:57] + "..."
    elif step.status == STEP_SLEEPING:
        outcome = f"until {step.wake_at.isoformat() if step.wake_at else '?'}"
    elif step.status == STEP_AWAITING:
        outcome = describe_wait(step)
    elif step.status == STEP_RETRYING:
        outcome = (f"{_describe_error(step.error)}; attempt {step.attempt + 1} at "
                   f"{step.wake_at.isoformat() if step.wake_at else '?'}")
    else:
        outcome = _describe_error(step.error)
    if effect_uncertain(run, step):
        status = "started (effect uncertain)"
    ended = ended_wait(run, step)
    if ended is not None:
        status, outcome = f"{step.status} (ended)", ended
    cpu = resources.format_cpu(step.cpu_seconds) if step.cpu_seconds is not None else "-"
    rss = resources.format_size(step.peak_rss_bytes) if step.peak_rss_bytes is not None else "-"
    return step.step_id, status, step.name, str(step.attempt), cpu, rss, outcome


def cmd_replay(store: Store, args: argparse.Namespace) -> int:
    from .local_replay import replay_run

    try:
        return replay_run(store, args.run_id, sys.stdout, until=args.until_step, debugger=args.pdb)
    finally:
        store.close()


def cmd_fork(store: Store, args: argparse.Namespace) -> int:
    options: dict[str, Any] = {}
    if args.args is not None:
        options["args"] = parse_json(args.args, "--args")
    try:
        run, copied = admin.fork(store, store.find_run(args.run_id).id, args.from_step, force=args.force, **options)
    except WorkflowArgumentsError as exc:
        raise WorkflowArgumentsError(f"{exc} (--args is the JSON array of its positional arguments: '[[1, 2]]' "
                                     "passes one list)") from None
    if args.json:
        print_json({**run.to_dict(), "copied_steps": copied})
    else:
        print(f"run {run.id} forked from {run.forked_from} at step {args.from_step} ({copied} step(s) copied); "
              f"now {run.status}")
    return 0


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


def cmd_cancel(store: Store, args: argparse.Namespace) -> int:
    before = store.find_run(args.run_id)
    done = admin.cancel_counting(store, before.id, args.reason)
    if before.status == RUNNING and before.claimed_by:
        print(f"run {done.run.id} cancelled{done.cascade_phrase()}; it was running under {before.claimed_by}: "
              "a supervisor kills its child now, a threaded worker stops at the next step boundary")
    else:
        print(f"run {done.run.id} cancelled (it was {before.status}){done.cascade_phrase()}")
    return 0


def cmd_schedules(store: Store, args: argparse.Namespace) -> int:
    periodic: dict[str, CronSchedule] = registry.schedules()
    if not args.app:
        raise EverystepError("schedules needs --app MODULE[,MODULE]: the code that declares the periodic workflows")
    ticks = store.cron_ticks(sorted(periodic))
    now = dt.datetime.now(dt.timezone.utc)
    entries = []
    for name, schedule in periodic.items():
        last = ticks.get(name)
        entries.append({
            "workflow": name, "cron": schedule.expr, "timezone": schedule.timezone,
            "last_tick": last[0].isoformat() if last else None, "last_run": last[1] if last else None,
            "last_status": last[2] if last else None, "next_tick": schedule.next_after(now).isoformat(),
        })
    if args.json:
        print_json(entries)
        return 0
    if not entries:
        print("no periodic workflows in " + args.app)
        return 0
    rows = [(entry["workflow"], entry["cron"], entry["timezone"], entry["last_tick"] or "never",
             entry["last_status"] or "", entry["next_tick"]) for entry in entries]
    print(format_table(("WORKFLOW", "CRON", "TIMEZONE", "LAST TICK (UTC)", "LAST RUN", "NEXT TICK (UTC)"), rows))
    return 0


def cmd_requeue(store: Store, args: argparse.Namespace) -> int:
    run = admin.requeue_run(store, store.find_run(args.run_id).id, force=args.force)
    print(f"run {run.id} is {run.status}")
    return 0


def cmd_runners(store: Store, args: argparse.Namespace) -> int:
    runners = store.list_runners()
    if args.json:
        print_json([{**vars(runner), "expired": runner.expired} for runner in runners])
        return 0
    rows = [
        (runner.name, runner.kind, runner.host, runner.pid, f"{runner.silent_seconds:.1f}s ago",
         f"{runner.lease_seconds:g}s", "EXPIRED" if runner.expired else "alive", runner.running)
        for runner in runners
    ]
    print(format_table(("NAME", "KIND", "HOST", "PID", "HEARTBEAT", "LEASE", "STATE", "RUNNING"), rows))
    return 0


def cmd_prune(store: Store, args: argparse.Namespace) -> int:
    older_than = retention.parse_duration(args.older_than)
    statuses = retention.parse_statuses(args.status)
    if not 1 <= args.batch <= retention.MAX_BATCH:
        raise EverystepError(f"--batch must be between 1 and {retention.MAX_BATCH:,}")
    runs, steps = retention.count(store, older_than, statuses)
    what = f"{runs:,} {'/'.join(statuses)} run(s) finished more than {args.older_than} ago ({steps:,} steps)"
    if args.dry_run:
        print(f"would delete {what}")
        return 0
    print(f"deleting {what}, {args.batch:,} runs per transaction", flush=True)

    def progress(report: retention.PruneReport) -> None:
        rate = report.runs / report.seconds if report.seconds > 0 else 0.0
        print(f"deleted {report.runs:,} of ~{runs:,} runs ({report.steps:,} steps) in {report.batches} "
              f"batch(es), {report.seconds:.1f}s, {rate:,.0f} runs/s", flush=True)

    report = retention.prune(store, older_than, statuses, args.batch, progress=progress)
    print(f"done: deleted {report.runs:,} runs and {report.steps:,} steps in {report.seconds:.1f}s")
    return 0


def cmd_worker(store: Store, args: argparse.Namespace, observer: Observer | None = None) -> int:
    for flag in WORKER_REFUSED:
        if getattr(args, flag.lstrip("-").replace("-", "_"), None) is not None:
            raise EverystepError(f"{flag} cannot be enforced by the threaded worker (its runs share one process); "
                                 "run everystep-supervisor for step resource limits")
    refuse_step_limits()
    versions.set_app_version(args.app_version)
    worker = Worker(pool_size=args.pool, poll=args.poll, name=args.name, drain=args.drain, database=store,
                    async_runs=args.async_runs,
                    metrics_port=args.metrics_port, metrics_bind=args.metrics_bind, lease=args.lease,
                    takeover=args.takeover, observer=observer, queues=args.queues,
                    history_warning=args.history_warning)
    # Touch the database once before working: a wrong URL or an unmigrated
    # database is a bad command line (one line, exit 2), whereas the claim
    # loop would log and retry it forever as if it were a passing outage.
    # Taking the runner name now refuses a name a live runner holds.
    store.count_scheduled(registry.workflow_names())
    worker.loop.lease.register()
    setup_logging(args.log_level, args.log_format)
    leftovers = worker.run()
    if leftovers:
        # Threads are still stuck in steps whose runs were given up at the
        # drain deadline: exit now instead of joining them at interpreter
        # shutdown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def cmd_check_deploy(store: Store, args: argparse.Namespace) -> int:
    if not args.app:
        raise EverystepError("check-deploy needs --app MODULE[,MODULE]: the code about to be deployed")
    if not args.timeout > 0:
        raise EverystepError("--timeout must be a positive number of seconds")
    counts: dict[str, int] = {}
    listed: list[dryrun.Verdict] = []
    problems = 0
    seen: list[tuple[dict[str, bool], dict[str, str]]] = []
    for verdict in dryrun.check_deploy(store, timeout=args.timeout):
        seen.append((verdict.patches, verdict.patch_calls))
        counts[verdict.outcome.value] = counts.get(verdict.outcome.value, 0) + 1
        problems += verdict.problem
        if verdict.problem or args.all:
            listed.append(verdict)
    checked = sum(counts.values())
    reports = patches.patch_reports(seen)
    if args.json:
        print_json({"checked": checked, "problems": problems, "counts": counts,
                    "runs": [verdict.to_dict() for verdict in listed],
                    "patches": [report.to_dict() for report in reports]})
        return 1 if problems else 0
    if listed:
        rows = [(v.run_id, v.status, v.workflow, v.outcome.value, v.detail) for v in listed]
        print(format_table(("RUN", "STATUS", "WORKFLOW", "VERDICT", "DETAIL"), rows))
        print()
    if reports:
        rows = [(r.patch_id, str(r.new), str(r.old), r.in_code or "-", r.advice) for r in reports]
        print(format_table(("PATCH", "NEW", "OLD", "CODE", "ADVICE"), rows))
        print()
    summary = ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items())) or "none"
    print(f"checked {checked} unfinished run(s): {summary}; "
          + (f"{problems} would fail with this code" if problems else "none would fail with this code"))
    return 1 if problems else 0


def cmd_remote(store: Store, args: argparse.Namespace) -> int:
    request: dict[str, Any] = {}
    if args.remote_command == "kill":
        if not args.target:
            raise EverystepError("remote kill needs the RUN to kill")
        request = {"run": store.find_run(args.target).id, "requeue": args.requeue}
    elif args.remote_command == "scale":
        try:
            request = {"procs": int(args.target or "")}
        except ValueError:
            raise EverystepError("remote scale needs N, the number of children") from None
    elif args.target is not None or args.requeue:
        raise EverystepError(f"remote {args.remote_command} takes no argument")
    if not args.timeout > 0:
        raise EverystepError("--timeout must be a positive number of seconds")
    _check_live_supervisor(store, args.runner)
    who = f"cli {os.environ.get('USER') or os.getuid()}@{socket.gethostname()}"
    sent = relay.submit(store, args.runner, args.remote_command, request, who)
    answer = relay.wait_reply(store, sent.id, timeout=args.timeout)
    if args.json:
        print_json(answer.to_dict())
    else:
        print(relay.describe_outcome(answer))
    if answer.status != relay.RequestStatus.ANSWERED:
        return 1
    return 0 if (answer.reply or {}).get("ok") else 1


def _check_live_supervisor(store: Store, name: str) -> None:
    """Only a live supervisor answers a request: refuse at once, naming the
    live ones, rather than wait out the timeout on a typo."""
    runners = store.list_runners()
    live = sorted(runner.name for runner in runners if not runner.expired and runner.kind == SUPERVISOR)
    listed = ", ".join(live) or "none"
    for runner in runners:
        if runner.name == name and not runner.expired and runner.kind != SUPERVISOR:
            raise EverystepError(f"runner {name!r} is a threaded {runner.kind}: only supervisors answer remote "
                                 f"commands (live supervisors: {listed})")
    if name not in live:
        raise EverystepError(f"no live supervisor is named {name!r} (live supervisors: {listed}; "
                             "see 'everystep runners')")


def cmd_ui(store: Store, args: argparse.Namespace) -> int:
    try:
        from .web.serve import serve
    except ImportError as exc:
        raise EverystepError(f"the console needs the ui extra (pip install 'everystep[ui]'): {exc}") from None
    token = args.auth_token if args.auth_token is not None else os.environ.get("EVERYSTEP_UI_AUTH_TOKEN")
    setup_logging(args.log_level)
    return serve(store.url, bind=args.bind, port=args.port, auth_token=token or None, app_modules=args.app,
                 read_database_url=args.read_database)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
