"""Case 6, the per-step cost of measuring steps (``supervisor.meter.ChildMeter``).

A supervisor child measures every step it runs (CPU from rusage, peak RSS
growth from a reset high-water mark) and stores both on the step's row. Two
measurements of what that adds to a step, in this process (the meter's
system calls are the same as in a child):

- **meter alone**: ``begin``/``call``/``end`` around a no-op step function,
  minus a direct call, over ``calls`` calls, in CPU and wall time, with the
  cost histograms live (``prometheus_client`` imported, as in a child); and
  the one read some kernels make it add (see ``meter_alone``). No database.
- **end to end**: the case's per-step overhead (``runner.execute`` of a
  ``noop100`` run, minus the 0-step run, minus direct calls, per step) with
  a meter and without one, the two taking turns repetition by repetition on
  the same database; the difference adds writing two more columns per row.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from everystep import runner
from everystep.store import connect
from supervisor.meter import ChildMeter

from .stats import Series
from .workloads import noop100, noop_plain

CLAIMER = "bench-step-cost"


def meter_alone(calls: int, reps: int) -> dict[str, Series]:
    """µs per step the meter adds around a no-op function, in CPU time
    (what it costs the process; steady on a shared machine) and in wall
    time; and the CPU time of the one read it adds on kernels that keep an
    exited thread's peak in ``ru_maxrss`` (``VmHWM`` from
    ``/proc/self/status``, see ``supervisor/meter.py``)."""
    meter = ChildMeter()
    ctx: Any = SimpleNamespace(workflow_id="bench", workflow_name=noop100.name)
    fn, step = noop_plain.fn, noop_plain
    out = {key: Series() for key in ("cpu", "wall", "hwm_cpu")}
    try:
        for rep in range(reps + 1):
            wall, cpu = time.perf_counter(), time.thread_time()
            for index in range(calls):
                gauge = meter.begin(ctx, str(index), step)
                gauge.call(fn, (), {})
                gauge.end()
            metered = time.perf_counter() - wall, time.thread_time() - cpu
            wall, cpu = time.perf_counter(), time.thread_time()
            for _ in range(calls):
                fn()
            direct = time.perf_counter() - wall, time.thread_time() - cpu
            cpu = time.thread_time()
            for _ in range(calls):
                meter.hwm()
            hwm = time.thread_time() - cpu
            if rep:  # the first round warms up (label children, page faults)
                out["wall"].add((metered[0] - direct[0]) / calls * 1e6)
                out["cpu"].add((metered[1] - direct[1]) / calls * 1e6)
                out["hwm_cpu"].add(hwm / calls * 1e6)
    finally:
        meter.close()
    return out


def _execute(store: Any, steps: int, meter: ChildMeter | None) -> float:
    store.schedule(noop100.name, f"[{steps}]")
    (run,) = store.claim(CLAIMER, 1, [noop100.name])
    start = time.perf_counter()
    status = runner.execute(store, run, claimer=CLAIMER, meter=meter)
    elapsed = time.perf_counter() - start
    if status != "completed":
        raise RuntimeError(f"step-cost run ended {status}")
    return elapsed


def end_to_end(url: str, steps: int, reps: int) -> dict[str, Series]:
    """Per-step overhead (µs) with and without a meter, and their difference
    within each repetition."""
    store = connect(url)
    meter = ChildMeter()
    out = {"with": Series(), "without": Series(), "added": Series()}
    try:
        store.migrate()
        for warm in (meter, None):
            _execute(store, steps, warm)
        for rep in range(reps):
            per_step = {}
            # Alternate which goes first, so drift on a shared machine hits both alike.
            for label, used in ((("with", meter), ("without", None)) if rep % 2 == 0
                                else (("without", None), ("with", meter))):
                full = _execute(store, steps, used)
                empty = _execute(store, 0, used)
                start = time.perf_counter()
                for _ in range(steps):
                    noop_plain.fn()
                direct = time.perf_counter() - start
                per_step[label] = (full - empty - direct) / steps * 1e6
                out[label].add(per_step[label])
            out["added"].add(per_step["with"] - per_step["without"])
    finally:
        meter.close()
        store.close()
    return out


def measure(url: str, steps: int, reps: int) -> dict[str, Any]:
    return {"alone_us": meter_alone(10_000, max(reps, 3)), "end_to_end": end_to_end(url, steps, max(reps, 3) * 2)}
