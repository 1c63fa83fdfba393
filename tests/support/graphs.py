"""Reading the console's step graph in tests: its nodes, depth first."""

from __future__ import annotations

from typing import Any

#: The kinds of node that hold a record (a step, a wait, a patch marker).
RECORD_KINDS = ("step", "wait", "patch")


def graph_nodes(nodes: list[dict[str, Any]], kinds: tuple[str, ...] = RECORD_KINDS) -> list[dict[str, Any]]:
    """Every node of these kinds in ``nodes`` and inside their lanes,
    handlers, blocks and loop iterations, depth first."""
    found: list[dict[str, Any]] = []

    def walk(items: list[dict[str, Any]]) -> None:
        for node in items:
            if node["kind"] in kinds:
                found.append(node)
            for lane in node.get("lanes", []) + node.get("handlers", []):
                walk(lane["nodes"])
            for key in ("body", "orelse", "final", "next"):
                walk(node.get(key, []))
            for iteration in node.get("iterations", []):
                walk(iteration)

    walk(nodes)
    return found
