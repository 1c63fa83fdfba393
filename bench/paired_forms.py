"""Cases 13 and 14: two forms of one workload executed in process, on the
benchmark's PostgreSQL and on SQLite, paired within each repetition.

Each case module supplies ``measure(url, runs, reps)``, returning a
``Series`` per form (ms per run) and one ``ratio``; this module runs it on
both databases, tabulates it and gives it a command line.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from everystep import runner
from everystep.store import Store

from . import esdb
from .context import Context
from .report import Table
from .stats import Series

Measure = Callable[[str, int, int], dict[str, Series]]

DATABASES = (("pg", "PostgreSQL (benchmark setting: durable commit)"), ("sqlite", "SQLite (WAL, synchronous=NORMAL)"))


def alternate(store: Store, forms: dict[str, Any], runs: int, reps: int, claimer: str) -> dict[str, Series]:
    """ms per run of each of the two ``forms`` (label → workflow), which take
    turns going first, after a small warm-up batch of each; ``ratio`` is the
    second form's over the first's, within each repetition."""
    first, second = forms
    out = {first: Series(), second: Series(), "ratio": Series()}
    for label, wf in forms.items():  # warm up: connections, prepared statements
        _batch(store, wf, label, max(2, runs // 10), -1, claimer)
    for rep in range(reps):
        order = (first, second) if rep % 2 == 0 else (second, first)
        ms = {label: _batch(store, forms[label], label, runs, rep, claimer) / runs * 1000.0 for label in order}
        for label, value in ms.items():
            out[label].add(value)
        out["ratio"].add(ms[second] / ms[first])
    return out


def _batch(store: Store, wf: Any, label: str, runs: int, rep: int, claimer: str) -> float:
    """Seconds to execute ``runs`` runs of ``wf``, each claimed first
    (scheduling and claiming are outside the timing)."""
    for index in range(runs):
        store.schedule(wf.name, f'["{label}-{rep}-{index}"]')
    claimed = store.claim(claimer, runs, [wf.name])
    if len(claimed) != runs:
        raise RuntimeError(f"claimed {len(claimed)} of {runs} runs")
    start = time.perf_counter()
    for run in claimed:
        if runner.execute(store, run, claimer=claimer) != "completed":
            raise RuntimeError(f"a {label} run did not complete")
    return time.perf_counter() - start


def run_both(ctx: Context, key: str, measure: Measure, forms: tuple[str, str], sqlite_file: str) -> None:
    """``measure`` on the benchmark database and on a SQLite file, at the
    overhead cases' sizes."""
    s = ctx.settings
    out = ctx.results.setdefault(key, {})
    runs, reps = max(5, s.overhead_steps // 2), max(3, s.overhead_reps)
    for database, url in (("pg", ctx.urls["es"]), ("sqlite", f"sqlite:///{ctx.work.path / sqlite_file}")):
        if database == "pg":
            esdb.reset(url)
        out[database] = measure(url, runs, reps)
        out["runs"], out["reps"] = runs, reps
        first, second = forms
        ctx.log(f"{key.replace('case', 'case ')}: {database}: {first} {out[database][first].median:.2f} ms per run, "
                f"{second} {out[database][second].median:.2f} ms")


def how(out: dict[str, object]) -> str:
    """The method's last sentence: how ``alternate`` paired the forms."""
    return (f"{out.get('runs', '?')} runs of each form per repetition, {out.get('reps', '?')} repetitions "
            "alternating which form goes first; the ratio is taken within each repetition.")


def table(out: dict[str, object], headers: list[str], forms: tuple[str, str]) -> Table:
    """One row per database: each form's ms per run and the paired ratio."""
    rows = Table(headers)
    for database, label in DATABASES:
        data = out.get(database)
        if isinstance(data, dict):
            rows.add(label, data[forms[0]].cell(2), data[forms[1]].cell(2), data["ratio"].cell(2))
        else:
            rows.add(label, "n/a", "n/a", "n/a")
    return rows


def main(prog: str, measure: Measure) -> None:
    """``python -m bench.caseNN --database URL [--runs N] [--reps R]``."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--database", required=True)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    data = measure(args.database, args.runs, args.reps)
    width = max(map(len, data))
    for key, series in data.items():
        print(f"{key:{width}} median {series.median:.3f}  low {series.low:.3f}  high {series.high:.3f}")
