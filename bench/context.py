"""What every case gets: the sizes for this mode, the server, the
databases, a work directory, and a place to leave results for other cases."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .pg import BenchServer
from .procs import Workdir


@dataclass(frozen=True)
class Settings:
    quick: bool = False
    mode: str = "full"
    procs: tuple[int, ...] = (1, 2, 4)
    reps: int = 3
    throughput_runs: int = 2000
    pgbench_seconds: float = 4.0
    cpu_runs: int = 8
    cpu_seconds: float = 0.5
    latency_notify_runs: int = 500
    latency_poll_runs: int = 500
    notify_gap: tuple[float, float] = (0.010, 0.030)
    poll_gap: tuple[float, float] = (0.040, 0.080)
    peer_reps: int = 3
    peer_runs: int = 2000
    overhead_steps: int = 100
    overhead_reps: int = 5
    respawn_reps: int = 5
    memory_procs: int = 4
    depth_history: tuple[int, ...] = (0, 100_000, 1_000_000)
    depth_backlog: tuple[int, ...] = (10_000, 100_000)
    depth_runs: int = 2000
    depth_probes: int = 400
    depth_reps: int = 2
    history_reps: int = 5
    scale_supervisors: tuple[int, ...] = (1, 2, 4, 8)
    scale_single_procs: int = 8
    scale_runs: int = 3000
    scale_reps: int = 3
    prune_history: int = 1_000_000
    prune_phase_seconds: float = 6.0
    profile_runs: int = 3000
    #: Case 10's accounting windows, each bracketed by pgbench (the CPU bars' repetitions).
    profile_windows: int = 3
    lever_runs: int = 300
    against_runs: int = 2000
    against_reps: int = 6
    #: Case 17: the app's heap (MiB), the worker counts, the burst per
    #: worker, the paired per-run cost, and the parent's long burst.
    heap_mb: int = 270
    tree_procs: tuple[int, ...] = (2, 4, 8)
    tree_runs_per_child: int = 100
    freeze_pair_runs: int = 500
    freeze_pair_reps: int = 4
    long_burst_runs: int = 5000
    long_burst_runs_per_child: int = 25

    @classmethod
    def for_mode(cls, quick: bool, smoke: bool = False) -> Settings:
        """``full``; ``quick``: fewer runs and repetitions, the same cases;
        ``smoke``: the smallest sizes that still run every case and write
        every table, for the test suite (its figures mean nothing)."""
        if smoke:
            return cls(
                quick=True, mode="smoke", procs=(1, 2), reps=1, throughput_runs=30, pgbench_seconds=0.5,
                cpu_runs=2, cpu_seconds=0.05, latency_notify_runs=10, latency_poll_runs=5, peer_reps=1,
                peer_runs=30, overhead_steps=20, overhead_reps=1, respawn_reps=1, memory_procs=2,
                depth_history=(0, 2_000), depth_backlog=(500,), depth_runs=50, depth_probes=10, depth_reps=1,
                history_reps=1, scale_supervisors=(1, 2), scale_single_procs=2, scale_runs=60, scale_reps=1,
                prune_history=2_000, prune_phase_seconds=0.5, profile_runs=60, profile_windows=1, lever_runs=20,
                against_runs=30, against_reps=1, heap_mb=16, tree_procs=(2,), tree_runs_per_child=5,
                freeze_pair_runs=20, freeze_pair_reps=1, long_burst_runs=40, long_burst_runs_per_child=5,
            )
        if not quick:
            return cls()
        return cls(
            quick=True, mode="quick", throughput_runs=200, pgbench_seconds=1.0, cpu_runs=4, cpu_seconds=0.15,
            latency_notify_runs=60, latency_poll_runs=30, peer_reps=1, peer_runs=200,
            overhead_steps=100, overhead_reps=3, respawn_reps=3, memory_procs=2,
            depth_history=(0, 20_000), depth_backlog=(2_000,), depth_runs=300, depth_probes=60, depth_reps=1,
            history_reps=1,
            scale_supervisors=(1, 2), scale_single_procs=4, scale_runs=300, scale_reps=1,
            prune_history=20_000, prune_phase_seconds=1.5, profile_runs=1000, lever_runs=60,
            against_runs=1000, against_reps=3, tree_runs_per_child=50, freeze_pair_runs=400, freeze_pair_reps=2,
            long_burst_runs=1000,
        )


@dataclass
class Context:
    settings: Settings
    server: BenchServer
    work: Workdir
    pgbench: str | None
    urls: dict[str, str] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def log(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[bench {elapsed:6.1f}s] {message}", flush=True)
