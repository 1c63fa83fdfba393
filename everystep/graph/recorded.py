"""A run's step graph from its records alone: the fallback when the
workflow's source cannot be read, and the records the overlay could not
place. Forks and lanes are rebuilt from the dotted step ids; a long row
of records, or a fork of many lanes, is cut (``collapse``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..patches import is_marker
from .collapse import cut, cut_lanes
from .drawn import PENDING, Details, Recorded, dressed, fork_state, patch_node, step_node, wait_node, wait_state
from .plan import wait_records


def recorded_graph(records: Sequence[Recorded], reason: str, details: Details | None = None) -> dict[str, Any]:
    """The records alone, forks and lanes rebuilt from their ids."""
    return dressed({"mode": "recorded", "reason": reason, "notes": [], "file": None, "line": None,
                    "nodes": recorded_nodes(records), "unplaced": []}, details)


def recorded_nodes(records: Sequence[Recorded], base: str = "") -> list[dict[str, Any]]:
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
            target.append(patch_node(None, record.step_id, record, str(record.status)))
        elif record.name in waiting:
            target.append(wait_node(None, record.step_id, record, wait_state(record), waiting))
        else:
            target.append(step_node(None, record.step_id, record, record.status))
    for fork in forks.values():
        fork["lanes"].sort(key=lambda l: (not l["index"].isdigit(), int(l["index"]) if l["index"].isdigit() else 0))
        for lane in fork["lanes"]:
            lane.pop("index", None)
        fork["state"] = fork_state(fork["lanes"])
    # Cut once every state is known: a fork's state counts every lane.
    for fork in forks.values():
        cut_lanes(fork)
        for lane in fork["lanes"]:
            lane["nodes"] = cut(lane["nodes"])
    return cut(root)


__all__ = ["recorded_graph", "recorded_nodes"]
