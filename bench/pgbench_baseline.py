"""Case 1, the physical limit: ``pgbench`` committing a one-row INSERT per
transaction, at 1 client and at N clients (N = each ``--procs`` of case 2),
against the same server and database settings as everything else.

Repetitions are interleaved with case 2's (see ``throughput``), so
each everystep measurement has a pgbench measurement taken moments before
it under the same machine conditions.
"""

from __future__ import annotations

import re
import subprocess

import psycopg

from .context import Context
from .fleet import postmaster_pid, sampled_cpu
from .procs import BenchError
from .report import Section, Table
from .stats import Series

SCRIPT = "INSERT INTO bench_insert (payload) VALUES ('x');\n"
TABLE_DDL = "CREATE TABLE IF NOT EXISTS bench_insert (id bigserial PRIMARY KEY, payload text NOT NULL)"


def prepare(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TABLE_DDL)


def measure(ctx: Context, url: str, clients: int, seconds: float) -> float:
    """One pgbench run; returns commits per second (without connection time)."""
    if ctx.pgbench is None:
        raise BenchError("pgbench not found on PATH or under /usr/lib/postgresql/*/bin")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE bench_insert")
    script = ctx.work.path / "pgbench_insert.sql"
    script.write_text(SCRIPT)
    cmd = [ctx.pgbench, "-n", "-f", str(script), "-c", str(clients), "-j", str(clients),
           "-T", str(max(1, int(round(seconds)))), url]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, check=False)
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", result.stdout)
    if result.returncode != 0 or not match:
        raise BenchError(f"pgbench failed ({result.returncode}): {(result.stderr or result.stdout).strip()[-500:]}")
    return float(match.group(1))


def measure_with_server_cpu(ctx: Context, url: str, clients: int, seconds: float) -> tuple[float, float]:
    """One pgbench run, plus the server's CPU per committed transaction (µs):
    the PostgreSQL process tree sampled every 50 ms while pgbench runs, since
    pgbench's backends exit with it and take their CPU times along."""
    with sampled_cpu([("postgres", postmaster_pid(url))]) as used:
        tps = measure(ctx, url, clients, seconds)
    with psycopg.connect(url, autocommit=True) as conn:
        committed = int(conn.execute("SELECT count(*) FROM bench_insert").fetchone()[0])
    cpu = used.get("postgres", 0.0)
    return tps, (cpu / committed * 1e6 if committed else float("nan"))


def section(ctx: Context) -> Section:
    results: dict[int, Series] = ctx.results.get("pgbench", {})
    s = ctx.settings
    section = Section(
        "case1", "Case 1 — physical limit: pgbench, one-row INSERT per transaction",
        method=(
            f"`pgbench -n -f insert.sql -c N -j N -T {s.pgbench_seconds:g}` where insert.sql is "
            "`INSERT INTO bench_insert (payload) VALUES ('x');` (one row, one commit per transaction), "
            "in its own database on the benchmark server. Commits/s is pgbench's "
            "\"tps (without initial connection time)\". "
            f"{s.reps} repetitions, interleaved with case 2's, so each everystep measurement has a "
            "pgbench measurement taken just before it."
        ),
    )
    table = Table(["clients", "commits/s median (min–max)", "repetitions"])
    for clients in sorted(results):
        table.add(clients, results[clients].cell(0), len(results[clients].values))
    if not results:
        table.add("—", "not measured: " + ctx.errors.get("pgbench", "pgbench unavailable"), 0)
    section.tables.append(table)
    return section
