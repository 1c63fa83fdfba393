"""A run's step graph from its records alone: the fallback when the
workflow's source cannot be read, and the records the overlay could not
place. Forks and lanes are rebuilt from the dotted step ids."""

from __future__ import annotations

from typing import Any

from ..models import StepRecord
from ..patches import is_marker
from .drawn import PENDING, fork_state, patch_node, step_node, wait_node, wait_state
from .plan import wait_records


def recorded_graph(records: list[StepRecord], reason: str) -> dict[str, Any]:
    """The records alone, forks and lanes rebuilt from their ids."""
    return {"mode": "recorded", "reason": reason, "notes": [], "file": None, "line": None,
            "nodes": recorded_nodes(records), "unplaced": []}


def recorded_nodes(records: list[StepRecord], base: str = "") -> list[dict[str, Any]]:
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
                fork["lanes"].sort(key=lambda l: (not l["index"].isdigit(), int(l["index"]) if l["index"].isdigit() else 0))
            target = lane["nodes"]
        if is_marker(record):
            target.append(patch_node(None, record.step_id, record, str(record.status)))
        elif record.name in waiting:
            target.append(wait_node(None, record.step_id, record, wait_state(record)))
        else:
            target.append(step_node(None, record.step_id, record, record.status))
    for fork in forks.values():
        for lane in fork["lanes"]:
            lane.pop("index", None)
        fork["state"] = fork_state(fork["lanes"])
    return root


__all__ = ["recorded_graph", "recorded_nodes"]
