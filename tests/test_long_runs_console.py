"""A run of 100,000 steps in the console's JSON API, over real HTTP: its
page answers with the first hundred steps and the cursor of the next, a
step graph summarised to a few dozen nodes, and a body of bounded size;
the rest of its steps come a page at a time. (The rows are written
straight into the tables: ``tests.support.long_runs``.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from everystep import schedule
from everystep.graph.collapse import KEPT
from tests.apps import long_runs
from tests.support.console import ConsoleServer, serve
from tests.support.graphs import graph_nodes
from tests.support.long_runs import ticks, write_history

pytestmark = [pytest.mark.timeout(600), pytest.mark.backends("sqlite", "postgres")]

STEPS = 100_000
#: A page's body stays under this however long the history (a hundred
#: steps and a summarised graph: about 50 KB).
MAX_BODY = 200_000


@pytest.fixture
def console(db_url: str) -> Iterator[ConsoleServer]:
    yield from serve(db_url, app_modules="tests.apps.long_runs")


def ids(steps: list[dict[str, object]]) -> list[str]:
    return [str(step["step_id"]) for step in steps]


def test_a_run_of_100000_steps_is_answered_with_a_page_and_a_summary(console: ConsoleServer) -> None:
    store = console.store
    run = schedule(long_runs.ticker, STEPS, database=store)
    write_history(store, run.id, ticks(STEPS))
    with console.client() as client:
        response = client.get(f"/api/runs/{run.id}")
        assert response.status_code == 200, response.text
        assert len(response.content) < MAX_BODY
        data = response.json()
        assert data["steps_total"] == STEPS and data["steps_next"] == "100"
        assert ids(data["steps"]) == [str(n) for n in range(1, 101)]
        assert data["steps"][99]["result"] == 99 and data["steps"][99]["args"] == [99]
        loop = data["graph"]["nodes"][0]
        assert loop["count"] == STEPS and loop["collapsed"]["count"] == STEPS - 2 * KEPT
        assert len(graph_nodes(data["graph"]["nodes"])) < 4 * KEPT  # drawn: the first and last ten, one ahead
        assert data["verdict"]["outcome"] is None and "100,000 steps" in data["verdict"]["detail"]

        page = client.get(f"/api/runs/{run.id}/steps", params={"after": "100"}).json()
        assert ids(page["steps"]) == [str(n) for n in range(101, 201)]
        assert page["total"] == STEPS and page["next"] == "200"
        last = client.get(f"/api/runs/{run.id}/steps", params={"after": "99950", "limit": "500"}).json()
        assert ids(last["steps"]) == [str(n) for n in range(99_951, 100_001)] and last["next"] is None

        for params, says in (({"after": "nope"}, "has no step 'nope'"), ({"limit": "501"}, "limit must be")):
            refused = client.get(f"/api/runs/{run.id}/steps", params=params)
            assert refused.status_code == 400 and says in refused.json()["error"]
            assert "\n" not in refused.json()["error"]


def test_without_its_source_the_records_alone_are_summarised(console: ConsoleServer) -> None:
    # A workflow this console does not know: no source to read.
    run = console.store.schedule("elsewhere.ticker", "[100000]")
    write_history(console.store, run.id, ticks(STEPS))
    with console.client() as client:
        response = client.get(f"/api/runs/{run.id}")
    assert response.status_code == 200 and len(response.content) < MAX_BODY
    graph = response.json()["graph"]
    assert graph["mode"] == "recorded" and len(graph["nodes"]) == 2 * KEPT + 1
    assert graph["nodes"][KEPT]["kind"] == "collapsed" and graph["nodes"][KEPT]["steps"] == STEPS - 2 * KEPT
