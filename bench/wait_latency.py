"""Case 12, waits: from the commit of a ``send()`` to the start of the step
after the ``recv`` it wakes, for runs waiting in ``recv`` at an otherwise
idle ``everystep-supervisor --procs 2`` on PostgreSQL.

Every run (``bench.workloads.recv_stamp``) is scheduled first and left to
reach its ``recv``: it is then ``scheduled`` with its step ``waiting``,
holding no child. The client sends to one run at a time with random gaps
(long enough that the previous run is done) and takes ``time.time()``
right after ``send()`` returned (its commit is acknowledged, and with it
the NOTIFY); the resumed run's next step returns ``time.time()`` as its
first statement. Both clocks are the same machine's. Target (as case 4's
pickup): p50 ≤ 5 ms and p99 ≤ 25 ms.

Workflows that do not use waits pay for them only in the one CTE of the
run's last write that wakes a waiting parent (a join on a NULL parent):
case 2 measures them unchanged.
"""

from __future__ import annotations

import random
import time

import psycopg

from everystep import schedule, send
from everystep.store import connect

from . import esdb, pickup_latency, procs
from .context import Context
from .report import Section, Table
from .stats import fmt, percentile
from .workloads import recv_stamp

APP = "bench.workloads"
PROCS = 2


def _wait_all_waiting(url: str, expected: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            waiting = conn.execute("SELECT count(*) FROM everystep_workflow WHERE status = 'scheduled' "
                                   "AND wait_key = 'message:go'").fetchone()[0]
            if waiting >= expected:
                return
            if time.monotonic() > deadline:
                raise procs.BenchError(f"only {waiting} of {expected} runs reached their recv within {timeout:.0f}s")
            time.sleep(0.02)


def measure(ctx: Context, url: str, runs: int, gap: tuple[float, float]) -> dict[str, list[float]]:
    esdb.reset(url)
    socket_path = ctx.work.socket()
    cmd = procs.supervisor_cmd(url, PROCS, socket_path, app=APP, burst=False)
    proc = procs.Proc(cmd, ctx.work.log("supervisor-waits"))
    store = connect(url)
    rng = random.Random(12)
    sent: dict[str, tuple[float, float]] = {}
    try:
        procs.wait_children_idle(socket_path, PROCS)
        ids = [schedule(recv_stamp, database=store).id for _ in range(runs + 3)]
        _wait_all_waiting(url, len(ids), timeout=60 + runs * 0.2)
        procs.wait_children_idle(socket_path, PROCS)
        warmup, measured = ids[:3], ids[3:]
        for run_id in warmup:
            send(run_id, "go", True, database=store)
        esdb.wait_completed(url, len(warmup), timeout=30)
        for run_id in measured:
            before = time.time()
            send(run_id, "go", True, database=store)
            after = time.time()
            sent[run_id] = (before, after)
            time.sleep(rng.uniform(*gap))
        esdb.wait_completed(url, len(ids), timeout=60)
    finally:
        proc.stop()
        store.close()
    return pickup_latency.stamped_latencies(url, sent, "2", runs, "waits (the step after recv)")


def run(ctx: Context) -> None:
    s = ctx.settings
    result = measure(ctx, ctx.urls["es"], s.latency_notify_runs, s.notify_gap)
    ctx.results["case12"] = result
    lat = result["latency_ms"]
    ctx.log(f"case 12 send→resume: p50 {percentile(lat, 50):.2f} ms, p99 {percentile(lat, 99):.2f} ms "
            f"over {len(lat)} runs")


def section(ctx: Context) -> Section:
    s = ctx.settings
    result = ctx.results.get("case12")
    section = Section(
        "case12", "Case 12 — waits: send() commit to the resumed run's next step",
        method=(
            f"`everystep-supervisor --procs {PROCS}` with {s.latency_notify_runs} runs of "
            "`bench.workloads.recv_stamp` waiting in `recv(\"go\")` (scheduled, no child held); one `send()` "
            f"at a time, gaps uniform in {s.notify_gap[0] * 1000:.0f}–{s.notify_gap[1] * 1000:.0f} ms. "
            "Pickup = the next step's own `time.time()` minus the client's `time.time()` right after "
            "`send()` returned."
        ),
    )
    table = Table(["runs", "p50 ms", "p99 ms", "max ms", "send call p50 ms"])
    if not result:
        table.add(0, "n/a", "n/a", "n/a", "n/a")
        section.tables.append(table)
        return section
    lat = result["latency_ms"]
    table.add(len(lat), fmt(percentile(lat, 50), 2), fmt(percentile(lat, 99), 2), fmt(max(lat), 2),
              fmt(percentile(result["call_ms"], 50), 2))
    section.tables.append(table)
    p50 = percentile(lat, 50) or 0.0
    p99 = percentile(lat, 99) or 0.0
    verdict = "met" if p50 <= 5 and p99 <= 25 else "missed"
    section.notes.append(f"Target (send to resume: p50 ≤ 5 ms and p99 ≤ 25 ms): **{verdict}** "
                         f"(p50 {p50:.2f} ms, p99 {p99:.2f} ms).")
    return section
