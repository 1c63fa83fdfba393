"""Run every case against one PostgreSQL server and write the report.

Each case is a module named by what it measures (``throughput``,
``pickup_latency``, ...); ``CASES`` gives each its number, the section id
of the report (``## Case 2 — throughput``) and what ``--only`` takes.
Order: cases 1 and 2 together (their repetitions interleave), then 3 to
20, then cases 2 and 4 on MariaDB against a MariaDB baseline
(``bench.on_mariadb``; ``--only mariadb`` runs just those). Case 9 prunes
the history case 7 leaves in the shared scale database. A case that fails
is reported as not measured, with its error; the others still run. The
exit status is 1 if an everystep case failed (a peer that is missing or
fails does not count), 0 otherwise.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from . import (async_io, child_memory, cpu_scaling, debounce_rate, esdb, flow_control, history_depth,
               no_regression, on_mariadb, overheads, peers, pg, pgbench_baseline, pickup_latency, pooler,
               resume_cost, retention, run_profile, scale_out, stream_latency, throughput, transactional_steps,
               wait_latency)
from .context import Context, Settings
from .procs import Workdir
from .report import ChartSeries, Section, failed_section, write_chart

DEFAULT_OUT = Path(__file__).resolve().parent / "out"

CASES: list[tuple[str, str, Callable[[Context], None] | None, Callable[[Context], Section]]] = [
    ("case1", "Case 1 — physical limit: pgbench", None, pgbench_baseline.section),
    ("case2", "Case 2 — throughput", throughput.run, throughput.section),
    ("case3", "Case 3 — CPU scaling", cpu_scaling.run, cpu_scaling.section),
    ("case4", "Case 4 — pickup latency", pickup_latency.run, pickup_latency.section),
    ("case5", "Case 5 — peers", peers.run, peers.section),
    ("case6", "Case 6 — overheads", overheads.run, overheads.section),
    ("case7", "Case 7 — depth and history", history_depth.run, history_depth.section),
    ("case8", "Case 8 — scale-out", scale_out.run, scale_out.section),
    ("case9", "Case 9 — retention", retention.run, retention.section),
    ("case10", "Case 10 — profile", run_profile.run, run_profile.section),
    ("case11", "Case 11 — queues", flow_control.run, flow_control.section),
    ("case12", "Case 12 — waits", wait_latency.run, wait_latency.section),
    ("case13", "Case 13 — transactional steps", transactional_steps.run, transactional_steps.section),
    ("case14", "Case 14 — async I/O", async_io.run, async_io.section),
    ("case15", "Case 15 — no regression", no_regression.run, no_regression.section),
    ("case16", "Case 16 — behind a pooler", pooler.run, pooler.section),
    ("case17", "Case 17 — a big app in every child", child_memory.run, child_memory.section),
    ("case18", "Case 18 — resume cost per recorded step", resume_cost.run, resume_cost.section),
    ("case19", "Case 19 — streams", stream_latency.run, stream_latency.section),
    ("case20", "Case 20 — debounced scheduling", debounce_rate.run, debounce_rate.section),
    ("mariadb", "MariaDB — cases 2 and 4", on_mariadb.run, on_mariadb.section),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark everystep against the database's limit, DBOS, Procrastinate and threads.",
    )
    parser.add_argument("--quick", action="store_true",
                        help="fewer runs and repetitions (a few minutes); same cases")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest sizes that run every case and write every table; its figures mean "
                             "nothing (the test suite's check of the harness)")
    parser.add_argument("--database", metavar="URL",
                        help="an existing PostgreSQL server (its URL; databases are created on it and dropped); "
                             "default: $EVERYSTEP_BENCH_DATABASE_URL, else a throwaway local cluster")
    parser.add_argument("--out", metavar="DIR", type=Path, default=DEFAULT_OUT,
                        help=f"where RESULTS.md and throughput.png go (default {DEFAULT_OUT})")
    parser.add_argument("--only", metavar="N[,N]", default="",
                        help="run only these cases (e.g. 2,3, or mariadb; case 1 runs with case 2); for development")
    parser.add_argument("--keep-work", action="store_true", help="keep the work directory (logs) afterwards")
    return parser


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM ends the run through its ``finally``: the throwaway cluster
    is stopped and the work directory removed, not left behind."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    settings = Settings.for_mode(args.quick, smoke=args.smoke)
    only = {f"case{part.strip()}" if part.strip().isdigit() else part.strip()
            for part in args.only.split(",") if part.strip()}
    if "case2" in only:
        only.add("case1")
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Workdir(Path(tempfile.mkdtemp(prefix="everystep-bench-")))
    facts = pg.machine()
    started = time.monotonic()
    print(f"[bench] {settings.mode} run; work directory {work.path}", flush=True)
    server = pg.start(args.database)
    ctx = Context(settings=settings, server=server, work=work, pgbench=pg.find_tool("pgbench"))
    sections: list[Section] = []
    failed_everystep = False
    try:
        ctx.urls["es"] = server.create_database("bench_es")
        ctx.urls["es_async"] = server.create_database("bench_es_async", synchronous_commit="off")
        ctx.urls["pgbench"] = server.create_database("bench_pgbench")
        ctx.urls["pgbench_async"] = server.create_database("bench_pgbench_async", synchronous_commit="off")
        ctx.urls["dbos"] = server.create_database("bench_dbos")
        ctx.urls["procrastinate"] = server.create_database("bench_procrastinate")
        ctx.urls["scale"] = server.create_database("bench_scale")
        server.set_database(ctx.urls["scale"], "track_functions", "pl")
        ctx.urls["profile"] = server.create_database("bench_profile")
        ctx.urls["queues"] = server.create_database("bench_queues")
        ctx.urls["against_base"] = server.create_database("bench_against_base")  # each side migrates its own
        ctx.urls["against_here"] = server.create_database("bench_against_here")
        ctx.urls["memory"] = server.create_database("bench_memory")
        ctx.urls["resume"] = server.create_database("bench_resume")
        ctx.urls["debounce"] = server.create_database("bench_debounce")
        for key in ("es", "es_async", "scale", "profile", "queues", "memory"):
            esdb.migrate(ctx.urls[key])
        server.enable_statement_stats(ctx.urls["profile"])
        settings_seen = server.settings(ctx.urls["es"])
        ctx.log(f"server ready ({'throwaway cluster' if server.owned else 'existing server'}): "
                f"fsync={settings_seen['fsync']}, synchronous_commit={settings_seen['synchronous_commit']}")
        durations: dict[str, float] = {}
        for key, title, run, _render in CASES:
            if run is None or (only and key not in only):
                continue
            case_start = time.monotonic()
            try:
                ctx.log(f"{title}: start")
                run(ctx)
            except Exception:
                error = traceback.format_exc()
                ctx.errors[key] = error
                ctx.log(f"{title}: FAILED\n{error}")
                if key != "case5":
                    failed_everystep = True
            durations[key] = time.monotonic() - case_start
        for key, title, _run, render in CASES:
            if only and key not in only:
                continue
            sections.append(_render_section(ctx, key, title, render, durations.get(key, 0.0)))
        facts["load_end"] = pg.load_average()
        chart_path = out_dir / "throughput.png"
        drawer = write_chart(chart_path, "Throughput vs --procs (same PostgreSQL server)",
                             "--procs (everystep) / clients (pgbench) / worker processes (peers)",
                             "per second (log scale)", _chart(ctx))
        scaling = _scaling_charts(ctx, out_dir)
        results = out_dir / "RESULTS.md"
        results.write_text(_document(ctx, facts, settings_seen, sections, drawer, time.monotonic() - started,
                                     scaling))
        print(f"[bench] wrote {results} and {chart_path} in {time.monotonic() - started:.0f}s", flush=True)
    finally:
        server.close()
        if args.keep_work:
            print(f"[bench] work directory kept: {work.path}")
        else:
            shutil.rmtree(work.path, ignore_errors=True)
    return 1 if failed_everystep else 0


def _render_section(ctx: Context, key: str, title: str, render: Callable[[Context], Section],
                    seconds: float) -> Section:
    """The case's own section; if it failed, its partial tables plus the error."""
    try:
        section = render(ctx)
    except Exception:
        section = failed_section(key, title, traceback.format_exc())
    if key in ctx.errors:
        failed = failed_section(key, title, ctx.errors[key])
        section.tables += failed.tables
        section.notes += failed.notes
    section.seconds = seconds
    return section


TARGETS = [
    ("case2", "step commits/s at --procs 2", "Case 2: recorded step commits/s at --procs 2 ≥ 40 % of pgbench at 2 clients"),
    ("case3", "threaded worker", "Case 3: supervisor --procs 2 ≥ 1.7× the threaded worker"),
    ("case4", "with NOTIFY", "Case 4: with NOTIFY, p50 ≤ 5 ms and p99 ≤ 25 ms"),
    ("case5", "3-step shape", "Case 5: ≥ 5× DBOS runs/s on the 3-step shape"),
    ("case5", "Procrastinate", "Case 5: ≥ 2.0× Procrastinate runs/s on the 1-step shape"),
    ("case5", "CPU case", "Case 5: ≥ 1.7× DBOS on the CPU case"),
    ("case7", "finished runs, runs/s within 10 %", "Case 7: at the largest history, runs/s within 10 % of the empty database"),
    ("case10", "all CPU per 3-step run", "Case 10: all CPU per 3-step run ÷ pgbench's server CPU per transaction ≤ 16"),
    ("case10", "PostgreSQL's CPU per run", "Case 10: PostgreSQL's CPU per run ÷ pgbench's server CPU per transaction ≤ 8"),
    ("case11", "flow control present", "Case 11: runs/s with flow control present ≥ 95 % of plain at --procs 2"),
    ("case12", "send to resume", "Case 12: send to resume, p50 ≤ 5 ms and p99 ≤ 25 ms"),
    ("case15", "no regression", "Case 15: case 2 at --procs 2 ≥ 1.0× b722e5f, paired (no regression)"),
    ("case16", "through PgBouncer", "Case 16: case 2 at --procs 2 through PgBouncer (transaction mode) ≥ 0.8× direct, paired"),
    ("case17", "USS per child", "Case 17: USS per child ≤ 15 % of the app's heap at every --procs"),
    ("case17", "total PSS", "Case 17: total PSS of the tree ≤ 2× the app's heap at --procs 8"),
    ("case17", "cost per run", "Case 17: the freeze's cost per run ≤ 1 %, paired"),
    ("case18", "PostgreSQL", "Case 18: a resume's CPU per recorded step ≤ 5 µs on PostgreSQL, 1k to 100k steps"),
    ("case18", "SQLite", "Case 18: a resume's CPU per recorded step ≤ 5 µs on SQLite, 1k to 100k steps"),
    ("case19", "write to read", "Case 19: a step's stream write to a reader, p50 ≤ 5 ms and p99 ≤ 25 ms"),
    ("case19", "writes/s from one step", "Case 19: writes/s from one step ≥ 2,000"),
]
_TARGET_NOTE = re.compile(r"^Target \((?P<what>.+?)\)[^:]*: \*\*(?P<verdict>met|missed)\*\* \((?P<value>.*)\)\.$")


def _targets(sections: list[Section]) -> list[str]:
    """The issue's targets, with the verdicts the cases wrote in their notes."""
    by_key = {section.key: section for section in sections}
    lines = ["## Targets (this machine, ratios from this run)", "", "| target | result | measured |",
             "|---|---|---|"]
    for key, needle, label in TARGETS:
        verdict, value = "not measured", "—"
        for note in by_key[key].notes if key in by_key else []:
            match = _TARGET_NOTE.match(note)
            if match and needle in match.group("what"):
                verdict, value = f"**{match.group('verdict')}**", match.group("value")
        lines.append(f"| {label} | {verdict} | {value} |")
    return lines + [""]


def _chart(ctx: Context) -> list[ChartSeries]:
    return throughput.chart_series(ctx) + peers.chart_points(ctx)


def _scaling_charts(ctx: Context, out_dir: Path) -> list[str]:
    """The scaling section's charts (cases 7 and 8); returns their file names."""
    written = []
    series = scale_out.chart_series(ctx)
    if any(item.points for item in series):
        write_chart(out_dir / "scaleout.png", "Scale-out: supervisors on one PostgreSQL server (this machine)",
                    "supervisors (--procs 2 each)", "runs/s", series, log_y=False)
        written.append("scaleout.png")
    series = history_depth.chart_series(ctx)
    if any(len(item.points) > 1 for item in series):
        write_chart(out_dir / "history.png", "Throughput against finished runs in the database",
                    "finished runs (log scale; 0 drawn at 1)", "runs/s", series, log_y=False, log_x=True)
        written.append("history.png")
    return written


def _scaling_section(ctx: Context, charts: list[str]) -> list[str]:
    lines = ["## Scaling (cases 7–9)", "",
             "How cost grows with history, queue depth and the number of supervisors, and what pruning costs a "
             "working supervisor. The capacity model and the reading of these numbers are in "
             "[docs/explanation/performance.md](../docs/explanation/performance.md).", ""]
    lines += [f"![{name}]({name})" for name in charts]
    return lines + [""]


def _document(ctx: Context, facts: dict[str, str], server: dict[str, str], sections: list[Section],
              drawer: str, seconds: float, charts: list[str] | None = None) -> str:
    s = ctx.settings
    mode = {"quick": "quick (`--quick`: fewer runs and repetitions)",
            "smoke": "smoke (`--smoke`: the smallest sizes; the figures mean nothing)"}.get(s.mode, "full")
    flag = {"quick": " --quick", "smoke": " --smoke"}.get(s.mode, "")
    lines = [
        "# everystep benchmarks",
        "",
        f"Produced by `python -m bench{flag}` on {facts['date']} ({mode}); "
        f"total wall time {seconds:.0f} s. Every case ran against the same PostgreSQL server in this one "
        "invocation; tables give the median of the repetitions and the min–max in parentheses.",
        "",
        "## Machine and settings",
        "",
        f"- CPU: {facts['cpu']}, `nproc` = {facts['nproc']}; RAM {facts['ram']}; {facts['kernel']}",
        f"- Python {facts['python']}; {facts['packages']}",
        f"- PostgreSQL: {server.get('version', 'unknown')}",
        f"- everystep: git {facts['commit']}",
        f"- Load average (1/5/15 min) at start: {facts['load']}; at end: {facts.get('load_end', 'n/a')} "
        "(the machine may be shared; see the min–max spreads)",
        f"- Server: {'a throwaway cluster started by the harness' if ctx.server.owned else 'an existing server (--database)'}; "
        + ", ".join(f"`{key}={server[key]}`" for key in pg.REPORTED_SETTINGS if key in server),
        "- Durability: " + (
            "the harness starts its cluster with `fsync=on`, `synchronous_commit=on`, `full_page_writes=on` "
            "(PostgreSQL's defaults, not the `fsync=off` of the test suite's clusters)"
            if ctx.server.owned else
            "the server's own `fsync` and `full_page_writes` (quoted above)"
        ) + ", and `ALTER DATABASE … SET synchronous_commit = on` on every benchmark database (everystep, "
        "pgbench, DBOS, Procrastinate): each commit waits for its WAL flush"
        + ("" if ctx.server.owned else " (a real disk flush only if the server's `fsync` is on)")
        + ", as in production, for every system measured. The only exceptions are the labelled sensitivity rows "
        "(databases with `synchronous_commit=off`) in cases 2 and 6. SQLite (case 6) uses everystep's "
        "embedded settings: WAL, `synchronous=NORMAL`.",
        f"- Charts: `throughput.png` (cases 1, 2 and 5), `scaleout.png` and `history.png` (cases 7 and 8), drawn "
        f"with {drawer}.",
        "- pg_stat_statements is loaded by the harness's cluster but tracks statements only in case 10's database.",
        "",
    ]
    lines += _targets(sections)
    for section in sections:
        if section.key == "case7":
            lines += _scaling_section(ctx, charts or [])
        lines.append(section.markdown())
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
