"""Case 7, depth and history: what a database full of finished runs, or a
long queue, does to claims and to case 2's throughput.

Conditions, each on the same database (``bench_scale``), measured in this
order so that case 9 inherits the largest history:

- *backlog, not served*: B scheduled runs of a workflow the supervisor does
  not serve, older than every run it does serve (another application's
  runs whose supervisor is down, or runs of a workflow since removed). Every
  claim walks the scheduled-runs index in creation order from the oldest,
  so this is the worst place for them to be.
- *backlog, served*: B scheduled runs of the measured workflow itself: a
  supervisor catching up on a queue; the rate is taken over the first runs.
- *history*: H completed runs with three steps each (COPY, then VACUUM
  ANALYZE, as autovacuum would have left a table that grew slowly).

For each: a supervisor (``--procs 2``, ``--poll 600``) starts idle; the
measured runs are COPYed without NOTIFY; the harness times
``Store.claim(limit=2)`` calls on them (the supervisor's claim, client
round trip included) and puts them back; ``EXPLAIN (ANALYZE, BUFFERS)`` of
the claim's row selection is taken; then one NOTIFY starts the measured
window. Server-side claim time under load comes from
``pg_stat_user_functions`` (``track_functions = pl`` on this database).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from everystep.store import connect

from . import bulk, esdb, fleet
from .context import Context
from .report import ChartSeries, Section, Table
from .stats import Series, fmt, percentile

RUN_NAME = "bench.workloads.noop3"
ELSEWHERE = "bench.elsewhere.unserved"
PROBE = "bench-probe"

#: The claim's row selection (version 10): per served name, its oldest due
#: runs of the queue and priority, then the oldest of those.
EXPLAIN_SQL = """
EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT c.id FROM (SELECT DISTINCT u.n FROM unnest(%s::text[]) AS u(n)) AS served
CROSS JOIN LATERAL (
    SELECT w.id, coalesce(w.not_before, w.created_at) AS due FROM everystep_workflow AS w
    WHERE w.status = 'scheduled' AND w.queue = 'default' AND w.priority = 0 AND w.name = served.n
      AND coalesce(w.not_before, w.created_at) <= clock_timestamp()
    ORDER BY coalesce(w.not_before, w.created_at) LIMIT 2) AS c
ORDER BY c.due LIMIT 2
"""
#: Version 9's: the queue's due runs of the priority in due order, each
#: one's name tested, locking as it goes.
VERSION_9_SQL = """
EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT w.id FROM everystep_workflow AS w
WHERE w.status = 'scheduled' AND w.queue = 'default' AND w.priority = 0
  AND coalesce(w.not_before, w.created_at) <= clock_timestamp() AND w.name = ANY(%s)
ORDER BY coalesce(w.not_before, w.created_at) LIMIT 2 FOR UPDATE SKIP LOCKED
"""
VERSION_9_INDEX = ("CREATE INDEX bench_alt ON everystep_workflow (queue, priority DESC, (coalesce(not_before, created_at)))"
                   " WHERE status = 'scheduled'")


def conditions(ctx: Context) -> list[tuple[str, int]]:
    s = ctx.settings
    return ([("unserved", b) for b in s.depth_backlog] + [("served", b) for b in s.depth_backlog]
            + [("history", h) for h in s.depth_history])


def label(kind: str, size: int) -> str:
    return {"history": f"{size:,} finished runs", "unserved": f"{size:,} scheduled, not served (older)",
            "served": f"{size:,} scheduled, served"}[kind]


def cleanup(url: str) -> None:
    """Delete everything but the history, then vacuum, as autovacuum would."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM everystep_step WHERE workflow_id IN (SELECT id FROM everystep_workflow"
                     " WHERE claimed_by IS DISTINCT FROM %s)", (bulk.HISTORY_RUNNER,))
        conn.execute("DELETE FROM everystep_workflow WHERE claimed_by IS DISTINCT FROM %s", (bulk.HISTORY_RUNNER,))
        conn.execute("TRUNCATE everystep_runner")
    bulk.vacuum_analyze(url)


def explain(url: str, query: str = EXPLAIN_SQL, setup: tuple[str, ...] = ()) -> dict[str, Any]:
    """EXPLAIN ANALYZE the claim's row selection with the claim function's
    planner settings, after ``setup`` statements, in a transaction rolled
    back (locks and any DDL undone)."""
    with psycopg.connect(url) as conn:
        for statement in setup:
            conn.execute(statement)
        conn.execute("SET LOCAL enable_bitmapscan = off")
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = conn.execute(query, ([RUN_NAME],)).fetchone()[0][0]
        conn.rollback()
    found: dict[str, Any] = {"exec_ms": float(plan.get("Execution Time", 0.0)), "removed": 0.0,
                             "buffers": float(plan["Plan"].get("Shared Hit Blocks", 0)
                                              + plan["Plan"].get("Shared Read Blocks", 0)),
                             "index": ""}

    def walk(node: dict[str, Any]) -> None:
        if "Index" in node.get("Node Type", ""):
            found["index"] = node.get("Index Name", "?")
            found["removed"] += float(node.get("Rows Removed by Filter", 0))
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    return found


def probe(url: str, calls: int) -> list[float]:
    """Time ``calls`` claims of 2 runs (ms), then give the runs back."""
    store = connect(url)
    latencies = []
    try:
        for _ in range(calls):
            started = time.perf_counter()
            store.claim(PROBE, 2, [RUN_NAME])
            latencies.append((time.perf_counter() - started) * 1000.0)
    finally:
        store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE everystep_workflow SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL"
                     " WHERE status = 'running' AND claimed_by = %s", (PROBE,))
    return latencies


def claim_function_stats(url: str) -> tuple[int, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT calls, total_time FROM pg_stat_user_functions"
                           " WHERE funcname = 'everystep_claim'").fetchone()
    return (int(row[0]), float(row[1])) if row else (0, 0.0)


def measure(ctx: Context, url: str, kind: str, size: int) -> dict[str, float]:
    s = ctx.settings
    group = fleet.Fleet(ctx, url, 1, 2, label=f"depth-{kind}-{size}", extra=("--poll", "600")).start()
    try:
        measured = size if kind == "served" else s.depth_runs
        bulk.load_scheduled(url, measured, RUN_NAME)
        plan = explain(url)
        latencies = probe(url, s.depth_probes)
        time.sleep(0.6)  # let function statistics settle before the baseline read
        calls0, total0 = claim_function_stats(url)

        def notify() -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SELECT pg_notify('everystep_scheduled', %s)", (RUN_NAME,))

        window = fleet.measure_window(group, url, s.depth_runs, notify, timeout=120 + s.depth_runs * 0.5)
    finally:
        group.stop()
    time.sleep(0.6)
    calls1, total1 = claim_function_stats(url)
    claims = calls1 - calls0
    facts = bulk.table_facts(url)
    result = {
        "runs_per_s": window.rate["runs_per_s"],
        "probe_p50": percentile(latencies, 50) or 0.0,
        "probe_p99": percentile(latencies, 99) or 0.0,
        "server_claim_ms": (total1 - total0) / claims if claims else float("nan"),
        "explain_ms": plan.get("exec_ms", float("nan")),
        "explain_removed": plan.get("removed", 0.0),
        "explain_buffers": plan.get("buffers", 0.0),
        "py_us": window.per_run_us("python"),
        "pg_us": window.per_run_us("postgres"),
        "workflow_bytes": facts.get("everystep_workflow:table_bytes", 0.0) + facts.get(
            "everystep_workflow:index_bytes", 0.0),
        "step_bytes": facts.get("everystep_step:table_bytes", 0.0) + facts.get("everystep_step:index_bytes", 0.0),
        "dead": facts.get("everystep_workflow:dead", 0.0),
        "autovacuums": facts.get("everystep_workflow:vacuums", 0.0),
    }
    return result


def history_url(ctx: Context, size: int) -> str:
    """One fresh database per history size (the empty one too: the backlog
    conditions churn ``ctx.urls["scale"]``), so repetitions can alternate
    between them and pair each with an empty-database measurement."""
    key = f"scale_{size}"
    if key not in ctx.urls:
        url = ctx.urls[key] = ctx.server.create_database(f"bench_scale_{size}")
        ctx.server.set_database(url, "track_functions", "pl")
        esdb.migrate(url)
    return ctx.urls[key]


def run(ctx: Context) -> None:
    s = ctx.settings
    out = ctx.results.setdefault("case7", {})
    for size in s.depth_history:
        url = history_url(ctx, size)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("TRUNCATE everystep_stream, everystep_attempt, everystep_step, everystep_message, "
                         "everystep_event, everystep_workflow, everystep_runner")
        if size:
            seconds = bulk.load_history(url, size)
            vacuum = bulk.vacuum_analyze(url)
            ctx.log(f"case 7: loaded {size:,} finished runs with 3 steps each in {seconds:.1f}s "
                    f"(COPY), VACUUM ANALYZE {vacuum:.1f}s")
            out.setdefault("load", {})[size] = seconds
    empty_url = ctx.urls["scale"]
    for kind, size in conditions(ctx):
        if kind == "history":
            continue
        if kind == "unserved":
            bulk.load_scheduled(empty_url, size, ELSEWHERE)
            bulk.vacuum_analyze(empty_url)
        for rep in range(s.depth_reps):
            _record(ctx, out, kind, size, rep, measure(ctx, empty_url, kind, size))
            if kind == "unserved":
                _cleanup_keep_unserved(empty_url)
            else:
                cleanup(empty_url)
        if kind == "unserved" and size == max(s.depth_backlog):
            # Served runs waiting behind the unserved ones, as many again.
            bulk.load_scheduled(empty_url, size, RUN_NAME)
            bulk.vacuum_analyze(empty_url)
            out["alternatives"] = claim_alternatives(empty_url)
        if kind == "unserved":
            cleanup(empty_url)
    # History: alternate the databases within each repetition, so each
    # ratio to the empty database pairs measurements taken moments apart.
    for rep in range(s.history_reps):
        rates = {}
        for size in s.depth_history:
            result = measure(ctx, history_url(ctx, size), "history", size)
            cleanup(history_url(ctx, size))
            _record(ctx, out, "history", size, rep, result)
            rates[size] = result["runs_per_s"]
        for size in s.depth_history:
            if rates.get(0):
                out.setdefault(("history", size, "paired_ratio"), Series()).add(rates[size] / rates[0])


def _record(ctx: Context, out: dict, kind: str, size: int, rep: int, result: dict[str, float]) -> None:
    for name, value in result.items():
        out.setdefault((kind, size, name), Series()).add(value)
    ctx.log(f"case 7 rep {rep + 1}: {label(kind, size)}: {result['runs_per_s']:,.0f} runs/s, claim p50 "
            f"{result['probe_p50']:.2f} ms p99 {result['probe_p99']:.2f} ms, server "
            f"{result['server_claim_ms']:.3f} ms/claim; EXPLAIN {result['explain_ms']:.2f} ms, "
            f"{result['explain_removed']:,.0f} rows removed by filter; CPU/run Python {result['py_us']:.0f} µs, "
            f"PostgreSQL {result['pg_us']:.0f} µs")


ALTERNATIVES = (
    ("the claim's (version 10: per served name)", None, EXPLAIN_SQL),
    ("version 9's (the queue's due runs in order, each name tested), with its index", VERSION_9_INDEX,
     VERSION_9_SQL),
)


def claim_alternatives(url: str) -> list[tuple[str, dict[str, Any]]]:
    """EXPLAIN the claim's row selection with the unserved backlog in place,
    as it is and in version 9's form with version 9's claimable index (DDL
    in the same transaction, rolled back)."""
    return [(title, explain(url, query, () if ddl is None else (
        "DROP INDEX everystep_workflow_claimable", ddl, "ANALYZE everystep_workflow")))
        for title, ddl, query in ALTERNATIVES]


def _cleanup_keep_unserved(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM everystep_step WHERE workflow_id IN (SELECT id FROM everystep_workflow"
                     " WHERE name = %s)", (RUN_NAME,))
        conn.execute("DELETE FROM everystep_workflow WHERE name = %s", (RUN_NAME,))
    bulk.vacuum_analyze(url)


def _cell(out: dict, kind: str, size: int, name: str, digits: int = 0) -> str:
    return out.get((kind, size, name), Series()).cell(digits)


def _median(out: dict, kind: str, size: int, name: str) -> float | None:
    series = out.get((kind, size, name))
    return series.median if series else None


def section(ctx: Context) -> Section:
    s = ctx.settings
    out = ctx.results.get("case7", {})
    section = Section(
        "case7", "Case 7 — depth and history: claims and throughput with a full database",
        method=(
            f"One supervisor at `--procs 2` works off {s.depth_runs:,} runs of the 3-step workflow (case 2's shape) "
            "in each condition. Finished history is COPYed into its own database per size (completed runs with "
            "their three `done` steps, realistic payloads, finished 31–90 days ago), then `VACUUM ANALYZE`; each of "
            f"the {s.history_reps} history repetitions measures the sizes back to back, and \"paired\" is the median "
            "of the per-repetition ratios to the empty database, which cancels most of a shared machine's drift. "
            "Backlogs are scheduled runs COPYed into another, empty database: *not served* = a workflow this supervisor "
            "does not know, created before the measured runs; *served* = the measured workflow itself (rate over "
            f"its first runs); {s.depth_reps} repetition(s) each. Claim latency: {s.depth_probes} timed "
            "`Store.claim(limit=2)` calls from the harness on the measured runs before the window (client round "
            "trip, Python included; the runs are then put back); server time per claim: `pg_stat_user_functions` "
            "for `everystep_claim` over the window. EXPLAIN: `EXPLAIN (ANALYZE, BUFFERS)` of the claim's row "
            "selection (for each served name its 2 oldest due runs, then the 2 oldest of those; with the function's "
            "planner settings). Median (min–max)."
        ),
    )
    table = Table(["condition", "runs/s", "vs empty (paired)", "claim p50 ms", "claim p99 ms",
                   "server ms per claim (under load)", "EXPLAIN ms", "index entries skipped (EXPLAIN)",
                   "buffers touched", "CPU µs/run Python / PostgreSQL"])
    empty = _median(out, "history", 0, "runs_per_s")
    for kind, size in conditions(ctx):
        runs = _median(out, kind, size, "runs_per_s")
        paired = out.get((kind, size, "paired_ratio"))
        if paired:
            vs = f"{(paired.median - 1) * 100:+.0f} % ({(paired.low - 1) * 100:+.0f} to {(paired.high - 1) * 100:+.0f})"
        else:
            vs = f"{(runs / empty - 1) * 100:+.0f} %" if runs and empty else "n/a"
        table.add(label(kind, size), _cell(out, kind, size, "runs_per_s"), vs,
                  _cell(out, kind, size, "probe_p50", 2), _cell(out, kind, size, "probe_p99", 2),
                  _cell(out, kind, size, "server_claim_ms", 3), _cell(out, kind, size, "explain_ms", 2),
                  fmt(_median(out, kind, size, "explain_removed")), fmt(_median(out, kind, size, "explain_buffers")),
                  f"{_cell(out, kind, size, 'py_us')} / {_cell(out, kind, size, 'pg_us')}")
    section.tables.append(table)
    alternatives = out.get("alternatives")
    if alternatives:
        alt = Table(["claim row selection", "index used", "EXPLAIN ms", "index entries skipped", "buffers"],
                    caption=f"With the {max(s.depth_backlog):,} unserved runs in place and as many served runs "
                            "behind them: the claim's row selection, and version 9's with its claimable index (the "
                            "index swap is made in the EXPLAIN's own transaction and rolled back):")
        for title, found in alternatives:
            alt.add(title, f"`{found.get('index', '')}`", fmt(found.get("exec_ms"), 2), fmt(found.get("removed")),
                    fmt(found.get("buffers")))
        section.tables.append(alt)
    sizes = Table(["history", "runs table + indexes MiB", "steps table + indexes MiB", "dead tuples (runs)",
                   "vacuums of the runs table"],
                  caption="Table sizes and vacuum state after the history measurements (pg_stat_user_tables):")
    for size in s.depth_history:
        sizes.add(f"{size:,}", fmt((_median(out, "history", size, "workflow_bytes") or 0) / 2**20, 1),
                  fmt((_median(out, "history", size, "step_bytes") or 0) / 2**20, 1),
                  fmt(_median(out, "history", size, "dead")), fmt(_median(out, "history", size, "autovacuums")))
    section.tables.append(sizes)
    loads = out.get("load", {})
    if loads:
        section.notes.append("COPY load times: " + ", ".join(
            f"{rows:,} runs (+{rows * 3:,} steps) in {seconds:.1f} s" for rows, seconds in sorted(loads.items())) + ".")
    biggest = max(s.depth_history)
    paired = out.get(("history", biggest, "paired_ratio"))
    if paired and paired.median is not None:
        verdict = "met" if paired.median >= 0.90 else "missed"
        section.notes.append(f"Target (at {biggest:,} finished runs, runs/s within 10 % of the empty database): "
                             f"**{verdict}** ({(paired.median - 1) * 100:+.0f} %, paired).")
    return section


def chart_series(ctx: Context) -> list[ChartSeries]:
    out = ctx.results.get("case7", {})
    points, ranges = [], {}
    for size in ctx.settings.depth_history:
        series = out.get(("history", size, "runs_per_s"))
        if series:
            x = float(max(size, 1))
            points.append((x, series.median))
            ranges[x] = (series.low, series.high)
    return [ChartSeries("runs/s vs finished runs in the database", points, ranges)]  # type: ignore[arg-type]
