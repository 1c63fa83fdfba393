"""The workflows every benchmark case runs, importable by subprocesses
(``--app bench.workloads`` with the repository root on ``PYTHONPATH``).

The shapes are deliberately trivial so that what is measured is the engine:
``noop3`` is three recorded no-op steps passing a small payload along,
``cpu1`` is one pure-Python CPU-bound step, ``stamp1`` records when its
first step started (pickup latency), and ``noop100`` is a hundred no-op steps
(per-step overhead). The peers (DBOS, Procrastinate) run the same payloads
from ``bench.peer_dbos`` and ``bench.peer_procrastinate``.
"""

from __future__ import annotations

import time

import everystep
from everystep import patched, step, workflow


def burn(iterations: int) -> int:
    """Pure-Python CPU work that holds the GIL for its whole duration."""
    total = 0
    for i in range(iterations):
        total = (total + i * i) % 1_000_003
    return total


def payload(i: int) -> dict:
    """The arguments of run ``i`` of the throughput shape (same for peers)."""
    return {"i": i, "tag": "bench"}


@step
def noop(value: dict) -> dict:
    return value


@workflow
def noop3(args: dict) -> dict:
    a = noop(args)
    b = noop(a)
    return noop(b)


@workflow
def noop3_twin(args: dict) -> dict:
    """``noop3`` under another name: ``bench.patch_cost``'s control, whose
    ratio to ``noop3`` is the noise of the measurement."""
    a = noop(args)
    b = noop(a)
    return noop(b)


@workflow
def noop3_patched(args: dict) -> dict:
    """``noop3`` with two patch points, both on the new path (``bench.patch_cost``)."""
    a = noop(args)
    if patched("bench-a"):
        a = noop(a)
    else:
        a = noop(dict(a))
    b = a if patched("bench-b") else dict(a)
    return noop(b)


@workflow
def noop1(args: dict) -> dict:
    return noop(args)


@step
def cpu_step(iterations: int) -> int:
    return burn(iterations)


@workflow
def cpu1(iterations: int) -> int:
    return cpu_step(iterations)


@step
def stamp() -> float:
    """Wall-clock time at the start of the run's first step."""
    return time.time()


@workflow
def stamp1() -> float:
    return stamp()


@workflow
def recv_stamp() -> float:
    """Waits for a message on "go", then records when its next step started
    (case 12: the send's commit to the resumed run's next step)."""
    everystep.recv("go")
    return stamp()


@step
def replayed(i: int) -> int:
    """One of ``resumer``'s recorded steps (written straight into the table)."""
    return i


@workflow
def resumer(n: int, resumes: int) -> int:
    """``n`` recorded steps, then ``resumes`` times a ``recv("go")`` and the
    step after it, stamped (case 18: what a resume costs per recorded step)."""
    for i in range(n):
        replayed(i)
    for _ in range(resumes):
        everystep.recv("go")
        stamp()
    return n


@workflow
def noop100(count: int) -> int:
    for _ in range(count):
        noop_plain()
    return count


@step
def noop_plain() -> None:
    return None


# -- case 19: streams -----------------------------------------------------------------


@step
def stream_stamps(count: int, gap_low: float, gap_high: float, seed: int) -> int:
    """Writes ``count`` values to stream "stamps" from its code, each the
    time just before its write, with random gaps between them."""
    import random

    rng = random.Random(seed)
    for _ in range(count):
        time.sleep(rng.uniform(gap_low, gap_high))
        everystep.write_stream("stamps", time.time())
    return count


@workflow
def streamer(count: int, gap_low: float, gap_high: float, seed: int) -> int:
    """Case 19's latency run: one step writing stamped values."""
    return stream_stamps(count, gap_low, gap_high, seed)


@step
def stream_burst_step(count: int) -> float:
    """Writes ``count`` values to stream "burst" from its code as fast as it
    can; returns when it began (``time.time()``: the last value's
    ``written_at`` says when they were all written)."""
    started = time.time()
    for i in range(count):
        everystep.write_stream("burst", i)
    return started


@workflow
def stream_burst(count: int) -> float:
    """Case 19's rate run, in one step."""
    return stream_burst_step(count)


@step
def now() -> float:
    return time.time()


@workflow
def stream_burst_body(count: int) -> float:
    """Case 19's rate run from the body: each write a recorded step."""
    started = now()
    for i in range(count):
        everystep.write_stream("burst", i)
    return started
