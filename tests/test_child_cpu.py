"""``ctl status``'s CPU column: a child's CPU% over a real interval.

Sampled over a few milliseconds (two status requests in a row), CPU% is
the kernel's tick granularity: a child spinning in pure Python read 0 %
and a single-threaded one 163 %. ``CpuSampler`` measures over at least
``CPU_WINDOW`` of wall time and answers the last full window in between.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from supervisor.children import CPU_WINDOW, Child, CpuSampler
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(120)]


@pytest.mark.parametrize("samples, expected", [
    # (monotonic seconds, CPU seconds used so far) ... -> the answer after the last one
    ([(0.0, 0.0)], None),  # nothing measured yet
    ([(0.0, 0.0), (0.005, 0.01)], None),  # 5 ms apart: one tick would read 200 %, so no answer
    ([(0.0, 0.0), (1.0, 1.0)], 100.0),
    ([(0.0, 0.0), (2.0, 0.5)], 25.0),
    ([(0.0, 0.0), (1.0, 1.0), (1.004, 1.0)], 100.0),  # within the window: the last full window's answer
    ([(0.0, 0.0), (1.0, 0.0), (2.0, 2.0)], 200.0),  # two busy threads
    ([(0.0, 5.0), (1.0, 4.0)], 0.0),  # never negative
])
def test_cpu_is_measured_over_a_full_window(samples: list[tuple[float, float]], expected: float | None) -> None:
    sampler = CpuSampler()
    answer = None
    for now, used in samples:
        answer = sampler.sample(now, used)
    assert answer == expected


def test_a_child_spinning_in_python_reads_busy_and_at_most_one_core() -> None:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        child = Child(slot=0, pid=spinner.pid, channel=None)  # type: ignore[arg-type]
        readings: list[float] = []

        def measured() -> bool:
            # Two status requests in a row, then a pause: the second of each
            # pair is the case that read 0 % or 163 % before.
            for _ in range(2):
                cpu = child.usage()["cpu_percent"]
                if cpu is not None:
                    readings.append(cpu)
            time.sleep(CPU_WINDOW / 4)
            return len(readings) >= 8

        wait_until(measured, "eight CPU readings", timeout=60)
    finally:
        spinner.kill()
        spinner.wait(30)
    # Busy (however loaded the machine, it got some CPU), never more than the
    # one core a single thread can use (a tick of slack over the window).
    assert all(0.0 < cpu <= 102.0 for cpu in readings), readings
