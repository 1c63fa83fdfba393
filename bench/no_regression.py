"""Case 15, no regression: case 2's shape at ``--procs 2``, this tree against
the code before the round that added waits, versions, transactional and
async steps (``bench.against_commit``), paired and interleaved on one
server. A workflow that uses none of those features must run at least as
fast as it did: the bar is a ratio of at least 1.0.

The earlier commit is checked out into a temporary worktree; a clone
without it (a shallow one) reports the case as not measured.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from . import against_commit
from .context import Context
from .report import Section, Table
from .stats import fmt_span

BASE = against_commit.DEFAULT_BASE
PROCS = 2


def run(ctx: Context) -> None:
    s = ctx.settings
    out = ctx.results.setdefault("case15", {})
    if not against_commit.available(BASE):
        out["missing"] = f"commit {BASE} is not in this clone (a shallow clone?)"
        return
    with against_commit.checked_out(BASE) as base, tempfile.TemporaryDirectory(prefix="everystep-sock-") as tmp:
        out.update(against_commit.measure(base, ctx.urls["against_base"], ctx.urls["against_here"],
                                          s.against_runs, s.against_reps, PROCS, Path(tmp),
                                          log=lambda line: ctx.log(f"case 15 {line}")))


def section(ctx: Context) -> Section:
    s = ctx.settings
    out = ctx.results.get("case15", {})
    section = Section(
        "case15", f"Case 15 — no regression: this tree against {BASE} (--procs {PROCS})",
        method=(
            f"`python -m bench.against_commit`: {BASE} (the code before waits, versions, transactional and async "
            "steps) checked out into a temporary worktree; each side on its own database of this server, migrated "
            f"by its own code. Each repetition, each side in turn (the order alternating) schedules "
            f"{s.against_runs:,} `noop3` runs with its own `schedule()` and works them off with its own "
            f"`everystep-supervisor --procs {PROCS} --burst`; runs/s over the database-stamped window, the ratio "
            f"taken within the repetition ({s.against_reps} repetitions, after one warm-up burst per side)."
        ),
    )
    if "missing" in out:
        section.notes.append(f"Not measured: {out['missing']}.")
        return section
    ratio = out.get("ratio")
    if not ratio:
        return section
    table = Table(["side", "runs/s, median (min–max)"])
    table.add(BASE, out["base"].cell(0))
    table.add("this tree", out["here"].cell(0))
    table.add("ratio, this tree / " + BASE, out["ratio"].cell(3))
    section.tables.append(table)
    verdict = "met" if ratio.median is not None and ratio.median >= 1.0 else "missed"
    section.notes.append(f"Target (no regression: case 2's shape at --procs {PROCS} ≥ 1.0× {BASE}): **{verdict}** "
                         f"({fmt_span(ratio)}).")
    return section
