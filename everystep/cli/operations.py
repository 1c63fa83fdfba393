"""The operator's commands on the installation rather than on one run:
``migrate``, ``schedules`` (the periodic workflows), ``runners``,
``remote`` (a command to a supervisor on any host) and ``prune``."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
from typing import Any

from .. import registry, relay, retention
from ..cliutil import count, format_table, print_json, seconds
from ..cron_schedule import CronSchedule
from ..errors import EverystepError
from ..models import PRUNABLE_STATUSES
from ..store import Store
from .command import Command, add_json_flag

#: The runner kind a supervisor registers under: the only one that answers
#: ``remote`` requests.
SUPERVISOR = "supervisor"


def cmd_migrate(store: Store, args: argparse.Namespace) -> int:
    applied = store.migrate()
    version = store.schema_version()
    # A fresh SQLite file migrates itself when opened, so there may be
    # nothing left to apply here: say where the schema stands either way.
    print(f"applied {', '.join(applied)}; schema at version {version}" if applied
          else f"schema is up to date (version {version})")
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


def _remote_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runner", metavar="RUNNER", help="the supervisor's runner name (see 'everystep runners')")
    parser.add_argument("remote_command", metavar="COMMAND", choices=relay.COMMANDS,
                        help=f"one of: {', '.join(relay.COMMANDS)}")
    parser.add_argument("target", nargs="?", metavar="RUN|N",
                        help="kill: the run (its id or a unique prefix); scale: the number of children")
    parser.add_argument("--requeue", action="store_true", help="kill: put the run back in the queue (default: off)")
    parser.add_argument("--timeout", type=seconds(0.1, 3600), default=relay.REPLY_TIMEOUT, metavar="S",
                        help=f"how long to wait for the reply (default {relay.REPLY_TIMEOUT:g})")
    add_json_flag(parser, "a line")


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


def _prune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--older-than", required=True, metavar="DURATION",
                        help="runs finished longer ago than this: 90s, 10m, 2h, 30d (required)")
    parser.add_argument("--status", default=",".join(PRUNABLE_STATUSES), metavar="S[,S]",
                        help=f"which finished runs (default {','.join(PRUNABLE_STATUSES)}); "
                             "scheduled, running and blocked runs are never pruned")
    parser.add_argument("--batch", type=count(1, retention.MAX_BATCH), default=retention.DEFAULT_BATCH, metavar="N",
                        help=f"runs deleted per transaction, 1 to {retention.MAX_BATCH:,} "
                             f"(default {retention.DEFAULT_BATCH:,})")
    parser.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")


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


MIGRATE = Command(
    "migrate", "create or upgrade the schema (idempotent)",
    "Apply the schema versions the database lacks; safe to run concurrently and again. A SQLite database migrates "
    "itself when first opened.",
    cmd_migrate)
SCHEDULES = Command(
    "schedules", "list the periodic (cron) workflows in --app, their last and next tick",
    "The periodic workflows the --app modules declare, with their last and next tick.",
    cmd_schedules, add_json_flag)
RUNNERS = Command(
    "runners", "list live runners, their heartbeats and what they hold",
    "Every registered supervisor and worker: host, pid, heartbeat age, lease, runs held.",
    cmd_runners, add_json_flag)
REMOTE = Command(
    "remote", "send a command to a supervisor on any host, through the database",
    f"Send {', '.join(relay.COMMANDS[:-1])} or {relay.COMMANDS[-1]} to the supervisor holding RUNNER, through a "
    "request row (and NOTIFY on PostgreSQL), and print its reply.",
    cmd_remote, _remote_arguments)
PRUNE = Command(
    "prune", "delete finished runs and their steps older than a duration",
    "Delete finished runs (and their steps) in bounded batches; never a scheduled, running or blocked run.",
    cmd_prune, _prune_arguments)

__all__ = ["MIGRATE", "PRUNE", "REMOTE", "RUNNERS", "SCHEDULES"]
