"""``supervisor.heap``: the parent's side of the ``gc.freeze()`` recipe,
played in a fresh interpreter (it changes the collector's state for the
whole process): what is frozen at the first fork, that garbage the parent
makes between forks never piles up in the frozen set, and that a reload
gives the old code back to the collector."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

PARENT = """
import gc, json
from supervisor import heap

def cycles(count):
    for _ in range(count):
        a = {}
        a["self"] = a

heap.hold()
app = [[i] for i in range(50_000)]   # the app's import
cycles(1_000)                                # and its garbage: never collected, holes avoided
took = heap.before_fork()
first = heap.frozen()
enabled_while_forking = gc.isenabled()
heap.after_fork()
counts = []
for _ in range(50):                          # the parent's work between forks, then a replacement fork
    cycles(2_000)
    heap.before_fork()
    heap.after_fork()
    counts.append(heap.frozen())
heap.reloading()
app = [[i] for i in range(50_000)]   # the new code; the old rows become garbage (no cycles)
old = [[None] for _ in range(1_000)]
for item in old:
    item[0] = item                            # old code with cycles, frozen at the first fork
old = None
reload_enabled_during_import = gc.isenabled()
heap.reloaded(imported=True)
print(json.dumps({"first": first, "counts": counts, "took": took, "enabled_while_forking": enabled_while_forking,
                  "enabled_after": gc.isenabled(), "after_reload": heap.frozen(),
                  "reload_enabled_during_import": reload_enabled_during_import}))
"""


def play() -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, timeout=100, check=True)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_the_parents_garbage_between_forks_never_piles_up_in_the_frozen_set() -> None:
    out = play()
    first, counts = out["first"], out["counts"]
    assert isinstance(first, int) and isinstance(counts, list)
    assert first >= 50_000 + 1_000, "the app, and its import's garbage, frozen at the first fork"
    # 50 forks after 2,000 cyclic objects each: frozen without a collection
    # first, the set would grow by 100,000.
    assert max(counts) - first < 2_000, (first, counts)
    assert not out["enabled_while_forking"] and out["enabled_after"]


def test_a_reload_imports_with_the_collector_off_and_freezes_the_new_code() -> None:
    out = play()
    assert out["reload_enabled_during_import"] is False
    assert out["enabled_after"] is True
    counts = out["counts"]
    assert isinstance(counts, list)
    # The old rows (freed by their count) and the import's frozen garbage
    # are gone; the new rows are frozen.
    after = out["after_reload"]
    assert isinstance(after, int) and 50_000 <= after < counts[-1], (after, counts[-1])
