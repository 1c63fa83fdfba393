"""A run's step graph: the plan read from source, overlaid with its records.

``build_graph(plan, records, active)`` walks the plan the way the runner
allocates step ids (a position per step or fork in each scope, a name
replacing the position's segment, ``<fork>.<branch>.`` prefixes for lanes)
and pins each recorded step to the call that made it. What the records do
not reach is the part of the body still ahead (``pending`` while the run is
unfinished, ``skipped`` once it is over). Control flow is settled by the
records themselves:

- a loop repeats for as long as the next iteration's first step was
  recorded, and no more times than its iterable has items when the source
  says (``Loop.count``); while more may come, its body is shown once more
  as the iteration that may come (``remaining``: how many, when known);
- an ``if``/``match`` arm is the one whose steps were recorded; while none
  is, every arm is drawn as an alternative;
- a recorded failure skips the rest of its block up to the ``try`` that
  catches it (its handler is the one whose steps were recorded, or, when
  the run recorded more after the failure, a handler that makes no step);
- after a construct whose length cannot be known (a loop, unequal arms),
  positions are found again from the next recorded call of the same
  function.

A wait (``plan.waits()``: a durable sleep, a message, a child's result) is
a node of kind ``wait`` with what it waits for and its wake time, in state
``waiting`` until its record says it ended (``done``). A ``patched()`` call
is a node of kind ``patch`` holding its run's marker row and its answer.

A recorded step whose function differs from the one the code now calls at
that id is drawn ``diverged`` (replaying it raises ``WorkflowCodeError``).
Every record appears exactly once: any the walk could not place (dynamic
code, a plan that guessed wrong) is listed in ``unplaced``.

``recorded_graph(records, reason)`` is the fallback without source: the
records alone, with forks and lanes rebuilt from their dotted ids.

A long history is summarised, never drawn whole: a loop that ran more than
``MAX_DRAWN`` times draws its first and last ``KEPT`` iterations and says
how many ran between them and how they ended (``collapsed``: a count of
steps by state and by function); a fork with more lanes, or a run of
records laid out one after another (the records alone, what a walk could
not place, a dynamic fork's lane), is cut the same way. The walk builds
each node's record lazily: only the records of the nodes kept are turned
into JSON, read in full through ``details`` when the walk was given
outlines (records without arguments, results and errors:
``Store.step_outline``). Every record still counts once: in a node, in a
collapsed summary, or in ``unplaced``.

The output is plain JSON-ready dicts (the console draws them in the
browser); see ``_step`` and the ``kind`` values for the shapes.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .. import registry
from ..models import STEP_DONE, STEP_FAILED, STEP_STARTED, StepOutline, StepRecord
from ..patches import PATCH_STEP, is_marker, marker_id, patch_of
from .plan import Choice, Exit, Fork, Loop, Node, Patch, Plan, StepCall, Try, Wait, wait_records

PENDING = "pending"
SKIPPED = "skipped"
DIVERGED = "diverged"
RUNNING = "running"
WAITING = "waiting"

#: A loop's iterations, a fork's lanes or a run of records are drawn whole
#: up to this many; past it, the first and last ``KEPT`` are drawn and the
#: rest summarised (``collapsed``).
MAX_DRAWN = 50
KEPT = 10

#: The kinds of node that may hold a record (and hold nothing else).
_LEAVES = frozenset({"step", "wait", "patch"})

#: What the walk reads of a record: a whole one, or a line of an outline
#: (``Store.step_outline``: id, function, status, a patch's answer).
Recorded = StepRecord | StepOutline

#: ``build_graph``'s ``details``: the full records of these step ids (those
#: of the nodes it keeps), when it was given outlines.
Details = Callable[[list[str]], Mapping[str, StepRecord]]

# How a walk through a block ended early.
EXITED = "exit"  # a return (or the end of the workflow)
RAISED = "raised"  # an exception propagates


@dataclasses.dataclass
class _Scope:
    prefix: str
    pos: int = 0
    certain: bool = True

    def copy(self) -> _Scope:
        return dataclasses.replace(self)


@dataclasses.dataclass
class _Walk:
    nodes: list[dict[str, Any]]
    matched: int = 0
    stop: str | None = None


def build_graph(plan: Plan, records: Sequence[Recorded], active: bool, running: bool = False,
                completed: bool = False, details: Details | None = None) -> dict[str, Any]:
    """The graph of a run from its workflow's plan and its records (in the
    order they were recorded). ``active``: the run is not finished, so what
    it has not reached is still ahead of it. ``running``: an executor holds
    it now, so the steps it has reached without recording them yet are in
    flight (see ``mark_in_flight``). ``completed``: the run returned, so
    every failure it recorded was caught. ``details``: where the full
    records of the nodes drawn are read when ``records`` are outlines."""
    if not plan.ok:
        return recorded_graph(records, plan.reason or "the workflow's source could not be read", details)
    walker = _Overlay(records, active, completed)
    walk = walker.sequence(list(plan.nodes or ()), _Scope(""), None)
    if running and active:
        mark_in_flight(walk.nodes)
    unplaced = [record for record in records if record.step_id not in walker.used]
    graph = {
        "mode": "source",
        "reason": None,
        "notes": list(plan.notes),
        "file": plan.file,
        "line": plan.line,
        "nodes": walk.nodes,
        "unplaced": _tree(unplaced),
    }
    return _dressed(graph, details)


def recorded_graph(records: Sequence[Recorded], reason: str, details: Details | None = None) -> dict[str, Any]:
    """The records alone, forks and lanes rebuilt from their ids."""
    return _dressed({"mode": "recorded", "reason": reason, "notes": [], "file": None, "line": None,
                     "nodes": _tree(records), "unplaced": []}, details)


def _dressed(graph: dict[str, Any], details: Details | None) -> dict[str, Any]:
    """The graph with each node's record (the one walked: whole, or a line
    of an outline) as JSON-ready data, whole: read through ``details`` when
    given. A wait's wake time is read there too."""
    nodes: list[dict[str, Any]] = []
    _with_records(graph["nodes"], nodes)
    _with_records(graph["unplaced"], nodes)
    full = details([node["record"].step_id for node in nodes]) if details is not None and nodes else {}
    transactional = registry.transactional_steps()
    for node in nodes:
        if node.get("exactly_once", False) is None:
            node["exactly_once"] = node["function"] in transactional
        record = full.get(node["record"].step_id, node["record"])
        if node["kind"] == "wait" and isinstance(record, StepRecord) and record.wake_at is not None:
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


# -- nodes ----------------------------------------------------------------------------


def _step(call: StepCall | None, step_id: str | None, record: Recorded | None, state: str) -> dict[str, Any]:
    function = record.name if record is not None else call.function if call is not None else "?"
    node: dict[str, Any] = {
        "kind": "step",
        "id": step_id,
        "function": function,
        "label": call.label if call is not None else function.rsplit(".", 1)[-1],
        "state": state,
        "unsafe": bool(call.unsafe) if call is not None else False,
        # Without a call (the records alone), read when the node is kept (``_dressed``).
        "exactly_once": call.exactly_once if call is not None else None,
        "line": call.line if call is not None else None,
        # The record itself while walking: made JSON (``_dressed``) only if the node is kept.
        "record": record,
    }
    if state == DIVERGED and call is not None:
        node["expected"] = call.function
    return node


def _wait(call: Wait | None, step_id: str | None, record: Recorded | None, state: str,
          kinds: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A wait's node: ``wait`` says what it waits for, ``until`` its wake
    time (None: until something else ends it, or not reached). ``kinds``:
    ``wait_records()``, when the caller has it."""
    row = (kinds if kinds is not None else wait_records()).get(record.name) \
        if call is None and record is not None else None
    kind = call.kind if call is not None else row.kind if row is not None else "wait"
    node = _step(None, step_id, record, state)
    node.update({
        "kind": "wait",
        "wait": kind,
        "function": call.function if call is not None else node["function"],
        "label": call.label if call is not None else kind,
        "line": call.line if call is not None else None,
        "until": None,  # its record's wake time, read whole when the node is kept (``_dressed``)
    })
    return node


def _patch(call: Patch | None, step_id: str | None, record: Recorded | None, state: str,
           answer: Any = None) -> dict[str, Any]:
    """A ``patched()`` call's node: ``answer`` is the recorded branch
    (True: the new code's, False: the old code's; None: not asked yet)."""
    node = _step(None, step_id, record, state)
    node.update({
        "kind": "patch",
        "function": PATCH_STEP,
        "patch": call.patch_id if call is not None else patch_of(record) if record is not None else None,
        "label": call.label if call is not None else "patched",
        "line": call.line if call is not None else None,
        "answer": record.result if record is not None else answer,
    })
    return node


def _wait_state(record: Recorded) -> str:
    """A wait's record is final once done (or failed); until then it waits,
    whatever its row's status says (``sleeping``, …)."""
    return str(record.status) if record.status in (STEP_DONE, STEP_FAILED) else WAITING


def _fork_state(lanes: list[dict[str, Any]]) -> str:
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


# -- the walk ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Index:
    """Where records are found when a position is not predicted, built on
    first need (a body whose every position is known, a long loop of steps,
    never needs it): the direct children of each scope prefix by function,
    numbered ones as (position, step id) in position order and named ones
    in record order, so the next unused one is found without a scan; the
    fork ids present, ``{scope prefix: [fork segment, ...]}``; each fork's
    records by lane, at any depth below it; and each record's place in the
    order recorded."""

    numbered: dict[tuple[str, str], list[tuple[int, str]]]
    named: dict[tuple[str, str], list[str]]
    forks: dict[str, list[str]]
    lanes: dict[str, dict[str, list[Recorded]]]
    order: dict[str, int]

    @classmethod
    def of(cls, records: Sequence[Recorded]) -> _Index:
        index = cls({}, {}, {}, {}, {})
        known_forks: dict[str, set[str]] = {}
        for place, record in enumerate(records):
            index.order[record.step_id] = place
            parts = record.step_id.split(".")
            prefix = ".".join(parts[:-1]) + "." if len(parts) > 1 else ""
            if parts[-1].isdigit():
                index.numbered.setdefault((prefix, record.name), []).append((int(parts[-1]), record.step_id))
            else:
                index.named.setdefault((prefix, record.name), []).append(record.step_id)
            for end in range(1, len(parts) - 1, 2):
                scope = ".".join(parts[: end - 1]) + "." if end > 1 else ""
                segment = parts[end - 1]
                if segment not in known_forks.setdefault(scope, set()):
                    known_forks[scope].add(segment)
                    index.forks.setdefault(scope, []).append(segment)
                fork_id = ".".join(parts[:end])
                index.lanes.setdefault(fork_id, {}).setdefault(parts[end], []).append(record)
        for positions in index.numbered.values():
            positions.sort()
        return index


class _Overlay:
    def __init__(self, records: Sequence[Recorded], active: bool, completed: bool = False) -> None:
        self.completed = completed
        self.ordered = records
        self.records = {record.step_id: record for record in records}
        self.ahead = PENDING if active else SKIPPED
        self.used: set[str] = set()
        self._journal: list[str] = []
        self._index: _Index | None = None

    @property
    def index(self) -> _Index:
        if self._index is None:
            self._index = _Index.of(self.ordered)
        return self._index

    # -- bookkeeping for trials ---------------------------------------------------------

    def _use(self, step_id: str) -> None:
        self.used.add(step_id)
        self._journal.append(step_id)

    def _mark(self) -> int:
        return len(self._journal)

    def _undo(self, mark: int) -> None:
        while len(self._journal) > mark:
            self.used.discard(self._journal.pop())

    def _trial(self, nodes: list[Node], scope: _Scope) -> _Walk:
        """Walk ``nodes`` to see what they match, leaving no trace."""
        mark, saved = self._mark(), scope.copy()
        walk = self.sequence(nodes, scope, None)
        self._undo(mark)
        scope.pos, scope.certain = saved.pos, saved.certain
        return walk

    # -- sequences ----------------------------------------------------------------------

    def sequence(self, nodes: list[Node], scope: _Scope, preview: str | None) -> _Walk:
        """Walk a block. ``preview`` is None to match records, else the state
        to draw every node in (``pending``/``skipped``), matching nothing."""
        out: list[dict[str, Any]] = []
        provisional: list[dict[str, Any]] = []
        matched = 0
        for index, node in enumerate(nodes):
            walk = self.node(node, scope, preview)
            if walk.matched:
                # The run got past every undecided construct before this one.
                for earlier in provisional:
                    _settle_passed(earlier)
                provisional.clear()
            out.extend(walk.nodes)
            provisional.extend(n for n in walk.nodes if n.get("undecided"))
            matched += walk.matched
            if walk.stop is not None:
                rest = nodes[index + 1:]
                if rest and preview is None:
                    out.extend(self.sequence(rest, _Scope(scope.prefix, certain=False), SKIPPED).nodes)
                return _Walk(out, matched, walk.stop)
        return _Walk(out, matched, None)

    def node(self, node: Node, scope: _Scope, preview: str | None) -> _Walk:
        if isinstance(node, StepCall):
            return self._step_call(node, scope, preview)
        if isinstance(node, Wait):
            return self._wait_call(node, scope, preview)
        if isinstance(node, Fork):
            return self._fork(node, scope, preview)
        if isinstance(node, Loop):
            return self._loop(node, scope, preview)
        if isinstance(node, Choice):
            return self._choice(node, scope, preview)
        if isinstance(node, Try):
            return self._try(node, scope, preview)
        if isinstance(node, Patch):
            return self._patch_call(node, preview)
        assert isinstance(node, Exit)
        # An exit records nothing, so whether the run got there is not known.
        return _Walk([{"kind": "exit", "label": node.text, "line": node.line}], 0,
                     RAISED if node.text == "raise" else EXITED)

    # -- steps ------------------------------------------------------------------------------

    def _predicted(self, name: str | None, dynamic: bool, scope: _Scope) -> str | None:
        if dynamic:
            return None
        if name is not None:
            return scope.prefix + name
        return scope.prefix + str(scope.pos) if scope.certain else None

    def _step_call(self, call: StepCall, scope: _Scope, preview: str | None) -> _Walk:
        scope.pos += 1
        if preview is not None:
            return _Walk([_step(call, self._predicted(call.name, call.dynamic_name, scope), None, preview)])
        step_id = self._locate_step(call, scope)
        record = self.records.get(step_id) if step_id is not None and step_id not in self.used else None
        if record is None:
            return _Walk([_step(call, step_id, None, self.ahead)])
        self._use(record.step_id)
        if record.name != call.function:
            return _Walk([_step(call, record.step_id, record, DIVERGED)])
        stop = RAISED if record.status == STEP_FAILED else None
        return _Walk([_step(call, record.step_id, record, record.status)], 1, stop)

    def _wait_call(self, call: Wait, scope: _Scope, preview: str | None) -> _Walk:
        scope.pos += 1
        if preview is not None:
            return _Walk([_wait(call, self._predicted(call.name, call.dynamic_name, scope), None, preview)])
        step_id = self._locate_step(call, scope)
        record = self.records.get(step_id) if step_id is not None and step_id not in self.used else None
        if record is None:
            return _Walk([_wait(call, step_id, None, self.ahead)])
        self._use(record.step_id)
        if record.name != call.function:
            step = _step(None, record.step_id, record, DIVERGED)
            step.update({"label": call.label, "line": call.line, "expected": call.function})
            return _Walk([step])
        state = _wait_state(record)
        return _Walk([_wait(call, record.step_id, record, state)], 1, RAISED if state == STEP_FAILED else None)

    def _patch_call(self, call: Patch, preview: str | None) -> _Walk:
        """A patch's marker is per run, not per scope: the first ``patched``
        call of its id holds the record; a later one (a loop, another
        branch) gets the same answer without it."""
        step_id = marker_id(call.patch_id) if call.patch_id is not None else None
        record = self.records.get(step_id) if step_id is not None else None
        if preview is not None or record is None:
            return _Walk([_patch(call, step_id, None, preview or self.ahead)])
        if step_id in self.used:
            return _Walk([_patch(call, step_id, None, str(record.status), record.result)])
        self._use(record.step_id)
        return _Walk([_patch(call, step_id, record, str(record.status))], 1)

    def _locate_step(self, call: StepCall | Wait, scope: _Scope) -> str | None:
        if call.dynamic_name:
            return next((step_id for step_id in self.index.named.get((scope.prefix, call.function), ())
                         if step_id not in self.used), None)
        predicted = self._predicted(call.name, False, scope)
        if predicted is not None:
            return predicted
        # Position unknown: the next unused record of this function here.
        positions = self.index.numbered.get((scope.prefix, call.function), [])
        for index in range(bisect.bisect_left(positions, (scope.pos, "")), len(positions)):
            position, step_id = positions[index]
            if step_id not in self.used:
                scope.pos, scope.certain = position, True
                return step_id
        return None

    # -- forks ------------------------------------------------------------------------------

    def _locate_fork(self, fork: Fork, scope: _Scope) -> str | None:
        predicted = self._predicted(fork.name, fork.dynamic_name, scope)
        if predicted is not None:
            return predicted
        segments = self.index.forks.get(scope.prefix, [])
        if fork.dynamic_name:
            candidates = [s for s in segments if not s.isdigit()]
            return scope.prefix + candidates[0] if candidates else None
        numbers = sorted(int(s) for s in segments if s.isdigit() and int(s) >= scope.pos)
        if not numbers:
            return None
        scope.pos, scope.certain = numbers[0], True
        return scope.prefix + str(numbers[0])

    def _fork(self, fork: Fork, scope: _Scope, preview: str | None) -> _Walk:
        scope.pos += 1
        fork_id = (self._predicted(fork.name, fork.dynamic_name, scope) if preview is not None
                   else self._locate_fork(fork, scope))
        lanes: list[dict[str, Any]] = []
        matched, raised = 0, False
        if fork.dynamic and preview is None and fork_id is not None:
            found = self.index.lanes.get(fork_id, {})
            for index in sorted(int(segment) for segment in found if segment.isdigit()):
                records = [r for r in found[str(index)] if r.step_id not in self.used]
                if not records:
                    continue
                for record in records:
                    self._use(record.step_id)
                nodes = _tree(records, f"{fork_id}.{index}.")
                matched += len(records)
                raised = raised or any(r.status == STEP_FAILED for r in records)
                lanes.append({"label": f"branch {index}", "nodes": nodes})
        # Where the fork's id is unknown its lanes cannot be matched: drawn ahead.
        lane_mode = preview if preview is not None or fork_id is not None else self.ahead
        for index, branch in enumerate(fork.branches if not fork.dynamic else ()):
            sub = _Scope(f"{fork_id}.{index}.") if fork_id is not None else _Scope("", certain=False)
            walk = self.sequence(list(branch), sub, lane_mode)
            matched += walk.matched
            raised = raised or walk.stop == RAISED
            lanes.append({"label": f"branch {index}", "nodes": walk.nodes})
        node = {
            "kind": "fork", "id": fork_id, "label": fork.name or "parallel", "line": fork.line,
            "dynamic": fork.dynamic, "lanes": lanes,
            "state": preview or _fork_state(lanes),
        }
        _cut_lanes(node)
        return _Walk([node], matched, RAISED if raised else None)

    # -- control flow -------------------------------------------------------------------------

    def _loop(self, loop: Loop, scope: _Scope, preview: str | None) -> _Walk:
        body = list(loop.body)
        iterations = _Kept()
        matched, stop = 0, None
        most = len(self.records) + 1 if loop.count is None else min(loop.count, len(self.records) + 1)
        if preview is None:
            for _ in range(most):
                # The next iteration, walked once: undone if it matched nothing.
                mark, pos, certain = self._mark(), scope.pos, scope.certain
                walk = self.sequence(body, scope, None)
                if not walk.matched:
                    self._undo(mark)
                    scope.pos, scope.certain = pos, certain
                    break
                iterations.add(walk.nodes)
                matched += walk.matched
                if walk.stop is not None:
                    stop = walk.stop
                    break
        # How many iterations may still come (None: not known). A loop over a
        # known number of items that recorded every one of them is over:
        # nothing is drawn ahead of it, and positions after it stay known.
        remaining = loop.count - iterations.count if loop.count is not None else None
        upcoming: list[dict[str, Any]] = []
        if stop is None and remaining != 0:
            # The iteration that may come (for a finished run, only a loop
            # that never ran a step is drawn, so its content is seen).
            if preview is not None or self.ahead == PENDING or not iterations:
                upcoming = self.sequence(body, scope.copy(), preview or self.ahead).nodes
            scope.certain = False  # how many more iterations is not known
        node = {"kind": "loop", "label": loop.text, "line": loop.line, "iterations": iterations.drawn(),
                "count": iterations.count, "collapsed": iterations.summary(), "next": upcoming,
                "remaining": remaining, "undecided": bool(upcoming) and preview is None}
        return _Walk([node], matched, stop)

    def _choice(self, choice: Choice, scope: _Scope, preview: str | None) -> _Walk:
        arms = list(choice.arms)
        taken = None
        if preview is None:
            taken = next((arm for arm in arms if self._trial(list(arm.body), scope).matched), None)
        if taken is not None:
            walk = self.sequence(list(taken.body), scope, None)
            lanes = [{"label": arm.label, "taken": arm is taken, "nodes": walk.nodes if arm is taken else []}
                     for arm in arms]
            node = {"kind": "choice", "label": choice.arms[0].label, "line": choice.line, "lanes": lanes,
                    "decided": True}
            return _Walk([node], walk.matched, walk.stop)
        lanes = [{"label": arm.label, "taken": False,
                  "nodes": self.sequence(list(arm.body), scope.copy(), preview or self.ahead).nodes}
                 for arm in arms]
        _advance(scope, [list(arm.body) for arm in arms])
        node = {"kind": "choice", "label": choice.arms[0].label, "line": choice.line, "lanes": lanes,
                "decided": False, "undecided": preview is None}
        return _Walk([node], 0, None)

    def _try(self, block: Try, scope: _Scope, preview: str | None) -> _Walk:
        mark = self._mark()
        body = self.sequence(list(block.body), scope, preview)
        matched, stop = body.matched, body.stop
        handlers: list[dict[str, Any]] = []
        orelse: list[dict[str, Any]] = []
        caught = None
        if stop == RAISED and preview is None:
            taken = next((arm for arm in block.handlers if self._trial(list(arm.body), scope).matched), None)
            if taken is not None:
                walk = self.sequence(list(taken.body), scope, None)
                caught, stop, matched = taken.label, walk.stop, matched + walk.matched
                handlers = [{"label": arm.label, "taken": arm is taken, "nodes": walk.nodes if arm is taken else []}
                            for arm in block.handlers]
            else:
                # Caught by a handler that records nothing (yet), or not at all.
                stepless = [arm for arm in block.handlers if not arm.body]
                went_on = bool(stepless) and self._recorded_after(self._journal[mark:], scope.prefix)
                if went_on and len(stepless) == 1:
                    caught = stepless[0].label
                elif went_on:
                    caught = "a handler without steps"
                handlers = [{"label": arm.label, "taken": went_on and len(stepless) == 1 and arm is stepless[0],
                             "nodes": self.sequence(list(arm.body), scope.copy(), self.ahead).nodes}
                            for arm in block.handlers]
                if any(arm.body for arm in block.handlers) or went_on:
                    # Where the next step lands is found from its record (an
                    # enclosing try may have been the one that caught it).
                    scope.certain = False
                stop = None if self.ahead == PENDING or went_on else RAISED
        else:
            # No failure (yet): the handlers are what a failure would run,
            # still possible while part of the body is ahead. Their step ids
            # would follow the step that fails, which is not known: none is
            # predicted (the next position after the body belongs to what
            # follows the try).
            state = preview or (self.ahead if _has_ahead(body.nodes) else SKIPPED)
            handlers = [{"label": arm.label, "taken": False,
                         "nodes": self.sequence(list(arm.body), _Scope(scope.prefix, scope.pos, False), state).nodes}
                        for arm in block.handlers]
            if stop is None:
                walk = self.sequence(list(block.orelse), scope, preview)
                orelse, matched, stop = walk.nodes, matched + walk.matched, walk.stop
        final = self.sequence(list(block.final), scope, preview)
        node = {"kind": "try", "line": block.line, "label": "try", "body": body.nodes, "handlers": handlers,
                "orelse": orelse, "final": final.nodes, "caught": caught,
                "undecided": preview is None and caught is None
                and any(_has_ahead(lane["nodes"]) for lane in handlers)}
        return _Walk([node], matched + final.matched, final.stop or stop)

    def _recorded_after(self, body_ids: list[str], prefix: str) -> bool:
        """Whether the run recorded a step in this scope (or below it) after
        the ones ``body_ids`` (a failed block's records): it went on past
        the failure, which something caught (a run that completed caught
        every failure it recorded)."""
        if not body_ids:
            return False
        if self.completed:
            return True
        last = max(self.index.order[step_id] for step_id in body_ids)
        # In record order from there: the first one found answers.
        return any(self.ordered[index].step_id not in self.used and self.ordered[index].step_id.startswith(prefix)
                   for index in range(last + 1, len(self.ordered)))


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


def _has_ahead(nodes: list[dict[str, Any]]) -> bool:
    """Whether anything in these drawn nodes is still ahead of the run."""
    for node in nodes:
        if node.get("state") == PENDING:
            return True
        for key in ("lanes", "handlers"):
            if any(_has_ahead(lane["nodes"]) for lane in node.get(key, ())):
                return True
        for key in ("body", "orelse", "final", "next"):
            if _has_ahead(node.get(key, [])):
                return True
        if any(_has_ahead(iteration) for iteration in node.get("iterations", ())):
            return True
    return False


def _settle_passed(node: dict[str, Any]) -> None:
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


def _positions(nodes: list[Node]) -> int | None:
    """Positions a block consumes in its scope, when that is fixed."""
    count = 0
    for node in nodes:
        if isinstance(node, (StepCall, Wait, Fork)):
            count += 1
        elif isinstance(node, Patch):
            pass  # a marker takes no position
        elif isinstance(node, Choice):
            counts = {_positions(list(arm.body)) for arm in node.arms}
            if len(counts) != 1 or None in counts:
                return None
            count += counts.pop() or 0
        elif isinstance(node, Exit):
            return None
        else:
            return None
    return count


def _advance(scope: _Scope, arms: list[list[Node]]) -> None:
    """Move past a choice nobody can decide yet."""
    counts = [_positions(arm) for arm in arms]
    known = [count for count in counts if count is not None]
    if counts and len(known) == len(counts) and len(set(known)) == 1:
        scope.pos += known[0]
    else:
        scope.pos += min(known) if known else 0
        scope.certain = False


# -- the records alone -----------------------------------------------------------------------


def _tree(records: Sequence[Recorded], base: str = "") -> list[dict[str, Any]]:
    """Records as nodes, in record order, forks rebuilt from dotted ids
    (``3.0.1``: step 1 of branch 0 of fork 3), read below ``base`` (a lane's
    prefix, ``3.0.``) when given."""
    waiting = wait_records()
    root: list[dict[str, Any]] = []
    forks: dict[str, dict[str, Any]] = {}
    lanes: dict[str, dict[str, Any]] = {}
    for record in records:
        parts = record.step_id[len(base):].split(".")
        target = root
        for end in range(1, len(parts) - 1, 2):
            fork_id = base + ".".join(parts[:end])
            fork = forks.get(fork_id)
            if fork is None:
                fork = forks[fork_id] = {"kind": "fork", "id": fork_id, "label": parts[end - 1] if not
                                         parts[end - 1].isdigit() else "parallel", "line": None,
                                         "dynamic": False, "lanes": [], "state": PENDING}
                target.append(fork)
            lane_id = f"{fork_id}.{parts[end]}"
            lane = lanes.get(lane_id)
            if lane is None:
                lane = lanes[lane_id] = {"label": f"branch {parts[end]}", "nodes": [], "index": parts[end]}
                fork["lanes"].append(lane)
            target = lane["nodes"]
        if is_marker(record):
            target.append(_patch(None, record.step_id, record, str(record.status)))
        elif record.name in waiting:
            target.append(_wait(None, record.step_id, record, _wait_state(record), waiting))
        else:
            target.append(_step(None, record.step_id, record, record.status))
    for fork in forks.values():
        fork["lanes"].sort(key=lambda l: (not l["index"].isdigit(), int(l["index"]) if l["index"].isdigit() else 0))
        for lane in fork["lanes"]:
            lane.pop("index", None)
        fork["state"] = _fork_state(fork["lanes"])
    # Cut once every state is known: a fork's state counts every lane.
    for fork in forks.values():
        _cut_lanes(fork)
        for lane in fork["lanes"]:
            lane["nodes"] = _cut(lane["nodes"])
    return _cut(root)


# -- long histories --------------------------------------------------------------------------


class _Tally:
    """What a collapsed part of the graph held: how many items (iterations,
    lanes or nodes), the records in them by state and by function, and the
    first and last of those records' step ids."""

    def __init__(self) -> None:
        self.items = 0
        self.states: collections.Counter[str] = collections.Counter()
        self.functions: collections.Counter[str] = collections.Counter()
        self.first: str | None = None
        self.last: str | None = None

    def add(self, nodes: Iterable[dict[str, Any]]) -> None:
        self.items += 1
        self.count(nodes)

    def count(self, nodes: Iterable[dict[str, Any]]) -> None:
        """Tally the records in ``nodes`` at any depth (this runs once per
        record of a long history: a step's node is looked at once)."""
        for node in nodes:
            kind = node["kind"]
            if kind in _LEAVES:
                if node["record"] is not None:
                    self.states[node["state"]] += 1
                    self.functions[node["label"]] += 1
                    self.first, self.last = self.first or node["id"], node["id"]
                continue
            if kind == "collapsed":
                self._merge(node)
                continue
            if node.get("collapsed"):  # a loop's iterations, a fork's lanes
                self._merge(node["collapsed"])
            for key in ("lanes", "handlers"):
                for lane in node.get(key, ()):
                    self.count(lane["nodes"])
            for key in ("body", "orelse", "final"):
                self.count(node.get(key, ()))
            for iteration in node.get("iterations", ()):
                self.count(iteration)

    def _merge(self, summary: dict[str, Any]) -> None:
        """A part collapsed further in: its tally added to this one."""
        self.states.update(summary["states"])
        self.functions.update(dict(summary["functions"]))
        self.first, self.last = self.first or summary["first"], summary["last"] or self.last

    def to_dict(self, after: int) -> dict[str, Any]:
        """``after``: how many items are drawn before the collapsed ones."""
        return {"after": after, "count": self.items, "steps": sum(self.states.values()),
                "states": dict(self.states), "functions": [[label, n] for label, n in self.functions.most_common()],
                "first": self.first, "last": self.last}


class _Kept:
    """Items (a loop's iterations, a fork's lanes, a row of nodes) kept as
    they come: all of them up to ``MAX_DRAWN``; past it the first and last
    ``KEPT``, the ones between tallied and dropped as they go."""

    def __init__(self) -> None:
        self.head: list[Any] = []
        self.tail: collections.deque[Any] = collections.deque()
        self.count = 0
        self.folded = _Tally()

    def add(self, item: Any, nodes: Iterable[dict[str, Any]] | None = None) -> None:
        """Keep ``item``, whose nodes are ``nodes`` (the item itself when None)."""
        self.count += 1
        if len(self.head) < KEPT:
            self.head.append((item, nodes))
            return
        self.tail.append((item, nodes))
        if self.count > MAX_DRAWN:
            while len(self.tail) > KEPT:
                folded, its_nodes = self.tail.popleft()
                self.folded.add(folded if its_nodes is None else its_nodes)

    def drawn(self) -> list[Any]:
        return [item for item, _nodes in (*self.head, *self.tail)]

    def summary(self) -> dict[str, Any] | None:
        return self.folded.to_dict(len(self.head)) if self.folded.items else None


def _cut(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A row of nodes, cut when too long: its first and last ``KEPT``
    around one ``collapsed`` node that tallies the rest."""
    if len(nodes) <= MAX_DRAWN:
        return nodes
    middle = _Tally()
    middle.items = len(nodes) - 2 * KEPT
    middle.count(nodes[KEPT:-KEPT])
    return [*nodes[:KEPT], {"kind": "collapsed", **middle.to_dict(KEPT)}, *nodes[-KEPT:]]


def _cut_lanes(fork: dict[str, Any]) -> None:
    """A fork with too many lanes draws its first and last ``KEPT``;
    ``collapsed`` tallies the rest."""
    lanes = fork["lanes"]
    fork["collapsed"] = None
    if len(lanes) <= MAX_DRAWN:
        return
    kept = _Kept()
    for lane in lanes:
        kept.add(lane, lane["nodes"])
    fork["lanes"], fork["collapsed"] = kept.drawn(), kept.summary()




__all__ = ["build_graph", "mark_in_flight", "recorded_graph"]
