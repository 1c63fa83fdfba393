"""Case 4, pickup latency: from the commit of a schedule to the start of the
run's first step, for runs arriving one at a time at an idle
``everystep-supervisor --procs 2``.

- With LISTEN/NOTIFY: runs are scheduled with the public ``schedule()``,
  which NOTIFYs in its transaction; the supervisor runs with its default
  ``--poll 0.5`` as the fallback.
- Polling only: the supervisor runs with ``--poll 0.2`` and runs are
  inserted with exactly the row ``Store.schedule`` writes but without its
  ``pg_notify`` (``esdb.insert_without_notify``), so only a poll finds them.
  The supervisor is unmodified and still LISTENs; nothing ever wakes it.

The client takes ``time.time()`` right after the scheduling call returns
(the commit is acknowledged); the step (``bench.workloads.stamp``) returns
``time.time()`` as its first statement. Both clocks are the same machine's.
Arrivals are spaced by random gaps (uniform), long enough that the previous
run is done: each run finds the supervisor idle.
"""

from __future__ import annotations

import random
import time

import psycopg

from everystep import schedule
from everystep.store import connect

from . import esdb, procs
from .context import Context
from .report import Section, Table
from .stats import Series, fmt, percentile
from .workloads import stamp1

APP = "bench.workloads"
PROCS = 2


def measure(ctx: Context, url: str, runs: int, notify: bool, gap: tuple[float, float]) -> dict[str, list[float]]:
    esdb.reset(url)
    socket_path = ctx.work.socket()
    extra = [] if notify else ["--poll", "0.2"]
    cmd = procs.supervisor_cmd(url, PROCS, socket_path, app=APP, burst=False, extra=extra)
    label = "notify" if notify else "poll"
    proc = procs.Proc(cmd, ctx.work.log(f"supervisor-latency-{label}"))
    store = connect(url)
    rng = random.Random(4 if notify else 5)
    sent: dict[str, tuple[float, float]] = {}
    try:
        procs.wait_children_idle(socket_path, PROCS)
        warmup = [schedule(stamp1, database=store).id for _ in range(3)]
        esdb.wait_completed(url, len(warmup), timeout=30)
        with psycopg.connect(url, autocommit=True) as raw:
            for _ in range(runs):
                before = time.time()
                if notify:
                    run_id = schedule(stamp1, database=store).id
                else:
                    run_id = esdb.insert_without_notify(raw, stamp1.name, [])
                after = time.time()
                sent[run_id] = (before, after)
                time.sleep(rng.uniform(*gap))
        esdb.wait_completed(url, runs + len(warmup), timeout=60)
    finally:
        proc.stop()
        store.close()
    return stamped_latencies(url, sent, "1", runs, f"latency ({label})")


def stamped_latencies(url: str, sent: dict[str, tuple[float, float]], step_id: str, runs: int,
                      label: str) -> dict[str, list[float]]:
    """From each run's call (its wall-clock start and end, in ``sent``) to
    the time its step ``step_id`` recorded as its result (``stamp``'s
    ``time.time()``): ms, with how long the calls themselves took."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT s.workflow_id::text, s.result::text FROM everystep_step s WHERE s.step_id = %s", (step_id,)
        ).fetchall()
    stamps = {run_id: float(result) for run_id, result in rows}
    latencies, calls = [], []
    for run_id, (before, after) in sent.items():
        if run_id in stamps:
            latencies.append((stamps[run_id] - after) * 1000.0)
            calls.append((after - before) * 1000.0)
    if len(latencies) != runs:
        raise procs.BenchError(f"{label}: {len(latencies)} of {runs} runs recorded step {step_id}")
    return {"latency_ms": latencies, "call_ms": calls}


def run(ctx: Context) -> None:
    s = ctx.settings
    url = ctx.urls["es"]
    out = ctx.results.setdefault("case4", {})
    for notify, runs, gap in ((True, s.latency_notify_runs, s.notify_gap), (False, s.latency_poll_runs, s.poll_gap)):
        key = "notify" if notify else "poll"
        result = measure(ctx, url, runs, notify, gap)
        out[key] = result
        lat = result["latency_ms"]
        ctx.log(f"case 4 {key}: p50 {percentile(lat, 50):.2f} ms, p99 {percentile(lat, 99):.2f} ms over {runs} runs")


def _blocks(values: list[float], count: int) -> list[list[float]]:
    size = max(1, len(values) // count)
    blocks = [values[i * size:(i + 1) * size] for i in range(count)]
    blocks[-1] = values[(count - 1) * size:]
    return [block for block in blocks if block]


def section(ctx: Context) -> Section:
    s = ctx.settings
    out = ctx.results.get("case4", {})
    section = Section(
        "case4", "Case 4 — pickup latency: schedule() commit to first step start",
        method=(
            f"`everystep-supervisor --procs {PROCS}` idle, runs of `bench.workloads.stamp1` arriving one at a time "
            f"({s.latency_notify_runs} with NOTIFY, gaps uniform in "
            f"{s.notify_gap[0] * 1000:.0f}–{s.notify_gap[1] * 1000:.0f} ms; {s.latency_poll_runs} polling only, "
            f"gaps {s.poll_gap[0] * 1000:.0f}–{s.poll_gap[1] * 1000:.0f} ms). Latency = the step's own "
            "`time.time()` minus the client's `time.time()` right after the scheduling call returned. "
            "Polling only: the supervisor gets `--poll 0.2` and runs are inserted with the same row "
            "`Store.schedule` writes minus its `pg_notify`, so nothing wakes the supervisor but its poll. "
            f"The pooled percentiles cover every run; the \"{s.reps} blocks\" columns split the runs "
            "into consecutive blocks and give the median (min–max) of the blocks' percentiles."
        ),
    )
    table = Table(["mechanism", "runs", "p50 ms (all)", "p99 ms (all)", "max ms",
                   f"p50 ms, {s.reps} blocks", f"p99 ms, {s.reps} blocks", "schedule call p50 ms"])
    for key, label in (("notify", "LISTEN/NOTIFY (default --poll 0.5)"), ("poll", "polling only (--poll 0.2)")):
        result = out.get(key)
        if not result:
            table.add(label, 0, "n/a", "n/a", "n/a", "n/a", "n/a", "n/a")
            continue
        lat = result["latency_ms"]
        p50s, p99s = Series(), Series()
        for block in _blocks(lat, s.reps):
            p50s.add(percentile(block, 50))
            p99s.add(percentile(block, 99))
        table.add(label, len(lat), fmt(percentile(lat, 50), 2), fmt(percentile(lat, 99), 2), fmt(max(lat), 2),
                  p50s.cell(2), p99s.cell(2), fmt(percentile(result["call_ms"], 50), 2))
    section.tables.append(table)
    notify = out.get("notify")
    if notify:
        p50 = percentile(notify["latency_ms"], 50) or 0.0
        p99 = percentile(notify["latency_ms"], 99) or 0.0
        verdict = "met" if p50 <= 5 and p99 <= 25 else "missed"
        section.notes.append(f"Target (with NOTIFY: p50 ≤ 5 ms and p99 ≤ 25 ms): **{verdict}** "
                             f"(p50 {p50:.2f} ms, p99 {p99:.2f} ms).")
    return section
