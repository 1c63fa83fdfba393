"""Case 9, retention: ``everystep prune`` deleting a large history while a
supervisor works next to it.

The database holds ``prune_history`` finished runs (three steps each,
finished 31–90 days ago; inherited from case 7 or loaded here). A
supervisor (``--procs 2``) works the 3-step workflow from a queue that a
feeder thread keeps topped up (COPY + NOTIFY whenever fewer than a few
thousand runs wait), so it is never short of work. Its completions are
read from ``ctl status`` every 0.25 s. Three phases: without the prune,
during ``everystep prune --older-than 30d`` (the real command, in its own
process, default batch of 10,000), and after it. Wait events and
ungranted locks are sampled throughout.
"""

from __future__ import annotations

import subprocess
import threading
import time

import psycopg

from . import bulk, fleet, history_depth, procs
from .context import Context
from .report import Section, Table
from .stats import fmt

RUN_NAME = "bench.workloads.noop3"
TOP_UP = 3000


class Feeder(threading.Thread):
    """Keeps at least ``TOP_UP`` runs of the measured workflow scheduled."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.loaded = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop_event.is_set():
                waiting = int(conn.execute("SELECT count(*) FROM everystep_workflow WHERE status = 'scheduled'"
                                           " AND name = %s", (RUN_NAME,)).fetchone()[0])
                if waiting < TOP_UP:
                    bulk.load_scheduled(self.url, TOP_UP, RUN_NAME, first_index=self.loaded, notify=True)
                    self.loaded += TOP_UP
                self._stop_event.wait(0.25)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)


def history_count(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute("SELECT count(*) FROM everystep_workflow WHERE claimed_by = %s",
                                (bulk.HISTORY_RUNNER,)).fetchone()[0])


def run(ctx: Context) -> None:
    s = ctx.settings
    url = history_depth.history_url(ctx, s.prune_history)
    out = ctx.results.setdefault("case9", {})
    history_depth.cleanup(url)
    have = history_count(url)
    if have < s.prune_history:
        seconds = bulk.load_history(url, s.prune_history - have)
        bulk.vacuum_analyze(url)
        ctx.log(f"case 9: loaded {s.prune_history - have:,} finished runs in {seconds:.1f}s")
    history = history_count(url)
    out["history"] = history
    group = fleet.Fleet(ctx, url, 1, 2, label="prune", extra=("--poll", "600")).start()
    feeder = Feeder(url)
    sampler = fleet.WaitSampler(url, interval=0.1)
    samples: list[tuple[float, int]] = []
    marks: dict[str, float] = {}

    def tick() -> None:
        samples.append((time.monotonic(), group.counts().get("completed", 0)))

    def phase(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            tick()
            time.sleep(0.25)

    try:
        feeder.start()
        sampler.start()
        phase(1.0)  # warm-up, not measured
        marks["before"] = time.monotonic()
        phase(s.prune_phase_seconds)
        marks["prune"] = time.monotonic()
        lock_before = (sampler.lock_waits, sampler.samples)
        log = ctx.work.log("prune")
        with open(log, "wb") as handle:
            pruner = subprocess.Popen(
                procs.python("-m", "everystep.cli", "prune", "--older-than", "30d", "--database", url),
                stdout=handle, stderr=subprocess.STDOUT, env=procs.env(), cwd=procs.ROOT)
            while pruner.poll() is None:
                tick()
                time.sleep(0.25)
        marks["after"] = time.monotonic()
        lock_during = (sampler.lock_waits - lock_before[0], sampler.samples - lock_before[1])
        if pruner.returncode != 0:
            raise procs.BenchError(f"everystep prune exited with {pruner.returncode}\n{procs.tail(log)}")
        phase(s.prune_phase_seconds)
        marks["end"] = time.monotonic()
    finally:
        sampler.stop()
        feeder.stop()
        group.stop()
    out["prune_seconds"] = marks["after"] - marks["prune"]
    out["prune_output"] = procs.tail(log, 2)
    out["lock_waits_during"] = lock_during[0] / max(lock_during[1], 1)
    out["waits"] = sampler.summary()
    for name, start, end in (("before", "before", "prune"), ("during", "prune", "after"), ("after", "after", "end")):
        out[name] = _rate(samples, marks[start], marks[end])
    left = history_count(url)
    out["left"] = left
    ctx.log(f"case 9: pruned {history - left:,} runs in {out['prune_seconds']:.1f}s; supervisor runs/s before "
            f"{out['before']:,.0f}, during {out['during']:,.0f}, after {out['after']:,.0f}")
    history_depth.cleanup(url)


def _rate(samples: list[tuple[float, int]], start: float, end: float) -> float:
    inside = [(t, c) for t, c in samples if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return float("nan")
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def section(ctx: Context) -> Section:
    s = ctx.settings
    out = ctx.results.get("case9", {})
    section = Section(
        "case9", "Case 9 — retention: pruning a large history beside a working supervisor",
        method=(
            f"The database holds {out.get('history', s.prune_history):,} finished runs (three steps each, finished "
            "31–90 days ago). One supervisor (`--procs 2`) works the 3-step workflow from a queue a feeder keeps "
            "topped up (COPY + NOTIFY). Its completions are read from `ctl status` every 0.25 s. Phases: "
            f"{s.prune_phase_seconds:g} s without pruning, then `everystep prune --older-than 30d` (its own "
            f"process, default batch 10,000) until it exits, then {s.prune_phase_seconds:g} s after. One run; the "
            "rates are completions over each phase."
        ),
    )
    table = Table(["phase", "supervisor runs/s", "vs before"])
    before = out.get("before")
    for name in ("before", "during", "after"):
        value = out.get(name)
        vs = f"{(value / before - 1) * 100:+.0f} %" if value and before else "n/a"
        table.add({"before": "without prune", "during": "during prune", "after": "after prune"}[name],
                  fmt(value), vs)
    section.tables.append(table)
    if "prune_seconds" in out:
        deleted = out.get("history", 0) - out.get("left", 0)
        prune = Table(["prune", "value"])
        prune.add("runs deleted (with 3 steps each)", f"{deleted:,}")
        prune.add("wall time s", fmt(out["prune_seconds"], 1))
        prune.add("runs deleted per second", fmt(deleted / out["prune_seconds"] if out["prune_seconds"] else None))
        prune.add("ungranted locks during the prune, mean per sample", fmt(out.get("lock_waits_during"), 3))
        prune.add("its last output line", "`" + out.get("prune_output", "").splitlines()[-1] + "`"
                  if out.get("prune_output") else "")
        section.tables.append(prune)
    return section
