"""Case 16, behind a pooler: case 2's shape through PgBouncer in transaction
mode, beside the direct connection, in the same run.

A PgBouncer (Debian's ``pgbouncer``, stock settings but for the port and
trust authentication: ``tests.support.pgbouncer``) is started in front of
the bench server. Each repetition works off the same burst of ``noop3``
runs with ``everystep-supervisor --procs 2 --burst`` twice, the order
alternating: once on the direct URL, once through PgBouncer with
``?pooler=transaction`` (no prepared statements, the step records called
as their PL/pgSQL functions, the parent's statement timeout inside each
transaction, polling instead of LISTEN). Runs/s over
the database-stamped window as in case 2; CPU per run of every process
involved (the supervisor's tree, the PostgreSQL server's and, through the
pooler, PgBouncer's), less what an empty burst costs on that side. The bar:
runs/s through the pooler at least 0.8x direct, the median of the ratios
taken within each repetition. Beside it, direct's CPU per run over the
pooler's, each repetition's: what the runs/s ratio would be were the CPU
the only limit (at ``--procs 2`` each statement's latency is one too), a
ratio that other work on the machine does not pull towards 1.
"""

from __future__ import annotations

import time

from . import esdb, fleet, procs
from .throughput import children_cpu
from .context import Context
from .report import Section, Table
from .stats import Series, fmt_span
from .workloads import noop3, payload

PROCS = 2
TARGET = 0.8
SIDES = ("direct", "pgbouncer")


def burst(ctx: Context, direct: str, runner_url: str, runs: int, roots: list[tuple[str, int | None]],
          label: str) -> tuple[float, dict[str, float]]:
    """One ``--burst`` on ``runner_url`` over ``runs`` fresh runs: (runs/s,
    CPU seconds of the supervisor's tree and of each of ``roots``)."""
    esdb.reset(direct)
    if runs:
        esdb.schedule_many(direct, noop3, ((payload(i),) for i in range(runs)))
    cmd = procs.supervisor_cmd(runner_url, PROCS, ctx.work.socket(), app="bench.workloads")
    with fleet.sampled_cpu(roots) as servers, children_cpu() as supervisor:
        procs.run(cmd, ctx.work.log(f"supervisor-{label}"), timeout=60 + runs * 0.5)
    # The sampler also splits each tree (``postgres:children``): the trees' totals only.
    cpu = {"supervisor": supervisor.get("seconds", 0.0),
           **{label: seconds for label, seconds in servers.items() if ":" not in label}}
    if not runs:
        return 0.0, cpu
    result = esdb.span(direct)
    esdb.expect_all_completed(result, runs, f"supervisor --procs {PROCS} ({label})")
    return result.runs_per_second, cpu


def run(ctx: Context) -> None:
    from tests.support.pgbouncer import start_pgbouncer

    s = ctx.settings
    out = ctx.results.setdefault("case16", {})
    bouncer = start_pgbouncer(ctx.server.admin_url, "transaction")
    if bouncer is None:
        out["missing"] = "pgbouncer is not installed (apt-get install pgbouncer)"
        return
    direct = ctx.urls["es"]
    try:
        urls = {"direct": direct, "pgbouncer": bouncer.url_for(direct)}
        postgres = ("postgres", fleet.postmaster_pid(direct))
        assert bouncer.process is not None
        roots = {"direct": [postgres], "pgbouncer": [postgres, ("pgbouncer", bouncer.process.pid)]}
        empty = {side: burst(ctx, direct, urls[side], 0, roots[side], f"{side}-empty")[1] for side in SIDES}
        for rep in range(s.reps):
            measured = {}
            cpu_measured = {}
            for side in SIDES if rep % 2 == 0 else reversed(SIDES):
                rate, cpu = burst(ctx, direct, urls[side], s.throughput_runs, roots[side], f"{side}-{rep}")
                per_run = {part: max(seconds - empty[side].get(part, 0.0), 0.0) / s.throughput_runs * 1e6
                           for part, seconds in cpu.items()}
                cpu_per_run = sum(per_run.values())
                out.setdefault(("runs_per_s", side), Series()).add(rate)
                out.setdefault(("cpu_per_run_us", side), Series()).add(cpu_per_run)
                for part, value in per_run.items():
                    out.setdefault((f"cpu_{part}_us", side), Series()).add(value)
                measured[side] = rate
                cpu_measured[side] = cpu_per_run
                parts = ", ".join(f"{part} {value:,.0f}" for part, value in per_run.items())
                ctx.log(f"case 16 rep {rep + 1}: {side}: {rate:,.0f} runs/s, {cpu_per_run:,.0f} µs CPU per run "
                        f"({parts})")
            out.setdefault("ratio", Series()).add(measured["pgbouncer"] / measured["direct"])
            if cpu_measured["pgbouncer"] > 0:
                out.setdefault("cpu_ratio", Series()).add(cpu_measured["direct"] / cpu_measured["pgbouncer"])
            time.sleep(0.2)
    finally:
        bouncer.close()


def section(ctx: Context) -> Section:
    s = ctx.settings
    out = ctx.results.get("case16", {})
    section = Section(
        "case16", f"Case 16 — behind a pooler: case 2 through PgBouncer, transaction mode (--procs {PROCS})",
        method=(
            f"PgBouncer (stock settings but for its port and trust authentication) in `pool_mode = transaction` "
            f"in front of the same server. Each repetition works off {s.throughput_runs:,} `noop3` runs with "
            f"`everystep-supervisor --procs {PROCS} --burst` twice, the order alternating: on the direct URL, and "
            "through PgBouncer with `?pooler=transaction` (no prepared statements, the step records called as "
            "their PL/pgSQL functions, the parent's statement timeout set inside each transaction, pickup by "
            "polling). Runs/s over the database-stamped window; "
            "CPU per run of the supervisor's tree, the PostgreSQL server and (through the pooler) PgBouncer, less "
            f"an empty burst's on that side; the ratio is taken within each repetition ({s.reps} repetitions). "
            "Direct's CPU per run over the pooler's is what the runs/s ratio would be were the CPU the only "
            f"limit (at --procs {PROCS} each statement's latency is one too); other work on the machine pulls "
            "the runs/s ratio towards 1, not that one."
        ),
    )
    if "missing" in out:
        section.notes.append(f"Not measured: {out['missing']}.")
        return section
    ratio = out.get("ratio")
    if not ratio:
        return section
    table = Table(["connection", "runs/s, median (min–max)", "CPU per run, all processes, µs",
                   "of which the supervisor's tree", "PostgreSQL", "PgBouncer"])
    for side in SIDES:
        table.add(side if side == "direct" else "through PgBouncer (?pooler=transaction)",
                  out[("runs_per_s", side)].cell(0), out[("cpu_per_run_us", side)].cell(0),
                  *(out.get((f"cpu_{part}_us", side), Series()).cell(0) if (f"cpu_{part}_us", side) in out else "—"
                    for part in ("supervisor", "postgres", "pgbouncer")))
    table.add("ratio, through PgBouncer / direct", ratio.cell(3), "", "", "", "")
    if out.get("cpu_ratio"):
        # What the runs/s ratio would be were the processes' CPU the only
        # limit: a machine busy with other work pulls the runs/s ratio
        # towards 1, not this one.
        table.add("CPU per run, direct / through PgBouncer", "", out["cpu_ratio"].cell(3), "", "", "")
    section.tables.append(table)
    verdict = "met" if ratio.median is not None and ratio.median >= TARGET else "missed"
    section.notes.append(f"Target (through PgBouncer in transaction mode ≥ {TARGET:g}× direct, runs/s at --procs "
                         f"{PROCS}): **{verdict}** ({fmt_span(ratio)}).")
    return section
