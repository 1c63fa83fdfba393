"""The operator's actions in the console, with exactly the CLI's rules.

Run actions go through ``everystep.admin`` (the functions behind
``everystep resolve-step`` and ``everystep requeue``), which check the run's
state under its row lock and refuse anything that does not fit with a
one-line ``AdminError``: the console shows that line, as the CLI prints it.
"Run again" schedules a new run with the same workflow and arguments;
"Fork" starts one from a recorded step (``everystep fork``).
Actions on a live supervisor (kill a run's child, scale) become a request
row for it (``everystep.relay``); the browser then waits for its reply.

``ACTIONS`` lists the run-level actions with the statuses they apply to;
the run page offers exactly those ``available`` for the run it shows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import admin, new_run, registry, relay, serde
from ..errors import EverystepError
from ..models import ACTIVE_STATUSES, BLOCKED, CANCELLABLE_STATUSES, RUNNING, Run
from ..store import Store
from ..vocabulary import Command

logger = logging.getLogger("everystep.console")

MAX_PROCS = 256


class ActionRefused(EverystepError):
    """The action does not fit the run's or runner's state (HTTP 409)."""


@dataclass(frozen=True)
class RunAction:
    name: str
    label: str
    help: str
    applies: Callable[[Run, dict[str, Any] | None], bool]
    #: Asked before acting (the browser shows it in a confirmation); a
    #: function of the run when the question depends on it.
    confirm: str | Callable[[Run], str | None] | None = None

    def confirmation(self, run: Run) -> str | None:
        return self.confirm(run) if callable(self.confirm) else self.confirm


def _fork_confirmation(run: Run) -> str | None:
    """Forking a run that is not finished makes a second live run beside
    it: asked first, and sent with ``force`` (the CLI's ``--force``)."""
    if run.status not in ACTIVE_STATUSES:
        return None
    return (f"This run is not finished ({run.status}): the fork would be a second live run of {run.name} beside "
            "it, both acting on the same objects. Cancel this run first if the fork replaces it. Fork anyway?")


def _live_child(run: Run, runner: dict[str, Any] | None) -> bool:
    return (run.status == RUNNING and runner is not None and runner.get("kind") == "supervisor"
            and not runner.get("expired") and runner.get("child") is not None)


ACTIONS: dict[str, RunAction] = {
    action.name: action for action in (
        RunAction("requeue", "Requeue", "put a run whose runner died back in the queue (a live runner's run "
                  "only when forced: that execution is fenced)",
                  lambda run, runner: run.status == RUNNING,
                  "Requeue this run?"),
        RunAction("kill", "Kill step", "kill the child process executing this run (its step is recorded "
                  "as StepKilled)", _live_child,
                  "Kill the child process running this run? The step in flight is recorded as failed."),
        RunAction("cancel", "Cancel", "end this run 'cancelled' now: a sleeping, waiting or blocked run stops "
                  "there; a running one's child is killed and its step in flight recorded as Cancelled",
                  lambda run, runner: run.status in CANCELLABLE_STATUSES,
                  "Cancel this run? It ends 'cancelled' and never resumes."),
        RunAction("rerun", "Run again", "schedule a new run of the same workflow with the same arguments",
                  lambda run, runner: True, None),
        RunAction("fork", "Fork", "start a new run from one of this run's recorded steps: the steps before it are "
                  "copied, it and the rest are executed by the code deployed now (everystep fork)",
                  lambda run, runner: True, _fork_confirmation),
    )
}


def available(run: Run, runner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The run actions that apply to ``run`` now (resolving is offered on
    the uncertain node of a blocked run instead)."""
    out = [{"name": action.name, "label": action.label, "help": action.help, "confirm": action.confirmation(run)}
           for action in ACTIONS.values() if action.applies(run, runner)]
    if run.status == BLOCKED:
        out.append({"name": "resolve", "label": "Resolve", "help": "resolve the uncertain step (on its node)",
                    "confirm": None})
    return out


def parse_json_value(text: Any, what: str) -> Any:
    if not isinstance(text, str):
        raise ValueError(f"{what} must be JSON text")
    try:
        return serde.from_jsonable(json.loads(text))
    except (ValueError, EverystepError) as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None


def resolve(store: Store, run_id: str, body: dict[str, Any], who: str) -> dict[str, Any]:
    """``everystep resolve-step`` from the console: body holds ``step`` and
    one of ``result`` (JSON text), ``error`` (a message) or ``discard``."""
    step_id = body.get("step")
    if not isinstance(step_id, str) or not step_id:
        raise ValueError('resolve needs "step": the uncertain step\'s id')
    options: dict[str, Any] = {}
    if body.get("result") is not None:
        options["result"] = parse_json_value(body["result"], "the result")
    if body.get("error") is not None:
        if not isinstance(body["error"], str) or not body["error"].strip():
            raise ValueError("the error message must not be empty")
        options["error"] = body["error"]
    if body.get("discard"):
        options["discard"] = True
    run = admin.resolve_step(store, run_id, step_id, **options)
    how = "result" if "result" in options else "error" if "error" in options else "discard"
    logger.info("console: %s resolved step %s of run %s with %s; now %s", who, step_id, run.id, how, run.status)
    return {"run": run.to_dict(), "message": f"run {run.id} resolved at step {step_id}; now {run.status}"}


def requeue(store: Store, run_id: str, body: dict[str, Any], who: str) -> dict[str, Any]:
    """As ``everystep requeue``: refused while the run's runner is alive,
    unless ``force`` (which fences that execution)."""
    force = body.get("force") is True
    run = admin.requeue_run(store, run_id, force=force)
    logger.info("console: %s requeued run %s%s", who, run.id, " (forced)" if force else "")
    return {"run": run.to_dict(), "message": f"run {run.id} is {run.status}"}


def cancel(store: Store, run_id: str, body: dict[str, Any], who: str) -> dict[str, Any]:
    """As ``everystep cancel``: body may hold ``reason``."""
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise ValueError("reason must be text")
    done = admin.cancel_counting(store, run_id, reason if reason else f"cancelled from the console by {who}")
    logger.info("console: %s cancelled run %s%s", who, done.run.id, done.cascade_phrase())
    return {"run": done.run.to_dict(), "message": f"run {done.run.id} cancelled{done.cascade_phrase()}"}


def rerun(store: Store, run_id: str, body: dict[str, Any], who: str) -> dict[str, Any]:
    run = store.get_run(run_id)
    if registry.workflow_names() and registry.get_workflow(run.name) is None:
        raise admin.AdminError(f"workflow {run.name!r} is not registered by the code loaded in this console")
    new = new_run.schedule(store, new_run.decide(run.name, run.args))
    logger.info("console: %s ran %s again as new run %s", who, run.id, new.id)
    return {"run": new.to_dict(), "message": f"scheduled run {new.id}", "new_run": new.id}


def fork(store: Store, run_id: str, body: dict[str, Any], who: str) -> dict[str, Any]:
    """As ``everystep fork RUN --from-step STEP [--force]``: body holds
    ``step``, and ``force`` (true) for a run that is not finished (the
    browser asks first: ``_fork_confirmation``)."""
    step_id = body.get("step")
    if not isinstance(step_id, str) or not step_id.strip():
        raise ValueError('fork needs "step": the id of the first step the fork executes')
    force = body.get("force") is True
    new, copied = admin.fork(store, run_id, step_id.strip(), force=force)
    logger.info("console: %s forked run %s at step %s as new run %s%s", who, run_id, step_id, new.id,
                " (forced: the source is not finished)" if force else "")
    return {"run": new.to_dict(), "message": f"forked as run {new.id} ({copied} step(s) copied)",
            "new_run": new.id}


def kill(store: Store, run_id: str, body: dict[str, Any], who: str) -> dict[str, Any]:
    """Kill the child running ``run_id``, through its supervisor."""
    run = store.get_run(run_id)
    if run.status != RUNNING or not run.claimed_by:
        raise admin.AdminError(f"run {run.id} is {run.status}, not running: there is no step to kill")
    requeue_after = bool(body.get("requeue", False))
    return runner_command(store, run.claimed_by, Command.KILL, {"run": run.id, "requeue": requeue_after}, who)


def send(store: Store, run_id: str, body: dict[str, Any], who: str) -> dict[str, Any]:
    """As ``everystep send``: body holds ``topic``, ``payload`` (JSON text)
    and optionally ``key`` (its idempotency key)."""
    topic, key = body.get("topic"), body.get("key") or None
    if not isinstance(topic, str) or not topic.strip():
        raise ValueError("topic must be a non-empty string")
    if key is not None and not isinstance(key, str):
        raise ValueError("key must be text")
    payload = parse_json_value(body.get("payload"), "the message")
    sent, line = admin.send(store, run_id, topic.strip(), payload, key)
    logger.info("console: %s sent message %d to run %s on topic %r%s", who, sent.id, run_id, topic,
                "" if sent.stored else " (a repeat of its key: nothing stored)")
    return {"message": line, "message_id": sent.id, "stored": sent.stored}


RUN_HANDLERS: dict[str, Callable[[Store, str, dict[str, Any], str], dict[str, Any]]] = {
    "send": send,
    "resolve": resolve,
    "requeue": requeue,
    "cancel": cancel,
    "rerun": rerun,
    "fork": fork,
    "kill": kill,
}


def _scale_arguments(args: dict[str, Any]) -> dict[str, Any]:
    procs = args.get("procs")
    if isinstance(procs, str) and procs.strip().isdigit():
        procs = int(procs)
    if not isinstance(procs, int) or isinstance(procs, bool) or not 0 <= procs <= MAX_PROCS:
        raise ValueError(f"scale needs procs: an integer from 0 to {MAX_PROCS}")
    return {"procs": procs}


def _kill_arguments(args: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(args.get("run"), str) or not args["run"]:
        raise ValueError("kill needs run: the id of the run to kill")
    return {"run": args["run"], "requeue": bool(args.get("requeue", False))}


#: The supervisor commands the console sends, each with the check of its
#: arguments (the supervisor validates them again).
RUNNER_ARGUMENTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    Command.KILL: _kill_arguments,
    Command.SCALE: _scale_arguments,
}
RUNNER_COMMANDS: tuple[str, ...] = tuple(RUNNER_ARGUMENTS)


def runner_command(store: Store, runner: str, command: str, args: dict[str, Any], who: str) -> dict[str, Any]:
    """Send ``command`` to a live supervisor; returns the request to wait on."""
    check = RUNNER_ARGUMENTS.get(command)
    if check is None:
        raise ValueError(f"unknown supervisor command {command[:40]!r}; expected one of: {', '.join(RUNNER_COMMANDS)}")
    args = check(args)
    target = next((info for info in store.list_runners() if info.name == runner), None)
    if target is None or target.expired:
        raise ActionRefused(f"runner {runner} is not alive (no heartbeat within its lease)")
    if target.kind != "supervisor":
        raise ActionRefused(f"runner {runner} is a {target.kind}, not a supervisor: it takes no commands")
    request = relay.submit(store, runner, command, args, f"console {who}")
    logger.info("console: %s asked supervisor %s to %s %s (request %d)", who, runner, command,
                json.dumps(args), request.id)
    return {"request": request.to_dict(), "message": f"asked {runner} to {command}; waiting for its reply"}


def _children(n: Any) -> str:
    return f"{n} child" if n == 1 else f"{n} children"


def _killed(reply: dict[str, Any]) -> str:
    then = ("the run was requeued" if reply.get("action") == "requeued"
            else f"its {reply.get('action', 'in-flight step recorded as StepKilled')}")
    return (f"ok, killed child {reply.get('slot', '?')} (pid {reply.get('pid', '?')}) running run "
            f"{reply.get('run', '?')}; {then}.")


def _scaled(reply: dict[str, Any]) -> str:
    procs, previous = reply.get("procs"), reply.get("previous")
    if procs == previous:
        return f"ok, already at {_children(procs)}."
    return f"ok, scaled from {previous} to {_children(procs)}."


def _reloaded(reply: dict[str, Any]) -> str:
    modules = ", ".join(str(module) for module in reply.get("modules") or []) or "no module"
    return f"ok, reloaded {modules}; replacing {_children(reply.get('replacing', 0))}."


def _draining(reply: dict[str, Any]) -> str:
    return f"ok, draining; {_children(reply.get('busy', 0))} still busy."


#: A supervisor's ok reply as a sentence, by command; any other reads "ok.".
SENTENCES: dict[str, Callable[[dict[str, Any]], str]] = {
    Command.KILL: _killed,
    Command.SCALE: _scaled,
    Command.RELOAD: _reloaded,
    Command.DRAIN: _draining,
}


def outcome(request: relay.OperatorRequest) -> str:
    """A supervisor's answer to a request, as a sentence for the operator
    ("ok, scaled from 1 to 2 children."); what is not an ok reply (a
    refusal, no reply yet) reads as ``relay.describe_outcome`` says it."""
    reply = request.reply
    if request.status != relay.RequestStatus.ANSWERED or not isinstance(reply, dict) or not reply.get("ok"):
        return relay.describe_outcome(request)
    sentence = SENTENCES.get(request.command)
    return sentence(reply) if sentence is not None else "ok."


__all__ = ["ACTIONS", "ActionRefused", "RUN_HANDLERS", "RunAction", "available", "outcome", "runner_command"]
