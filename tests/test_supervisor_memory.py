"""A big app in every child: the supervisor keeps the app's heap shared
(``supervisor.heap``: ``gc.freeze()`` before each fork) and measures what a
child owns (USS). Real supervisors, real forks, real full collections."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from everystep import schedule
from everystep.models import COMPLETED, FAILED, SCHEDULED
from everystep.store import Store
from tests.apps import supervised
from tests.support.scrape import free_port, metrics_args, scrape_until
from tests.support.supervisor import supervisors, wait_run  # noqa: F401

pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]

BIG_APP = "tests.apps.bigheap"
#: What a child may own after GC-heavy runs, as a share of the app's heap.
#: With the freeze a child owns about 11 MiB of an 80 MiB app (its own
#: state: interpreter, connection, the run); without it, its full
#: collections copy most of the heap into it (67 MiB, 83 %, measured).
USS_SHARE = 0.35


def gc_heavy(store: Store, sup: Any, rounds: int) -> dict[str, Any]:
    run = schedule("tests.apps.bigheap.gc_heavy", rounds, database=store)
    finished = wait_run(store, run.id, (COMPLETED, FAILED), timeout=120, supervisor=sup)
    assert finished.status == COMPLETED, finished.error
    result: dict[str, Any] = finished.result
    return result


def test_a_child_owns_a_small_share_of_the_apps_heap_after_full_collections(
    db_url: str, store: Store, supervisors: Any
) -> None:
    port = free_port()
    sup = supervisors(db_url, procs=1, app=BIG_APP, args=metrics_args(port)).start(timeout=120)
    results = [gc_heavy(store, sup, rounds=3) for _ in range(3)]

    pid, heap = results[-1]["pid"], results[-1]["heap"]
    assert {result["pid"] for result in results} == {pid}, "one child ran every run"
    assert heap > 60 * 1024 * 1024, results
    assert all(result["gc_enabled"] for result in results), "the child collects normally"
    owned = psutil.Process(pid).memory_full_info()
    assert owned.uss <= USS_SHARE * heap, (
        f"child {pid} owns {owned.uss / 2**20:.0f} MiB (USS) of an app of {heap / 2**20:.0f} MiB: "
        f"its collections copied the app's pages\n{sup.log()}")
    assert owned.rss > heap, "the app's pages are resident in the child, shared"
    child = sup.wait_idle()["children"][0]
    assert child["pid"] == pid and 0 < child["uss"] <= child["pss"] <= child["rss"], child
    assert "thread(s)" not in sup.log() and "network connection(s)" not in sup.log()

    name, labels = "everystep_supervisor_memory_bytes", {"runner": sup.name}
    page = scrape_until(port, lambda page: page.value(name, **labels, process="children", measure="uss"),
                        "the children's memory gauges", log=sup.log)
    children = {measure: page.value(name, **labels, process="children", measure=measure)
                for measure in ("uss", "pss", "rss")}
    largest = page.value(name, **labels, process="largest_child", measure="uss")
    assert children["uss"] == largest and children["uss"] <= USS_SHARE * heap < heap < children["rss"], children
    assert page.value(name, **labels, process="parent", measure="rss") > heap


def test_children_forked_after_a_reload_share_the_reimported_app(db_url: str, store: Store, supervisors: Any) -> None:
    sup = supervisors(db_url, procs=1, app=BIG_APP).start(timeout=120)
    before = gc_heavy(store, sup, rounds=1)["pid"]

    sup.send_signal(signal.SIGHUP)  # re-imports the app (a new heap) and replaces the child
    sup.wait_status(lambda s: [c["pid"] for c in s["children"]] not in ([], [before])
                    and all(c["state"] == "idle" for c in s["children"]), "a replacement child", timeout=120)
    results = [gc_heavy(store, sup, rounds=3) for _ in range(2)]

    pid, heap = results[-1]["pid"], results[-1]["heap"]
    assert pid != before and {result["pid"] for result in results} == {pid}, results
    owned = psutil.Process(pid).memory_full_info().uss
    assert owned <= USS_SHARE * heap, (
        f"child {pid}, forked after the reload, owns {owned / 2**20:.0f} MiB (USS) of an app of "
        f"{heap / 2**20:.0f} MiB\n{sup.log()}")


def test_max_memory_per_child_below_a_new_childs_uss_is_refused_at_start(
    db_url: str, store: Store, supervisors: Any, tmp_path: Path
) -> None:
    run = schedule(supervised.tiny, {"dir": str(tmp_path)}, database=store)
    sup = supervisors(db_url, procs=2, args=["--max-memory-per-child", "1"]).spawn()

    code = sup.wait(timeout=120)

    log = sup.log()
    errors = [line for line in log.splitlines() if "ERROR" in line]
    assert code == 2, log
    assert len(errors) == 1, log
    assert re.search(r"--max-memory-per-child 1 MB is below what a new child owns \(\d+ MB USS", errors[0]), log
    assert store.get_run(run.id).status == SCHEDULED, "nothing ran"


def test_threads_and_connections_opened_by_the_apps_import_are_warned_about(
    db_url: str, store: Store, supervisors: Any
) -> None:
    sup = supervisors(db_url, procs=1, app="tests.apps.fork_hazards").start()
    run = schedule("tests.apps.fork_hazards.greet", database=store)
    assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup).status == COMPLETED

    log = sup.log()
    threads = [line for line in log.splitlines() if "started 1 thread(s) (app-poller)" in line]
    connections = [line for line in log.splitlines() if "opened" in line and "network connection(s)" in line]
    assert len(threads) == 1 and "WARNING" in threads[0], log
    assert len(connections) == 1 and "WARNING" in connections[0] and "127.0.0.1:" in connections[0], log
