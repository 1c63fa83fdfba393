"""Case 19, streams: from a value's write in a running step to a reader
outside receiving it, and how many values one run writes per second, under
``everystep-supervisor --procs 1`` on PostgreSQL.

Latency: a run of ``bench.workloads.streamer`` writes values from one
step's code, with random gaps between them (long enough that the reader is
waiting again), each value the step's ``time.time()`` just before its
``write_stream`` call; the client reads the stream with
``everystep.read_stream`` (a LISTEN connection of its own, woken by each
write's commit) and takes ``time.time()`` as each value arrives. Both
clocks are the same machine's; the first values are a warm-up. Target (as
case 4's pickup): p50 ≤ 5 ms and p99 ≤ 25 ms.

Rate: runs of ``bench.workloads.stream_burst`` write N values from one
step's code as fast as they can (queued; the execution's writer thread
commits them in batches, each batch one transaction fenced by the claim,
with its NOTIFY); the same from the body (``stream_burst_body``: each
write a recorded step: the row and the step's record in one commit).
Writes/s = N ÷ (the last value's ``written_at``, the database's clock at
its insert, minus the step's ``time.time()`` before its first write),
so it counts values committed, not queued; a reader checks it got all N
in order. Median and min–max over the repetitions. Target: ≥ 2,000/s from
one step.

``python -m bench.stream_latency --database URL`` runs it alone on a
scratch PostgreSQL database (its everystep tables are emptied).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import everystep  # noqa: E402
from everystep import schedule  # noqa: E402
from everystep.store import connect  # noqa: E402

from . import esdb, procs  # noqa: E402
from .report import Section, Table  # noqa: E402
from .stats import fmt, percentile  # noqa: E402
from .workloads import stream_burst, stream_burst_body, streamer  # noqa: E402

APP = "bench.workloads"
PROCS = 1
WARMUP = 5
#: Latency targets (ms), as case 4's.
P50_MS, P99_MS = 5.0, 25.0
#: Writes/s from one step.
RATE_TARGET = 2000.0


def measure(url: str, work: procs.Workdir, values: int, gap: tuple[float, float], burst: int,
            reps: int) -> dict[str, Any]:
    """Latencies (ms) of ``values`` stamped writes, then ``reps`` bursts of
    ``burst`` writes from a step and from a body (writes/s)."""
    esdb.migrate(url)
    esdb.reset(url)
    socket_path = work.socket()
    proc = procs.Proc(procs.supervisor_cmd(url, PROCS, socket_path, app=APP, burst=False),
                      work.log("supervisor-streams"))
    store = connect(url)
    try:
        procs.wait_children_idle(socket_path, PROCS)
        run = schedule(streamer, values + WARMUP, gap[0], gap[1], 19, database=store)
        latency_ms = []
        for index, stamp in enumerate(everystep.read_stream(run.id, "stamps", timeout=60, database=store)):
            arrived = time.time()
            if index >= WARMUP:
                latency_ms.append((arrived - stamp) * 1000)
        step_rates, body_rates = [], []
        for _ in range(reps):
            for workflow, rates in ((stream_burst, step_rates), (stream_burst_body, body_rates)):
                burst_run = schedule(workflow, burst, database=store)
                done = everystep.wait(burst_run.id, timeout=300, database=store)
                if done.status != "completed":
                    raise procs.BenchError(f"stream burst run {burst_run.id} ended {done.status}: {done.error}")
                received = list(everystep.read_stream(burst_run.id, "burst", timeout=60, items=True,
                                                      database=store))
                if [item.value for item in received] != list(range(burst)):
                    raise procs.BenchError(f"a reader got {len(received)} of {burst} values, or out of order")
                last = received[-1].written_at
                assert last is not None
                rates.append(burst / (last.timestamp() - float(done.result)))
    finally:
        proc.stop()
        store.close()
    return {"latency_ms": latency_ms, "step_rates": step_rates, "body_rates": body_rates, "burst": burst}


def run(ctx: Any) -> None:
    s = ctx.settings
    values = {"full": 500, "quick": 150}.get(s.mode, 20)
    burst = {"full": 5000, "quick": 2000}.get(s.mode, 200)
    reps = {"full": 5, "quick": 3}.get(s.mode, 1)
    result = measure(ctx.urls["es"], ctx.work, values, s.notify_gap, burst, reps)
    ctx.results["case19"] = result
    lat = result["latency_ms"]
    ctx.log(f"case 19 write→read: p50 {percentile(lat, 50):.2f} ms, p99 {percentile(lat, 99):.2f} ms; "
            f"{statistics.median(result['step_rates']):.0f} writes/s from a step")


def tables(result: dict[str, Any]) -> list[Table]:
    lat = result["latency_ms"]
    latency = Table(["values", "p50 ms", "p99 ms", "max ms"])
    latency.add(len(lat), fmt(percentile(lat, 50), 2), fmt(percentile(lat, 99), 2), fmt(max(lat), 2))
    rates = Table(["writer", "values per run", "runs", "writes/s (median, min–max)"])
    for label, key in (("a step's code", "step_rates"), ("the body (each a recorded step)", "body_rates")):
        found = result[key]
        rates.add(label, result["burst"], len(found),
                  f"{statistics.median(found):,.0f} ({min(found):,.0f}–{max(found):,.0f})")
    return [latency, rates]


def verdicts(result: dict[str, Any]) -> list[str]:
    lat = result["latency_ms"]
    p50, p99 = percentile(lat, 50) or 0.0, percentile(lat, 99) or 0.0
    rate = statistics.median(result["step_rates"])
    return [
        f"Target (write to read: p50 ≤ {P50_MS:g} ms and p99 ≤ {P99_MS:g} ms): "
        f"**{'met' if p50 <= P50_MS and p99 <= P99_MS else 'missed'}** (p50 {p50:.2f} ms, p99 {p99:.2f} ms).",
        f"Target (writes/s from one step ≥ {RATE_TARGET:,.0f}): **{'met' if rate >= RATE_TARGET else 'missed'}** "
        f"({rate:,.0f}/s, median).",
    ]


def section(ctx: Any) -> Section:
    s = ctx.settings
    result = ctx.results.get("case19")
    section = Section(
        "case19", "Case 19 — streams: a step's write to a reader outside, and writes/s from one run",
        method=(
            f"`everystep-supervisor --procs {PROCS}`; one run of `bench.workloads.streamer` writing stamped values "
            f"from its step, gaps uniform in {s.notify_gap[0] * 1000:.0f}–{s.notify_gap[1] * 1000:.0f} ms; the "
            "client reads with `everystep.read_stream` (LISTEN). Latency = the client's `time.time()` on arrival "
            "minus the step's just before `write_stream`. Writes/s: `bench.workloads.stream_burst` (from a step: "
            "queued, committed in batches by the execution's writer thread) and `stream_burst_body` (from the "
            "body: each a recorded step), N values each, N ÷ (the last value's `written_at` − the time before the "
            "first write)."
        ),
    )
    if not result:
        empty = Table(["values", "p50 ms", "p99 ms", "max ms"])
        empty.add(0, "n/a", "n/a", "n/a")
        section.tables.append(empty)
        return section
    section.tables += tables(result)
    section.notes += verdicts(result)
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", required=True, help="a scratch PostgreSQL database's URL (emptied)")
    parser.add_argument("--values", type=int, default=500, help="stamped values for the latency")
    parser.add_argument("--burst", type=int, default=5000, help="values per rate run")
    parser.add_argument("--reps", type=int, default=5, help="rate runs per writer")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="everystep-streams-") as tmp:
        result = measure(args.database, procs.Workdir(Path(tmp)), args.values, (0.010, 0.030), args.burst,
                         args.reps)
    for table in tables(result):
        print(table.markdown())
        print()
    for line in verdicts(result):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
