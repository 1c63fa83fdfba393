"""``supervisor.memory``: what a child owns, and how often smaps is read."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import psutil

from supervisor.ctl import render_status
from supervisor.memory import RSS_SLACK, Footprint, MemorySampler, measure
from supervisor.protocol import ChildStatus, StatusReply

MIB = 1 << 20


@dataclass
class FakeProcess:
    """Answers like ``psutil.Process``; counts the smaps readings."""

    rss: int
    uss: int
    full_reads: int = 0
    denied: bool = False
    calls: list[str] = field(default_factory=list)

    def memory_info(self) -> Any:
        return SimpleNamespace(rss=self.rss)

    def memory_full_info(self) -> Any:
        if self.denied:
            raise psutil.AccessDenied(1)
        self.full_reads += 1
        return SimpleNamespace(rss=self.rss, uss=self.uss, pss=(self.rss + self.uss) // 2)


def test_owned_is_the_uss_where_known_else_the_rss() -> None:
    assert Footprint(rss=300 * MIB, uss=12 * MIB, pss=50 * MIB).owned == 12 * MIB
    assert Footprint(rss=300 * MIB).owned == 300 * MIB


def test_measure_falls_back_to_rss_where_smaps_is_unreadable() -> None:
    process = FakeProcess(rss=300 * MIB, uss=12 * MIB, denied=True)
    assert measure(process) == Footprint(rss=300 * MIB)  # type: ignore[arg-type]


def test_smaps_is_read_again_when_due_or_when_rss_moved() -> None:
    process = FakeProcess(rss=300 * MIB, uss=12 * MIB)
    sampler = MemorySampler(every=5.0)
    assert sampler.sample(process, now=0.0).uss == 12 * MIB  # type: ignore[arg-type]
    process.uss, process.rss = 14 * MIB, 300 * MIB + RSS_SLACK // 2
    held = sampler.sample(process, now=1.0)  # type: ignore[arg-type]
    assert (held.rss, held.uss, process.full_reads) == (300 * MIB + RSS_SLACK // 2, 12 * MIB, 1)
    assert sampler.sample(process, now=5.0).uss == 14 * MIB and process.full_reads == 2  # type: ignore[arg-type]
    process.rss, process.uss = 600 * MIB, 300 * MIB  # a step kept 300 MiB: read at once
    assert sampler.sample(process, now=5.1).uss == 300 * MIB and process.full_reads == 3  # type: ignore[arg-type]


def test_ctl_status_shows_what_each_child_owns_beside_its_rss() -> None:
    child = ChildStatus(slot=1, pid=4242, state="idle", run_id=None, workflow=None, step_id=None, step_name=None,
                        step_seconds=None, steps_in_flight=0, run_seconds=None, rss=283 * MIB, cpu_percent=0.0,
                        runs_done=12, uss=11 * MIB, pss=64 * MIB)
    reply = StatusReply(pid=1, name="vm", procs=1, draining=False, uptime=5.0, database="sqlite", ready=0, runs={},
                        restarts={}, children=[child])
    header, row = render_status(reply).splitlines()[1:3]
    assert header.split()[-4:] == ["USS", "RSS", "CPU", "DONE"]
    assert row.split()[-4:] == ["11M", "283M", "0%", "12"]
