"""The console's step graph draws the patterns the documentation teaches.

Each workflow is the docs' own code (``tests.support.doc_workflows``): the
children page's fan-out/fan-in, the waiting page's message with a timeout
(answered, and timed out), the deploy page's patch (a new run, and one the
old code took past the patch point). Each runs for real on SQLite, in this
process, and its graph is read as the console serves it
(``Views.run``): every recorded step is placed by the source, a loop over a
known number of items draws no iteration beyond them, a failure a handler
caught lets the rest be placed, and every node that starts or waits for a
child names that child (id, workflow, status)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import everystep
from everystep import schedule
from everystep.errors import SimulatedCrash
from everystep.models import COMPLETED
from everystep.store import Store, connect
from everystep.web.views import Views
from tests.support.deploys import deploy
from tests.support.doc_workflows import PATCH_STEPS, load_example
from tests.support.graphs import RECORD_KINDS, graph_nodes
from tests.support.runs import crash_at, drain, execute_run, expire_wait


@pytest.fixture
def lite(tmp_path: Path) -> Iterator[Store]:
    store = connect(f"sqlite:///{tmp_path / 'docs.db'}")
    yield store
    store.close()


def nodes(graph: dict[str, Any], kinds: tuple[str, ...] = RECORD_KINDS) -> list[dict[str, Any]]:
    """Every node of these kinds the source places (not the unplaced ones), depth first."""
    return graph_nodes(graph["nodes"], kinds)


def console_graph(store: Store, run_id: str) -> dict[str, Any]:
    """The run's graph as the console serves it, every record placed once."""
    graph: dict[str, Any] = Views(store).run(run_id)["graph"]
    assert graph["mode"] == "source", graph["reason"]
    assert graph["unplaced"] == [], [node["id"] for node in graph["unplaced"]]
    placed = [node["id"] for node in nodes(graph) if node["record"] is not None]
    assert sorted(placed) == sorted(step.step_id for step in store.get_steps(run_id))
    return graph


def loops(graph: dict[str, Any]) -> list[dict[str, Any]]:
    return [node for node in graph["nodes"] if node["kind"] == "loop"]


def assert_children_named(store: Store, graph: dict[str, Any], parent: str) -> list[dict[str, Any]]:
    """Every start and child wait names the child its record names; returns the waits."""
    children = {child.id: child for child in store.children(parent)}
    waits = [node for node in nodes(graph) if node["kind"] == "wait" and node["wait"] == "child" and node["record"]]
    starts = [node for node in nodes(graph) if node["function"] == "everystep.start" and node["record"]]
    assert len(starts) == len(children)
    for node in starts + waits:
        record = node["record"]
        child_id = record["result"] if node in starts else record["args"][0]
        assert node["child"] == {"id": child_id, "name": children[child_id].name,
                                 "status": children[child_id].status}, node["id"]
    return waits


def test_the_children_pages_fan_out_and_fan_in(lite: Store, tmp_path: Path) -> None:
    docs = load_example("how-to/children.md", "def publish", "docs_children", tmp_path)
    run = schedule(docs.publish, "cat.png", database=lite)
    assert execute_run(lite, run.id) == "released"  # three children started, waiting for the first

    graph = console_graph(lite, run.id)
    fan_out, fan_in = loops(graph)
    assert [[n["id"] for n in iteration] for iteration in fan_out["iterations"]] == [["1"], ["2"], ["3"]]
    assert fan_out["next"] == []  # three widths, three starts: no phantom fourth
    (first,) = fan_in["iterations"]
    assert first[0]["kind"] == "try" and first[0]["body"][0]["state"] == "waiting"
    assert fan_in["remaining"] == 2 and fan_in["next"][0]["body"][0]["id"] == "5"
    waits = assert_children_named(lite, graph, run.id)
    assert [(n["id"], n["child"]["name"]) for n in waits] == [("4", "docs_children.thumbnail")]

    drain(lite)
    assert lite.get_run(run.id).status == COMPLETED
    graph = console_graph(lite, run.id)
    fan_out, fan_in = loops(graph)
    assert fan_in["next"] == [] and len(fan_in["iterations"]) == 3
    waits = assert_children_named(lite, graph, run.id)
    assert [(n["id"], n["state"], n["child"]["status"]) for n in waits] == [
        ("4", "done", "completed"), ("5", "done", "completed"), ("6", "failed", "failed")]
    # The 8000 px child failed; ``except ChildFailed`` caught it and the run went on.
    assert fan_in["iterations"][2][0]["caught"] == "except ChildFailed"


def test_a_fan_out_of_twenty_children(lite: Store, tmp_path: Path) -> None:
    """The shape the issue met: twenty children, every start and wait placed."""
    docs = load_example("how-to/children.md", "def publish", "docs_twenty", tmp_path,
                        change=lambda source: source.replace("(320, 1280, 8000)", "range(100, 2100, 100)"))
    run = schedule(docs.publish, "cat.png", database=lite)
    assert execute_run(lite, run.id) == "released"
    fan_out, fan_in = loops(console_graph(lite, run.id))
    assert len(fan_out["iterations"]) == 20 and fan_out["next"] == [] and fan_in["remaining"] == 19
    drain(lite)
    graph = console_graph(lite, run.id)
    assert len(assert_children_named(lite, graph, run.id)) == 20
    assert [len(loop["iterations"]) for loop in loops(graph)] == [20, 20]


def test_the_waiting_pages_approval_answered_and_timed_out(lite: Store, tmp_path: Path) -> None:
    docs = load_example("how-to/waiting.md", "def expense", "docs_waiting", tmp_path)
    answered = schedule(docs.expense, {"id": 7, "amount": 120}, database=lite)
    assert execute_run(lite, answered.id) == "released"
    graph = console_graph(lite, answered.id)
    recv = next(node for node in nodes(graph) if node["kind"] == "wait")
    assert (recv["wait"], recv["state"], recv["until"] is not None) == ("message", "waiting", True)
    assert [node["state"] for node in nodes(graph)][-1] == "pending"  # settle, ahead
    everystep.send(answered.id, "approved", {"approved": True}, database=lite)
    assert execute_run(lite, answered.id) == COMPLETED
    assert {node["state"] for node in nodes(console_graph(lite, answered.id))} == {"done"}

    silent = schedule(docs.expense, {"id": 8, "amount": 50}, database=lite)
    assert execute_run(lite, silent.id) == "released"
    expire_wait(lite, silent.id, "3")
    assert execute_run(lite, silent.id) == COMPLETED
    assert lite.get_run(silent.id).result == "refused"
    graph = console_graph(lite, silent.id)
    block = next(node for node in graph["nodes"] if node["kind"] == "try")
    assert block["caught"] == "except RecvTimeout" and block["body"][0]["state"] == "failed"
    assert [(node["label"], node["state"]) for node in nodes(graph)][-1] == ("settle", "done")


def test_the_deploy_pages_patch_new_and_old_runs(lite: Store, tmp_path: Path) -> None:
    def old_code(source: str) -> str:
        """The body before the release that added the patch."""
        return re.sub(r"\n( +)if patched\(\"tax\"\):.*\n\1 +add_tax\(o\)", "", source)

    (tmp_path / "old").mkdir()
    old = load_example("how-to/deploying-new-code.md", 'patched("tax")', "docs_patch", tmp_path / "old",
                       PATCH_STEPS, change=old_code)
    assert "patched(" not in Path(str(old.__file__)).read_text().split("def order")[1]
    order = {"sku": "A-1", "amount": 30}
    past = schedule(old.order, order, database=lite)
    crash_at("3")  # reserve and charge recorded by the old code, then the process died in ship
    with pytest.raises(SimulatedCrash):
        execute_run(lite, past.id)
    assert lite.requeue(lite.get_run(past.id).claim_as("tester"))

    (tmp_path / "new").mkdir()
    new = load_example("how-to/deploying-new-code.md", 'patched("tax")', "docs_patch", tmp_path / "new",
                       PATCH_STEPS)
    deploy(new)
    assert execute_run(lite, past.id) == COMPLETED
    fresh = schedule(new.order, order, database=lite)
    assert execute_run(lite, fresh.id) == COMPLETED

    for run_id, answer, steps in ((fresh.id, True, ["reserve", "add_tax", "charge", "ship"]),
                                  (past.id, False, ["reserve", "charge", "ship"])):
        graph = console_graph(lite, run_id)
        (patch,) = nodes(graph, ("patch",))
        assert (patch["id"], patch["patch"], patch["answer"], patch["state"]) == ("@patch:tax", "tax", answer, "done")
        assert [node["label"] for node in nodes(graph, ("step",)) if node["state"] == "done"] == steps
