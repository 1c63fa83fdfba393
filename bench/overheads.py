"""Case 6, overheads.

- Per-step overhead of a no-op step, in process: ``runner.execute`` of a
  claimed run of ``noop100`` (S recorded no-op steps) minus the same
  workflow with zero steps (the per-run fixed cost: loading outcomes and the
  final status write), minus S direct calls of the undecorated function,
  divided by S. On SQLite (the embedded default: WAL, ``synchronous=NORMAL``)
  and on PostgreSQL, with the benchmark's durable commit and with
  ``synchronous_commit = off`` (CPU and round trip only).
- Child respawn: ``everystep-supervisor --procs 2`` idle; SIGKILL one child
  and time until the control socket reports a replacement child idle
  (forked, connected to nothing yet, and reported "ready"). Cold start: from
  launching the supervisor process to all children idle.
- Memory, with the example app preloaded (``--app examples.app,bench.workloads``):
  the parent's RSS and USS, each child's USS (``psutil``'s
  ``memory_full_info().uss``: pages only that child holds) and RSS, idle
  after start and again after working off a burst of runs.
"""

from __future__ import annotations

import os
import signal
import time

import psutil

from everystep import runner
from everystep.store import connect

from . import esdb, procs, step_cost
from .context import Context
from .report import Section, Table
from .stats import Series
from .workloads import noop3, noop100, noop_plain, payload

CLAIMER = "bench-overhead"
MEMORY_APP = "examples.app,bench.workloads"


def _execute_once(store, steps: int) -> float:  # type: ignore[no-untyped-def]
    store.schedule(noop100.name, f"[{steps}]")
    runs = store.claim(CLAIMER, 1, [noop100.name])
    if len(runs) != 1:
        raise procs.BenchError("could not claim the overhead run")
    start = time.perf_counter()
    status = runner.execute(store, runs[0], claimer=CLAIMER)
    elapsed = time.perf_counter() - start
    if status != "completed":
        raise procs.BenchError(f"overhead run ended {status}")
    return elapsed


def _direct(steps: int) -> float:
    fn = noop_plain.fn
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return time.perf_counter() - start


def per_step(url: str, steps: int, reps: int) -> dict[str, Series]:
    store = connect(url)
    try:
        store.migrate()
        _execute_once(store, steps)  # warm up: connections, prepared statements, imports
        per_step_us, fixed_ms = Series(), Series()
        for _ in range(reps):
            full = _execute_once(store, steps)
            empty = _execute_once(store, 0)
            direct = _direct(steps)
            per_step_us.add((full - empty - direct) / steps * 1e6)
            fixed_ms.add(empty * 1e3)
        return {"per_step_us": per_step_us, "fixed_ms": fixed_ms}
    finally:
        store.close()


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []


def _memory(pid: int) -> dict[str, float]:
    parent = psutil.Process(pid)
    info = parent.memory_full_info()
    kids = [kid.memory_full_info() for kid in _children(pid)]
    mib = 1024 * 1024
    return {
        "parent_rss": info.rss / mib,
        "parent_uss": info.uss / mib,
        "child_uss": sum(k.uss for k in kids) / len(kids) / mib if kids else float("nan"),
        "child_rss": sum(k.rss for k in kids) / len(kids) / mib if kids else float("nan"),
        "children": float(len(kids)),
    }


def processes(ctx: Context, url: str) -> dict[str, object]:
    s = ctx.settings
    esdb.reset(url)
    socket_path = ctx.work.socket()
    cmd = procs.supervisor_cmd(url, s.memory_procs, socket_path, app=MEMORY_APP, burst=False)
    launched = time.perf_counter()
    proc = procs.Proc(cmd, ctx.work.log("supervisor-overheads"))
    out: dict[str, object] = {}
    try:
        status = procs.wait_children_idle(socket_path, s.memory_procs)
        out["cold_start_s"] = time.perf_counter() - launched
        time.sleep(0.3)
        out["idle"] = _memory(proc.pid)
        respawn = Series()
        for _ in range(s.respawn_reps):
            status = procs.wait_children_idle(socket_path, s.memory_procs)
            victim = status["children"][0]["pid"]
            start = time.perf_counter()
            os.kill(victim, signal.SIGKILL)
            procs.wait_children_idle(socket_path, s.memory_procs, exclude_pids={victim})
            respawn.add((time.perf_counter() - start) * 1000.0)
            time.sleep(0.2)
        out["respawn_ms"] = respawn
        burst = 200 if not s.quick else 50
        esdb.schedule_many(url, noop3, ((payload(i),) for i in range(burst)))
        esdb.wait_completed(url, burst, timeout=120)
        time.sleep(0.3)
        out["busy"] = _memory(proc.pid)
        out["burst"] = burst
    finally:
        proc.stop()
    return out


def run(ctx: Context) -> None:
    s = ctx.settings
    out = ctx.results.setdefault("case6", {})
    sqlite_url = f"sqlite:///{ctx.work.path / 'overhead.db'}"
    for key, url in (("sqlite", sqlite_url), ("pg", ctx.urls["es"]), ("pg_async", ctx.urls["es_async"])):
        if key != "sqlite":
            esdb.reset(url)
        out[key] = per_step(url, s.overhead_steps, s.overhead_reps)
        ctx.log(f"case 6: {key}: {out[key]['per_step_us'].median:.0f} µs per no-op step")
    out["step_cost"] = step_cost.measure(sqlite_url, s.overhead_steps, s.overhead_reps)
    ctx.log(f"case 6: measuring a step costs {out['step_cost']['alone_us']['cpu'].median:.1f} µs of CPU")
    out["procs"] = processes(ctx, ctx.urls["es"])
    ctx.log(f"case 6: respawn {out['procs']['respawn_ms'].median:.1f} ms")


def section(ctx: Context) -> Section:
    s = ctx.settings
    out = ctx.results.get("case6", {})
    section = Section(
        "case6", "Case 6 — overheads",
        method=(
            f"Per-step: in-process `runner.execute` of a claimed `noop100` run with {s.overhead_steps} no-op "
            f"steps, minus the same with 0 steps (per-run fixed cost), minus {s.overhead_steps} direct calls, "
            f"divided by {s.overhead_steps}; {s.overhead_reps} repetitions after a warm-up run. "
            f"Respawn: `everystep-supervisor --procs {s.memory_procs} --app {MEMORY_APP}`, SIGKILL one idle "
            "child, time until `ctl status` shows a new child `idle` (polled every 2 ms); "
            f"{s.respawn_reps} repetitions. Memory via psutil on the same supervisor."
        ),
    )
    steps = Table(["backend", "per-step overhead µs", "per-run fixed cost ms (0-step run)"])
    for key, label in (("sqlite", "SQLite (WAL, synchronous=NORMAL)"),
                       ("pg", "PostgreSQL (benchmark setting: durable commit)"),
                       ("pg_async", "PostgreSQL, synchronous_commit=off")):
        data = out.get(key)
        if data:
            steps.add(label, data["per_step_us"].cell(0), data["fixed_ms"].cell(2))
        else:
            steps.add(label, "n/a", "n/a")
    section.tables.append(steps)
    section.tables.append(_step_cost_table(out.get("step_cost")))
    pr = out.get("procs") or {}
    table = Table(["process measurement", "value"])
    respawn = pr.get("respawn_ms")
    table.add("child respawn after SIGKILL → replacement idle, ms", respawn.cell(1) if respawn else "n/a")
    if "cold_start_s" in pr:
        table.add(f"cold start: launch → {s.memory_procs} children idle, s", f"{pr['cold_start_s']:.2f}")
    for key, when in (("idle", "idle after start"), ("busy", f"after a burst of {pr.get('burst', 0)} runs")):
        mem = pr.get(key)
        if not mem:
            continue
        table.add(f"parent RSS / USS, MiB ({when})", f"{mem['parent_rss']:.1f} / {mem['parent_uss']:.1f}")
        table.add(f"per-child USS, MiB, mean of {mem['children']:.0f} ({when})", f"{mem['child_uss']:.1f}")
        table.add(f"per-child RSS, MiB, mean ({when})", f"{mem['child_rss']:.1f}")
    section.tables.append(table)
    return section


def _step_cost_table(data: dict[str, object] | None) -> Table:
    """What measuring each step (CPU, peak RSS growth; supervisor children) adds, µs per step."""
    table = Table(["step cost accounting (SQLite; see bench/step_cost.py)", "µs per step"])
    if not data:
        table.add("meter alone", "n/a")
        return table
    alone, paired = data["alone_us"], data["end_to_end"]
    assert isinstance(alone, dict) and isinstance(paired, dict)
    table.add("meter alone: begin, call, end around a no-op, minus a direct call; CPU", alone["cpu"].cell(1))
    table.add("the same, wall clock", alone["wall"].cell(1))
    table.add("plus, on kernels keeping an exited thread's peak in ru_maxrss: reading VmHWM; CPU",
              alone["hwm_cpu"].cell(1))
    table.add("per-step overhead with the meter", paired["with"].cell(0))
    table.add("per-step overhead without it", paired["without"].cell(0))
    table.add("added by the meter, paired repetitions", paired["added"].cell(1))
    return table
