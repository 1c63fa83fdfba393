"""A long history summarised, never drawn whole: a loop that ran more than
``MAX_DRAWN`` times draws its first and last ``KEPT`` iterations, and a
``collapsed`` summary says how many ran between them and how they ended (a
count of steps by state and by function, the first and last step ids); a
fork with more lanes, or a row of records laid out one after another, is
cut the same way. Every record still counts once: in a drawn node or in a
summary. The items between are tallied and dropped as they come, so a
loop of 100,000 iterations never holds more than ``2 * KEPT`` of them.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

#: A loop's iterations, a fork's lanes or a row of records are drawn whole
#: up to this many; past it, the first and last ``KEPT`` are drawn and the
#: rest summarised (``collapsed``).
MAX_DRAWN = 50
KEPT = 10

#: The kinds of node that may hold a record (and hold nothing else).
_LEAVES = frozenset({"step", "wait", "patch"})


class Tally:
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


class Kept:
    """Items (a loop's iterations, a fork's lanes, a row of nodes) kept as
    they come: all of them up to ``MAX_DRAWN``; past it the first and last
    ``KEPT``, the ones between tallied and dropped as they go."""

    def __init__(self) -> None:
        self.head: list[Any] = []
        self.tail: collections.deque[Any] = collections.deque()
        self.count = 0
        self.folded = Tally()

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


def cut(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A row of nodes, cut when too long: its first and last ``KEPT``
    around one ``collapsed`` node that tallies the rest."""
    if len(nodes) <= MAX_DRAWN:
        return nodes
    middle = Tally()
    middle.items = len(nodes) - 2 * KEPT
    middle.count(nodes[KEPT:-KEPT])
    return [*nodes[:KEPT], {"kind": "collapsed", **middle.to_dict(KEPT)}, *nodes[-KEPT:]]


def cut_lanes(fork: dict[str, Any]) -> None:
    """A fork with too many lanes draws its first and last ``KEPT``;
    ``collapsed`` tallies the rest."""
    lanes = fork["lanes"]
    fork["collapsed"] = None
    if len(lanes) <= MAX_DRAWN:
        return
    kept = Kept()
    for lane in lanes:
        kept.add(lane, lane["nodes"])
    fork["lanes"], fork["collapsed"] = kept.drawn(), kept.summary()


__all__ = ["KEPT", "MAX_DRAWN", "Kept", "Tally", "cut", "cut_lanes"]
