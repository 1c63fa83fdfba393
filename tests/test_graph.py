"""The step graph: plans read from source, overlaid with real records.

Plans are checked against the workflows of ``tests.apps.shapes``; overlays
against the records those workflows really leave (run in-process on
SQLite, stopped part-way with the fault hook where a test needs a run in
flight), and against made-up records for the property that matters most:
every record appears exactly once, whatever the plan says."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from everystep import schedule
from everystep.graph import analyse, build_graph, recorded_graph
from everystep.graph.plan import Choice, Exit, Fork, Loop, StepCall, Try
from everystep.models import StepRecord
from everystep.store import Store, connect
from tests.apps import shapes
from tests.support.graphs import graph_nodes
from tests.support.runs import crash_at, execute_run

S = "tests.apps.shapes."


@pytest.fixture
def lite(tmp_path: Path) -> Iterator[Store]:
    store = connect(f"sqlite:///{tmp_path / 'graph.db'}")
    yield store
    store.close()


def steps_of(nodes: Any) -> list[tuple[str, ...]]:
    """(function, name) of every StepCall, depth first, for compact asserts."""
    out: list[tuple[str, ...]] = []
    for node in nodes:
        if isinstance(node, StepCall):
            out.append((node.function.removeprefix(S),) + ((node.name,) if node.name else ()))
        elif isinstance(node, Fork):
            for branch in node.branches:
                out += steps_of(branch)
        elif isinstance(node, Loop):
            out += steps_of(node.body)
        elif isinstance(node, Choice):
            for arm in node.arms:
                out += steps_of(arm.body)
        elif isinstance(node, Try):
            for part in (node.body, *(arm.body for arm in node.handlers), node.orelse, node.final):
                out += steps_of(part)
    return out


def drawn(graph: dict[str, Any]) -> list[dict[str, Any]]:
    """Every step, wait and patch node in a built graph (including unplaced), depth first."""
    return graph_nodes(graph["nodes"]) + graph_nodes(graph["unplaced"])


def by_id(graph: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {node["id"]: node for node in drawn(graph) if node["record"] is not None}


def run_graph(store: Store, wf: Any, *args: Any) -> tuple[str, dict[str, Any]]:
    run = schedule(wf, *args, database=store)
    status = execute_run(store, run.id)
    run = store.get_run(run.id)
    graph = build_graph(analyse(wf), store.get_steps(run.id), active=run.status in ("scheduled", "running", "blocked"))
    return status, graph


# -- plans -------------------------------------------------------------------------------


def test_a_straight_body_is_its_steps_in_call_order() -> None:
    plan = analyse(shapes.linear)
    assert plan.ok and plan.reason is None
    assert steps_of(plan.nodes) == [("fetch",), ("transform",), ("store_it",)]
    assert isinstance(plan.nodes[-1], Exit)
    first = plan.nodes[0]
    assert first.label == "fetch" and first.line is not None and plan.file.endswith("shapes.py")


def test_forks_read_lambdas_sequences_partials_and_names() -> None:
    plan = analyse(shapes.fanout)
    forks = [node for node in plan.nodes if isinstance(node, Fork)]
    assert [len(fork.branches) for fork in forks] == [3, 2]
    assert steps_of(forks[0].branches[2]) == [("fetch",), ("store_it",)]  # a sequence branch
    assert forks[1].name == "tidy" and steps_of(forks[1].branches[1]) == [("cleanup",)]  # a partial


def test_control_flow_is_kept_only_where_steps_are() -> None:
    loop = analyse(shapes.looping).nodes[0]
    assert isinstance(loop, Loop) and loop.text == 'for item in spec["items"]'
    choice = analyse(shapes.branching).nodes[0]
    assert isinstance(choice, Choice)
    assert [arm.label for arm in choice.arms] == ['if spec.get("fast")', 'elif spec.get("medium")', "else"]
    block = analyse(shapes.guarded).nodes[0]
    assert isinstance(block, Try) and [arm.label for arm in block.handlers] == ["except ValueError"]


def test_helpers_and_sub_workflows_are_read_in_place() -> None:
    assert steps_of(analyse(shapes.with_helpers).nodes) == [("fetch",), ("transform",), ("store_it",)]
    assert steps_of(analyse(shapes.named_steps).nodes) == [("fetch", "get"), ("transform",), ("store_it", "put")]


def test_unreadable_bodies_say_why() -> None:
    assert "lambda" in analyse(shapes.lambda_flow).reason
    assert "not a Python function" in analyse(len).reason
    plan = analyse(shapes.dynamic_fanout)
    assert plan.ok and plan.nodes[0].dynamic and "built at run time" in plan.notes[0]


# -- overlays of real runs ----------------------------------------------------------------------


def test_a_finished_run_pins_every_step(lite: Store) -> None:
    status, graph = run_graph(lite, shapes.linear, "k")
    assert status == "completed" and graph["mode"] == "source" and graph["unplaced"] == []
    steps = [node for node in graph["nodes"] if node["kind"] == "step"]
    assert [(n["id"], n["label"], n["state"]) for n in steps] == [
        ("1", "fetch", "done"), ("2", "transform", "done"), ("3", "store_it", "done")]
    assert steps[0]["record"]["result"] == "fetched:k" and steps[0]["record"]["duration"] >= 0


def test_a_run_in_flight_shows_what_is_ahead(lite: Store) -> None:
    run = schedule(shapes.linear, "k", database=lite)
    crash_at("2")
    with pytest.raises(Exception):
        execute_run(lite, run.id)
    graph = build_graph(analyse(shapes.linear), lite.get_steps(run.id), active=True)
    states = [(n["id"], n["state"]) for n in graph["nodes"] if n["kind"] == "step"]
    assert states == [("1", "done"), ("2", "pending"), ("3", "pending")]


def test_parallel_lanes_and_a_failed_branch(lite: Store) -> None:
    status, graph = run_graph(lite, shapes.fanout, {"fail_on": ["right"]})
    assert status == "failed" and graph["unplaced"] == []
    fork = next(node for node in graph["nodes"] if node["kind"] == "fork")
    assert fork["id"] == "2" and fork["state"] == "failed"
    lanes = [[(n["id"], n["state"]) for n in lane["nodes"]] for lane in fork["lanes"]]
    assert lanes == [[("2.0.1", "done")], [("2.1.1", "failed")], [("2.2.1", "done"), ("2.2.2", "done")]]
    # The failure propagates: the rest of the body was not reached.
    later = [node for node in graph["nodes"] if node["kind"] in ("fork", "step")][2:]
    assert [node["label"] for node in later] == ["tidy", "store_it"]
    assert all(node["state"] == "skipped" for node in later)


def test_parallel_all_done_and_named_fork(lite: Store) -> None:
    status, graph = run_graph(lite, shapes.fanout, {})
    assert status == "completed" and graph["unplaced"] == []
    ids = by_id(graph)
    assert {"tidy.0.1", "tidy.1.1", "4"} <= set(ids) and ids["4"]["label"] == "store_it"
    assert all(node["state"] == "done" for node in drawn(graph))


def test_loop_iterations_follow_the_records(lite: Store) -> None:
    status, graph = run_graph(lite, shapes.looping, {"items": ["a", "b", "c"]})
    assert status == "completed" and graph["unplaced"] == []
    loop = graph["nodes"][0]
    assert [[n["id"] for n in it] for it in loop["iterations"]] == [["1", "2"], ["3", "4"], ["5", "6"]]
    assert loop["next"] == []  # finished: no iteration ahead
    assert by_id(graph)["7"]["label"] == "store_it"


def test_the_taken_arm_is_the_recorded_one(lite: Store) -> None:
    status, graph = run_graph(lite, shapes.branching, {"medium": True})
    assert status == "completed" and graph["unplaced"] == []
    choice = graph["nodes"][0]
    assert choice["decided"] and [lane["taken"] for lane in choice["lanes"]] == [False, True, False]
    assert by_id(graph)["2"]["label"] == "store_it"


def test_a_caught_failure_takes_its_handler(lite: Store) -> None:
    status, graph = run_graph(lite, shapes.guarded, {"fail_on": ["one"]})
    assert status == "completed" and graph["unplaced"] == []
    block = graph["nodes"][0]
    assert block["caught"] == "except ValueError"
    body = [(n["id"], n["state"]) for n in block["body"] if n["kind"] == "step"]
    assert body == [("1", "failed"), (None, "skipped")]
    assert [n["id"] for n in block["handlers"][0]["nodes"] if n["kind"] == "step"] == ["2"]


def test_named_steps_and_helpers(lite: Store) -> None:
    status, graph = run_graph(lite, shapes.named_steps, "k")
    assert status == "completed" and set(by_id(graph)) == {"get", "2", "put"} and graph["unplaced"] == []
    status, graph = run_graph(lite, shapes.with_helpers, "k")
    assert status == "completed" and set(by_id(graph)) == {"1", "2", "3"} and graph["unplaced"] == []


def test_a_dynamic_fork_is_drawn_from_its_records(lite: Store) -> None:
    status, graph = run_graph(lite, shapes.dynamic_fanout, {"keys": ["a", "b", "c"]})
    assert status == "completed" and graph["unplaced"] == []
    fork = graph["nodes"][0]
    assert fork["dynamic"] and [[n["id"] for n in lane["nodes"]] for lane in fork["lanes"]] == [
        ["1.0.1"], ["1.1.1"], ["1.2.1"]]


def test_nested_forks(lite: Store) -> None:
    status, graph = run_graph(lite, shapes.nested_fork, {})
    assert status == "completed" and graph["unplaced"] == []
    assert {"1.0.1", "1.0.2.0.1", "1.0.2.1.1", "1.1.2.1.1"} <= set(by_id(graph))


def test_a_blocked_run_shows_its_uncertain_step(lite: Store) -> None:
    run = schedule(shapes.payment, 5, database=lite)
    crash_at("1")
    with pytest.raises(Exception):
        execute_run(lite, run.id)
    lite.requeue(lite.get_run(run.id).claim_as("tester"))
    assert execute_run(lite, run.id) == "blocked"
    graph = build_graph(analyse(shapes.payment), lite.get_steps(run.id), active=True)
    first, second = [n for n in graph["nodes"] if n["kind"] == "step"]
    assert (first["id"], first["state"], first["unsafe"]) == ("1", "started", True)
    assert (second["id"], second["state"]) == ("2", "pending")


def test_a_divergence_is_drawn(lite: Store) -> None:
    records = [StepRecord("r", "1", S + "transform", "done"), StepRecord("r", "2", S + "transform", "done")]
    graph = build_graph(analyse(shapes.linear), records, active=True)
    first = graph["nodes"][0]
    assert first["state"] == "diverged" and first["expected"] == S + "fetch" and first["function"] == S + "transform"


def test_without_source_the_records_are_drawn_with_the_reason(lite: Store) -> None:
    status, graph = run_graph(lite, shapes.lambda_flow, "k")
    assert status == "completed" and graph["mode"] == "recorded" and "lambda" in graph["reason"]
    records = [StepRecord("r", "1", "f", "done"), StepRecord("r", "2.0.1", "g", "done"),
               StepRecord("r", "2.1.1", "h", "failed"), StepRecord("r", "2.0.2", "g", "done")]
    graph = recorded_graph(records, "no source")
    fork = graph["nodes"][1]
    assert fork["kind"] == "fork" and fork["state"] == "failed"
    assert [[n["id"] for n in lane["nodes"]] for lane in fork["lanes"]] == [["2.0.1", "2.0.2"], ["2.1.1"]]


# -- the property: nothing recorded is lost or doubled -------------------------------------------

_ids = st.lists(st.integers(1, 6), min_size=1, max_size=3).map(lambda parts: ".".join(map(str, parts))) \
    | st.sampled_from(["@patch:tax", "@patch:other"])
_names = st.sampled_from([S + "fetch", S + "transform", S + "store_it", S + "flaky", S + "cleanup", "x.y",
                         "everystep.sleep", "everystep.start", "everystep.child", "everystep.patch"])
_records = st.lists(st.tuples(_ids, _names, st.sampled_from(["done", "failed", "started"])), max_size=12,
                    unique_by=lambda item: item[0])


@settings(max_examples=150, deadline=None)
@given(records=_records, active=st.booleans(),
       wf=st.sampled_from([shapes.linear, shapes.fanout, shapes.looping, shapes.branching,
                           shapes.guarded, shapes.dynamic_fanout, shapes.nested_fork, shapes.napping,
                           shapes.fan_in_shapes, shapes.patched_order]),
       completed=st.booleans())
def test_every_record_is_drawn_exactly_once(records: list[tuple[str, str, str]], active: bool, wf: Any,
                                            completed: bool) -> None:
    rows = [StepRecord("r", step_id, name, status) for step_id, name, status in records]
    graph = build_graph(analyse(wf), rows, active=active, completed=completed and not active)
    placed = [node["id"] for node in drawn(graph) if node["record"] is not None]
    assert sorted(placed) == sorted(step_id for step_id, _, _ in records)


def test_an_untaken_handler_does_not_take_the_next_steps_number(lite: Store) -> None:
    status, graph = run_graph(lite, shapes.guarded, {})
    assert status == "completed" and graph["unplaced"] == []
    block = graph["nodes"][0]
    handler = [(n["id"], n["state"]) for n in block["handlers"][0]["nodes"] if n["kind"] == "step"]
    assert handler == [(None, "skipped")]
    assert [(n["id"], n["label"]) for n in graph["nodes"][1:] if n["kind"] == "step"] == [("3", "store_it")]
    # While the body is ahead, where a failure would land is not known either.
    graph = build_graph(analyse(shapes.guarded), [StepRecord("r", "1", S + "flaky", "done")], active=True)
    assert [n["id"] for n in graph["nodes"][0]["handlers"][0]["nodes"] if n["kind"] == "step"] == [None]


def test_a_sleep_is_a_wait_with_its_wake_time(lite: Store) -> None:
    plan = analyse(shapes.napping)
    assert [type(node).__name__ for node in plan.nodes] == ["StepCall", "Wait", "StepCall", "Exit"]
    status, graph = run_graph(lite, shapes.napping, {"seconds": 300})
    assert status == "released" and graph["unplaced"] == []
    fetch, nap, store_it = [n for n in graph["nodes"] if n["kind"] in ("step", "wait")]
    assert (fetch["id"], fetch["state"]) == ("1", "done")
    assert (nap["kind"], nap["wait"], nap["id"], nap["state"]) == ("wait", "sleep", "2", "waiting")
    assert nap["until"] == nap["record"]["wake_at"] and nap["label"] == "everystep.sleep"
    assert (store_it["kind"], store_it["id"], store_it["state"], store_it["label"]) == ("step", "3", "pending", "store_it")
    assert not [n for n in drawn(graph) if n["state"] == "diverged"]
    # Without the source, a wait record is still a wait.
    records = lite.get_steps(lite.get_run(nap["record"]["workflow_id"]).id)
    assert [n["kind"] for n in recorded_graph(records, "no source")["nodes"]] == ["step", "wait"]


def test_messages_events_and_children_take_their_places_in_the_graph(lite: Store) -> None:
    from tests.apps import waits as waiting

    def shape(wf: Any) -> list[tuple[str, str | None, str]]:
        return [(type(n).__name__, getattr(n, "kind", None), n.function) for n in analyse(wf).nodes
                if not isinstance(n, Exit)]

    assert shape(waiting.checkout) == [
        ("StepCall", None, "everystep.set_event"), ("Wait", "message", "everystep.recv"),
        ("StepCall", None, "everystep.set_event"), ("StepCall", None, "tests.apps.waits.note")]
    assert shape(waiting.parent_calls) == [
        ("StepCall", None, "everystep.start"), ("Wait", "child", "everystep.child"),
        ("StepCall", None, "tests.apps.waits.note")]
    starts, fan_in = analyse(waiting.parent_of_three).nodes[:3], analyse(waiting.parent_of_three).nodes[3]
    assert [(type(n).__name__, n.function) for n in starts] == [("StepCall", "everystep.start")] * 3
    # ``for handle in handles``: a list of child handles, so each ``handle.result()`` is a child wait.
    assert isinstance(fan_in, Loop) and fan_in.count == 3 and isinstance(fan_in.body[0], Try)
    assert [(type(n).__name__, n.kind) for n in fan_in.body[0].body] == [("Wait", "child")]
    # A run waiting in recv: its event step done, its wait waiting, nothing diverged.
    status, graph = run_graph(lite, waiting.checkout, "o-1")
    assert status == "released" and graph["unplaced"] == []
    event, wait = [n for n in graph["nodes"] if n["kind"] in ("step", "wait")][:2]
    assert (event["id"], event["state"], wait["kind"], wait["wait"], wait["state"]) == (
        "1", "done", "wait", "message", "waiting")
    assert not [n for n in drawn(graph) if n["state"] == "diverged"]


def test_the_wait_table_reads_a_handle_method_by_its_return_annotation(monkeypatch: pytest.MonkeyPatch) -> None:
    from everystep.graph import plan as plan_module

    original = plan_module.waits
    monkeypatch.setattr(plan_module, "waits", lambda: {**original(), shapes.Handle.result:
                                                       plan_module.WaitKind("child", "everystep.child_result")})
    nodes = analyse(shapes.awaiting_a_handle).nodes
    assert [(type(n).__name__, getattr(n, "kind", None)) for n in nodes] == [
        ("StepCall", None), ("Wait", "child"), ("Wait", "child"), ("StepCall", None), ("Exit", None)]


def test_child_handles_are_followed_through_lists_and_loops() -> None:
    """A fan-in reads every ``.result()`` as a child wait, whichever way the
    handles are held: a comprehension over a list of them, ``enumerate``,
    ``zip``, ``sorted``; loops over literals know their length."""

    def kinds(nodes: Any) -> list[str]:
        out: list[str] = []
        for node in nodes:
            if isinstance(node, Loop):
                out.append(f"loop({node.count})[{','.join(kinds(node.body))}]")
            else:
                out.append(getattr(node, "kind", None) or getattr(node, "function", type(node).__name__))
        return out

    assert kinds(analyse(shapes.fan_in_shapes).nodes) == [
        "loop(None)[everystep.start]", "loop(None)[child]", "loop(None)[child]", "loop(None)[child]",
        "everystep.start", "everystep.start", "loop(2)[child]", S + "store_it", "Exit"]
    assert analyse(shapes.looping).nodes[0].count is None  # a loop over an argument: only records tell


def test_the_steps_a_running_run_has_reached_are_in_flight() -> None:
    records = [StepRecord("r", "1", S + "fetch", "done"), StepRecord("r", "2.0.1", S + "transform", "done")]
    graph = build_graph(analyse(shapes.fanout), records, active=True, running=True)
    fork = graph["nodes"][1]
    assert fork["state"] == "running"
    assert [[(n["id"], n["state"]) for n in lane["nodes"]] for lane in fork["lanes"]] == [
        [("2.0.1", "done")], [("2.1.1", "running")], [("2.2.1", "running"), ("2.2.2", "pending")]]
    assert [n["state"] for n in graph["nodes"][2:] if n["kind"] in ("step", "fork")] == ["pending", "pending"]
    # Not held by an executor (scheduled, blocked): nothing is in flight.
    idle = build_graph(analyse(shapes.fanout), records, active=True)
    assert "running" not in [n["state"] for n in drawn(idle)]
    # Outside a fork: the step after the last recorded one.
    done = [StepRecord("r", "1", S + "fetch", "done")]
    assert by_state(build_graph(analyse(shapes.linear), done, active=True, running=True)) == {
        "1": "done", "2": "running", "3": "pending"}


def by_state(graph: dict[str, Any]) -> dict[str, str]:
    return {node["id"]: node["state"] for node in drawn(graph)}


# -- async bodies ----------------------------------------------------------------------


def test_an_async_body_reads_as_its_sync_twin(lite: Store) -> None:
    from tests.apps import async_steps

    sync_plan, async_plan = analyse(async_steps.mixed_sync), analyse(async_steps.mixed_async)
    assert async_plan.ok, async_plan.reason
    assert steps_of(async_plan.nodes) == steps_of(sync_plan.nodes) == [
        ("tests.apps.async_steps.fetch",), ("tests.apps.async_steps.compute",), ("tests.apps.async_steps.fetch",),
        ("tests.apps.async_steps.compute",), ("tests.apps.async_steps.fetch",),
        ("tests.apps.async_steps.compute", "named")]
    fork = next(node for node in async_plan.nodes if isinstance(node, Fork))
    assert [len(branch) for branch in fork.branches] == [1, 2]
    status, graph = run_graph(lite, async_steps.mixed_async, 1)
    assert status == "completed" and graph["mode"] == "source" and graph["unplaced"] == []
    assert sorted(by_id(graph)) == ["1", "2", "3.0.1", "3.1.1", "3.1.2", "named"]


def test_an_async_body_reads_its_awaited_waits() -> None:
    from everystep.graph.plan import Wait
    from tests.apps import async_steps

    nodes = analyse(async_steps.receives).nodes
    assert [type(node).__name__ for node in nodes][:2] == ["Wait", "StepCall"]
    assert isinstance(nodes[0], Wait) and nodes[0].kind == "message"
    assert analyse(async_steps.sleeps_then_fetches).nodes[0].kind == "sleep"  # type: ignore[union-attr]
