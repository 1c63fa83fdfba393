"""What two ``patched()`` calls add to a run's CPU (the contract: at most 5 %).

``noop3_patched`` is ``noop3`` (three recorded no-op steps) with two patch
points on its new path: two more marker rows, written in the transactions
of the steps after them, never in one of their own (``everystep.patches``).
The two workflows take turns, batch by batch on the same database, in an
order that alternates, so drift on a shared machine hits both alike; each
batch measures this thread's CPU time (``time.thread_time``: on SQLite the
database's own work is in it) per run, for the claim and ``execute``
together, for ``execute`` alone, and with the ``schedule`` that inserted
the run; the ratio of the patched batch to the plain one is taken within
each repetition.

``python -m bench.patch_cost [--database URL] [--runs N] [--reps R]``
(default: a throwaway SQLite file).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from everystep import runner  # noqa: E402
from everystep.store import Store, connect  # noqa: E402

from .stats import Series  # noqa: E402
from .workloads import noop3, noop3_patched, payload  # noqa: E402

CLAIMER = "bench-patch-cost"
WORKFLOWS = {"plain": noop3.name, "patched": noop3_patched.name}


def _batch(store: Store, name: str, runs: int) -> tuple[float, float, float]:
    """CPU seconds per run: (claim + execute, execute alone, schedule)."""
    start = time.thread_time()
    for i in range(runs):
        store.schedule(name, f"[{{\"i\": {i}, \"tag\": \"bench\"}}]")
    scheduling = (time.thread_time() - start) / runs
    whole = alone = 0.0
    for _ in range(runs):
        start = time.thread_time()
        (run,) = store.claim(CLAIMER, 1, [name])
        claimed = time.thread_time()
        status = runner.execute(store, run, claimer=CLAIMER)
        end = time.thread_time()
        if status != "completed":
            raise RuntimeError(f"{name} run ended {status}")
        whole += end - start
        alone += end - claimed
    return whole / runs, alone / runs, scheduling


def measure(url: str, runs: int, reps: int) -> dict[str, Any]:
    store = connect(url)
    out = {key: Series() for key in ("plain_us", "patched_us", "ratio", "ratio_execute", "ratio_with_schedule")}
    try:
        store.migrate()
        for name in WORKFLOWS.values():  # warm up: statements prepared, caches filled
            _batch(store, name, max(runs // 4, 10))
        for rep in range(reps):
            order = list(WORKFLOWS.items()) if rep % 2 == 0 else list(reversed(WORKFLOWS.items()))
            per: dict[str, tuple[float, float, float]] = {}
            for label, name in order:
                per[label] = _batch(store, name, runs)
            out["plain_us"].add(per["plain"][0] * 1e6)
            out["patched_us"].add(per["patched"][0] * 1e6)
            out["ratio"].add(per["patched"][0] / per["plain"][0])
            out["ratio_execute"].add(per["patched"][1] / per["plain"][1])
            out["ratio_with_schedule"].add((per["patched"][0] + per["patched"][2]) / (per["plain"][0] + per["plain"][2]))
    finally:
        store.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.patch_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--database", default=None, help="database URL (default: a throwaway SQLite file)")
    parser.add_argument("--runs", type=int, default=300, help="runs per batch")
    parser.add_argument("--reps", type=int, default=9, help="paired repetitions")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="everystep-patch-cost-") as tmp:
        url = args.database or f"sqlite:///{tmp}/bench.db"
        out = measure(url, args.runs, args.reps)
    print(f"database: {url.split('://')[0]}; {args.runs} runs per batch, {args.reps} paired repetitions")
    print(f"CPU per run, claim + execute, noop3:          {out['plain_us'].cell(0)} µs")
    print(f"CPU per run, claim + execute, noop3_patched:  {out['patched_us'].cell(0)} µs")
    print(f"ratio patched / plain (claim + execute):      {out['ratio'].cell(3)}")
    print(f"ratio patched / plain (execute alone):        {out['ratio_execute'].cell(3)}")
    print(f"ratio patched / plain (schedule + claim + execute): {out['ratio_with_schedule'].cell(3)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
