"""The nodes of a step graph as the console draws them: plain JSON-ready
dicts, one ``kind`` each (``step``, ``wait``, ``patch``, ``fork`` with its
``lanes``, ``choice``, ``loop``, ``try``), and their states.

A node's ``state`` is a step status (``done``, ``failed``, ``started``)
or where the run stands with it: ``pending`` (still ahead), ``skipped``
(the run ended without reaching it), ``diverged`` (the code now calls
another function there), ``running`` (in flight, see ``mark_in_flight``),
``waiting`` (a wait not ended yet). The walk that places records on a plan
(``overlay``) and the records-only fallback (``recorded``) build their
nodes here, holding the record they were walked with; ``dressed`` turns
the records of the nodes kept into JSON, read whole where needed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .. import registry, wait_kinds
from ..models import STEP_DONE, STEP_FAILED, STEP_STARTED, StepOutline, StepRecord
from ..patches import PATCH_STEP, patch_of
from .nodes import Patch, StepCall, Wait
from .plan import wait_records

PENDING = "pending"
SKIPPED = "skipped"
DIVERGED = "diverged"
RUNNING = "running"
WAITING = "waiting"

#: What a walk reads of a record: a whole one, or a line of an outline
#: (``Store.step_outline``: id, function, status, a patch's answer).
Recorded = StepRecord | StepOutline

#: Where the full records of the nodes drawn are read (their step ids in,
#: the records by id out), when a graph was walked from outlines.
Details = Callable[[list[str]], Mapping[str, StepRecord]]


def step_node(call: StepCall | None, step_id: str | None, record: Recorded | None, state: str) -> dict[str, Any]:
    function = record.name if record is not None else call.function if call is not None else "?"
    node: dict[str, Any] = {
        "kind": "step",
        "id": step_id,
        "function": function,
        "label": call.label if call is not None else function.rsplit(".", 1)[-1],
        "state": state,
        "unsafe": bool(call.unsafe) if call is not None else False,
        # Without a call (the records alone), read when the node is kept (``dressed``).
        "exactly_once": call.exactly_once if call is not None else None,
        "line": call.line if call is not None else None,
        # The record itself while walking: made JSON (``dressed``) only if the node is kept.
        "record": record,
    }
    if state == DIVERGED and call is not None:
        node["expected"] = call.function
    return node


def wait_node(call: Wait | None, step_id: str | None, record: Recorded | None, state: str,
              kinds: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A wait's node: ``wait`` says what kind of wait it is, ``what`` what it
    waits for in words (from the kind's declaration, ``everystep.wait_kinds``,
    read with the whole record by ``dressed``), ``until`` its wake time
    (None: until something else ends it, or not reached). ``kinds``:
    ``wait_records()``, when the caller has it."""
    row = (kinds if kinds is not None else wait_records()).get(record.name) \
        if call is None and record is not None else None
    kind = call.kind if call is not None else row.kind if row is not None else "wait"
    node = step_node(None, step_id, record, state)
    node.update({
        "kind": "wait",
        "wait": kind,
        "what": kind,
        "function": call.function if call is not None else node["function"],
        "label": call.label if call is not None else kind,
        "line": call.line if call is not None else None,
        "until": None,
    })
    return node


def patch_node(call: Patch | None, step_id: str | None, record: Recorded | None, state: str,
               answer: Any = None) -> dict[str, Any]:
    """A ``patched()`` call's node: ``answer`` is the recorded branch
    (True: the new code's, False: the old code's; None: not asked yet)."""
    node = step_node(None, step_id, record, state)
    node.update({
        "kind": "patch",
        "function": PATCH_STEP,
        "patch": call.patch_id if call is not None else patch_of(record) if record is not None else None,
        "label": call.label if call is not None else "patched",
        "line": call.line if call is not None else None,
        "answer": record.result if record is not None else answer,
    })
    return node


def wait_state(record: Recorded) -> str:
    """A wait's record is final once done (or failed); until then it waits,
    whatever its row's status says (``sleeping``, …)."""
    return str(record.status) if record.status in (STEP_DONE, STEP_FAILED) else WAITING


def fork_state(lanes: list[dict[str, Any]]) -> str:
    states = [state for lane in lanes for state in _states(lane["nodes"])]
    if not states:
        return PENDING
    for worst in (DIVERGED, STEP_FAILED, STEP_STARTED):
        if worst in states:
            return worst
    if all(state == "done" for state in states):
        return "done"
    if all(state in (PENDING, SKIPPED) for state in states):
        return states[0]
    return RUNNING


def _states(nodes: list[dict[str, Any]]) -> list[str]:
    out = []
    for node in nodes:
        if node["kind"] in ("step", "wait", "fork"):
            out.append(node["state"])
    return out


def mark_in_flight(nodes: list[dict[str, Any]]) -> bool:
    """Mark ``running`` the steps a running run is executing: in each
    sequence the body has reached (everything before it recorded done), the
    first step not recorded yet, or an unsafe step ``started`` without an
    outcome; in a fork, that step of every lane, since branches run side by
    side. A choice or loop not yet settled by the records stops the marking
    (the path is not known). Returns whether the whole sequence is done."""
    for node in nodes:
        kind, state = node["kind"], node.get("state")
        if kind == "step":
            if state == "done":
                continue
            if state in (PENDING, STEP_STARTED):
                node["state"] = RUNNING
                node["in_flight"] = True
            return False
        if kind == "wait":
            if state == "done":
                continue
            return False
        if kind == "patch":
            continue  # its marker is written with the run's next write: never in flight itself
        if kind == "fork":
            if state == "done":
                continue
            finished = [mark_in_flight(lane["nodes"]) for lane in node["lanes"]]
            if all(finished) and node["lanes"]:
                continue
            if any(_in_flight(lane["nodes"]) for lane in node["lanes"]):
                node["state"] = RUNNING
            return False
        if kind == "choice":
            if not node.get("decided"):
                return False
            taken = [lane for lane in node["lanes"] if lane["taken"]]
            if not taken or not mark_in_flight(taken[0]["nodes"]):
                return False
            continue
        if kind == "try":
            if not mark_in_flight(node["body"]):
                if node.get("caught") is None:
                    return False
            taken = [lane for lane in node["handlers"] if lane["taken"]]
            if taken and not mark_in_flight(taken[0]["nodes"]):
                return False
            if not taken and not mark_in_flight(node["orelse"]):
                return False
            if not mark_in_flight(node["final"]):
                return False
            continue
        if kind == "loop":
            for iteration in node["iterations"]:
                if not mark_in_flight(iteration):
                    return False
            return False  # another iteration, or what follows the loop: not known
        if kind == "collapsed" and set(node["states"]) <= {"done"}:
            continue  # records summarised, every one of them done
        return False  # an exit, or a kind this walk does not know
    return True


def _in_flight(nodes: list[dict[str, Any]]) -> bool:
    for node in nodes:
        if node.get("in_flight"):
            return True
        for key in ("lanes", "handlers"):
            if any(_in_flight(lane["nodes"]) for lane in node.get(key, ())):
                return True
        for key in ("body", "orelse", "final"):
            if _in_flight(node.get(key, [])):
                return True
        if any(_in_flight(iteration) for iteration in node.get("iterations", ())):
            return True
    return False


def has_ahead(nodes: list[dict[str, Any]]) -> bool:
    """Whether anything in these drawn nodes is still ahead of the run."""
    for node in nodes:
        if node.get("state") == PENDING:
            return True
        for key in ("lanes", "handlers"):
            if any(has_ahead(lane["nodes"]) for lane in node.get(key, ())):
                return True
        for key in ("body", "orelse", "final", "next"):
            if has_ahead(node.get(key, [])):
                return True
        if any(has_ahead(iteration) for iteration in node.get("iterations", ())):
            return True
    return False


def settle_passed(node: dict[str, Any]) -> None:
    """The run went past this undecided construct without recording any of
    it: a loop that ended, an arm without steps that was taken."""
    node["undecided"] = False
    if node["kind"] == "loop":
        _restate(node["next"], SKIPPED)
        node["next"] = []
    elif node["kind"] == "choice":
        node["passed"] = True
        for lane in node["lanes"]:
            _restate(lane["nodes"], SKIPPED)
    elif node["kind"] == "try":
        for lane in node["handlers"]:
            _restate(lane["nodes"], SKIPPED)


def _restate(nodes: list[dict[str, Any]], state: str) -> None:
    for node in nodes:
        if "state" in node and node.get("record") is None:
            node["state"] = state
        for key in ("lanes", "handlers"):
            for lane in node.get(key, ()):
                _restate(lane["nodes"], state)
        for key in ("body", "orelse", "final", "next"):
            _restate(node.get(key, []), state)


def dressed(graph: dict[str, Any], details: Details | None) -> dict[str, Any]:
    """The graph with each drawn node's record (the one walked: whole, or a
    line of an outline) as JSON-ready data, whole: read through ``details``
    when given. What a wait waits for and its wake time are read there too."""
    nodes: list[dict[str, Any]] = []
    _with_records(graph["nodes"], nodes)
    _with_records(graph["unplaced"], nodes)
    full = details([node["record"].step_id for node in nodes]) if details is not None and nodes else {}
    transactional = registry.transactional_steps()
    for node in nodes:
        if node.get("exactly_once", False) is None:
            node["exactly_once"] = node["function"] in transactional
        record = full.get(node["record"].step_id, node["record"])
        if node["kind"] == "wait" and isinstance(record, StepRecord):
            declared = wait_kinds.by_step.get(record.name)
            if declared is not None:
                node["what"] = declared.describe(record.args)
            if record.wake_at is not None:
                node["until"] = record.wake_at.isoformat()
        node["record"] = _record_data(record)
    return graph


def _with_records(nodes: list[dict[str, Any]], found: list[dict[str, Any]]) -> None:
    """Collect the drawn nodes that hold a record, at any depth."""
    for node in nodes:
        if isinstance(node.get("record"), (StepRecord, StepOutline)):
            found.append(node)
        for key in ("lanes", "handlers"):
            for lane in node.get(key, ()):
                _with_records(lane["nodes"], found)
        for key in ("body", "orelse", "final", "next"):
            _with_records(node.get(key, []), found)
        for iteration in node.get("iterations", ()):
            _with_records(iteration, found)


def _record_data(record: Recorded) -> dict[str, Any]:
    if isinstance(record, StepOutline):  # no details to read it whole from
        record = StepRecord(record.workflow_id, record.step_id, record.name, record.status, result=record.result)
    data = record.to_dict()
    data["duration"] = (
        (record.completed_at - record.started_at).total_seconds()
        if record.completed_at is not None and record.started_at is not None else None
    )
    return data


__all__ = ["DIVERGED", "PENDING", "RUNNING", "SKIPPED", "WAITING", "Details", "Recorded", "dressed", "fork_state", "has_ahead", "mark_in_flight",
           "patch_node", "settle_passed", "step_node", "wait_node", "wait_state"]
