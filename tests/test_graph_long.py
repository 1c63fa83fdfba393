"""The step graph of a long history is summarised, never drawn whole: a
loop's iterations, a fork's branches and a row of records past fifty are
cut to their first and last ten around a tally of the rest, every record
still counted exactly once, and only the records of the nodes drawn are
read in full."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from everystep.graph import analyse, build_graph, recorded_graph
from everystep.graph.collapse import KEPT, MAX_DRAWN
from everystep.graph.drawn import mark_in_flight
from everystep.models import StepOutline, StepRecord
from everystep.waits import RECV_STEP
from tests.apps import long_runs, shapes
from tests.support.graphs import graph_nodes

TICK = long_runs.tick.name
HANDLE = long_runs.handle.name
FETCH = "tests.apps.shapes.fetch"


def outline(records: list[tuple[str, str]], status: str = "done") -> list[StepOutline]:
    """Records as an outline holds them: no arguments, results or errors."""
    return [StepOutline("r", step_id, name, status) for step_id, name in records]


def ticks(count: int) -> list[StepOutline]:
    return outline([(str(n), TICK) for n in range(1, count + 1)])


def drawn_ids(graph: dict[str, Any]) -> list[str]:
    return [node["id"] for node in graph_nodes(graph["nodes"]) + graph_nodes(graph["unplaced"])
            if node["record"] is not None]


def summaries(graph: dict[str, Any]) -> list[dict[str, Any]]:
    """Every tally the graph shows (those folded further in are inside them)."""
    found = graph_nodes(graph["nodes"], ("collapsed",)) + graph_nodes(graph["unplaced"], ("collapsed",))
    holders = graph_nodes(graph["nodes"], ("loop", "fork")) + graph_nodes(graph["unplaced"], ("fork",))
    return found + [node["collapsed"] for node in holders if node.get("collapsed")]


def counted(graph: dict[str, Any]) -> int:
    return len(drawn_ids(graph)) + sum(summary["steps"] for summary in summaries(graph))


def test_a_loop_of_100000_iterations_draws_its_first_and_last_ten_and_counts_the_rest() -> None:
    asked: list[list[str]] = []

    def details(step_ids: list[str]) -> dict[str, StepRecord]:
        asked.append(step_ids)
        return {step_id: StepRecord("r", step_id, TICK, "done", result=int(step_id), args=[int(step_id) - 1])
                for step_id in step_ids}

    graph = build_graph(analyse(long_runs.ticker), ticks(100_000), active=False, completed=True, details=details)
    loop, end = graph["nodes"]
    assert end["kind"] == "exit"
    assert loop["kind"] == "loop" and loop["count"] == 100_000 and len(loop["iterations"]) == 2 * KEPT
    assert loop["collapsed"] == {"after": KEPT, "count": 100_000 - 2 * KEPT, "steps": 100_000 - 2 * KEPT,
                                 "states": {"done": 100_000 - 2 * KEPT}, "functions": [["tick", 100_000 - 2 * KEPT]],
                                 "first": "11", "last": "99990"}
    ids = [str(n) for n in (*range(1, 11), *range(99_991, 100_001))]
    assert drawn_ids(graph) == ids and graph["unplaced"] == []
    assert asked == [ids]  # only the records drawn are read in full
    node = graph_nodes(loop["iterations"][-1])[0]
    assert node["record"]["args"] == [99_999] and node["record"]["result"] == 100_000
    assert len(json.dumps(graph)) < 30_000


def test_fifty_iterations_are_drawn_whole_and_fifty_one_are_cut() -> None:
    whole = build_graph(analyse(long_runs.ticker), ticks(MAX_DRAWN), active=True)
    assert whole["nodes"][0]["collapsed"] is None and len(whole["nodes"][0]["iterations"]) == MAX_DRAWN
    cut = build_graph(analyse(long_runs.ticker), ticks(MAX_DRAWN + 1), active=True)
    assert cut["nodes"][0]["collapsed"]["count"] == MAX_DRAWN + 1 - 2 * KEPT
    assert counted(cut) == MAX_DRAWN + 1


def test_a_message_loop_with_its_waits_is_summarised_by_function() -> None:
    records = outline([(str(n), RECV_STEP if n % 2 else HANDLE) for n in range(1, 20_001)])
    graph = build_graph(analyse(long_runs.subscription), records, active=True)
    [loop] = graph["nodes"]
    assert loop["count"] == 10_000 and loop["collapsed"]["count"] == 10_000 - 2 * KEPT
    assert dict(loop["collapsed"]["functions"]) == {"handle": 9_980, "everystep.recv": 9_980}
    assert loop["collapsed"]["states"] == {"done": 19_960} and counted(graph) == 20_000
    assert [node["kind"] for node in loop["next"]] == ["wait", "step"]  # the iteration that may come


def test_without_source_a_long_row_of_records_is_cut_around_a_tally() -> None:
    graph = recorded_graph(ticks(100_000), "no source")
    nodes = graph["nodes"]
    assert len(nodes) == 2 * KEPT + 1 and nodes[KEPT]["kind"] == "collapsed"
    assert nodes[KEPT]["count"] == nodes[KEPT]["steps"] == 100_000 - 2 * KEPT
    assert counted(graph) == 100_000


def test_a_fork_of_many_branches_draws_the_first_and_last_ten() -> None:
    records = outline([(f"1.{lane}.1", FETCH) for lane in range(200)] + [("2", "tests.apps.shapes.store_it")])
    graph = build_graph(analyse(shapes.dynamic_fanout), records, active=False, completed=True)
    fork = graph["nodes"][0]
    assert [lane["label"] for lane in fork["lanes"]] == [f"branch {n}" for n in (*range(10), *range(190, 200))]
    assert fork["collapsed"]["count"] == 180 and fork["collapsed"]["steps"] == 180
    assert fork["state"] == "done" and counted(graph) == 201


def test_a_lane_of_a_long_row_is_cut_and_a_done_tally_lets_in_flight_marking_through() -> None:
    records = outline([(f"1.0.{n}", FETCH) for n in range(1, 201)])
    graph = build_graph(analyse(shapes.dynamic_fanout), records, active=True, running=True)
    lane = graph["nodes"][0]["lanes"][0]["nodes"]
    assert [node["kind"] for node in lane].count("collapsed") == 1 and len(lane) == 2 * KEPT + 1
    # A running run past a fork whose lane is all done: its next step is in flight.
    assert graph_nodes(graph["nodes"])[-1]["state"] == "running"
    assert mark_in_flight([{"kind": "collapsed", "states": {"done": 3}}, {"kind": "step", "state": "pending"}]) \
        is False


def test_loops_within_loops_fold_their_tallies_into_the_outer_one() -> None:
    # ``looping`` records fetch and transform per item: 400 items, 800 records.
    records = outline([(str(n), FETCH if n % 2 else "tests.apps.shapes.transform") for n in range(1, 801)])
    graph = build_graph(analyse(shapes.looping), records, active=True)
    loop = graph["nodes"][0]
    assert loop["count"] == 400 and loop["collapsed"]["steps"] == 2 * (400 - 2 * KEPT)
    assert counted(graph) == 800


@settings(max_examples=60, deadline=None)
@given(items=st.integers(0, 300), statuses=st.lists(st.sampled_from(["done", "failed", "started"]), min_size=1,
                                                    max_size=5),
       strays=st.lists(st.sampled_from(["9.0.1", "charge", "@patch:tax", "700.1.2"]), unique=True),
       wf=st.sampled_from([shapes.looping, shapes.dynamic_fanout, long_runs.ticker, long_runs.subscription]),
       active=st.booleans())
def test_every_record_of_a_long_history_is_drawn_or_counted_once(items: int, statuses: list[str],
                                                                  strays: list[str], wf: Any, active: bool) -> None:
    names = [FETCH, "tests.apps.shapes.transform", TICK, RECV_STEP, HANDLE]
    records = [StepOutline("r", str(n), names[n % len(names)], statuses[n % len(statuses)])
               for n in range(1, items + 1)]
    records += [StepOutline("r", step_id, FETCH, "done") for step_id in strays]
    for graph in (build_graph(analyse(wf), records, active=active), recorded_graph(records, "no source")):
        assert counted(graph) == len(records)
        assert len(set(drawn_ids(graph))) == len(drawn_ids(graph))
