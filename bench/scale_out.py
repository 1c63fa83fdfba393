"""Case 8, scale-out: several supervisors on one PostgreSQL server.

1, 2, 4 and 8 supervisors (``--procs 2`` each, distinct ``--name``) and one
supervisor at ``--procs 8`` work off the same 3-step queue. All start idle;
the runs are then COPYed in one transaction and one NOTIFY wakes every
supervisor at once (so start-up is outside the window). Measured over the
window: runs/s (first claim to last completion, database clock), claims
that came back empty (the supervisors' ``empty_claims`` counters), wait
events and ungranted locks sampled every 50 ms, and CPU seconds of the
supervisors' process trees (parents and children apart) and of the
PostgreSQL server's tree (minus the sampler's own backend).

From those, the per-run CPU cost in microseconds (Python parent, Python
children, PostgreSQL) feeds a capacity model: on C cores the CPU-bound
ceiling is C / (cost per run), and one supervisor can never exceed
1 / (its parent's cost per run), since the parent claims and dispatches
every run on one thread.
"""

from __future__ import annotations

import os

from . import bulk, esdb, fleet
from .context import Context
from .report import ChartSeries, Section, Table
from .stats import Series, fmt

RUN_NAME = "bench.workloads.noop3"


def configurations(ctx: Context) -> list[tuple[int, int]]:
    s = ctx.settings
    return [(count, 2) for count in s.scale_supervisors] + [(1, s.scale_single_procs)]


def measure(ctx: Context, url: str, supervisors: int, procs_: int, runs: int) -> fleet.Window:
    esdb.reset(url)
    group = fleet.Fleet(ctx, url, supervisors, procs_, label=f"scale{supervisors}x{procs_}",
                        extra=("--poll", "60")).start()
    try:
        return fleet.measure_window(
            group, url, runs, lambda: bulk.load_scheduled(url, runs, RUN_NAME, notify=True),
            timeout=120 + runs * 0.2)
    finally:
        group.stop()


def run(ctx: Context) -> None:
    s = ctx.settings
    url = ctx.urls["es"]
    out = ctx.results.setdefault("case8", {})
    for rep in range(s.scale_reps):
        for supervisors, procs_ in configurations(ctx):
            window = measure(ctx, url, supervisors, procs_, s.scale_runs)
            key = (supervisors, procs_)
            values = {
                "runs_per_s": window.rate["runs_per_s"],
                "empty_claims": float(window.counts.get("empty_claims", 0)),
                "claims_per_run": float(window.counts.get("claims", 0)) / max(window.runs, 1),
                "py_us": window.per_run_us("python"),
                "py_parent_us": window.per_run_us("python:parent"),
                "py_children_us": window.per_run_us("python:children"),
                "pg_us": window.per_run_us("postgres"),
                "cpu_util": (window.cpu.get("python", 0.0) + window.cpu.get("postgres", 0.0))
                / (window.seconds * (os.cpu_count() or 1)),
                "lock_waits_mean": window.waits.get("lock_waits_mean", 0.0),
                "lock_waits_max": window.waits.get("lock_waits_max", 0.0),
                "active_mean": window.waits.get("active_mean", 0.0),
            }
            for event, share in window.waits.items():
                if event.startswith("event:"):
                    values[event] = share
            for name, value in values.items():
                out.setdefault((name, key), Series()).add(value)
            out.setdefault("events", set()).update(e for e in values if e.startswith("event:"))
            ctx.log(f"case 8 rep {rep + 1}: {supervisors} supervisor(s) × --procs {procs_}: "
                    f"{values['runs_per_s']:,.0f} runs/s, {values['empty_claims']:.0f} empty claims, "
                    f"CPU/run Python {values['py_us']:.0f} µs (parent {values['py_parent_us']:.0f}), "
                    f"PostgreSQL {values['pg_us']:.0f} µs, lock waits {values['lock_waits_mean']:.2f}")


def _median(out: dict, name: str, key: tuple[int, int]) -> float | None:
    series = out.get((name, key))
    return series.median if series else None


def model(ctx: Context) -> dict[str, float]:
    """The capacity model from the single supervisor at --procs 2."""
    out = ctx.results.get("case8", {})
    base = (1, 2)
    py, pg, parent = (_median(out, name, base) for name in ("py_us", "pg_us", "py_parent_us"))
    measured = _median(out, "runs_per_s", base)
    if not (py and pg and parent and measured):
        return {}
    cores = float(os.cpu_count() or 1)
    return {"py_us": py, "pg_us": pg, "parent_us": parent, "cost_us": py + pg, "cores": cores,
            "cpu_ceiling": cores * 1e6 / (py + pg), "parent_ceiling": 1e6 / parent, "measured": measured}


def section(ctx: Context) -> Section:
    s = ctx.settings
    out = ctx.results.get("case8", {})
    section = Section(
        "case8", f"Case 8 — scale-out: {s.scale_runs:,} runs of the 3-step workflow, several supervisors, one server",
        method=(
            "Supervisors are started (not in burst mode, `--poll 60`) and wait idle; then the runs are COPYed in one "
            "transaction and one NOTIFY wakes them all, so start-up is outside the measured window. Runs/s uses the "
            "database clock (first `claimed_at` to last `completed_at`). Empty claims: the supervisors' "
            "`empty_claims` counters (`ctl status`) over the window. Waits: `pg_stat_activity` of this database's "
            "active backends and ungranted `pg_locks`, sampled every 50 ms (mean per sample). CPU: psutil user+system "
            "seconds of every process in the supervisors' trees and in the PostgreSQL postmaster's tree (background "
            "writers and autovacuum included, the sampler's backend excluded), over the window, per run completed. "
            f"{s.scale_reps} repetition(s); median (min–max)."
        ),
    )
    table = Table(["supervisors × --procs", "runs/s", "empty claims", "claim statements per run",
                   "Python CPU µs/run (parents / children)", "PostgreSQL CPU µs/run", "CPU busy (of all cores)",
                   "ungranted locks, mean (max)", "active backends, mean"])
    for key in configurations(ctx):
        def cell(name: str, digits: int = 0) -> str:
            return out.get((name, key), Series()).cell(digits)
        parents = _median(out, "py_parent_us", key)
        children = _median(out, "py_children_us", key)
        table.add(f"{key[0]} × {key[1]}", cell("runs_per_s"), cell("empty_claims"), cell("claims_per_run", 2),
                  f"{cell('py_us')} ({fmt(parents)} / {fmt(children)})", cell("pg_us"),
                  f"{(_median(out, 'cpu_util', key) or 0) * 100:.0f} %",
                  f"{fmt(_median(out, 'lock_waits_mean', key), 2)} ({fmt(_median(out, 'lock_waits_max', key))})",
                  cell("active_mean", 2))
    section.tables.append(table)
    events = sorted(out.get("events", set()))
    if events:
        waits = Table(["wait event (share of samples, mean backends)"] + [f"{a} × {b}" for a, b in configurations(ctx)],
                      caption="What the active backends were doing when sampled (mean number of backends per sample; "
                              "`CPU` = active, no wait event):")
        for event in events:
            waits.add(event.removeprefix("event:"),
                      *[fmt(_median(out, event, key), 2) for key in configurations(ctx)])
        section.tables.append(waits)
    m = model(ctx)
    if m:
        section.notes.append(
            f"Model, from the 1 × 2 row: a run costs {m['py_us']:.0f} µs of Python CPU "
            f"(of which {m['parent_us']:.0f} µs in the parent) and {m['pg_us']:.0f} µs of PostgreSQL CPU, "
            f"{m['cost_us']:.0f} µs in all. On {m['cores']:.0f} cores the CPU-bound ceiling is "
            f"{m['cores']:.0f} × 10⁶ / {m['cost_us']:.0f} = {m['cpu_ceiling']:,.0f} runs/s (measured "
            f"{m['measured']:,.0f}); one supervisor's parent caps it at 10⁶ / {m['parent_us']:.0f} = "
            f"{m['parent_ceiling']:,.0f} runs/s whatever the cores. On N cores: runs/s ≈ min(N × "
            f"{1e6 / m['cost_us']:,.0f}, supervisors × {m['parent_ceiling']:,.0f}, the WAL flush rate ÷ 3), "
            "while the per-run costs stay flat (see the rows above for how they move with contention).")
    return section


def chart_series(ctx: Context) -> list[ChartSeries]:
    out = ctx.results.get("case8", {})
    points, ranges = [], {}
    for supervisors in ctx.settings.scale_supervisors:
        series = out.get(("runs_per_s", (supervisors, 2)))
        if series:
            points.append((float(supervisors), series.median))
            ranges[float(supervisors)] = (series.low, series.high)
    single = out.get(("runs_per_s", (1, ctx.settings.scale_single_procs)))
    result = [ChartSeries("runs/s, N supervisors × --procs 2", points, ranges)]  # type: ignore[arg-type]
    if single:
        result.append(ChartSeries(f"runs/s, 1 supervisor × --procs {ctx.settings.scale_single_procs} (at x = 1)",
                                  [(1.0, single.median)], {1.0: (single.low, single.high)}))  # type: ignore[arg-type]
    m = model(ctx)
    if m:
        xs = [float(x) for x in ctx.settings.scale_supervisors]
        result.append(ChartSeries("model: CPU-bound ceiling on this machine", [(x, m["cpu_ceiling"]) for x in xs]))
    return result
