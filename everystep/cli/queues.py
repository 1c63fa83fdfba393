"""``everystep queue set|pause|resume NAME`` and ``everystep queues``.

The settings are rows of ``everystep_queue``: every supervisor and worker
reads them in its next claim, so a change applies everywhere at once, with
nobody restarted.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

from .. import registry
from ..cliutil import format_table, print_json
from ..errors import EverystepError
from ..new_run import workflow_placement
from ..queues import DEFAULT_QUEUE, QueueSettings, format_rate, parse_rate, queue_name
from ..store import Store
from .command import Command, add_json_flag

UNLIMITED = "none"


def _limit(minimum: int) -> Callable[[str], Any]:
    """An argparse type: a whole number >= minimum, or ``none`` (no limit)."""

    def parse(text: str) -> Any:
        if text.strip().lower() == UNLIMITED:
            return UNLIMITED
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number or 'none'") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is out of range: must be at least {minimum} (or 'none')")
        return value

    parse.__name__ = "a limit"
    return parse


def _queue_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="queue_action", metavar="ACTION", parser_class=type(parser))
    actions.required = True
    setting = actions.add_parser("set", help="set limits (options not given keep their value)",
                                 description="Set a queue's limits; 'none' removes one. Options not given keep "
                                             "their value.")
    _common_after(setting)
    setting.add_argument("queue", metavar="NAME", help="the queue (one that nothing names yet needs --create)")
    _create(setting)
    setting.add_argument("--concurrency", type=_limit(0), metavar="N|none",
                         help="at most N of its runs running at once, across every runner (default: unchanged)")
    setting.add_argument("--key-concurrency", type=_limit(1), metavar="N|none",
                         help="at most N running at once per concurrency key (default: unchanged)")
    setting.add_argument("--rate", metavar="COUNT/PERIOD|none",
                         help="at most COUNT claims in any window of PERIOD (100/60s, 10/s, 5/2m) (default: unchanged)")
    for action, summary in (("pause", "claim nothing from it (running runs go on)"),
                            ("resume", "claim from it again")):
        paused = actions.add_parser(action, help=summary, description=summary[0].upper() + summary[1:] + ".")
        paused.add_argument("queue", metavar="NAME", help="the queue")
        _create(paused)
        _common_after(paused)


def _create(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--create", action="store_true",
                        help="act on a queue that no run, runner or setting names yet (default: refuse it, "
                             "as a typo)")


def known_queues(store: Store) -> set[str]:
    """Queue names something names: settings and unfinished runs, the
    workflows in --app, the runners' --queues (as supervisors publish
    them), and the default queue. (Finished runs: ``queue_has_runs``.)"""
    names = {queue.name for queue in store.queues()} | {DEFAULT_QUEUE}
    names |= {workflow_placement(name).queue for name in registry.workflow_names()}
    for detail in store.runner_details().values():
        names |= {queue for queue in detail.get("queues") or () if isinstance(queue, str)}
    return names


def _check_known(store: Store, name: str, action: str) -> None:
    """A queue nothing names is almost always a typo: acting on it would
    succeed and change nothing the operator meant."""
    known = known_queues(store)
    if name in known or store.queue_has_runs(name):
        return
    listed = ", ".join(sorted(known))
    raise EverystepError(f"no queue named {name!r}: no run, runner or setting names it (known: {listed}); "
                         f"add --create to {action} it anyway")


def _common_after(parser: argparse.ArgumentParser) -> None:
    """--database and --app after the action too (``queue set NAME --database URL``);
    suppressed defaults keep what was given before the action."""
    parser.add_argument("--database", metavar="URL", default=argparse.SUPPRESS,
                        help="database URL (default: $EVERYSTEP_DATABASE_URL, else sqlite:///everystep.db)")
    parser.add_argument("-A", "--app", metavar="MODULE[,MODULE]", default=argparse.SUPPRESS,
                        help="import these modules to register workflows (default: none)")


def cmd_queue(store: Store, args: argparse.Namespace) -> int:
    name = queue_name(args.queue)
    rate: tuple[int | None, float | None] | None = None
    if args.queue_action == "set":
        if args.concurrency is None and args.key_concurrency is None and args.rate is None:
            raise EverystepError("queue set needs --concurrency, --key-concurrency or --rate")
        if args.rate is not None:
            rate = (None, None) if args.rate.strip().lower() == UNLIMITED else parse_rate(args.rate)
    if not args.create:
        _check_known(store, name, args.queue_action)
    if args.queue_action in ("pause", "resume"):
        paused = args.queue_action == "pause"
        store.update_queue(name, lambda current: dataclasses.replace(current, paused=paused))
        print(f"queue {name} {'paused: nothing is claimed from it' if paused else 'resumed'}")
        return 0

    def change(current: QueueSettings) -> QueueSettings:
        new = current
        if args.concurrency is not None:
            new = dataclasses.replace(new, concurrency=None if args.concurrency == UNLIMITED else args.concurrency)
        if args.key_concurrency is not None:
            new = dataclasses.replace(new, key_concurrency=None if args.key_concurrency == UNLIMITED
                                      else args.key_concurrency)
        if rate is not None:
            new = dataclasses.replace(new, rate_limit=rate[0], rate_period=rate[1])
        return new

    print(f"queue {name}: {describe(store.update_queue(name, change))}")
    return 0


def describe(queue: QueueSettings) -> str:
    parts = [f"concurrency {queue.concurrency if queue.concurrency is not None else 'unlimited'}",
             f"per key {queue.key_concurrency if queue.key_concurrency is not None else 'unlimited'}",
             f"rate {format_rate(queue.rate_limit, queue.rate_period) or 'unlimited'}"]
    if queue.paused:
        parts.append("paused")
    return ", ".join(parts)


def cmd_queues(store: Store, args: argparse.Namespace) -> int:
    queues = store.queues()
    if args.json:
        print_json([queue.to_dict() for queue in queues])
        return 0
    if not queues:
        print("no queues: nothing scheduled, running or blocked, and no limits set")
        return 0
    rows = [
        (q.name, q.scheduled, q.running, q.blocked, _cell(q.settings.concurrency), _cell(q.settings.key_concurrency),
         format_rate(q.settings.rate_limit, q.settings.rate_period) or "-", "yes" if q.settings.paused else "no",
         f"{q.oldest_pending_age_seconds:.1f}s" if q.pending else "-")
        for q in queues
    ]
    print(format_table(("QUEUE", "SCHEDULED", "RUNNING", "BLOCKED", "CONCURRENCY", "PER KEY", "RATE", "PAUSED",
                        "OLDEST DUE"), rows))
    return 0


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


QUEUE = Command("queue", "set a queue's limits, pause or resume it",
                "Limits and pause flags live in the database: every supervisor and worker obeys them from its next "
                "claim on.",
                cmd_queue, _queue_arguments)
QUEUES = Command("queues", "list queues with their counts and limits",
                 "Every queue that has runs scheduled, running or blocked, or limits or a pause flag: counts, limits, "
                 "whether it is paused, and the age of its oldest due run.",
                 cmd_queues, add_json_flag)

__all__ = ["QUEUE", "QUEUES"]
