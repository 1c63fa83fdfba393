"""Reading a long run: how fast ``everystep show`` and the console open a
run of 100,000 steps, and what the history bound costs.

A run of ``--steps`` recorded steps (``tests.apps.long_runs.ticker``, its
rows written straight into the table as its executions would have left
them) is read the ways a person reads it, each timed ``--reps`` times:

- ``console page``: the console's ``GET /api/runs/ID`` body (a fresh
  console each time: nothing cached), and its size;
- ``console more``: a page of 100 steps from the middle (``/steps?after=``);
- ``show``: ``everystep show RUN`` in this process, and once as a command
  (``python -m everystep.cli``: the interpreter's start included);
- ``get_steps page``: ``get_steps(run, after=..., limit=100)``;
- ``get_steps whole``: the whole history, as before pages existed.

Then the history bound: ``note_history`` (the one statement an execution
of a run with a long history adds) and ``largest_history`` (the gauge's
query) over ``--waiting`` waiting runs.

``python -m bench.long_history [--database URL] [--steps N] [--reps R] [--waiting N]``
(default: a throwaway SQLite file; give a PostgreSQL URL of a scratch
database for the other). Nothing is asserted: the numbers are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from everystep import get_steps, schedule  # noqa: E402
from everystep.store import Store, connect  # noqa: E402
from everystep.web.handlers import Console  # noqa: E402
from tests.apps import long_runs  # noqa: E402
from tests.support.cli import run_in_process  # noqa: E402
from tests.support.long_runs import ticks, write_history  # noqa: E402

CLAIMER = "bench-long-history"


def timed(label: str, reps: int, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` ``reps`` times; print the first, median and best times."""
    times, value = [], None
    for _ in range(reps):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    print(f"{label:<34} first {times[0] * 1000:9.2f} ms   median {statistics.median(times) * 1000:9.2f} ms   "
          f"best {min(times) * 1000:9.2f} ms")
    return value


def console_page(store: Store, run_id: str) -> int:
    reply = Console(store).view("run", {}, run_id)
    assert reply.status == 200, reply.data
    return len(reply.body())


def more_steps(store: Store, run_id: str, after: str) -> int:
    reply = Console(store).view("steps", {"after": after}, run_id)
    assert reply.status == 200, reply.data
    return len(reply.data["steps"])


def show(url: str, run_id: str, workdir: Path) -> None:
    result = run_in_process(["show", run_id, "--database", url], dict(os.environ), workdir)
    assert result.returncode == 0, result.stderr


def show_command(url: str, run_id: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "everystep.cli", "show", run_id, "--database", url], check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": ROOT})
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.long_history", description=__doc__.split("\n")[0])
    parser.add_argument("--database", default=None, help="database URL (default: a throwaway SQLite file)")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--waiting", type=int, default=10_000, help="waiting runs for the gauge's query")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="everystep-long-history-"))
    url = args.database or f"sqlite:///{workdir / 'long.db'}"
    store = connect(url)
    store.migrate()

    run = schedule(long_runs.ticker, args.steps, database=store)
    started = time.perf_counter()
    write_history(store, run.id, ticks(args.steps))
    print(f"{store.backend}: a run of {args.steps:,} steps written in {time.perf_counter() - started:.1f} s "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    middle = str(args.steps // 2)

    size = timed("console page (GET /api/runs/ID)", args.reps, lambda: console_page(store, run.id))
    print(f"{'':<34} body {size:,} bytes")
    timed("console more (100 steps, middle)", args.reps, lambda: more_steps(store, run.id, middle))
    timed("show (in process)", args.reps, lambda: show(url, run.id, workdir))
    print(f"{'show (a command)':<34} {show_command(url, run.id) * 1000:8.1f} ms")
    timed("get_steps page (first 100)", args.reps, lambda: get_steps(run.id, database=store, limit=100))
    timed("get_steps page (100, middle)", args.reps,
          lambda: get_steps(run.id, database=store, after=middle, limit=100))
    timed("get_steps whole", max(1, args.reps // 2), lambda: get_steps(run.id, database=store))

    # The history bound: the note an execution adds, the gauge's query.
    for _ in range(args.waiting):
        store.schedule(long_runs.subscription.name, '["acct"]')
    [claimed] = store.claim(CLAIMER, 1, [long_runs.ticker.name])
    claim = claimed.claim
    note = timed("note_history (one execution's)", 200, lambda: store.note_history(claim, args.steps))
    assert note, "the note was refused"
    timed(f"largest_history ({args.waiting:,} waiting)", args.reps, store.largest_history)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
