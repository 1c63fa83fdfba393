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

    @classmethod
    def for_mode(cls, quick: bool) -> Settings:
        if not quick:
            return cls()
        return cls(
            quick=True, throughput_runs=200, pgbench_seconds=1.0, cpu_runs=4, cpu_seconds=0.15,
            latency_notify_runs=60, latency_poll_runs=30, peer_reps=1, peer_runs=200,
            overhead_steps=100, overhead_reps=3, respawn_reps=3, memory_procs=2,
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
