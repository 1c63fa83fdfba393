"""Case 10, profile: where the time of one 3-step run goes at ``--procs 2``.

Two windows of the same work (one supervisor, ``--procs 2``, case 2's
3-step workflow, runs COPYed in and woken by one NOTIFY), on a database
where pg_stat_statements tracks top-level statements:

1. *accounting*: nothing attached. CPU seconds per process tree (psutil),
   per-statement server time and calls (pg_stat_statements, reset just
   before), wait events sampled every 50 ms. Repeated ``profile_windows``
   times on the same supervisor, pgbench at 2 clients before the first and
   after each: every window's CPU bars are read against the pgbench runs on
   either side of it, and the bars report the median and min–max over the
   windows; the tables read the windows together.
2. *levers*: the child's write path alone, in the forms the levers of
   issue 18 would give it (``bench.levers``);
3. *sampling*: the same work with ``py-spy record --subprocesses --nonblocking --gil``
   attached to the supervisor (parent and children), which slows it; only
   the *shares* of Python CPU by component are taken from this window and
   applied to the CPU measured in the accounting windows. ``--gil`` keeps
   the samples of threads holding the GIL: without it a thread waiting in
   libpq for a reply is sampled as if it ran, and the store's path looked
   like half the children's CPU when it was their wait.

A top-level statement is one round trip (nothing is pipelined today), so
the calls per run are the round trips per run.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path

import psycopg

from . import bulk, esdb, fleet, levers, pgbench_baseline, procs, throughput
from .context import Context
from .report import Section, Table
from .stats import Series, fmt

RUN_NAME = "bench.workloads.noop3"
PY_SPY_RATE = 250
#: Case 2's target: step commits/s at --procs 2 against pgbench at 2 clients.
BAR_SHARE = 0.40
BAR_CLIENTS = 2
STEPS_PER_RUN = throughput.STEPS_PER_RUN

#: Python components, by the file of the innermost frame (self time).
CATEGORIES = (
    ("psycopg (client side of each statement)", re.compile(r"psycopg")),
    ("JSON and tagged serde", re.compile(r"(^|/)json/|everystep/serde")),
    ("replay engine (runner, context, api)", re.compile(r"everystep/(runner|context|api|registry|observer)")),
    ("store (SQL parameters, row mapping, pool)", re.compile(r"everystep/store")),
    ("metrics and tracing hooks", re.compile(r"prometheus_client|everystep/(metrics|traces|telemetry|sentry)")),
    ("child: channel, step board, loop", re.compile(r"supervisor/(child|stepboard|protocol)")),
    ("parent: arbiter loop, dispatch, children", re.compile(r"supervisor/")),
    ("selectors, sockets, os", re.compile(r"(^|/)(selectors|socket|os|subprocess)\.py")),
    ("logging", re.compile(r"(^|/)logging/")),
)
OTHER = "other (stdlib, dataclasses, uuid, datetime…)"


def _work(url: str, runs: int) -> None:
    bulk.load_scheduled(url, runs, RUN_NAME, notify=True)


def _statements(url: str) -> list[tuple[str, int, float, float]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [(str(q), int(c), float(t), float(p)) for q, c, t, p in conn.execute(
            "SELECT query, calls, total_exec_time, total_plan_time FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND query NOT ILIKE '%%pg_stat%%' AND query NOT ILIKE 'COPY%%' AND query NOT ILIKE '%%pg_notify(%%$1)%%'"
            " ORDER BY total_exec_time DESC")]


def _reset_statements(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def _category(frame: str) -> str:
    match = re.search(r"\(([^()]*):\d+\)$", frame)
    path = match.group(1) if match else frame
    for name, pattern in CATEGORIES:
        if pattern.search(path):
            return name
    return OTHER


def parse_raw(path: Path, parent_pid: int) -> dict[str, collections.Counter[str]]:
    """py-spy raw output → samples by role (parent / children) and category."""
    roles: dict[str, collections.Counter[str]] = {"parent": collections.Counter(),
                                                   "children": collections.Counter()}
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        pids = [int(m.group(1)) for m in (re.match(r"process (\d+):", f) for f in frames) if m]
        calls = [f for f in frames if not f.startswith("process ")]
        if not calls:
            continue
        role = "parent" if pids and pids[-1] == parent_pid else "children"
        roles[role][_category(calls[-1])] += int(count)
    return roles


def run(ctx: Context) -> None:
    s = ctx.settings
    url = ctx.urls["profile"]
    out = ctx.results.setdefault("case10", {})
    # The accounting windows, each bracketed by pgbench at 2 clients (the bar's
    # denominator, whose disk may change pace within minutes).
    esdb.reset(url)
    pgbench_baseline.prepare(ctx.urls["pgbench"])
    out["pgbench"] = [_pgbench(ctx)]
    group = fleet.Fleet(ctx, url, 1, 2, label="profile", extra=("--poll", "600")).start()
    windows = out["windows"] = []
    try:
        _reset_statements(url)
        for _ in range(s.profile_windows):
            windows.append(fleet.measure_window(group, url, s.profile_runs, lambda: _work(url, s.profile_runs),
                                                timeout=120 + s.profile_runs * 0.5))
            out["pgbench"].append(_pgbench(ctx))  # the supervisor idle, waiting for a NOTIFY
    finally:
        group.stop()
    window = out["window"] = together(windows)
    out["statements"] = _statements(url)
    ctx.log(f"case 10: {window.rate['runs_per_s']:,.0f} runs/s; CPU/run parent {window.per_run_us('python:parent'):.0f} µs, "
            f"children {window.per_run_us('python:children'):.0f} µs, PostgreSQL {window.per_run_us('postgres'):.0f} µs")
    # The child's write path in the forms the levers would give it.
    for key, lever_url in (("durable", url), ("async", ctx.urls["es_async"])):
        measured = out.setdefault("levers", {})[key] = levers.measure(lever_url, s.lever_runs)
        med = levers.medians(measured["wall"])
        ctx.log(f"case 10: write path per run ({key}): "
                + ", ".join(f"{form} {value:.0f} µs" for form, value in med.items()))
        ratio = levers.cpu_ratio(measured["cpu"])
        if ratio is not None:
            ctx.log(f"case 10: client CPU per run ({key}), RawCursor against the private path: {ratio * 100:+.0f} %")
    # Window 2: sampling with py-spy.
    spy = shutil.which("py-spy")
    if spy is None:
        out["spy_error"] = "py-spy is not installed (it is in the bench extra)"
        return
    esdb.reset(url)
    group = fleet.Fleet(ctx, url, 1, 2, label="profile-spy", extra=("--poll", "600")).start()
    raw = ctx.work.path / "py-spy.txt"
    log = ctx.work.log("py-spy")
    try:
        with open(log, "wb") as handle:
            sampler = subprocess.Popen([spy, "record", "--pid", str(group.pids[0]), "--subprocesses",
                                        "--nonblocking", "--gil", "--rate", str(PY_SPY_RATE), "--format", "raw",
                                        "-o", str(raw)], stdout=handle, stderr=subprocess.STDOUT)
            time.sleep(1.0)  # let py-spy attach to every process
            before = group.counts().get("completed", 0)
            _work(url, s.profile_runs)
            group.wait_completed(before + s.profile_runs, timeout=120 + s.profile_runs)
            sampler.send_signal(signal.SIGINT)
            sampler.wait(timeout=60)
    finally:
        group.stop()
    if not raw.exists():
        out["spy_error"] = f"py-spy wrote nothing: {procs.tail(log, 3)}"
        return
    out["spy"] = parse_raw(raw, group.pids[0])


def _pgbench(ctx: Context) -> tuple[float, float]:
    tps, cpu_us = pgbench_baseline.measure_with_server_cpu(ctx, ctx.urls["pgbench"], BAR_CLIENTS,
                                                        ctx.settings.pgbench_seconds)
    ctx.log(f"case 10: pgbench -c {BAR_CLIENTS}: {tps:,.0f} tps, server CPU {cpu_us:.0f} µs per transaction")
    return tps, cpu_us


def budget_table(pgbench: list[tuple[float, float]], window: fleet.Window, round_trips: float | None,
                 cores: int) -> tuple[Table, float]:
    """Case 2's bar read as CPU: at the pgbench rate measured around window
    1, how much CPU per run the cores allow, against what a run took. Returns
    the table and the ceiling (step commits/s with every core busy at the
    measured CPU per run, as a share of pgbench). ``round_trips`` per run
    come from pg_stat_statements; without them that row is left out."""
    tps = statistics.mean(rate for rate, _ in pgbench)
    runs_needed = BAR_SHARE * tps / STEPS_PER_RUN
    allowed = cores * 1e6 / runs_needed
    total = window.per_run_us("python") + window.per_run_us("postgres")
    server = window.per_run_us("postgres")
    ceiling = throughput.ceiling(total, tps, cores) if total else float("nan")
    pgbench_tx = statistics.mean(cpu for _, cpu in pgbench)
    table = Table(["the 40 % bar as CPU (--procs 2)", "value"],
                  caption=f"Case 2's bar read as a CPU budget on this machine's {cores} cores, at the pgbench rate "
                          "measured around the accounting windows:")
    table.add(f"pgbench at {BAR_CLIENTS} clients, before the first window and after each, commits/s",
              " / ".join(fmt(rate) for rate, _ in pgbench))
    table.add("the bar: 40 % of their mean, step commits/s (runs/s at 3 steps)",
              f"{fmt(BAR_SHARE * tps)} ({fmt(runs_needed)})")
    table.add(f"CPU per run the {cores} cores allow at that rate", f"{fmt(allowed)} µs")
    table.add("CPU per run measured in the windows, all processes", f"{fmt(total)} µs ({total / allowed * 100:.0f} % of it)")
    table.add("of which PostgreSQL alone", f"{fmt(server)} µs ({server / allowed * 100:.0f} % of it)")
    table.add("server CPU per pgbench transaction (one-row INSERT and its commit)", f"{fmt(pgbench_tx)} µs")
    if round_trips is not None:
        table.add(f"a run's {round_trips:.1f} round trips at that price", f"{fmt(pgbench_tx * round_trips)} µs")
    table.add("ceiling: step commits/s with every core busy at the measured CPU per run, share of pgbench",
              f"{ceiling * 100:.0f} %")
    return table, ceiling


#: Issue bars on CPU per 3-step run, in units of pgbench's server CPU per
#: transaction (a one-row INSERT and its commit): machine-independent.
ALL_CPU_BAR = 16.0
SERVER_CPU_BAR = 8.0


def together(windows: list[fleet.Window]) -> fleet.Window:
    """Several windows of the same work read as one: runs, seconds and CPU
    summed, wait samples and the rate averaged."""
    cpu: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for window in windows:
        cpu.update(window.cpu)
        counts.update(window.counts)

    def mean_of(key: str, field: str) -> float:
        return statistics.mean(getattr(window, field).get(key, 0.0) for window in windows)

    waits = {key: mean_of(key, "waits") for key in {k for window in windows for k in window.waits}}
    rate = {key: mean_of(key, "rate") for key in {k for window in windows for k in window.rate}}
    return fleet.Window(runs=sum(window.runs for window in windows), seconds=sum(window.seconds for window in windows),
                        cpu=dict(cpu), counts=dict(counts), waits=waits, rate=rate)


def cpu_ratios(pgbench: list[tuple[float, float]], windows: list[fleet.Window]) -> tuple[Series, Series]:
    """All CPU, and PostgreSQL's, per run of each window over the server CPU
    of one pgbench transaction measured just before and just after it."""
    total, server = Series(), Series()
    for index, window in enumerate(windows):
        around = [cpu for _, cpu in pgbench[index:index + 2] if cpu]
        if not around:
            continue
        pgbench_tx = statistics.mean(around)
        total.add((window.per_run_us("python") + window.per_run_us("postgres")) / pgbench_tx)
        server.add(window.per_run_us("postgres") / pgbench_tx)
    return total, server


def cpu_targets(pgbench: list[tuple[float, float]], windows: list[fleet.Window]) -> list[str]:
    """Target notes: all CPU, and PostgreSQL's, per run against the server
    CPU of one pgbench transaction, the median over the windows."""
    total, server = cpu_ratios(pgbench, windows)
    if not total:
        return []
    return [
        f"Target (all CPU per 3-step run ÷ pgbench's server CPU per transaction ≤ {ALL_CPU_BAR:g}): "
        f"**{'met' if total.median <= ALL_CPU_BAR else 'missed'}** ({_span(total)}).",
        f"Target (PostgreSQL's CPU per run ÷ pgbench's server CPU per transaction ≤ {SERVER_CPU_BAR:g}): "
        f"**{'met' if server.median <= SERVER_CPU_BAR else 'missed'}** ({_span(server)}).",
    ]


def _span(series: Series) -> str:
    if len(series.values) == 1:
        return f"{series.median:.1f}, 1 window"
    return f"{series.median:.1f}, {series.low:.1f}–{series.high:.1f} over {len(series.values)} windows"


def _short(query: str) -> str:
    text = " ".join(query.split())
    for name, needle in (("claim (everystep_claim function)", "everystep_claim("),
                         ("finish_run_with_step (last step's record and the terminal status, one statement)",
                          "WITH owned AS"),
                         ("record_step (INSERT … ON CONFLICT, ownership check)", "INSERT INTO everystep_step"),
                         ("finish_run (UPDATE, async commit)", "SET status = $1, result"),
                         ("claim_own (reconciliation every 5 s)", "claimed_by = $1 AND name = ANY"),
                         ("get_steps (outcomes of a replayed run)", "FROM everystep_step WHERE workflow_id"),
                         ("heartbeat", "UPDATE everystep_runner"),
                         ("recover_expired (lease sweep)", "WITH dead AS")):
        if needle in text:
            return name
    return "`" + (text[:70] + "…" if len(text) > 70 else text) + "`"


def section(ctx: Context) -> Section:
    s = ctx.settings
    out = ctx.results.get("case10", {})
    section = Section(
        "case10", f"Case 10 — profile: where each 100 µs of a 3-step run goes (--procs 2, "
                  f"{s.profile_windows} × {s.profile_runs:,} runs)",
        method=(
            f"{s.profile_windows} accounting windows of the same work: one supervisor at `--procs 2` working off "
            "case 2's 3-step runs (COPYed in, woken by one NOTIFY), pgbench at 2 clients before the first window and "
            "after each. Nothing is attached to them: psutil CPU per process tree, `pg_stat_statements` (top-level "
            "statements, reset before the first) and wait events; the tables read the windows together, and each "
            "CPU bar is read per window, against the pgbench runs on either side of it. A last window repeats the "
            f"work with `py-spy record --subprocesses --nonblocking --gil --rate {PY_SPY_RATE}` attached; only the "
            "shares of Python samples holding the GIL by component (innermost frame's file) are used, scaled to the "
            "accounting windows' CPU. Every top-level statement is one round trip. See "
            "docs/explanation/performance.md for the reading of these tables."
        ),
    )
    window = out.get("window")
    if window is None:
        return section
    runs = window.runs
    rate = window.rate["runs_per_s"]
    cpu = Table(["per run", "µs", "share of the wall time between completions"],
                caption=f"CPU per run (the accounting windows: {rate:,.0f} runs/s, so {1e6 / rate:,.0f} µs of wall time per run "
                        f"and {2e6 / rate:,.0f} µs of the 2 cores):")
    wall = 1e6 / rate if rate else float("nan")
    for label, key in (("Python, supervisor parent", "python:parent"), ("Python, 2 children", "python:children"),
                       ("PostgreSQL backends and background processes", "postgres")):
        value = window.per_run_us(key)
        cpu.add(label, fmt(value), f"{value / wall * 100:.0f} %")
    total = window.per_run_us("python") + window.per_run_us("postgres")
    cpu.add("**all CPU**", fmt(total), f"{total / wall * 100:.0f} % (of 200 % available)")
    section.tables.append(cpu)
    statements = out.get("statements", [])
    round_trips: float | None = None
    if statements:
        table = Table(["statement", "calls per run", "server µs per call", "server µs per run"],
                      caption="Server time per statement (pg_stat_statements execution time; planning is not tracked, and the commit's "
                              "WAL flush is not in it):")
        round_trips = 0.0
        server = 0.0
        for query, calls, exec_ms, plan_ms in statements:
            per_run = calls / runs
            if per_run < 0.001:
                continue
            round_trips += per_run
            us_per_run = (exec_ms + plan_ms) * 1000 / runs
            server += us_per_run
            table.add(_short(query), fmt(per_run, 2), fmt((exec_ms + plan_ms) * 1000 / max(calls, 1), 1),
                      fmt(us_per_run, 1))
        table.add("**all statements**", fmt(round_trips, 2), "", fmt(server, 1))
        section.tables.append(table)
        section.notes.append(f"Round trips per run: {round_trips:.2f} (top-level statements; the claim's "
                             f"round trip is shared by the runs it claims).")
    pgbench = out.get("pgbench")
    if pgbench:
        table, ceiling = budget_table(pgbench, window, round_trips, os.cpu_count() or 1)
        section.tables.append(table)
        section.notes.append(
            f"With every core busy at the CPU per run measured here, case 2's bar could reach at most "
            f"{ceiling * 100:.0f} % of pgbench on this machine; the 40 % bar is "
            + ("within that ceiling, so what is left is waiting (commit flushes, hand-offs), not CPU."
               if ceiling >= BAR_SHARE else
               "beyond it: it needs less CPU per run, not less waiting."))
        section.notes += cpu_targets(pgbench, out.get("windows") or [window])
    waits = {k.removeprefix("event:"): v for k, v in window.waits.items() if k.startswith("event:")}
    if waits:
        table = Table(["wait event of active backends", "mean backends per sample"],
                      caption="What the database's active backends were doing (sampled every 50 ms):")
        for event, value in sorted(waits.items(), key=lambda item: -item[1]):
            table.add(event, fmt(value, 2))
        section.tables.append(table)
    lever_results = out.get("levers")
    if lever_results:
        table = Table(["form of the write path (3 step records + terminal status)",
                       "durable: µs per run, median (p25–p75)", "vs the first row",
                       "synchronous_commit = off: µs per run", "vs the first row",
                       "client CPU µs per run (synchronous_commit = off)"],
                      caption="The write path of one run replayed in the forms the levers would give it "
                              "(`bench/levers.py`: the engine's own statements, each form on its own connection, "
                              f"the forms taking turns run by run, {s.lever_runs} runs each):")
        first = {key: levers.medians(values["wall"]).get(levers.BEFORE_FOLD)
                 for key, values in lever_results.items()}
        for form in levers.FORMS:
            cells: list[str] = [form]
            for key in ("durable", "async"):
                values = lever_results.get(key, {}).get("wall", {}).get(form, [])
                if len(values) < 2:
                    cells += ["n/a", "n/a"]
                    continue
                q1, q2, q3 = levers.quartiles(values)
                base = first.get(key)
                cells += [f"{q2:,.0f} ({q1:,.0f}–{q3:,.0f})",
                          f"{(q2 / base - 1) * 100:+.0f} %" if base else "n/a"]
            cpu = lever_results.get("async", {}).get("cpu", {}).get(form, [])
            cells.append(f"{statistics.median(cpu):,.0f}" if cpu else "n/a")
            table.add(*cells)
        section.tables.append(table)
        ratio = levers.cpu_ratio(lever_results.get("async", {}).get("cpu", {}))
        if ratio is not None:
            verdict = ("within" if ratio <= levers.KEEP_PRIVATE_ABOVE else "beyond")
            section.notes.append(
                f"psycopg's public RawCursor with prepare=True takes {ratio * 100:+.0f} % of the client CPU per "
                f"run of the engine's own path past the cursor: {verdict} the "
                f"{levers.KEEP_PRIVATE_ABOVE * 100:.0f} % that would retire the private path.")
    spy = out.get("spy")
    if spy:
        table = Table(["Python component (innermost frame)", "parent µs/run", "children µs/run"],
                      caption="Python CPU per run by component (shares of the py-spy samples holding the GIL × "
                              "the accounting windows' CPU per run):")
        parent_total = sum(spy["parent"].values()) or 1
        children_total = sum(spy["children"].values()) or 1
        names = [name for name, _ in CATEGORIES] + [OTHER]
        for name in names:
            p = spy["parent"].get(name, 0) / parent_total * window.per_run_us("python:parent")
            c = spy["children"].get(name, 0) / children_total * window.per_run_us("python:children")
            if p >= 0.5 or c >= 0.5:
                table.add(name, fmt(p), fmt(c))
        section.tables.append(table)
    elif out.get("spy_error"):
        section.notes.append(f"Python breakdown not measured: {out['spy_error']}.")
    return section
