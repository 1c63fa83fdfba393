"""Case 2, throughput: N runs of the 3-step no-op workflow (``noop3``),
worked off by ``everystep-supervisor --burst`` at each ``--procs``.

The queue is filled first (one transaction), then the supervisor is
started; the rate is runs (and recorded steps) over the window from the
first ``claimed_at`` to the last ``completed_at``, both stamped by the
database, so process start-up and the burst-mode exit check are excluded
(the process wall time is reported alongside). Each repetition first takes
case 1's pgbench numbers, then the everystep numbers, so paired ratios
compare measurements taken under the same machine conditions.

A sensitivity table repeats ``--procs 2`` against pgbench at 2 clients
with ``synchronous_commit = off`` on both, which takes the disk flush out
and shows the CPU cost of the engine's round trips.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Iterator

import psycopg

from . import esdb, fleet, pgbench_baseline, procs
from .context import Context
from .report import ChartSeries, Section, Table
from .stats import Series, fmt_ratio, fmt_span
from .workloads import noop3, payload

APP = "bench.workloads"
#: Recorded steps per run of ``noop3``.
STEPS_PER_RUN = 3


def xact_commits(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return int(conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()[0])


def measure(ctx: Context, url: str, procs_: int, runs: int, label: str = "noop3",
            workflow=noop3, args=None, with_timeline: bool = False,  # type: ignore[no-untyped-def]
            fixed_cpu: float = 0.0) -> dict[str, float]:
    """Fill the queue, run one burst, return the measured rates (and the CPU
    per run of every process, less ``fixed_cpu``: an empty burst's)."""
    esdb.reset(url)
    esdb.schedule_many(url, workflow, args or ((payload(i),) for i in range(runs)))
    before = xact_commits(url)
    cpu, wall = burst_cpu(ctx, url, procs_, f"supervisor-{label}-p{procs_}", timeout=60 + runs * 0.5)
    result = esdb.span(url)
    esdb.expect_all_completed(result, runs, f"supervisor --procs {procs_}")
    time.sleep(0.6)  # let the backends' statistics reach pg_stat_database
    commits = xact_commits(url) - before
    parts = {f"timeline:{name}": value for name, value in esdb.timeline(url).items()} if with_timeline else {}
    return {
        **parts,
        "runs_per_s": result.runs_per_second,
        "steps_per_s": result.steps_per_second,
        "seconds": result.seconds,
        "wall": wall,
        "tx_per_run": commits / runs,
        "cpu_per_run_us": max(cpu - fixed_cpu, 0.0) / runs * 1e6,
    }


def burst_cpu(ctx: Context, url: str, procs_: int, log: str, timeout: float) -> tuple[float, float]:
    """One ``--burst`` supervisor: the CPU seconds of its whole tree (its
    children are reaped by it) and of the server, and its wall time."""
    cmd = procs.supervisor_cmd(url, procs_, ctx.work.socket(), app=APP)
    with fleet.sampled_cpu([("postgres", fleet.postmaster_pid(url))]) as server, children_cpu() as supervisor:
        wall = procs.run(cmd, ctx.work.log(log), timeout=timeout)
    return supervisor.get("seconds", 0.0) + server.get("postgres", 0.0), wall


def startup_cpu(ctx: Context, url: str, procs_: int) -> float:
    """What a burst costs with nothing to do (start-up, the exit check,
    shutdown): taken out of the CPU per run, which would otherwise depend
    on how many runs share it."""
    esdb.reset(url)
    return burst_cpu(ctx, url, procs_, f"supervisor-empty-p{procs_}", timeout=60)[0]


@contextlib.contextmanager
def children_cpu() -> Iterator[dict[str, float]]:
    """CPU seconds of the child processes this process waited for during
    the block (with theirs: a supervisor reaps its own children)."""
    used: dict[str, float] = {}
    start = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        yield used
    finally:
        end = resource.getrusage(resource.RUSAGE_CHILDREN)
        used["seconds"] = (end.ru_utime - start.ru_utime) + (end.ru_stime - start.ru_stime)


def ceiling(cpu_per_run_us: float, pgbench_tps: float, cores: int) -> float:
    """Step commits/s with every core busy at this CPU per run, as a share of
    pgbench: what the 40 % bar can reach on this machine as loaded now."""
    return cores * 1e6 / cpu_per_run_us * STEPS_PER_RUN / pgbench_tps


def run(ctx: Context) -> None:
    s = ctx.settings
    es_url, pgb_url = ctx.urls["es"], ctx.urls["pgbench"]
    es_async, pgb_async = ctx.urls["es_async"], ctx.urls["pgbench_async"]
    pg = ctx.results.setdefault("pgbench", {})
    out = ctx.results.setdefault("case2", {})
    paired_pg = ctx.results.setdefault("pgbench_paired", {})
    for url in (pgb_url, pgb_async):
        pgbench_baseline.prepare(url)
    for rep in range(s.reps):
        for clients in s.procs:
            try:
                tps = pgbench_baseline.measure(ctx, pgb_url, clients, s.pgbench_seconds)
                pg.setdefault(clients, Series()).add(tps)
                paired_pg[(rep, clients)] = tps
                ctx.log(f"case 1 rep {rep + 1}: pgbench -c {clients}: {tps:,.0f} tps")
            except procs.BenchError as exc:
                ctx.errors["pgbench"] = str(exc)
        for procs_ in s.procs:
            if ("fixed_cpu", procs_) not in out:
                out[("fixed_cpu", procs_)] = startup_cpu(ctx, es_url, procs_)
            m = measure(ctx, es_url, procs_, s.throughput_runs, with_timeline=True,
                        fixed_cpu=out[("fixed_cpu", procs_)])
            for key, value in m.items():
                out.setdefault((key, procs_), Series()).add(value)
            paired = paired_pg.get((rep, procs_))
            reached = ""
            if paired:
                out.setdefault(("step_ratio", procs_), Series()).add(m["steps_per_s"] / paired)
                out.setdefault(("run_ratio", procs_), Series()).add(m["runs_per_s"] / paired)
                if m["cpu_per_run_us"] > 0:
                    top = ceiling(m["cpu_per_run_us"], paired, os.cpu_count() or 1)
                    out.setdefault(("ceiling", procs_), Series()).add(top)
                    reached = (f"; {m['steps_per_s'] / paired * 100:.0f} % of pgbench, ceiling at its "
                               f"{m['cpu_per_run_us']:,.0f} µs of CPU per run {top * 100:.0f} %")
            ctx.log(f"case 2 rep {rep + 1}: --procs {procs_}: {m['runs_per_s']:,.0f} runs/s, "
                    f"{m['steps_per_s']:,.0f} step commits/s ({m['seconds']:.1f}s){reached}")
        # Sensitivity: no disk flush on either side.
        try:
            tps = pgbench_baseline.measure(ctx, pgb_async, 2, s.pgbench_seconds)
            out.setdefault(("async_pgbench", 2), Series()).add(tps)
        except procs.BenchError as exc:
            ctx.errors["pgbench"] = str(exc)
            tps = None
        m = measure(ctx, es_async, 2, s.throughput_runs, label="noop3-async")
        out.setdefault(("async_steps", 2), Series()).add(m["steps_per_s"])
        out.setdefault(("async_runs", 2), Series()).add(m["runs_per_s"])
        if tps:
            out.setdefault(("async_ratio", 2), Series()).add(m["steps_per_s"] / tps)
        ctx.log(f"case 2 rep {rep + 1}: synchronous_commit=off: pgbench -c 2 {tps or 0:,.0f} tps, "
                f"everystep --procs 2 {m['steps_per_s']:,.0f} step commits/s")


def section(ctx: Context) -> Section:
    s = ctx.settings
    out = ctx.results.get("case2", {})
    pg = ctx.results.get("pgbench", {})
    section = Section(
        "case2", f"Case 2 — throughput: {s.throughput_runs:,} runs of a 3-step no-op workflow",
        method=(
            f"`bench.workloads.noop3` (three `@step` calls passing `{{\"i\": n, \"tag\": \"bench\"}}` along). "
            f"The {s.throughput_runs:,} runs are scheduled first in one transaction, then "
            "`everystep-supervisor --app bench.workloads --procs P --burst` works them off. "
            "Rates use the database's own clock: first `claimed_at` to last `completed_at` "
            "(start-up and the burst exit check excluded; the process wall time is shown too). "
            "\"Step commits\" are the recorded `done` step rows (3 per run). "
            "\"DB transactions per run\" is the `pg_stat_database.xact_commit` delta over the burst "
            "divided by the runs (every round trip in autocommit counts, reads included). "
            "Ratios are to case 1 at the same client count: median of the per-repetition ratios, "
            "each pairing an everystep burst with the pgbench run taken just before it. "
            "CPU per run: the supervisor's whole process tree and the PostgreSQL server's, over the burst, less "
            "what a burst with nothing to do costs (start-up and shutdown); the ceiling is the share of pgbench "
            "that step commits/s would reach with every core busy at that CPU per run, so a repetition on a "
            "loaded machine shows as one."
        ),
    )
    table = Table(["--procs", "runs/s", "step commits/s", "pgbench commits/s (same clients)",
                   "step commits / pgbench", "runs / pgbench", "DB transactions per run", "burst wall s",
                   "CPU per run, all processes, µs", "ceiling at that CPU"])
    for procs_ in s.procs:
        table.add(
            procs_,
            out.get(("runs_per_s", procs_), Series()).cell(0),
            out.get(("steps_per_s", procs_), Series()).cell(0),
            pg.get(procs_, Series()).cell(0),
            _ratio_cell(out.get(("step_ratio", procs_))),
            _ratio_cell(out.get(("run_ratio", procs_))),
            out.get(("tx_per_run", procs_), Series()).cell(1),
            out.get(("wall", procs_), Series()).cell(1),
            out.get(("cpu_per_run_us", procs_), Series()).cell(0),
            _ratio_cell(out.get(("ceiling", procs_))),
        )
    section.tables.append(table)
    timeline = Table(["median per run, ms"] + [f"--procs {p}" for p in s.procs],
                     caption="Where a run's time goes (from the runs' own timestamps; median over the runs of "
                             "each burst, then median (min–max) over the repetitions):")
    for name, label in TIMELINE_LABELS:
        timeline.add(label, *[out.get((f"timeline:{name}", p), Series()).cell(2) for p in s.procs])
    section.tables.append(timeline)
    sens = Table(["synchronous_commit = off, --procs 2", "value"],
                 caption="Sensitivity (same server, databases with `synchronous_commit = off`: no wait for the WAL flush):")
    sens.add("pgbench commits/s, 2 clients", out.get(("async_pgbench", 2), Series()).cell(0))
    sens.add("everystep step commits/s", out.get(("async_steps", 2), Series()).cell(0))
    sens.add("everystep runs/s", out.get(("async_runs", 2), Series()).cell(0))
    sens.add("step commits / pgbench", _ratio_cell(out.get(("async_ratio", 2))))
    section.tables.append(sens)
    target = out.get(("step_ratio", 2))
    if target and target.median is not None:
        verdict = "met" if target.median >= 0.40 else "missed"
        top = out.get(("ceiling", 2))
        allowed = f"; the ceiling each repetition's CPU allowed: {fmt_span(top, percent=True)}" if top else ""
        section.notes.append(
            f"Target (step commits/s at --procs 2 ≥ 40 % of pgbench at 2 clients): **{verdict}** "
            f"({fmt_span(target, percent=True)}{allowed})."
        )
    return section


TIMELINE_LABELS = (
    ("claim_gap", "latest completion → next claimed_at (a freed child's wait for a claim; claimed ahead, "
                  "the claim follows the previous hand-off instead)"),
    ("claim_to_first", "claimed → first step starts (dispatch, outcomes read; claimed ahead, the wait for a child)"),
    ("in_step", "inside a step (call → its record statement), mean of 3"),
    ("between_steps", "between steps (record commit → next step call), mean of 2"),
    ("last_to_done", "last step recorded → run completed (commit, status write)"),
    ("claimed_to_done", "claimed → completed, whole run"),
)


def _ratio_cell(series: Series | None) -> str:
    if not series:
        return "n/a"
    med = fmt_ratio(series.median, percent=True)
    if len(series.values) == 1:
        return med
    return f"{med} ({fmt_ratio(series.low, percent=True)}–{fmt_ratio(series.high, percent=True)})"


def chart_series(ctx: Context) -> list[ChartSeries]:
    out = ctx.results.get("case2", {})
    pg = ctx.results.get("pgbench", {})

    def series(label: str, data: dict[int, Series]) -> ChartSeries:
        points = [(float(p), data[p].median) for p in sorted(data) if data[p]]
        ranges = {float(p): (data[p].low, data[p].high) for p in data if data[p]}
        return ChartSeries(label, points, ranges)  # type: ignore[arg-type]

    procs_ = ctx.settings.procs
    return [
        series("pgbench commits/s (1-row INSERT)", {p: pg[p] for p in procs_ if p in pg}),
        series("everystep step commits/s (3-step)", {p: out[("steps_per_s", p)] for p in procs_
                                                     if ("steps_per_s", p) in out}),
        series("everystep runs/s (3-step)", {p: out[("runs_per_s", p)] for p in procs_
                                             if ("runs_per_s", p) in out}),
    ]

