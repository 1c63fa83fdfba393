"""What two ``patched()`` calls add to a run's CPU (the contract: at most 5 %).

``noop3_patched`` is ``noop3`` (three recorded no-op steps) with two patch
points on its new path: two more marker rows, written in the statements
of the steps after them, never in one of their own (``everystep.patches``).
``noop3_twin`` is ``noop3`` under another name: the control, whose ratio to
``noop3`` shows how much this machine's noise alone moves a ratio.

The three take turns in small chunks (``--runs`` runs each: schedule them,
then claim and execute them one by one), in an order that rotates, on one
database: drift on a shared machine hits all three alike, where batches of
hundreds of runs each took 0.7–1.5× ratios of one workflow to itself. Each
chunk measures this thread's CPU time (``time.thread_time``: on SQLite the
database's own work is in it). A repetition is ``--rounds`` rounds; its
ratio is that of the workflows' CPU totals over them.

``python -m bench.patch_cost [--database URL] [--runs N] [--rounds N] [--reps R]``
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
from .workloads import noop3, noop3_patched, noop3_twin  # noqa: E402

CLAIMER = "bench-patch-cost"
WORKFLOWS = {"plain": noop3.name, "twin": noop3_twin.name, "patched": noop3_patched.name}


def _chunk(store: Store, name: str, runs: int) -> tuple[float, float]:
    """CPU seconds for ``runs`` runs of ``name``: (schedule, claim + execute)."""
    start = time.thread_time()
    for i in range(runs):
        store.schedule(name, f"[{{\"i\": {i}, \"tag\": \"bench\"}}]")
    scheduled = time.thread_time()
    for _ in range(runs):
        (run,) = store.claim(CLAIMER, 1, [name])
        status = runner.execute(store, run, claimer=CLAIMER)
        if status != "completed":
            raise RuntimeError(f"{name} run ended {status}")
    return scheduled - start, time.thread_time() - scheduled


def measure(url: str, runs: int, rounds: int, reps: int) -> dict[str, Any]:
    store = connect(url)
    out = {key: Series() for key in ("plain_us", "twin_us", "patched_us", "ratio", "control", "ratio_with_schedule")}
    labels = list(WORKFLOWS)
    turn = 0
    try:
        store.migrate()
        for name in WORKFLOWS.values():  # warm up: statements prepared, caches filled
            _chunk(store, name, 100)
        for _ in range(reps):
            spent = {label: [0.0, 0.0] for label in labels}
            for _ in range(rounds):
                turn += 1
                for label in labels[turn % 3:] + labels[:turn % 3]:
                    scheduling, running = _chunk(store, WORKFLOWS[label], runs)
                    spent[label][0] += scheduling
                    spent[label][1] += running
            per_run = {label: spent[label][1] / (rounds * runs) * 1e6 for label in labels}
            for label in labels:
                out[f"{label}_us"].add(per_run[label])
            out["ratio"].add(spent["patched"][1] / spent["plain"][1])
            out["control"].add(spent["twin"][1] / spent["plain"][1])
            out["ratio_with_schedule"].add(sum(spent["patched"]) / sum(spent["plain"]))
    finally:
        store.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.patch_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--database", default=None, help="database URL (default: a throwaway SQLite file)")
    parser.add_argument("--runs", type=int, default=20, help="runs per chunk")
    parser.add_argument("--rounds", type=int, default=20, help="rounds of three chunks per repetition")
    parser.add_argument("--reps", type=int, default=9, help="repetitions")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="everystep-patch-cost-") as tmp:
        url = args.database or f"sqlite:///{tmp}/bench.db"
        out = measure(url, args.runs, args.rounds, args.reps)
    print(f"database: {url.split('://')[0]}; chunks of {args.runs} runs, {args.rounds} rounds a repetition, "
          f"{args.reps} repetitions")
    print(f"CPU per run, claim + execute, noop3:          {out['plain_us'].cell(0)} µs")
    print(f"CPU per run, claim + execute, noop3_twin:     {out['twin_us'].cell(0)} µs")
    print(f"CPU per run, claim + execute, noop3_patched:  {out['patched_us'].cell(0)} µs")
    print(f"ratio patched / plain (claim + execute):      {out['ratio'].cell(3)}")
    print(f"control: twin / plain (claim + execute):      {out['control'].cell(3)}")
    print(f"ratio patched / plain (schedule + claim + execute): {out['ratio_with_schedule'].cell(3)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
