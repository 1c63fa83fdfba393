"""Case 18, resume cost: what it costs a waiting run to resume, by the
length of the history it replays, under ``everystep-supervisor --procs 1``
on PostgreSQL and on SQLite.

A run of ``bench.workloads.resumer`` holds N recorded steps (0, 1,000,
10,000, 100,000; written straight into the table as its executions would
have left them), then waits in ``recv("go")``. The client sends it "go"
and takes ``time.time()`` right after ``send()`` returned; the run's next
step returns its own ``time.time()`` (latency, as case 12), then the run
waits in its next ``recv`` again, and the same run is resumed ``reps``
times. The CPU of a resume is the supervisor's child's, from before the
send to the run waiting again: every thread's time on a CPU, to the
nanosecond (``/proc/PID/task/*/schedstat``), up to the supervisor saying
the child is idle again, so it holds the claim's receipt, reading the
history, replaying it, the recv, the stamp, the next wait and freeing what
was read. Per recorded step: (a resume at N − a resume at 0) ÷ N.
Targets (issue 46): at most 5 µs of CPU per recorded step, flat from 1k to
100k. The child's RSS is read when the runs first wait and its peak
(``VmHWM``) after every resume: what a resume of 100,000 steps holds at
once.

``python -m bench.resume_cost [--database URL] [--sizes 0,1000,...] [--reps R]``
runs it alone (default: SQLite in a temporary file; give a scratch
PostgreSQL database's URL for the other).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from everystep import schedule, send  # noqa: E402
from everystep.store import Store, connect  # noqa: E402
from tests.support.long_runs import write_history  # noqa: E402
from tests.support.rawdb import reader  # noqa: E402

from . import procs  # noqa: E402
from .report import Section, Table  # noqa: E402
from .stats import fmt, percentile  # noqa: E402
from .workloads import replayed, resumer  # noqa: E402

SIZES = (0, 1_000, 10_000, 100_000)
#: Most CPU a resume may spend per recorded step, in µs (issue 46).
TARGET_US = 5.0
#: The SQLite supervisor's --poll (seconds): it has no NOTIFY to wake it.
SQLITE_POLL = 0.01


@dataclass
class Resumes:
    """One history length's resumes: latency and the child's CPU, in ms."""

    steps: int
    latency_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)


@dataclass
class Measured:
    """Every length's resumes, and the child's memory: its RSS when the
    runs first waited, and its peak RSS after every resume (KiB)."""

    resumes: list[Resumes]
    rss_kib: int
    peak_kib: int


def _cpu_ns(pid: int) -> int:
    """Every thread of ``pid``'s time on a CPU so far, in nanoseconds."""
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        raise procs.BenchError(f"the supervisor's child {pid} exited during the measurement "
                               "(its log says why)") from None
    for task in tasks:
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total


def _status_kib(pid: int, field_name: str) -> int:
    """A memory line of ``/proc/PID/status`` (``VmRSS``, ``VmHWM``), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return 0


def _wait_step(conn: Any, run_id: str, step_id: str, status: str, timeout: float) -> Any:
    """Poll (on ``conn``, a plain connection) until the run's step
    ``step_id`` is recorded ``status``; its result."""
    mark = "?" if isinstance(conn, sqlite3.Connection) else "%s"
    sql = f"SELECT status, result FROM everystep_step WHERE workflow_id = {mark} AND step_id = {mark}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(sql, (run_id, step_id)).fetchone()
        if row is not None and row[0] == status:
            return json.loads(row[1]) if isinstance(row[1], str) else row[1]
        time.sleep(0.002)
    raise procs.BenchError(f"run {run_id}: step {step_id} not {status} within {timeout:.0f}s")


@dataclass
class _Supervisor:
    proc: procs.Proc
    socket: str

    def child(self) -> int:
        """Its one child's pid."""
        kids = psutil.Process(self.proc.pid).children()
        if len(kids) != 1:
            raise procs.BenchError(f"expected one child of the supervisor, found {len(kids)}")
        return kids[0].pid

    def wait_idle(self) -> None:
        """Until its child says it is idle: done with the run, the history
        it read freed."""
        procs.wait_children_idle(self.socket, 1, timeout=600)


@contextlib.contextmanager
def _supervisor(url: str, work: procs.Workdir, label: str) -> Iterator[_Supervisor]:
    socket_path = work.socket()
    # SQLite has no NOTIFY: a runner polls, so its latency would be the poll
    # interval's (--poll 0.5 by default); a short one leaves the resume's own.
    extra = ("--poll", str(SQLITE_POLL)) if url.startswith("sqlite") else ()
    proc = procs.Proc(procs.supervisor_cmd(url, 1, socket_path, burst=False, extra=extra),
                      work.log(f"supervisor-{label}"))
    try:
        procs.wait_children_idle(socket_path, 1)
        yield _Supervisor(proc, socket_path)
    finally:
        proc.stop()


def measure(url: str, work: procs.Workdir, sizes: Sequence[int], reps: int, label: str) -> Measured:
    """Each length's run resumed ``reps`` times (one warm-up first), one
    resume at a time, the lengths taking turns."""
    store = connect(url)
    try:
        store.migrate()
        runs: dict[int, str] = {}
        for size in sizes:  # written before any runner sees them: each run's first execution replays them
            run = schedule(resumer, size, reps + 1, database=store)
            write_history(store, run.id, ((str(i + 1), replayed.name, i) for i in range(size)))
            runs[size] = run.id
        results = {size: Resumes(size) for size in sizes}
        with reader(url) as conn, _supervisor(url, work, label) as supervisor:
            for size, run_id in runs.items():
                _wait_step(conn, run_id, str(size + 1), "waiting", timeout=600)
            supervisor.wait_idle()
            child = supervisor.child()
            rss = _status_kib(child, "VmRSS")
            for rep in range(reps + 1):
                for size, run_id in runs.items():
                    latency, cpu = _resume(store, conn, supervisor, run_id, size, rep, reps, child)
                    if rep:  # the first is a warm-up
                        results[size].latency_ms.append(latency)
                        results[size].cpu_ms.append(cpu)
            if child != supervisor.child():
                raise procs.BenchError("the supervisor's child was replaced during the measurement")
            peak = _status_kib(child, "VmHWM")
        return Measured([results[size] for size in sizes], rss, peak)
    finally:
        store.close()


def _resume(store: Store, conn: Any, supervisor: _Supervisor, run_id: str, size: int, rep: int, reps: int,
            child: int) -> tuple[float, float]:
    """One resume: its latency and its child's CPU up to its child being
    idle again, in ms."""
    stamp_id = str(size + 2 * rep + 2)
    before = _cpu_ns(child)
    send(run_id, "go", rep, database=store)
    sent = time.time()
    stamped = _wait_step(conn, run_id, stamp_id, "done", timeout=600)
    if rep < reps:  # waiting again in its next recv
        _wait_step(conn, run_id, str(size + 2 * rep + 3), "waiting", timeout=600)
    else:
        deadline = time.monotonic() + 600
        while store.get_run(run_id).status != "completed" and time.monotonic() < deadline:
            time.sleep(0.002)
    supervisor.wait_idle()
    return (stamped - sent) * 1000, (_cpu_ns(child) - before) / 1e6


def per_step_us(results: Sequence[Resumes]) -> dict[int, float | None]:
    """CPU per recorded step (µs) at each size past 0: the median resume
    at that size less the median at 0, over the size."""
    empty = next((r for r in results if r.steps == 0), None)
    base = statistics.median(empty.cpu_ms) if empty is not None and empty.cpu_ms else 0.0
    return {r.steps: (statistics.median(r.cpu_ms) - base) * 1000 / r.steps if r.steps and r.cpu_ms else None
            for r in results}


def table(measured: Measured, caption: str) -> Table:
    per_step = per_step_us(measured.resumes)
    out = Table(["recorded steps", "resumes", "latency p50 ms", "latency p99 ms", "CPU per resume ms (median)",
                 "CPU range ms", "CPU per recorded step µs"],
                caption=f"{caption}: the child's RSS {measured.rss_kib / 1024:.1f} MiB when the runs first waited, "
                        f"its peak {measured.peak_kib / 1024:.1f} MiB after every resume.")
    for r in measured.resumes:
        out.add(f"{r.steps:,}", len(r.cpu_ms), fmt(percentile(r.latency_ms, 50), 2),
                fmt(percentile(r.latency_ms, 99), 2), fmt(statistics.median(r.cpu_ms), 2) if r.cpu_ms else "n/a",
                f"{min(r.cpu_ms):.2f}–{max(r.cpu_ms):.2f}" if r.cpu_ms else "n/a",
                fmt(per_step[r.steps], 2) if per_step[r.steps] is not None else "—")
    return out


def verdict(results: Sequence[Resumes]) -> str:
    per_step = [value for value in per_step_us(results).values() if value is not None]
    if not per_step:
        return "not measured"
    worst = max(per_step)
    return (f"**{'met' if worst <= TARGET_US else 'missed'}** "
            f"({', '.join(f'{value:.2f}' for value in per_step)} µs at the lengths past 0)")


def run(ctx: Any) -> None:
    sizes = SIZES if not ctx.settings.quick else SIZES[:3] if ctx.settings.mode == "quick" else (0, 1_000)
    reps = 7 if ctx.settings.mode == "full" else 3  # past the warm-up: a median needs a few
    ctx.results["case18"] = {}
    for label, url in (("postgres", ctx.urls["resume"]), ("sqlite", f"sqlite:///{ctx.work.path / 'resume.db'}")):
        measured = measure(url, ctx.work, sizes, reps, label)
        ctx.results["case18"][label] = measured
        ctx.log(f"case 18 {label}: " + ", ".join(
            f"{r.steps}: {statistics.median(r.cpu_ms):.2f} ms CPU" for r in measured.resumes))


def section(ctx: Any) -> Section:
    found = ctx.results.get("case18") or {}
    section = Section(
        "case18", "Case 18 — resume cost per recorded step",
        method=(
            "`everystep-supervisor --procs 1`; one run of `bench.workloads.resumer` per history length, its "
            "recorded steps written straight into the table, waiting in `recv(\"go\")`; one `send()` at a time, "
            "the lengths taking turns, the first resume of each a warm-up. Latency = the next step's "
            "`time.time()` minus the client's right after `send()` returned; CPU = the child's every thread "
            "(`/proc/PID/task/*/schedstat`) from before the send to the run waiting again; per step = "
            f"(median at N − median at 0) ÷ N. SQLite has no NOTIFY: its supervisor polls, at `--poll {SQLITE_POLL}` "
            "here, so its latency is the resume's and not the poll interval's (0.5 s by default)."
        ),
    )
    for label, name in (("postgres", "PostgreSQL"), ("sqlite", "SQLite")):
        measured = found.get(label)
        if not measured:
            continue
        section.tables.append(table(measured, name))
        section.notes.append(f"Target (CPU per recorded step, {name}, ≤ {TARGET_US:g} µs): "
                             f"{verdict(measured.resumes)}.")
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.resume_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", help="a scratch database's URL (default: SQLite in a temporary file)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="history lengths, comma-separated")
    parser.add_argument("--reps", type=int, default=7, help="resumes per length, after a warm-up")
    args = parser.parse_args(argv)
    sizes = [int(part) for part in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="everystep-resume-") as tmp:
        work = procs.Workdir(Path(tmp))
        url = args.database or f"sqlite:///{Path(tmp) / 'resume.db'}"
        measured = measure(url, work, sizes, args.reps, url.split(":", 1)[0])
    print(table(measured, url.split(":", 1)[0]).markdown())
    print(f"target: {verdict(measured.resumes)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
