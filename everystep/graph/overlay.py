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

``recorded.recorded_graph(records, reason)`` is the fallback without
source: the records alone, with forks and lanes rebuilt from their dotted
ids.

A long history is summarised, never drawn whole: a loop that ran more than
``collapse.MAX_DRAWN`` times draws its first and last ``collapse.KEPT`` iterations and says
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
browser); ``drawn`` builds every node and says their shapes and states.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from typing import Any

from ..models import STEP_FAILED
from ..patches import marker_id
from .collapse import Kept, cut_lanes
from .drawn import DIVERGED, PENDING, SKIPPED, Details, Recorded, dressed, fork_state, has_ahead, mark_in_flight, \
    patch_node, settle_passed, step_node, wait_node, wait_state
from .nodes import Choice, Exit, Fork, Loop, Node, Patch, Plan, StepCall, Try, Wait
from .recorded import recorded_graph, recorded_nodes

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
        "unplaced": recorded_nodes(unplaced),
    }
    return dressed(graph, details)


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
                    settle_passed(earlier)
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
            return _Walk([step_node(call, self._predicted(call.name, call.dynamic_name, scope), None, preview)])
        step_id = self._locatestep_node(call, scope)
        record = self.records.get(step_id) if step_id is not None and step_id not in self.used else None
        if record is None:
            return _Walk([step_node(call, step_id, None, self.ahead)])
        self._use(record.step_id)
        if record.name != call.function:
            return _Walk([step_node(call, record.step_id, record, DIVERGED)])
        stop = RAISED if record.status == STEP_FAILED else None
        return _Walk([step_node(call, record.step_id, record, record.status)], 1, stop)

    def _wait_call(self, call: Wait, scope: _Scope, preview: str | None) -> _Walk:
        scope.pos += 1
        if preview is not None:
            return _Walk([wait_node(call, self._predicted(call.name, call.dynamic_name, scope), None, preview)])
        step_id = self._locatestep_node(call, scope)
        record = self.records.get(step_id) if step_id is not None and step_id not in self.used else None
        if record is None:
            return _Walk([wait_node(call, step_id, None, self.ahead)])
        self._use(record.step_id)
        if record.name != call.function:
            step = step_node(None, record.step_id, record, DIVERGED)
            step.update({"label": call.label, "line": call.line, "expected": call.function})
            return _Walk([step])
        state = wait_state(record)
        return _Walk([wait_node(call, record.step_id, record, state)], 1, RAISED if state == STEP_FAILED else None)

    def _patch_call(self, call: Patch, preview: str | None) -> _Walk:
        """A patch's marker is per run, not per scope: the first ``patched``
        call of its id holds the record; a later one (a loop, another
        branch) gets the same answer without it."""
        step_id = marker_id(call.patch_id) if call.patch_id is not None else None
        record = self.records.get(step_id) if step_id is not None else None
        if preview is not None or record is None:
            return _Walk([patch_node(call, step_id, None, preview or self.ahead)])
        if step_id in self.used:
            return _Walk([patch_node(call, step_id, None, str(record.status), record.result)])
        self._use(record.step_id)
        return _Walk([patch_node(call, step_id, record, str(record.status))], 1)

    def _locatestep_node(self, call: StepCall | Wait, scope: _Scope) -> str | None:
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
                nodes = recorded_nodes(records, f"{fork_id}.{index}.")
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
            "state": preview or fork_state(lanes),
        }
        cut_lanes(node)
        return _Walk([node], matched, RAISED if raised else None)

    # -- control flow -------------------------------------------------------------------------

    def _loop(self, loop: Loop, scope: _Scope, preview: str | None) -> _Walk:
        body = list(loop.body)
        iterations = Kept()
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
            state = preview or (self.ahead if has_ahead(body.nodes) else SKIPPED)
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
                and any(has_ahead(lane["nodes"]) for lane in handlers)}
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


__all__ = ["build_graph"]
