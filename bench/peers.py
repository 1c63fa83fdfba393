"""Case 5, peers on the same server in the same invocation.

- DBOS (``dbos`` from PyPI) runs the 3-step shape (``dbos_noop3``: three
  ``@DBOS.step`` no-ops, same payloads) and the CPU case (``dbos_cpu1``).
  Configured per its docs for throughput on several processes: a PostgreSQL
  system database, workflows enqueued on a queue, one worker process per
  everystep child (2), each with a unique ``executor_id`` and a per-process
  ``worker_concurrency``, and a short ``polling_interval_sec`` (the default
  1 s would cap each process at ``worker_concurrency`` starts per second).
  For the CPU case ``worker_concurrency=1``: threads cannot run pure Python
  in parallel, so one workflow per process is the best DBOS can do there.
- Procrastinate runs one-step jobs: an ``async`` no-op task, deferred first
  (``batch_defer``), then two worker processes with ``concurrency``
  (the docs' ways to raise throughput: more worker processes, and async
  sub-workers), LISTEN/NOTIFY on.

Every peer measurement is paired with an everystep measurement of the same
shape taken just before it in the same repetition (``--procs 2``; a 1-step
workflow against Procrastinate), and every rate uses the peer's own rows:
first start to last completion. A peer that is not installed, or fails, is
reported as such; the rest of the report is unaffected.
"""

from __future__ import annotations

import importlib.util
import time

import psycopg

from . import cpu_scaling, procs, throughput
from .context import Context
from .report import ChartSeries, Section, Table
from .stats import Series, fmt_ratio, fmt_span
from .workloads import noop1, payload

DBOS_PROCS = 2
DBOS_CONCURRENCY = 32
DBOS_POLL = 0.05
PROC_PROCS = 2
PROC_CONCURRENCY = 16

_KEEP_DBOS_TABLES = {"dbos_migrations", "queues", "application_versions", "workflow_schedules", "event_dispatch_kv"}


def available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# -- DBOS ------------------------------------------------------------------------------


def _dbos(ctx: Context, role: str, *args: str, label: str) -> procs.Proc:
    cmd = procs.python("-m", "bench.peer_dbos", role, "--url", ctx.urls["dbos"], *args)
    return procs.Proc(cmd, ctx.work.log(f"dbos-{label}"))


def _dbos_reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'dbos'") if row[0] not in _KEEP_DBOS_TABLES]
        if tables:
            conn.execute("TRUNCATE " + ", ".join(f"dbos.{name}" for name in tables) + " CASCADE")


def dbos_measure(ctx: Context, kind: str, count: int, concurrency: int, iterations: int = 0,
                 processes: int = DBOS_PROCS) -> dict[str, float]:
    """One DBOS measurement; ``concurrency`` 0 means DBOS's default (no
    per-process limit: every dequeued workflow gets a thread)."""
    url = ctx.urls["dbos"]
    _dbos_reset(url)
    common = ["--worker-concurrency", str(concurrency), "--poll", str(DBOS_POLL)]
    _dbos(ctx, "setup", *common, label="setup").check(120)
    markers = [ctx.work.path / f"dbos-ready-{time.monotonic_ns()}-{i}" for i in range(processes)]
    workers = [_dbos(ctx, "worker", "--executor-id", f"bench-w{i}", "--expect", str(count),
                     "--ready", str(markers[i]), "--timeout", "300", label=f"worker-{kind}-{i}")
               for i in range(processes)]
    try:
        deadline = time.monotonic() + 60
        while not all(marker.exists() for marker in markers):
            if time.monotonic() > deadline or any(w.popen.poll() is not None for w in workers):
                raise procs.BenchError("DBOS workers did not launch:\n" + procs.tail(workers[0].log))
            time.sleep(0.02)
        _dbos(ctx, "enqueue", "--kind", kind, "--count", str(count), "--iterations", str(iterations),
              label=f"enqueue-{kind}").check(300)
        for worker in workers:
            worker.check(330)
    finally:
        for worker in workers:
            worker.kill()
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'SUCCESS'), count(*),"
            " (max(completed_at) - min(started_at_epoch_ms)) / 1000.0 FROM dbos.workflow_status"
        ).fetchone()
        steps = conn.execute("SELECT count(*) FROM dbos.operation_outputs").fetchone()[0]
    done, total, seconds = int(row[0]), int(row[1]), float(row[2] or 0)
    if done != count or total != count:
        raise procs.BenchError(f"DBOS {kind}: {done} of {count} workflows succeeded ({total} rows)")
    return {"seconds": seconds, "runs_per_s": count / seconds, "steps": int(steps)}


# -- Procrastinate ---------------------------------------------------------------------


def _proc_cmd(role: str, url: str, *args: str) -> list[str]:
    # Not ``-m``: Procrastinate warns when its App lives in ``__main__``.
    code = "import sys; from bench.peer_procrastinate import main; sys.exit(main(sys.argv[1:]))"
    return procs.python("-c", code, role, "--url", url, *args)


def procrastinate_measure(ctx: Context, count: int) -> dict[str, float]:
    url = ctx.urls["procrastinate"]
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL").fetchone()[0]
        if exists:
            conn.execute("TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers CASCADE")
    if not exists:
        procs.run(_proc_cmd("setup", url), ctx.work.log("procrastinate-setup"), timeout=120)
    procs.run(_proc_cmd("defer", url, "--count", str(count)), ctx.work.log("procrastinate-defer"), timeout=300)
    workers = [procs.Proc(_proc_cmd("worker", url, "--name", f"w{i}", "--concurrency", str(PROC_CONCURRENCY)),
                          ctx.work.log(f"procrastinate-worker-{i}")) for i in range(PROC_PROCS)]
    for worker in workers:
        worker.check(300)
    with psycopg.connect(url, autocommit=True) as conn:
        done = conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'").fetchone()[0]
        seconds = conn.execute(
            "SELECT extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')"
            " - min(at) FILTER (WHERE type = 'started')) FROM procrastinate_events").fetchone()[0]
    if int(done) != count:
        raise procs.BenchError(f"Procrastinate: {done} of {count} jobs succeeded")
    seconds = float(seconds or 0)
    return {"seconds": seconds, "runs_per_s": count / seconds}


# -- the case ------------------------------------------------------------------------------


def run(ctx: Context) -> None:
    s = ctx.settings
    out = ctx.results.setdefault("case5", {})
    runs = s.peer_runs
    have_dbos, have_proc = available("dbos"), available("procrastinate")
    if not have_dbos:
        ctx.errors["dbos"] = "not installed (pip install 'everystep[bench]')"
    if not have_proc:
        ctx.errors["procrastinate"] = "not installed (pip install 'everystep[bench]')"
    iterations = ctx.results.get("case3", {}).get("iterations") or cpu_scaling.calibrate(s.cpu_seconds)[0]
    for rep in range(s.peer_reps):
        if have_dbos and "dbos" not in ctx.errors:
            es = throughput.measure(ctx, ctx.urls["es"], DBOS_PROCS, runs, label="noop3-vs-dbos")
            out.setdefault("es_noop3", Series()).add(es["runs_per_s"])
            try:
                peer = dbos_measure(ctx, "noop3", runs, DBOS_CONCURRENCY)
                out.setdefault("dbos_noop3", Series()).add(peer["runs_per_s"])
                out.setdefault("ratio_noop3", Series()).add(es["runs_per_s"] / peer["runs_per_s"])
                ctx.log(f"case 5 rep {rep + 1}: everystep {es['runs_per_s']:,.0f} runs/s, "
                        f"DBOS {peer['runs_per_s']:,.0f} runs/s (3-step)")
            except procs.BenchError as exc:
                ctx.errors["dbos"] = str(exc)
                continue
            es_cpu = cpu_scaling.supervisor_seconds(ctx, ctx.urls["es"], DBOS_PROCS, s.cpu_runs, iterations)
            out.setdefault("es_cpu", Series()).add(es_cpu)
            try:
                best = dbos_measure(ctx, "cpu1", s.cpu_runs, 1, iterations)
                out.setdefault("dbos_cpu", Series()).add(best["seconds"])
                out.setdefault("ratio_cpu", Series()).add(best["seconds"] / es_cpu)
                default = dbos_measure(ctx, "cpu1", s.cpu_runs, 0, iterations, processes=1)
                out.setdefault("dbos_cpu_default", Series()).add(default["seconds"])
                out.setdefault("ratio_cpu_default", Series()).add(default["seconds"] / es_cpu)
                ctx.log(f"case 5 rep {rep + 1}: CPU everystep {es_cpu:.2f}s, DBOS {best['seconds']:.2f}s "
                        f"(2 processes), {default['seconds']:.2f}s (1 process, threads)")
            except procs.BenchError as exc:
                ctx.errors["dbos"] = str(exc)
        if have_proc and "procrastinate" not in ctx.errors:
            es = throughput.measure(ctx, ctx.urls["es"], PROC_PROCS, runs, label="noop1-vs-procrastinate",
                                          workflow=noop1, args=((payload(i),) for i in range(runs)))
            out.setdefault("es_noop1", Series()).add(es["runs_per_s"])
            try:
                peer = procrastinate_measure(ctx, runs)
                out.setdefault("proc_noop1", Series()).add(peer["runs_per_s"])
                out.setdefault("ratio_noop1", Series()).add(es["runs_per_s"] / peer["runs_per_s"])
                ctx.log(f"case 5 rep {rep + 1}: everystep 1-step {es['runs_per_s']:,.0f} runs/s, "
                        f"Procrastinate {peer['runs_per_s']:,.0f} jobs/s")
            except procs.BenchError as exc:
                ctx.errors["procrastinate"] = str(exc)


def section(ctx: Context) -> Section:
    s = ctx.settings
    out = ctx.results.get("case5", {})
    reps_note = f"{s.peer_reps} repetition(s)" + (" (quick mode: peers measured once)" if s.quick else "")
    section = Section(
        "case5", "Case 5 — peers on the same server, same invocation",
        method=(
            f"{reps_note}; each peer measurement follows an everystep measurement of the same shape "
            "(`everystep-supervisor --procs 2`) in the same repetition; ratios are the median of the "
            "per-repetition everystep/peer ratios (for wall times, peer time / everystep time).\n\n"
            f"**DBOS** ({_version('dbos')}): PostgreSQL system database (its own database on this server), "
            f"{DBOS_PROCS} worker processes (`DBOS.listen_queues`, unique `executor_id`) launched first; once "
            "both are up, the workflows are enqueued in one transaction (`DBOSClient.enqueue_in_transaction`) "
            "so they appear at once, as everystep's pre-filled queue does; the queue is registered with "
            f"`worker_concurrency={DBOS_CONCURRENCY}` and `polling_interval_sec={DBOS_POLL}` (the default "
            "1 s would cap each process at `worker_concurrency` starts per second); CPU case with "
            "`worker_concurrency=1` per process. Rate = runs over first `started_at_epoch_ms` to last "
            "`completed_at` of `dbos.workflow_status`. The CPU case is also run the way a DBOS app runs "
            "out of the box: one process, no `worker_concurrency` (each workflow on its own thread).\n\n"
            f"**Procrastinate** ({_version('procrastinate')}): an `async` no-op task, jobs deferred first "
            f"(`batch_defer`), then {PROC_PROCS} worker processes with `concurrency={PROC_CONCURRENCY}` "
            "(`wait=False`, LISTEN/NOTIFY on, jobs kept). Rate = jobs over first `started` to last "
            "`succeeded` event. Compared with everystep running the same number of 1-step runs "
            "(`bench.workloads.noop1`)."
        ),
    )
    table = Table(["shape", "everystep", "peer", "peer result", "everystep / peer"])
    dbos_error = ctx.errors.get("dbos")
    if out.get("dbos_noop3"):
        table.add(f"{s.peer_runs:,} × 3-step no-op, runs/s", out["es_noop3"].cell(0), "DBOS",
                  out["dbos_noop3"].cell(0), _ratio(out.get("ratio_noop3")))
    else:
        table.add(f"{s.peer_runs:,} × 3-step no-op, runs/s", out.get("es_noop3", Series()).cell(0), "DBOS",
                  "not run: " + (dbos_error or "unknown").splitlines()[0], "n/a")
    cpu_shape = f"{s.cpu_runs} × ~{s.cpu_seconds:g} s CPU step, wall s"
    if out.get("dbos_cpu"):
        table.add(cpu_shape, out["es_cpu"].cell(2), f"DBOS, {DBOS_PROCS} processes × worker_concurrency=1",
                  out["dbos_cpu"].cell(2), _ratio(out.get("ratio_cpu")))
    else:
        table.add(cpu_shape, out.get("es_cpu", Series()).cell(2), "DBOS",
                  "not run: " + (dbos_error or "unknown").splitlines()[0], "n/a")
    if out.get("dbos_cpu_default"):
        table.add(cpu_shape, out["es_cpu"].cell(2), "DBOS, 1 process, default (a thread per workflow)",
                  out["dbos_cpu_default"].cell(2), _ratio(out.get("ratio_cpu_default")))
    proc_error = ctx.errors.get("procrastinate")
    if out.get("proc_noop1"):
        table.add(f"{s.peer_runs:,} × 1-step no-op, runs (jobs)/s", out["es_noop1"].cell(0), "Procrastinate",
                  out["proc_noop1"].cell(0), _ratio(out.get("ratio_noop1")))
    else:
        table.add(f"{s.peer_runs:,} × 1-step no-op, runs (jobs)/s", out.get("es_noop1", Series()).cell(0),
                  "Procrastinate", "not run: " + (proc_error or "unknown").splitlines()[0], "n/a")
    section.tables.append(table)
    for name, error in (("DBOS", dbos_error), ("Procrastinate", proc_error)):
        if error and "not installed" not in error:
            section.notes.append(f"{name} failed: `{error.splitlines()[0]}` (rerun with --keep-work for its logs).")
    r3, rc = out.get("ratio_noop3"), out.get("ratio_cpu")
    if r3 and r3.median is not None:
        section.notes.append(f"Target (≥ 5× DBOS runs/s on the 3-step shape): "
                             f"**{'met' if r3.median >= 5.0 else 'missed'}** ({fmt_span(r3)}).")
    r1 = out.get("ratio_noop1")
    if r1 and r1.median is not None:
        section.notes.append(f"Target (≥ 2.0× Procrastinate runs/s on the 1-step shape): "
                             f"**{'met' if r1.median >= 2.0 else 'missed'}** ({fmt_span(r1)}).")
    if rc and rc.median is not None:
        rd = out.get("ratio_cpu_default")
        default = f"; against DBOS's single-process default: {fmt_ratio(rd.median)}" if rd else ""
        section.notes.append(f"Target (≥ 1.7× DBOS on the CPU case), judged against DBOS's best configuration "
                             f"here ({DBOS_PROCS} processes): **{'met' if rc.median >= 1.7 else 'missed'}** "
                             f"({fmt_span(rc)}{default}).")
    bare = ctx.results.get("case3", {}).get("bare")
    if rc and rc.median is not None and bare and out.get("dbos_cpu"):
        ceiling = out["dbos_cpu"].median / bare.median
        section.notes.append(
            f"Ceiling: the same {s.cpu_runs} steps in a bare `multiprocessing` pool of 2 (case 3, no engine) take "
            f"{bare.median:.2f} s, so no runner on this machine could be more than {ceiling:.2f}× faster than "
            f"DBOS's {DBOS_PROCS}-process configuration on this case."
        )
    best = ctx.results.get("case2", {})
    rates = {p: best[("runs_per_s", p)].median for p in ctx.settings.procs if best.get(("runs_per_s", p))}
    if rates and out.get("dbos_noop3"):
        top = max(rates, key=lambda p: rates[p])
        section.notes.append(f"For reference, case 2's best everystep rate on the 3-step shape was "
                             f"{rates[top]:,.0f} runs/s at --procs {top} (median, measured earlier in this run).")
    return section


def _ratio(series: Series | None) -> str:
    if not series:
        return "n/a"
    if len(series.values) == 1:
        return fmt_ratio(series.median)
    return f"{fmt_ratio(series.median)} ({fmt_ratio(series.low)}–{fmt_ratio(series.high)})"


def _version(name: str) -> str:
    from importlib import metadata

    try:
        return f"{name} {metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return f"{name} not installed"


def chart_points(ctx: Context) -> list[ChartSeries]:
    out = ctx.results.get("case5", {})
    series = []
    for key, label, x in (("dbos_noop3", f"DBOS runs/s (3-step, {DBOS_PROCS} procs)", DBOS_PROCS),
                          ("es_noop1", "everystep runs/s (1-step, --procs 2)", PROC_PROCS),
                          ("proc_noop1", f"Procrastinate jobs/s (1-step, {PROC_PROCS} procs)", PROC_PROCS)):
        data = out.get(key)
        if data:
            series.append(ChartSeries(label, [(float(x), data.median)], {float(x): (data.low, data.high)}))
    return series

