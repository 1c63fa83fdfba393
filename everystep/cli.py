"""The ``everystep`` command: migrate, schedule, inspect, resolve, run a worker.

Every command takes ``--database URL`` (else ``EVERYSTEP_DATABASE_URL``, else
``sqlite:///everystep.db``) and ``--app MODULE[,MODULE]`` to import the
user's workflows. Bad input prints one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from . import admin, dryrun, registry, relay, resources, retention, serde
from .cliutil import OneLineParser, fail, format_table, print_json, setup_logging
from .errors import EverystepError
from .models import PRUNABLE_STATUSES, RUN_STATUSES, Run, StepRecord
from .observer import Observer
from .store import Store, connect
from .lease import DEFAULT_LEASE
from .worker import Worker, refuse_step_limits

MAX_COUNT = 1_000_000


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database", metavar="URL", help="database URL (default: $EVERYSTEP_DATABASE_URL or sqlite:///everystep.db)")
    parser.add_argument("--app", metavar="MODULE[,MODULE]", help="import these modules to register workflows")


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="everystep", description="Durable workflows recorded step by step in SQL.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    commands.required = True

    sub = commands.add_parser("migrate", help="create or upgrade the schema (idempotent)")
    _common(sub)

    sub = commands.add_parser("schedule", help="schedule runs of a workflow")
    _common(sub)
    sub.add_argument("workflow", help="registered workflow name (module.qualname)")
    sub.add_argument(
        "args", nargs="?", default="[]", metavar="ARGS_JSON",
        help="a JSON array of positional arguments, or any other JSON value as the single argument (default: [])",
    )
    sub.add_argument("--idempotency-key", metavar="KEY")
    sub.add_argument("--count", type=int, default=1, metavar="N", help="schedule N identical runs")

    sub = commands.add_parser("runs", help="list runs, newest first")
    _common(sub)
    add_runs_arguments(sub)

    sub = commands.add_parser("show", help="show a run and its recorded steps")
    _common(sub)
    sub.add_argument("run_id", metavar="RUN")
    sub.add_argument("--json", action="store_true")

    sub = commands.add_parser("resolve-step", help="resolve the uncertain step of a blocked run")
    _common(sub)
    add_resolve_step_arguments(sub)

    sub = commands.add_parser("requeue", help="put a run parked 'running' by a dead runner back in the queue")
    _common(sub)
    sub.add_argument("run_id", metavar="RUN")
    sub.add_argument("--force", action="store_true",
                     help="requeue even though its runner is alive; that execution is fenced (its writes are "
                          "refused) and a supervisor kills its child")

    sub = commands.add_parser("runners", help="list live runners, their heartbeats and what they hold")
    _common(sub)
    sub.add_argument("--json", action="store_true")

    sub = commands.add_parser("check-deploy", help="dry-replay every unfinished run against the code in --app")
    _common(sub)
    sub.add_argument("--json", action="store_true")
    sub.add_argument("--all", action="store_true", help="list every run checked, not only those that would fail")
    sub.add_argument("--timeout", type=float, default=dryrun.DEFAULT_TIMEOUT, metavar="S",
                     help="give up on one run's replay after S seconds (default 5)")

    sub = commands.add_parser("remote", help="send a command to a supervisor on any host, through the database")
    _common(sub)
    sub.add_argument("runner", metavar="RUNNER", help="the supervisor's runner name (see 'everystep runners')")
    sub.add_argument("remote_command", metavar="COMMAND", choices=relay.COMMANDS,
                     help=f"one of: {', '.join(relay.COMMANDS)}")
    sub.add_argument("target", nargs="?", metavar="RUN|N", help="kill: the run id; scale: the number of children")
    sub.add_argument("--requeue", action="store_true", help="kill: put the run back in the queue")
    sub.add_argument("--timeout", type=float, default=relay.REPLY_TIMEOUT, metavar="S",
                     help="how long to wait for the reply (default 15)")
    sub.add_argument("--json", action="store_true")

    sub = commands.add_parser("ui", help="serve the operations console (needs the ui extra)")
    _common(sub)
    sub.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                     help="address to listen on (default 127.0.0.1; any other needs --auth-token)")
    sub.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    sub.add_argument("--auth-token", metavar="TOKEN", default=None,
                     help="require this token (Bearer, or as the basic-auth password); "
                          "default: $EVERYSTEP_UI_AUTH_TOKEN")
    sub.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    sub = commands.add_parser("prune", help="delete finished runs and their steps older than a duration")
    _common(sub)
    sub.add_argument("--older-than", required=True, metavar="DURATION",
                     help="runs finished longer ago than this: 90s, 10m, 2h, 30d")
    sub.add_argument("--status", default=",".join(PRUNABLE_STATUSES), metavar="S[,S]",
                     help=f"which finished runs (default {','.join(PRUNABLE_STATUSES)}); "
                          "scheduled, running and blocked runs are never pruned")
    sub.add_argument("--batch", type=int, default=retention.DEFAULT_BATCH, metavar="N",
                     help=f"runs deleted per transaction (default {retention.DEFAULT_BATCH:,})")
    sub.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")

    sub = commands.add_parser("worker", help="run a threaded worker (embedded mode)")
    _common(sub)
    add_worker_arguments(sub)
    return parser


# The options of the commands a host framework also exposes (Django's
# management commands), declared once here and shared with it.


def add_runs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", choices=RUN_STATUSES)
    parser.add_argument("--workflow", metavar="NAME")
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--json", action="store_true")


def add_resolve_step_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN")
    parser.add_argument("step_id", metavar="STEP")
    choice = parser.add_mutually_exclusive_group(required=True)
    choice.add_argument("--result", metavar="JSON", help="the effect happened; record this JSON value as its result")
    choice.add_argument("--error", metavar="MESSAGE", help="the effect happened and failed; record this failure")
    choice.add_argument("--discard", action="store_true", help="the effect did not happen; run the step again")


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool", type=int, default=4, help="threads executing runs (default 4)")
    parser.add_argument("--poll", type=float, default=0.2, help="seconds between claims when idle (default 0.2)")
    parser.add_argument("--name", help="runner name, stable across restarts (default: hostname)")
    parser.add_argument("--takeover", action="store_true",
                        help="take the runner name even though its holder looks alive (it is gone for good, "
                             "e.g. a frozen VM); its runs are fenced")
    parser.add_argument("--drain", type=float, default=30.0, help="seconds to wait for runs on stop (default 30)")
    parser.add_argument("--lease", type=float, default=DEFAULT_LEASE, metavar="S",
                        help="heartbeat lease: runners silent longer than S seconds have their runs requeued (default 60)")
    parser.add_argument("--metrics-port", type=int, default=0, metavar="PORT",
                        help="serve /metrics and /healthz on this port (default: off)")
    parser.add_argument("--metrics-bind", default="0.0.0.0", metavar="ADDR", help="address for --metrics-port")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="text", choices=["text", "json"])
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
    except EverystepError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _dispatch(args: argparse.Namespace) -> int:
    store = connect(args.database)
    handler = {
        "migrate": cmd_migrate,
        "schedule": cmd_schedule,
        "runs": cmd_runs,
        "show": cmd_show,
        "resolve-step": cmd_resolve_step,
        "requeue": cmd_requeue,
        "runners": cmd_runners,
        "prune": cmd_prune,
        "worker": cmd_worker,
        "check-deploy": cmd_check_deploy,
        "remote": cmd_remote,
        "ui": cmd_ui,
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
    value = parse_json(args.args, "ARGS_JSON")
    positional = value if isinstance(value, list) else [value]
    if not 1 <= args.count <= MAX_COUNT:
        raise EverystepError(f"--count must be between 1 and {MAX_COUNT}")
    if args.idempotency_key is not None:
        # An empty key is almost always an unset shell variable: it would
        # silently merge every run scheduled that way into the first one.
        if not args.idempotency_key:
            raise EverystepError("--idempotency-key must not be empty")
        if args.count > 1:
            raise EverystepError("--idempotency-key schedules one run; it cannot be combined with --count")
    args_json = serde.dumps(positional, "ARGS_JSON")
    runs = [store.schedule(args.workflow, args_json, args.idempotency_key) for _ in range(args.count)]
    if len(runs) == 1:
        print(runs[0].id)
    else:
        print(f"scheduled {len(runs)} runs of {args.workflow} ({runs[0].id} … {runs[-1].id})")
    return 0


def _age(run: Run) -> str:
    return run.created_at.strftime("%Y-%m-%d %H:%M:%S") if run.created_at else ""


def cmd_runs(store: Store, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise EverystepError("--limit must be at least 1")
    runs = store.list_runs(status=args.status, name=args.workflow, limit=args.limit)
    if args.json:
        print_json([run.to_dict() for run in runs])
        return 0
    rows = [(run.id, run.status, run.name, run.claimed_by or "", _age(run)) for run in runs]
    print(format_table(("RUN", "STATUS", "WORKFLOW", "CLAIMED BY", "CREATED (UTC)"), rows))
    return 0


def _describe_error(error: dict[str, Any] | None) -> str:
    if not error:
        return ""
    return f"{error.get('type', '?')}: {error.get('message', '')}"


def cmd_show(store: Store, args: argparse.Namespace) -> int:
    run = store.get_run(args.run_id)
    steps = store.get_steps(run.id)
    cost = resources.run_cost(steps)
    if args.json:
        print_json({"run": run.to_dict(), "steps": [step.to_dict() for step in steps],
                    "cost": cost.to_dict() if cost is not None else None})
        return 0
    print(f"run        {run.id}")
    print(f"workflow   {run.name}")
    print(f"status     {run.status}")
    print(f"args       {json.dumps(serde.to_jsonable(run.args))}")
    if run.claimed_by:
        print(f"claimed by {run.claimed_by}")
    if run.result is not None:
        print(f"result     {json.dumps(serde.to_jsonable(run.result))}")
    if run.error:
        print(f"error      {_describe_error(run.error)}")
    print(f"created    {run.created_at}")
    if run.completed_at:
        print(f"completed  {run.completed_at}")
    if cost is not None:
        print(f"cost       {resources.format_cpu(cost.cpu_seconds)} CPU in {cost.measured_steps} measured "
              f"step(s); largest peak RSS growth {resources.format_size(cost.peak_rss_bytes)}")
    if steps:
        print()
        if cost is not None:
            print(format_table(("STEP", "STATUS", "FUNCTION", "CPU", "PEAK RSS", "OUTCOME"),
                               [_costed_step_row(step) for step in steps]))
        else:
            print(format_table(("STEP", "STATUS", "FUNCTION", "OUTCOME"), [_step_row(step) for step in steps]))
    return 0


def _step_row(step: StepRecord) -> tuple[str, str, str, str]:
    if step.status == "done":
        outcome = json.dumps(serde.to_jsonable(step.result))
        outcome = outcome if len(outcome) <= 60 else outcome[:57] + "..."
    else:
        outcome = _describe_error(step.error)
    return step.step_id, step.status, step.name, outcome


def _costed_step_row(step: StepRecord) -> tuple[str, str, str, str, str, str]:
    step_id, status, name, outcome = _step_row(step)
    cpu = resources.format_cpu(step.cpu_seconds) if step.cpu_seconds is not None else "-"
    rss = resources.format_size(step.peak_rss_bytes) if step.peak_rss_bytes is not None else "-"
    return step_id, status, name, cpu, rss, outcome


def cmd_resolve_step(store: Store, args: argparse.Namespace) -> int:
    options: dict[str, Any] = {}
    if args.result is not None:
        options["result"] = parse_json(args.result, "--result")
    elif args.error is not None:
        options["error"] = args.error
    else:
        options["discard"] = True
    run = admin.resolve_step(store, args.run_id, args.step_id, **options)
    print(f"run {run.id} resolved at step {args.step_id}; now {run.status}")
    return 0


def cmd_requeue(store: Store, args: argparse.Namespace) -> int:
    run = admin.requeue_run(store, args.run_id, force=args.force)
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
    worker = Worker(pool_size=args.pool, poll=args.poll, name=args.name, drain=args.drain, database=store,
                    metrics_port=args.metrics_port, metrics_bind=args.metrics_bind, lease=args.lease,
                    takeover=args.takeover, observer=observer)
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
    for verdict in dryrun.check_deploy(store, timeout=args.timeout):
        counts[verdict.outcome.value] = counts.get(verdict.outcome.value, 0) + 1
        problems += verdict.problem
        if verdict.problem or args.all:
            listed.append(verdict)
    checked = sum(counts.values())
    if args.json:
        print_json({"checked": checked, "problems": problems, "counts": counts,
                    "runs": [verdict.to_dict() for verdict in listed]})
        return 1 if problems else 0
    if listed:
        rows = [(v.run_id, v.status, v.workflow, v.outcome.value, v.detail) for v in listed]
        print(format_table(("RUN", "STATUS", "WORKFLOW", "VERDICT", "DETAIL"), rows))
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
        request = {"run": args.target, "requeue": args.requeue}
    elif args.remote_command == "scale":
        try:
            request = {"procs": int(args.target or "")}
        except ValueError:
            raise EverystepError("remote scale needs N, the number of children") from None
    elif args.target is not None or args.requeue:
        raise EverystepError(f"remote {args.remote_command} takes no argument")
    if not args.timeout > 0:
        raise EverystepError("--timeout must be a positive number of seconds")
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


def cmd_ui(store: Store, args: argparse.Namespace) -> int:
    try:
        from .web.serve import serve
    except ImportError as exc:
        raise EverystepError(f"the console needs the ui extra (pip install 'everystep[ui]'): {exc}") from None
    token = args.auth_token if args.auth_token is not None else os.environ.get("EVERYSTEP_UI_AUTH_TOKEN")
    setup_logging(args.log_level)
    return serve(store.url, bind=args.bind, port=args.port, auth_token=token or None, app_modules=args.app)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
