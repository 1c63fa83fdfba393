"""Case 11, queues and flow control: what the machinery costs.

Throughput: case 2's burst (the 3-step ``noop3``, ``--procs 2``) twice per
repetition, paired: *plain*, runs in the default queue with no queue
settings; *flow control present*, the same runs in an unconstrained queue
``fast`` while three other queues have settings (one at its concurrency
limit, one paused, one limited per key) and the first two hold a backlog the
supervisor walks past on every claim. The rate is measured as in case 2
(first ``claimed_at`` to last ``completed_at`` of the measured runs). The
target: flow control present keeps at least 95 % of the plain rate.

Claim latency: a backlog of scheduled runs spread over ten queues (two
paused, two at a concurrency limit of 0, one at a limit of 3 that fills at
once, one limited per key, one rate-limited, three unconstrained, one of
them with priorities), then single claims as a supervisor makes them
(``Store.claim``, one run, every queue served; then one queue served), timed
in the claiming process. The same backlog in one unconstrained queue is the
reference.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import psycopg

from everystep import schedule
from everystep.store import Store, connect

from . import bulk, procs
from .context import Context
from .report import Section, Table
from .stats import Series, fmt, fmt_ratio, percentile
from .workloads import noop3, payload

APP = "bench.workloads"
QUEUE_TABLES = "everystep_stream, everystep_attempt, everystep_step, everystep_message, everystep_event, everystep_workflow, everystep_runner, everystep_queue, " \
               "everystep_queue_claim"


def sizes(ctx: Context) -> dict[str, int]:
    quick = ctx.settings.quick
    return {
        "runs": 600 if quick else ctx.settings.throughput_runs,
        "reps": 3 if quick else ctx.settings.reps + 2,
        "backlog": 500 if quick else 5_000,
        "latency_backlog": 20_000 if quick else 100_000,
        "probes": 60 if quick else 300,
    }


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE " + QUEUE_TABLES)
        conn.execute("VACUUM ANALYZE everystep_workflow")


def settle(store: Store, queue: str, **settings: Any) -> None:
    store.update_queue(queue, lambda current: dataclasses.replace(current, **settings))


def burst(ctx: Context, url: str, runs: int, queue: str, label: str) -> float:
    """Schedule ``runs`` noop3 runs in ``queue``, work them off with a burst
    supervisor at --procs 2; returns runs/s over the database's own window."""
    with psycopg.connect(url) as conn:
        for i in range(runs):
            schedule(noop3, payload(i), conn=conn, queue=queue)
        conn.commit()
    cmd = procs.supervisor_cmd(url, 2, ctx.work.socket(), app=APP)
    procs.run(cmd, ctx.work.log(f"supervisor-case11-{label}"), timeout=60 + runs * 0.5)
    with psycopg.connect(url, autocommit=True) as conn:
        done, seconds = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'completed'),"
            " extract(epoch FROM max(completed_at) - min(claimed_at))::float8"
            " FROM everystep_workflow WHERE queue = %s", (queue,)).fetchone()
    if done != runs:
        raise procs.BenchError(f"case 11 {label}: {done} of {runs} runs completed")
    return runs / seconds if seconds else 0.0


def throughput(ctx: Context, url: str, n: dict[str, int], out: dict[Any, Series]) -> None:
    for rep in range(n["reps"]):
        # Alternate which goes first, so a drift of the machine's load
        # during a repetition does not favour one side.
        first, second = ("plain", "flow") if rep % 2 == 0 else ("flow", "plain")
        measured = {first: one_burst(ctx, url, n, first), second: one_burst(ctx, url, n, second)}
        plain, flow = measured["plain"], measured["flow"]
        out.setdefault("plain", Series()).add(plain)
        out.setdefault("flow", Series()).add(flow)
        out.setdefault("ratio", Series()).add(flow / plain if plain else None)
        ctx.log(f"case 11 rep {rep + 1}: --procs 2 plain {plain:,.0f} runs/s, flow control present "
                f"{flow:,.0f} runs/s ({fmt_ratio(flow / plain if plain else None, percent=True)})")


def one_burst(ctx: Context, url: str, n: dict[str, int], kind: str) -> float:
    reset(url)
    if kind == "plain":
        return burst(ctx, url, n["runs"], "default", "plain")
    flow_settings(url, n)
    return burst(ctx, url, n["runs"], "fast", "flow")


def flow_settings(url: str, n: dict[str, int]) -> None:
    """The queues that make flow control present: settings and backlogs."""
    store = connect(url)
    try:
        settle(store, "limited", concurrency=0)
        settle(store, "held", paused=True)
        settle(store, "keyed", key_concurrency=1)
    finally:
        store.close()
    for queue in ("limited", "held"):
        bulk.load_scheduled(url, n["backlog"], noop3.name, queue=queue)
    bulk.vacuum_analyze(url)


def claim_cost(ctx: Context, url: str, n: dict[str, int], out: dict[str, list[float]]) -> None:
    """The claim statement alone, plain against flow control present: one
    run per claim from a backlog of the measured queue, timed in process."""
    for kind in ("plain", "flow"):
        reset(url)
        queue = "default" if kind == "plain" else "fast"
        if kind == "flow":
            flow_settings(url, n)
        bulk.load_scheduled(url, n["probes"] * 5, noop3.name, queue=queue)
        bulk.vacuum_analyze(url)
        store = connect(url)
        try:
            time_claims(store, 20, None)
            out[kind] = time_claims(store, n["probes"] * 4, None)
        finally:
            store.close()
        ctx.log(f"case 11 claim statement, {kind}: p50 {percentile(out[kind], 50):.3f} ms")


LATENCY_QUEUES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    # (queue, settings, how its backlog is loaded)
    ("q0-paused", {"paused": True}, {}),
    ("q1-paused", {"paused": True}, {}),
    ("q2-at-limit", {"concurrency": 0}, {}),
    ("q3-at-limit", {"concurrency": 0}, {}),
    ("q4-limit-3", {"concurrency": 3}, {}),
    ("q5-per-key", {"key_concurrency": 1}, {"keys": 100}),
    ("q6-rate", {"rate_limit": 20, "rate_period": 60.0}, {}),
    ("q7-priorities", {}, {"priority": 5}),
    ("q8-free", {}, {}),
    ("q9-free", {}, {}),
]


def time_claims(store: Store, probes: int, queues: list[str] | None) -> list[float]:
    latencies = []
    for _ in range(probes):
        started = time.perf_counter()
        store.claim("bench-latency", 1, [noop3.name], queues)
        latencies.append((time.perf_counter() - started) * 1000.0)
    return latencies


def latency(ctx: Context, url: str, n: dict[str, int], out: dict[str, list[float]]) -> None:
    per_queue = n["latency_backlog"] // len(LATENCY_QUEUES)
    reset(url)
    bulk.load_scheduled(url, n["latency_backlog"], noop3.name)
    bulk.vacuum_analyze(url)
    store = connect(url)
    try:
        time_claims(store, 5, None)  # warm the connection and the plan
        out["one queue, no settings"] = time_claims(store, n["probes"], None)
    finally:
        store.close()
    reset(url)
    store = connect(url)
    try:
        for queue, settings, load in LATENCY_QUEUES:
            if settings:
                settle(store, queue, **settings)
            bulk.load_scheduled(url, per_queue, noop3.name, queue=queue, **load)
        bulk.vacuum_analyze(url)
        time_claims(store, 5, None)
        out["ten queues, every queue served"] = time_claims(store, n["probes"], None)
        out["ten queues, one queue served (--queues q9-free)"] = time_claims(store, n["probes"], ["q9-free"])
    finally:
        store.close()
    for label, values in out.items():
        ctx.log(f"case 11 claim latency, {label}: p50 {percentile(values, 50):.2f} ms, "
                f"p99 {percentile(values, 99):.2f} ms")


def run(ctx: Context) -> None:
    n = sizes(ctx)
    url = ctx.urls["queues"]
    out = ctx.results.setdefault("case11", {})
    throughput(ctx, url, n, out.setdefault("throughput", {}))
    claim_cost(ctx, url, n, out.setdefault("claim_cost", {}))
    latency(ctx, url, n, out.setdefault("latency", {}))
    reset(url)


def section(ctx: Context) -> Section:
    n = sizes(ctx)
    out = ctx.results.get("case11", {})
    rates: dict[str, Series] = out.get("throughput", {})
    section = Section(
        "case11", "Case 11 — queues and flow control",
        method=(
            f"Throughput: {n['runs']:,} runs of `noop3` worked off by `everystep-supervisor --procs 2 --burst`, "
            f"{n['reps']} paired repetitions (which side goes first alternates). *Plain*: the default queue, no queue settings. *Flow control "
            f"present*: the runs in an unconstrained queue while `limited` (concurrency 0) and `held` (paused) "
            f"each hold {n['backlog']:,} scheduled runs of the same workflow that every claim walks past, and "
            "`keyed` has a per-key limit. Rates as in case 2 (first claimed_at to last completed_at). "
            f"Claim latency: {n['latency_backlog']:,} scheduled runs, `Store.claim` of one run timed in the "
            f"claiming process, {n['probes']} claims per row, claimed runs left running."
        ),
    )
    table = Table(["--procs 2", "runs/s"])
    table.add("plain (default queue, no settings)", rates.get("plain", Series()).cell(0))
    table.add("flow control present (unconstrained queue)", rates.get("flow", Series()).cell(0))
    ratio = rates.get("ratio", Series())
    table.add("flow / plain (median of paired ratios)",
              fmt_ratio(ratio.median, percent=True) if ratio else "n/a")
    section.tables.append(table)
    costs: dict[str, list[float]] = out.get("claim_cost", {})
    cost = Table(["claim of one run, timed in the claiming process", "p50 ms", "p99 ms"],
                 caption="The claim statement alone, same two setups:")
    for kind, label in (("plain", "plain"), ("flow", "flow control present")):
        if costs.get(kind):
            cost.add(label, fmt(percentile(costs[kind], 50), 3), fmt(percentile(costs[kind], 99), 3))
    section.tables.append(cost)
    latencies: dict[str, list[float]] = out.get("latency", {})
    lat = Table(["backlog", "p50 ms", "p99 ms", "max ms"],
                caption="Claim latency (one run per claim). Ten queues: " + ", ".join(
                    f"`{queue}`" for queue, _, _ in LATENCY_QUEUES) + ".")
    for label, values in latencies.items():
        lat.add(label, fmt(percentile(values, 50), 2), fmt(percentile(values, 99), 2), fmt(max(values), 2))
    section.tables.append(lat)
    if ratio and ratio.median is not None:
        verdict = "met" if ratio.median >= 0.95 else "missed"
        section.notes.append(f"Target (flow control present ≥ 95 % of plain runs/s at --procs 2): **{verdict}** "
                             f"({fmt_ratio(ratio.median, percent=True)}).")
    return section
