"""The commands for a deploy: ``check-deploy`` (would the code in --app
fail any unfinished run?), ``replay`` (one run's records against that
code, here, writing nothing) and ``fork`` (a new run from a recorded step,
executed by that code)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import admin, dryrun, patches
from ..cliutil import format_table, print_json, seconds
from ..errors import EverystepError, WorkflowArgumentsError
from ..local_replay import replay_run
from ..store import Store
from .command import Command, add_json_flag, add_run_argument, parse_json


def _fork_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_argument(parser, "the run to fork")
    parser.add_argument("--from-step", required=True, metavar="ID", help="the first step the fork executes")
    parser.add_argument("--args", metavar="JSON", default=None,
                        help="replace the run's arguments (a JSON list of positional arguments, or one value) "
                             "(default: RUN's own)")
    parser.add_argument("--force", action="store_true",
                        help="fork a run that is not finished (scheduled, waiting, running, blocked): the fork is a "
                             "second live run beside it (default: refused)")
    parser.add_argument("--json", action="store_true", help="print the new run as JSON (default: one line)")


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


def _replay_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_argument(parser)
    parser.add_argument("--pdb", action="store_true",
                        help="stop in the debugger at the first divergence, or at --until-step (default: off)")
    parser.add_argument("--until-step", metavar="ID", default=None,
                        help="stop the replay before step ID (in the debugger with --pdb) (default: replay it all)")


def cmd_replay(store: Store, args: argparse.Namespace) -> int:
    try:
        return replay_run(store, args.run_id, sys.stdout, until=args.until_step, debugger=args.pdb)
    finally:
        store.close()


def _check_deploy_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_flag(parser)
    parser.add_argument("--all", action="store_true",
                        help="list every run checked, not only those that would fail (default: off)")
    parser.add_argument("--timeout", type=seconds(0.01, 3600), default=dryrun.DEFAULT_TIMEOUT, metavar="S",
                        help=f"give up on one run's replay after S seconds (default {dryrun.DEFAULT_TIMEOUT:g})")


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


FORK = Command(
    "fork", "start a new run from a recorded step of a run, with the code in --app",
    "A new run of RUN's workflow: the steps RUN recorded before --from-step are copied (their results replayed, "
    "never re-run) and everything from that step on is executed by the code deployed now. Repairs a run a bad deploy "
    "failed: fix the code, fork it from the failed step.",
    cmd_fork, _fork_arguments)
REPLAY = Command(
    "replay", "replay a recorded run here, against its records, writing nothing",
    "Replay RUN's body in this process with the code in --app against its recorded steps, through a read-only "
    "connection (a read replica will do), printing each step as it is matched: its recorded outcome, or where and "
    "why the code diverges. Never executes a step. Exit 1 if the code diverges from the records.",
    cmd_replay, _replay_arguments, read_only=True)
CHECK_DEPLOY = Command(
    "check-deploy", "dry-replay every unfinished run against the code in --app",
    "Replay each unfinished run's body against its recorded steps with the code in --app, never executing a step. "
    "Exit 1 if any would fail: code_error (a step id now calls another function: WorkflowCodeError), missing (its "
    "workflow is gone), fails (code between steps raises on the recorded results) or timeout (the replay did not "
    "stop within --timeout); 0 otherwise.",
    cmd_check_deploy, _check_deploy_arguments)

__all__ = ["CHECK_DEPLOY", "FORK", "REPLAY"]
