"""Supervisors under measurement, and what is sampled while they work.

A ``Fleet`` is one or more ``everystep-supervisor`` processes (not in
burst mode) on one database. The scale cases start it, wait until every
child is idle, take a ``Snapshot`` (CPU of every process in the
supervisors' trees and in the PostgreSQL server's tree, each supervisor's
run counters), make work appear, wait for it through the control sockets
(no query on a table that may hold a million rows), and snapshot again.

CPU comes from psutil: user + system seconds of each process, remembered
at every sample so that a process that exits between samples (an
autovacuum worker, a recycled child) still counts up to its last sample.
The ``WaitSampler`` polls ``pg_stat_activity`` and ``pg_locks`` every
``interval`` seconds on its own connection: which wait events the
database's active backends are in, and how many lock requests wait.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Any

import psutil
import psycopg

from . import procs
from .context import Context
from .procs import Proc

APP = "bench.workloads"


def postmaster_pid(url: str) -> int | None:
    """The server's postmaster, if it runs on this machine."""
    with psycopg.connect(url, autocommit=True) as conn:
        backend = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        # Ask while the connection is open: its backend exits with it.
        with contextlib.suppress(psutil.Error):
            return psutil.Process(backend).ppid()
    return None


class CpuMeter:
    """Cumulative CPU seconds of process trees, sampled on demand."""

    def __init__(self, roots: list[tuple[str, int | None]], exclude: set[int] | None = None) -> None:
        self.roots = [(label, pid) for label, pid in roots if pid]
        self.exclude = exclude or set()
        self._last: dict[tuple[str, int, float], tuple[float, str]] = {}
        self._lock = threading.Lock()

    def sample(self) -> None:
        for label, root in self.roots:
            try:
                parent = psutil.Process(root)
                tree = [parent, *parent.children(recursive=True)]
            except psutil.Error:
                continue
            for process in tree:
                if process.pid in self.exclude:
                    continue
                try:
                    times = process.cpu_times()
                    key = (label, process.pid, process.create_time())
                    role = label + (":parent" if process.pid == root else ":children")
                    with self._lock:
                        self._last[key] = (times.user + times.system, role)
                except psutil.Error:
                    continue

    def totals(self) -> dict[str, float]:
        """CPU seconds by label and by label:role (parent / children)."""
        out: dict[str, float] = collections.defaultdict(float)
        with self._lock:
            for (label, _pid, _created), (seconds, role) in self._last.items():
                out[label] += seconds
                out[role] += seconds
        return dict(out)


@contextlib.contextmanager
def sampled_cpu(roots: list[tuple[str, int | None]], interval: float = 0.05) -> Iterator[dict[str, float]]:
    """CPU seconds each labelled process tree used over the block (filled in
    when it ends), sampled every ``interval`` seconds: a backend that exits
    with its client takes its CPU time along, so it is read while it lives."""
    meter = CpuMeter(roots)
    meter.sample()
    before = meter.totals()
    used: dict[str, float] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(interval):
            meter.sample()

    sampler = threading.Thread(target=sample, name="cpu-sampler", daemon=True)
    sampler.start()
    try:
        yield used
    finally:
        stop.set()
        sampler.join()
        meter.sample()
        used.update({label: seconds - before.get(label, 0.0) for label, seconds in meter.totals().items()})


class WaitSampler(threading.Thread):
    """Samples wait events and lock waits of one database's backends."""

    def __init__(self, url: str, interval: float = 0.05, meter: CpuMeter | None = None) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.interval = interval
        self.meter = meter
        self.samples = 0
        self.active = 0
        self.events: collections.Counter[str] = collections.Counter()
        self.lock_waits = 0
        self.max_lock_waits = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            me = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
            if self.meter is not None:
                self.meter.exclude.add(me)  # the sampler's own backend is not under test
            while not self._stop_event.is_set():
                rows = conn.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity"
                    " WHERE datname = current_database() AND state = 'active' AND pid <> %s", (me,)
                ).fetchall()
                waiting = int(conn.execute(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE NOT l.granted AND a.datname = current_database()").fetchone()[0])
                self.samples += 1
                self.active += len(rows)
                self.events.update(row[0] for row in rows)
                self.lock_waits += waiting
                self.max_lock_waits = max(self.max_lock_waits, waiting)
                if self.meter is not None:
                    self.meter.sample()
                self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)

    def summary(self) -> dict[str, float]:
        n = max(self.samples, 1)
        out = {"samples": float(self.samples), "active_mean": self.active / n,
               "lock_waits_mean": self.lock_waits / n, "lock_waits_max": float(self.max_lock_waits)}
        for event, count in self.events.items():
            out[f"event:{event}"] = count / n
        return out


@dataclass
class Fleet:
    """``supervisors`` processes of ``procs`` children each."""

    ctx: Context
    url: str
    supervisors: int
    procs: int
    label: str
    extra: tuple[str, ...] = ()
    members: list[tuple[Proc, str, str]] = field(default_factory=list)

    def start(self) -> Fleet:
        for index in range(self.supervisors):
            socket_path = self.ctx.work.socket()
            name = f"{self.label}-{index}"
            cmd = procs.supervisor_cmd(self.url, self.procs, socket_path, app=APP, name=name, burst=False,
                                       extra=self.extra)
            self.members.append((Proc(cmd, self.ctx.work.log(f"fleet-{name}")), socket_path, name))
        for proc, socket_path, _name in self.members:
            try:
                procs.wait_children_idle(socket_path, self.procs, timeout=60)
            except procs.BenchError as exc:
                raise procs.BenchError(f"{exc}\n{procs.tail(proc.log)}") from None
        return self

    @property
    def names(self) -> list[str]:
        return [name for _proc, _socket, name in self.members]

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc, _socket, _name in self.members]

    def counts(self) -> dict[str, int]:
        """The supervisors' run counters, summed (``ctl status``)."""
        total: collections.Counter[str] = collections.Counter()
        for _proc, socket_path, _name in self.members:
            reply = procs.ctl(socket_path, {"cmd": "status"})
            total.update({key: int(value) for key, value in reply.get("runs", {}).items()})
        return dict(total)

    def wait_completed(self, target: int, timeout: float, on_tick: Any = None) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        while True:
            counts = self.counts()
            if counts.get("completed", 0) >= target:
                return counts
            if time.monotonic() > deadline:
                raise procs.BenchError(f"{self.label}: {counts.get('completed', 0)} of {target} runs completed "
                                       f"within {timeout:.0f}s")
            for proc, _socket, _name in self.members:
                if proc.popen.poll() is not None:
                    raise procs.BenchError(f"{proc.describe()} exited\n{procs.tail(proc.log)}")
            if on_tick is not None:
                on_tick()
            time.sleep(0.05)

    def stop(self) -> None:
        for proc, _socket, _name in self.members:
            proc.signal(15)
        for proc, _socket, _name in self.members:
            proc.stop(timeout=60)


def rate(url: str, claimers: list[str], name: str = "bench.workloads.noop3") -> dict[str, float]:
    """Runs completed by ``claimers`` and the rate over first claim → last completion."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*), extract(epoch FROM max(completed_at) - min(claimed_at))"
            " FROM everystep_workflow WHERE status = 'completed' AND name = %s AND claimed_by = ANY(%s)",
            (name, claimers)).fetchone()
    runs, seconds = int(row[0]), float(row[1] or 0.0)
    return {"runs": float(runs), "seconds": seconds, "runs_per_s": runs / seconds if seconds > 0 else float("nan")}


@dataclass
class Window:
    """One measured stretch of work: CPU, counters, waits and the rate."""

    runs: int
    seconds: float
    cpu: dict[str, float]
    counts: dict[str, int]
    waits: dict[str, float]
    rate: dict[str, float]

    def per_run_us(self, key: str) -> float:
        return self.cpu.get(key, 0.0) / self.runs * 1e6 if self.runs else float("nan")


def measure_window(fleet: Fleet, url: str, runs: int, make_work: Any, timeout: float,
                   name: str = "bench.workloads.noop3") -> Window:
    """Snapshot, ``make_work()``, wait for ``runs`` more completions, snapshot."""
    server = postmaster_pid(url)
    meter = CpuMeter([("python", pid) for pid in fleet.pids] + [("postgres", server)])
    meter.sample()
    before_cpu = meter.totals()
    before = fleet.counts()
    sampler = WaitSampler(url, meter=meter)
    sampler.start()
    started = time.monotonic()
    try:
        make_work()
        after = fleet.wait_completed(before.get("completed", 0) + runs, timeout)
    finally:
        sampler.stop()
    seconds = time.monotonic() - started
    meter.sample()
    after_cpu = meter.totals()
    cpu = {key: after_cpu.get(key, 0.0) - before_cpu.get(key, 0.0) for key in after_cpu}
    counts = {key: after.get(key, 0) - before.get(key, 0) for key in after}
    return Window(runs=runs, seconds=seconds, cpu=cpu, counts=counts, waits=sampler.summary(),
                  rate=rate(url, fleet.names, name))
