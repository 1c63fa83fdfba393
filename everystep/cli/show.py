"""``everystep show RUN``: one run in full, its steps, children, events,
messages and streams, as text or as JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import patches, resources, serde
from ..cliutil import count, format_table, print_json
from ..context import step_sort_key
from ..models import STEP_WAITING, STEP_DONE, STEP_RETRYING, STEP_SLEEPING, Run, StepRecord
from ..store import Store, step_pages
from ..waiting import describe_wait, effect_uncertain, ended_wait, waiting_for
from .command import Command, add_json_flag, add_run_argument


#: The steps ``show`` lists unless --limit says otherwise.
SHOW_STEPS = 100


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_argument(parser)
    add_json_flag(parser, "text")
    parser.add_argument("--limit", type=count(0, 1_000_000), default=SHOW_STEPS, metavar="N",
                        help=f"steps shown, 0 for all (default {SHOW_STEPS})")
    parser.add_argument("--after", metavar="STEP", default=None,
                        help="show the steps recorded after this one: the last of the page before (default: from "
                             "the first)")


def _describe_error(error: dict[str, Any] | None) -> str:
    if not error:
        return ""
    return f"{error.get('type', '?')}: {error.get('message', '')}"


def cmd_show(store: Store, args: argparse.Namespace) -> int:
    run = store.find_run(args.run_id)
    page = step_pages.read_page(store, run.id, args.after, args.limit or None)
    steps = sorted(page.steps, key=lambda step: step_sort_key(step.step_id))
    window = store.debounce_windows([run.id]).get(run.id)
    waiting = waiting_for(run, store.steps_of_runs([run.id], waiting_only=True)[run.id], debounce=window)
    cost = store.run_cost(run.id)
    forks = store.forks_of(run.id)
    if args.json:
        links = store.links(run.id)
        print_json({"run": {**run.to_dict(), "waiting": waiting, "forks": [fork.id for fork in forks],
                            "debounce": {"key": window.key, "calls": window.calls} if window else None,
                            "parent_id": links.parent_id,
                            "deadline": links.deadline.isoformat() if links.deadline else None},
                    "children": [{"id": c.id, "status": c.status, "name": c.name} for c in store.children(run.id)],
                    "events": [event.to_dict() for event in store.events(run.id)],
                    "messages": [message.to_dict() for message in store.messages(run.id)],
                    "streams": [summary.to_dict() for summary in store.streams_of(run.id)],
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
    if window:
        print(f"debounce   key {window.key!r}: {window.calls} call{'' if window.calls == 1 else 's'} folded in")
    if run.claimed_by:
        print(f"claimed by {run.claimed_by}")
    print(f"version    {run.app_version or '-'}")
    if run.forked_from:
        print(f"forked     forked from {run.forked_from}")
    if run.continued_from:
        print(f"continued  from {run.continued_from}")
    if run.continued_as:
        print(f"continued  as {run.continued_as}")
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
    """``show``'s sections on a run's children, events, messages and streams."""
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
    streams = store.streams_of(run_id)
    if streams:
        print()
        print(format_table(("STREAM", "LAST", "STATE"), [
            (summary.key, summary.last_seq, "closed" if summary.closed else "open") for summary in streams]))
        print(f"(everystep stream {run_id} KEY prints one)")


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
    elif step.status == STEP_WAITING:
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


SHOW = Command("show", "show a run and its recorded steps",
               "A run (args, result, error with its traceback) and its steps, a page at a time: --limit of "
               "them in the order they were recorded, from the first or those after --after, listed in "
               "step-id order.",
               cmd_show, _show_arguments)

__all__ = ["SHOW", "cmd_show"]
