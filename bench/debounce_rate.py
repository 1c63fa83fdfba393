"""Case 20, debounced scheduling: how many ``schedule(..., debounce=)``
calls per second concurrent schedulers make, on one key and on many keys,
beside plain ``schedule()`` in the same run, on PostgreSQL and on SQLite.

W scheduler processes (forked, each with its own connection, started
together on a barrier) make N calls each, as fast as they can, with a
window long enough that none closes during the measurement:

- **one key**: every call on the same key. The first opens the window and
  every other folds into its run: each call takes the key's row lock (an
  upsert) and updates the run, so calls on one key queue behind each other
  on every backend. The run's ``debounce_calls`` is checked to equal W × N
  afterwards (no call lost).
- **many keys**: every call on a key of its own: each opens a window (the
  key's row and the run inserted), and nothing waits for another key.
- **plain**: ``schedule()`` without debounce, the same W × N calls: one
  insert each, what the other two are read against.

Rate = every call made ÷ (the last scheduler's end − the first one's start).
Each shape is repeated ``reps`` times, the shapes taking turns; tables show
the median and the range. SQLite takes one writer at a time whatever the
key, so there the three differ by their statements only.

``python -m bench.debounce_rate [--database URL] [--workers W] [--calls N] [--reps R]``
runs it alone (default: SQLite in a temporary file; give a scratch
PostgreSQL database's URL for the other).
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from everystep import Debounce, schedule  # noqa: E402
from everystep.store import connect  # noqa: E402
from tests.support.debounce_hammer import debounced  # noqa: E402

from .report import Section, Table  # noqa: E402
from .stats import Series, fmt_ratio, ratio  # noqa: E402

SHAPES = ("one key", "many keys", "plain")
#: Long enough that no window closes while the schedulers run.
PERIOD = 3600.0


@dataclass
class Rates:
    """One backend's measurements: schedules/s per shape, over repetitions,
    and whether every one-key repetition folded every call into one run."""

    workers: int
    calls: int
    rates: dict[str, Series] = field(default_factory=lambda: {shape: Series() for shape in SHAPES})
    folded_ok: list[bool] = field(default_factory=list)


def _scheduler(url: str, shape: str, tag: str, worker: int, calls: int, barrier: Any, out: Any) -> None:
    """One scheduler process: its own store, one warm-up call (the
    connection opened, the statements parsed), then ``calls`` timed ones."""
    store = connect(url)
    try:
        key = f"{tag}-one"
        schedule(debounced, "warm-up", worker, database=store, debounce=Debounce(f"{tag}-warm-{worker}", PERIOD))
        barrier.wait(timeout=120)
        started = time.perf_counter()
        for call in range(calls):
            if shape == "one key":
                schedule(debounced, f"w{worker}", call, database=store, debounce=Debounce(key, PERIOD))
            elif shape == "many keys":
                schedule(debounced, f"w{worker}", call, database=store,
                         debounce=Debounce(f"{tag}-{worker}-{call}", PERIOD))
            else:
                schedule(debounced, f"w{worker}", call, database=store)
        out.put((started, time.perf_counter()))
    finally:
        store.close()


def _one(url: str, shape: str, workers: int, calls: int) -> tuple[float, bool | None]:
    """One repetition of ``shape``: schedules/s, and for one key whether
    its run holds every call."""
    tag = uuid.uuid4().hex[:12]
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_scheduler, args=(url, shape, tag, n, calls, barrier, out)) for n in range(workers)]
    for proc in procs:
        proc.start()
    spans = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        if proc.exitcode != 0:
            raise RuntimeError(f"a scheduler exited with {proc.exitcode}")
    elapsed = max(end for _, end in spans) - min(start for start, _ in spans)
    folded: bool | None = None
    if shape == "one key":
        store = connect(url)
        try:
            first = schedule(debounced, "check", 0, database=store, debounce=Debounce(f"{tag}-one", PERIOD))
            folded = first.debounce_calls == workers * calls + 1
        finally:
            store.close()
    return workers * calls / elapsed, folded


def measure(url: str, workers: int, calls: int, reps: int) -> Rates:
    """Every shape ``reps`` times, taking turns (the parent holds no
    connection while it forks)."""
    store = connect(url)
    store.migrate()
    store.close()
    rates = Rates(workers, calls)
    for _ in range(reps):
        for shape in SHAPES:
            rate, folded = _one(url, shape, workers, calls)
            rates.rates[shape].add(rate)
            if folded is not None:
                rates.folded_ok.append(folded)
    return rates


def table(rates: Rates, caption: str) -> Table:
    out = Table(["shape", "schedules/s (median, range)", "÷ plain schedule (median)", "repetitions"],
                caption=f"{caption}: {rates.workers} scheduler processes × {rates.calls:,} calls each.")
    plain = rates.rates["plain"].median
    for shape in SHAPES:
        series = rates.rates[shape]
        out.add(shape, series.cell(0), fmt_ratio(ratio(series.median, plain)) if shape != "plain" else "1.00×",
                len(series.values))
    return out


def note(rates: Rates, name: str) -> str:
    ok = rates.folded_ok and all(rates.folded_ok)
    return (f"{name}, one key: every call folded into the window's one run in "
            f"{sum(rates.folded_ok)} of {len(rates.folded_ok)} repetitions"
            + ("" if ok else " (**a call was lost**)") + ".")


def run(ctx: Any) -> None:
    mode = ctx.settings.mode
    workers = 4 if mode != "smoke" else 2
    calls = {"full": 2000, "quick": 400}.get(mode, 20)
    reps = 3 if mode == "full" else 2 if mode == "quick" else 1
    ctx.results["case20"] = {}
    for label, url in (("postgres", ctx.urls["debounce"]), ("sqlite", f"sqlite:///{ctx.work.path / 'debounce.db'}")):
        rates = measure(url, workers, calls, reps)
        ctx.results["case20"][label] = rates
        ctx.log(f"case 20 {label}: " + ", ".join(
            f"{shape} {series.median:.0f}/s" for shape, series in rates.rates.items() if series.median))


def section(ctx: Any) -> Section:
    found = ctx.results.get("case20") or {}
    section = Section(
        "case20", "Case 20 — debounced scheduling",
        method=(
            "W forked scheduler processes, each with its own connection, released together; each makes N "
            "`schedule()` calls as fast as it can. *One key*: every call `debounce=Debounce(key, 3600)` on the "
            "same key (one window: each call takes the key's row lock and folds into its run); *many keys*: "
            "each call a key of its own (each opens a window); *plain*: no debounce. Rate = every call ÷ (last "
            "end − first start); the shapes take turns, repeated; median and range shown."
        ),
    )
    for label, name in (("postgres", "PostgreSQL"), ("sqlite", "SQLite")):
        rates = found.get(label)
        if not rates:
            continue
        section.tables.append(table(rates, name))
        section.notes.append(note(rates, name))
    return section


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.debounce_rate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", help="a scratch database's URL (default: SQLite in a temporary file)")
    parser.add_argument("--workers", type=int, default=4, help="scheduler processes (default 4)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per scheduler (default 2000)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each shape (default 3)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="everystep-debounce-") as tmp:
        url = args.database or f"sqlite:///{Path(tmp) / 'debounce.db'}"
        rates = measure(url, args.workers, args.calls, args.reps)
    name = url.split(":", 1)[0]
    print(table(rates, name).markdown())
    print(note(rates, name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
