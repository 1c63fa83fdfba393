"""Case 17, a big app in every child: what a child costs in memory.

The app (``bench.bigapp``) builds ``heap_mb`` MiB of Python objects at
import; its task reads a few rows, makes and drops cyclic garbage and keeps
some objects in a bounded cache, so the children's collectors run as in a
long-lived worker, full collections included. Each system forks its
workers from a parent that imported it, runs a burst of
``tree_runs_per_child`` tasks per worker, and then, with every worker idle
and alive, the memory of each process of the tree is read
(``bench.footprint``: RSS, PSS and USS from ``/proc/PID/smaps_rollup``):

- **everystep**: ``everystep-supervisor --app bench.bigapp --procs N``;
- **everystep, freeze off**: the same supervisor with its ``gc.freeze()``
  recipe turned off (``bench.nofreeze``, a control: the supervisor as it
  was before it froze);
- **Celery**: Celery's prefork pool, ``celery -A bench.celery_app worker -c
  N``, Redis as broker (``bench.peer_celery``);
- **multiprocessing**: a bare fork ``Pool(N)`` (``bench.mp_pool``).

What the freeze costs: at start, the ``gc.freeze()`` call the supervisor
makes before its first fork, timed in a process that imported the app as
the supervisor does (collector off), and the app's import with the
collector on and off; per run, everystep's runs/s with and without the
freeze, paired (each repetition starts both supervisors in turn, the order
alternating, and the ratio is taken within it). And the parent over a long
burst: its memory and the objects it froze at the first and the last of
many forks (children replaced every ``--max-runs-per-child``), read from
its debug log line.

``python -m bench --only 16``.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from . import esdb, footprint, procs
from .context import Context
from .report import Section, Table
from .stats import Series

APP = "bench.bigapp"
WORKFLOW = "bench.bigapp.churn_flow"
MIB = 1024 * 1024
SYSTEMS = ("everystep", "everystep, freeze off", "Celery prefork", "multiprocessing Pool")
#: USS per child at most this share of the app's heap; the tree's PSS at the
#: largest --procs at most this many heaps.
USS_SHARE_BAR = 0.15
PSS_HEAPS_BAR = 2.0
PAIR_PROCS = 2
FROZE = re.compile(r"froze (\d+) objects before forking in ([\d.]+) ms")


def _env(ctx: Context) -> dict[str, str]:
    return {"EVERYSTEP_BENCH_HEAP_MB": str(ctx.settings.heap_mb)}


def _supervisor(ctx: Context, url: str, nprocs: int, socket_path: str, *, freeze: bool = True,
                extra: Sequence[str] = ()) -> procs.Proc:
    """A supervisor of the app on an emptied database (its runner row included)."""
    esdb.reset(url)
    cmd = procs.supervisor_cmd(url, nprocs, socket_path, app=APP, burst=False, extra=extra)
    if not freeze:
        cmd[cmd.index("supervisor.cli")] = "bench.nofreeze"
    return procs.Proc(cmd, ctx.work.log("case17-supervisor"), _env(ctx))


def _everystep_burst(url: str, proc: procs.Proc, socket_path: str, nprocs: int,
                     runs: int, before: int = 0) -> dict[str, Any]:
    """Wait for the children, run ``runs`` runs (after the ``before`` runs
    this supervisor already ran), wait for them to be idle; returns the
    tree's memory and the rate of all its runs."""
    procs.wait_children_idle(socket_path, nprocs, timeout=300)
    esdb.schedule_many(url, WORKFLOW, [(seed,) for seed in range(runs)])
    esdb.wait_completed(url, before + runs, timeout=600)
    rate = esdb.span(url)
    esdb.expect_all_completed(rate, before + runs, "case 17")
    status = procs.wait_children_idle(socket_path, nprocs, timeout=60)
    tree = footprint.tree(proc.pid)
    return {"tree": tree, "runs_per_second": rate.runs_per_second, "status": status,
            "heap": _heap_from_results(url)}


def _heap_from_results(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT result FROM everystep_workflow WHERE status = 'completed' LIMIT 1").fetchone()
    result = row[0] if row else None
    if isinstance(result, str):
        result = json.loads(result)
    return int(result["heap"]) if result else 0


def measure_everystep(ctx: Context, nprocs: int, freeze: bool) -> dict[str, Any]:
    url = ctx.urls["memory"]
    socket_path = ctx.work.socket()
    proc = _supervisor(ctx, url, nprocs, socket_path, freeze=freeze)
    with procs.running(proc):
        return _everystep_burst(url, proc, socket_path, nprocs, nprocs * ctx.settings.tree_runs_per_child)


def measure_celery(ctx: Context, nprocs: int) -> dict[str, Any]:
    from . import peer_celery

    queue = f"bench16-{time.monotonic_ns()}"
    proc = procs.Proc(peer_celery.worker_cmd(nprocs, queue), ctx.work.log("case17-celery"), _env(ctx))
    with procs.running(proc):
        runs = nprocs * ctx.settings.tree_runs_per_child
        done = subprocess.run(peer_celery.client_cmd(queue, nprocs, runs, proc.pid), capture_output=True, text=True,
                              timeout=960, env=procs.env(**_env(ctx)), cwd=procs.ROOT)
        if done.returncode != 0:
            raise procs.BenchError(f"the Celery client exited with {done.returncode}\n{done.stderr[-2000:]}\n"
                                   f"{procs.tail(proc.log)}")
        tree = footprint.tree(proc.pid)
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {"tree": tree, **out}


def measure_mp(ctx: Context, nprocs: int) -> dict[str, Any]:
    runs = nprocs * ctx.settings.tree_runs_per_child
    done = subprocess.run(procs.python("-m", "bench.mp_pool", str(nprocs), str(runs)), capture_output=True,
                          text=True, timeout=600, env=procs.env(**_env(ctx)), cwd=procs.ROOT)
    if done.returncode != 0:
        raise procs.BenchError(f"bench.mp_pool exited with {done.returncode}\n{done.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def start_cost(ctx: Context) -> dict[str, float]:
    """The app's import with the collector on and off, and the freeze."""
    script = (
        "import gc, json, sys, time\n"
        "if sys.argv[1] == 'off': gc.disable()\n"
        "started = time.perf_counter()\n"
        "import bench.bigapp\n"
        "imported = time.perf_counter() - started\n"
        "started = time.perf_counter()\n"
        "gc.freeze()\n"
        "froze = time.perf_counter() - started\n"
        "print(json.dumps({'import_s': imported, 'freeze_ms': froze * 1000, 'frozen': gc.get_freeze_count()}))\n"
    )
    out: dict[str, float] = {}
    for mode in ("on", "off"):
        done = subprocess.run(procs.python("-c", script, mode), capture_output=True, text=True, timeout=300,
                              env=procs.env(**_env(ctx)), cwd=procs.ROOT, check=True)
        data = json.loads(done.stdout.strip().splitlines()[-1])
        out[f"import_{mode}_s"] = data["import_s"]
        if mode == "off":
            out["freeze_ms"], out["frozen"] = data["freeze_ms"], data["frozen"]
    return out


def paired_runs(ctx: Context) -> dict[str, Series]:
    """runs/s with and without the freeze at --procs 2, paired per repetition."""
    s = ctx.settings
    out = {"freeze": Series(), "nofreeze": Series(), "ratio": Series()}
    for rep in range(s.freeze_pair_reps):
        order = (True, False) if rep % 2 == 0 else (False, True)
        rates: dict[bool, float] = {}
        for freeze in order:
            socket_path = ctx.work.socket()
            proc = _supervisor(ctx, ctx.urls["memory"], PAIR_PROCS, socket_path, freeze=freeze)
            with procs.running(proc):
                rates[freeze] = _everystep_burst(ctx.urls["memory"], proc, socket_path, PAIR_PROCS,
                                                 s.freeze_pair_runs)["runs_per_second"]
        out["freeze"].add(rates[True])
        out["nofreeze"].add(rates[False])
        out["ratio"].add(rates[True] / rates[False])
    return out


def long_burst(ctx: Context) -> dict[str, Any]:
    """The parent over many forks: its memory early and at the end, and what
    it froze at its first and last forks."""
    s = ctx.settings
    url = ctx.urls["memory"]
    socket_path = ctx.work.socket()
    proc = _supervisor(ctx, url, PAIR_PROCS, socket_path,
                       extra=("--max-runs-per-child", str(s.long_burst_runs_per_child), "--log-level", "debug"))
    early_runs = max(s.long_burst_runs // 10, 1)
    with procs.running(proc):
        first = _everystep_burst(url, proc, socket_path, PAIR_PROCS, early_runs)
        last = _everystep_burst(url, proc, socket_path, PAIR_PROCS, s.long_burst_runs, before=early_runs)
        restarts = last["status"].get("restarts", {})
    froze = [(int(count), float(ms)) for count, ms in FROZE.findall(proc.log.read_text(errors="replace"))]
    return {"early": first["tree"]["parent"], "end": last["tree"]["parent"], "froze": froze,
            "early_runs": early_runs, "runs": early_runs + s.long_burst_runs, "restarts": sum(restarts.values())}


def run(ctx: Context) -> None:
    s = ctx.settings
    out: dict[str, Any] = ctx.results.setdefault("case17", {"trees": {}})
    for nprocs in s.tree_procs:
        for system, measure in (("everystep", lambda n: measure_everystep(ctx, n, True)),
                                ("everystep, freeze off", lambda n: measure_everystep(ctx, n, False)),
                                ("Celery prefork", lambda n: measure_celery(ctx, n)),
                                ("multiprocessing Pool", lambda n: measure_mp(ctx, n))):
            ctx.log(f"case 17: {system} at {nprocs} workers")
            try:
                out["trees"][(system, nprocs)] = measure(nprocs)
            except Exception as exc:  # a peer that fails is reported, the rest still measured
                if system.startswith("everystep"):
                    raise
                out["trees"][(system, nprocs)] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    ctx.log("case 17: start cost")
    out["start"] = start_cost(ctx)
    ctx.log("case 17: per-run cost, paired")
    out["pair"] = paired_runs(ctx)
    ctx.log("case 17: the parent over a long burst")
    out["long"] = long_burst(ctx)


def summarize(tree: dict[str, Any]) -> dict[str, float]:
    """Per-child means and maxima, the parent's, and the tree's PSS, in MiB."""
    kids = tree["children"]
    parent = tree["parent"]

    def mean(key: str) -> float:
        return sum(kid[key] for kid in kids) / len(kids) / MIB if kids else float("nan")

    return {"children": len(kids), "rss": mean("rss"), "pss": mean("pss"), "uss": mean("uss"),
            "uss_max": max((kid["uss"] for kid in kids), default=0) / MIB,
            "parent_rss": parent["rss"] / MIB, "parent_pss": parent["pss"] / MIB, "parent_uss": parent["uss"] / MIB,
            "tree_pss": (parent["pss"] + sum(kid["pss"] for kid in kids)) / MIB}


def section(ctx: Context) -> Section:
    s = ctx.settings
    out = ctx.results.get("case17", {})
    section = Section(
        "case17", "Case 17 — a big app in every child: memory",
        method=(
            f"The app (`bench.bigapp`) builds {s.heap_mb} MiB of Python objects at import (rows of dicts, "
            "tuples and strings); its task reads 100 rows, makes and drops 20,000 pairs of dicts in cycles and "
            "keeps 10,000 lists in a bounded per-process cache, so full collections come as in a long-lived "
            "worker. Each system forks its workers from a parent that imported the app and runs "
            f"{s.tree_runs_per_child} tasks per worker; then, every worker idle and alive, RSS, PSS and USS of "
            "each process are read from `/proc/PID/smaps_rollup` (psutil `memory_full_info()`). everystep: "
            "`everystep-supervisor --app bench.bigapp --procs N` on PostgreSQL; *freeze off*: the same "
            "supervisor with its `gc.freeze()` recipe disabled (`bench.nofreeze`, the control); Celery "
            "5.7's prefork pool, `celery -A bench.celery_app worker -c N`, Redis broker and result backend; a "
            "bare `multiprocessing` fork `Pool(N)`. The app's heap is what its import added to the process's "
            "RSS."
        ),
    )
    trees = out.get("trees", {})
    table = Table(["system", "workers", "app heap MiB", "child RSS MiB", "child PSS MiB", "child USS MiB (max)",
                   "largest USS ÷ heap", "parent RSS / PSS / USS MiB", "tree PSS MiB", "tree PSS ÷ heap"],
                  caption="Means per child after the burst; the tree is the parent and its children.")
    uss_ok: list[str] = []
    pss_at_max: str | None = None
    pss_met = False
    for nprocs in s.tree_procs:
        for system in SYSTEMS:
            data = trees.get((system, nprocs))
            if data is None:
                continue
            if "error" in data:
                table.add(system, nprocs, "n/a", "not measured: " + data["error"])
                continue
            heap = data["heap"] / MIB
            m = summarize(data["tree"])
            table.add(system, nprocs, f"{heap:.0f}", f"{m['rss']:.0f}", f"{m['pss']:.0f}",
                      f"{m['uss']:.1f} ({m['uss_max']:.1f})", f"{m['uss_max'] / heap:.1%}",
                      f"{m['parent_rss']:.0f} / {m['parent_pss']:.0f} / {m['parent_uss']:.0f}",
                      f"{m['tree_pss']:.0f}", f"{m['tree_pss'] / heap:.2f}×")
            if system == "everystep":
                uss_ok.append(f"{m['uss_max'] / heap:.1%} at {nprocs}")
                if m["uss_max"] / heap > USS_SHARE_BAR:
                    uss_ok.append("(over)")
                if nprocs == max(s.tree_procs):
                    pss_at_max = f"{m['tree_pss'] / heap:.2f}× at --procs {nprocs}"
                    pss_met = m["tree_pss"] / heap <= PSS_HEAPS_BAR
    section.tables.append(table)
    if uss_ok:
        verdict = "missed" if "(over)" in uss_ok else "met"
        shown = ", ".join(part for part in uss_ok if part != "(over)")
        section.notes.append(f"Target (USS per child ≤ {USS_SHARE_BAR:.0%} of the app's heap, every --procs): "
                             f"**{verdict}** (largest child's USS ÷ heap: {shown}).")
    if pss_at_max is not None:
        section.notes.append(f"Target (total PSS of the tree ≤ {PSS_HEAPS_BAR:g}× the app's heap at the largest "
                             f"--procs): **{'met' if pss_met else 'missed'}** ({pss_at_max}).")
    costs = Table(["what the freeze costs", "value"])
    start = out.get("start")
    if start:
        costs.add("gc.freeze() before the first fork, µs (objects frozen)",
                  f"{start['freeze_ms'] * 1000:.1f} ({start['frozen']:,.0f})")
        costs.add("the app's import, collector on → off (as the supervisor imports it), s",
                  f"{start['import_on_s']:.2f} → {start['import_off_s']:.2f}")
    pair = out.get("pair")
    if pair:
        costs.add(f"runs/s at --procs {PAIR_PROCS}, freeze on", pair["freeze"].cell(1))
        costs.add(f"runs/s at --procs {PAIR_PROCS}, freeze off", pair["nofreeze"].cell(1))
        costs.add("on ÷ off, paired repetitions", pair["ratio"].cell(3))
    long = out.get("long")
    if long:
        early, end, froze = long["early"], long["end"], long["froze"]
        costs.add(f"parent RSS / USS MiB, after {long['early_runs']} runs → after {long['runs']} "
                  f"({long['restarts']} children replaced)",
                  f"{early['rss'] / MIB:.1f} / {early['uss'] / MIB:.1f} → {end['rss'] / MIB:.1f} / "
                  f"{end['uss'] / MIB:.1f}")
        if froze:
            later = [ms for _count, ms in froze[1:]]
            costs.add(f"objects frozen at the first fork → at the last ({len(froze)} forks)",
                      f"{froze[0][0]:,} → {froze[-1][0]:,}")
            if later:
                later.sort()
                costs.add("collect + freeze before a replacement fork, ms, median (max)",
                          f"{later[len(later) // 2]:.2f} ({later[-1]:.2f})")
    section.tables.append(costs)
    if pair and pair["ratio"]:
        ratio = pair["ratio"].median or 0.0
        section.notes.append(f"Target (the freeze's cost per run, paired, ≤ 1 %): **{'met' if ratio >= 0.99 else 'missed'}** "
                             f"(runs/s on ÷ off {ratio:.3f}).")
    return section

