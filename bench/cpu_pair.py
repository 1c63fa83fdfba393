"""CPU per run of this tree under two sets of supervisor options, paired:
the A/B that case 10's CPU bars need, as ``against_commit`` is for runs/s.

A CPU bar moves a few per cent between windows on a quiet machine, so an
option's effect on it is read side by side: each side has its own database
on one PostgreSQL server (the bench's durable throwaway cluster, or
``--database``) and, in every repetition, its own fresh supervisor; the
sides take turns, the order alternating. A repetition starts the side's
supervisor (not in burst mode: its start-up is not a run's cost), warms it
with a few runs, COPYs ``--runs`` ``noop3`` runs in and analyzes the
tables, wakes it with one NOTIFY and samples the CPU of its process tree
and of the server's (the harness's own backend excluded) until they are
all completed, as case 10's windows do. The ratio is taken within each
repetition.

``--a-rev REV`` runs side a from an earlier commit instead (checked out into
a temporary worktree as ``against_commit`` does, its database migrated by
its own code): the CPU half of a before/after that ``against_commit``
measures in runs/s.

``python -m bench.cpu_pair [--a-args A] [--b-args B] [--a-rev REV] [--runs N]
[--reps R] [--procs P] [--database URL]``; for example
``--a-args="--claim-ahead 4"`` against this tree's default.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bench import against_commit, bulk, esdb, fleet, pg, procs  # noqa: E402
from bench.stats import Series  # noqa: E402

RUN_NAME = "bench.workloads.noop3"
WARM_RUNS = 300


def window(url: str, runs: int, procs_: int, socket_path: str, options: Sequence[str],
           tree: Path = ROOT) -> dict[str, float]:
    """One side's repetition: CPU µs per run of the supervisor's tree and of
    the server's, and runs/s, over ``runs`` runs after a warm-up; the
    supervisor's code is ``tree``'s."""
    esdb.reset(url)
    cmd = procs.supervisor_cmd(url, procs_, socket_path, app=fleet.APP, burst=False,
                               extra=("--poll", "600", *options))
    supervisor = subprocess.Popen(cmd, cwd=tree, env=against_commit.env_for(tree), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
    try:
        procs.wait_children_idle(socket_path, procs_, timeout=60)
        bulk.load_scheduled(url, WARM_RUNS, RUN_NAME, notify=True)
        with psycopg.connect(url, autocommit=True) as conn:
            me = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])

            def completed() -> int:
                return int(conn.execute("SELECT count(*) FROM everystep_workflow WHERE status = 'completed'")
                           .fetchone()[0])

            _wait(completed, WARM_RUNS, supervisor)
            bulk.load_scheduled(url, runs, RUN_NAME, first_index=WARM_RUNS)
            # Plans made during the warm-up, on tables of a few hundred rows,
            # may scan them whole and stay cached while they grow (until
            # autovacuum analyzes them, within minutes in production): the
            # statistics of a steady state make the children plan again.
            conn.execute("ANALYZE everystep_workflow, everystep_step")
            meter = fleet.CpuMeter([("python", supervisor.pid), ("postgres", fleet.postmaster_pid(url))],
                                   exclude={me})
            meter.sample()
            before, started = meter.totals(), time.monotonic()
            conn.execute("SELECT pg_notify('everystep_scheduled', %s)", (RUN_NAME,))
            _wait(completed, WARM_RUNS + runs, supervisor, meter)
            seconds = time.monotonic() - started
            meter.sample()
            after = meter.totals()
    finally:
        supervisor.terminate()
        supervisor.wait(timeout=60)
    used = {key: (after.get(key, 0.0) - before.get(key, 0.0)) / runs * 1e6 for key in ("python", "postgres")}
    return {**used, "all": used["python"] + used["postgres"], "runs_per_s": runs / seconds}


def _wait(completed: Callable[[], int], target: int, supervisor: subprocess.Popen[bytes],
          meter: fleet.CpuMeter | None = None) -> None:
    deadline = time.monotonic() + 60 + target
    while completed() < target:
        if supervisor.poll() is not None:
            raise RuntimeError(f"the supervisor exited ({supervisor.returncode}) before the runs completed")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{target} runs not completed in time")
        if meter is not None:
            meter.sample()  # a backend that exits takes its CPU time along
        time.sleep(0.25)


def measure(url_a: str, url_b: str, options: Mapping[str, Sequence[str]], runs: int, reps: int, procs_: int,
            sockets: Path, tree_a: Path = ROOT) -> dict[str, Series]:
    out = {key: Series() for key in ("a", "b", "ratio", "a_rate", "b_rate")}
    sides = [("a", url_a, tree_a), ("b", url_b, ROOT)]
    for rep in range(reps):
        got: dict[str, dict[str, float]] = {}
        for side, url, tree in sides if rep % 2 == 0 else list(reversed(sides)):
            got[side] = window(url, runs, procs_, str(sockets / f"{side}.sock"), options[side], tree)
        out["a"].add(got["a"]["all"])
        out["b"].add(got["b"]["all"])
        out["ratio"].add(got["b"]["all"] / got["a"]["all"])
        out["a_rate"].add(got["a"]["runs_per_s"])
        out["b_rate"].add(got["b"]["runs_per_s"])
        print(f"rep {rep + 1}: " + ", ".join(
            f"{side} {got[side]['all']:,.0f} µs/run (supervisor {got[side]['python']:,.0f}, "
            f"PostgreSQL {got[side]['postgres']:,.0f}; {got[side]['runs_per_s']:,.0f} runs/s)" for side in ("a", "b"))
            + f", b ÷ a {got['b']['all'] / got['a']['all']:.3f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_pair", description=__doc__.splitlines()[0])
    parser.add_argument("--a-args", default="", metavar="A", help="supervisor options of side a")
    parser.add_argument("--b-args", default="", metavar="B", help="supervisor options of side b")
    parser.add_argument("--a-rev", default=None, metavar="REV", help="run side a from this earlier commit")
    parser.add_argument("--runs", type=int, default=4000, help="runs per side and repetition")
    parser.add_argument("--reps", type=int, default=6, help="paired repetitions")
    parser.add_argument("--procs", type=int, default=2, help="the supervisor's --procs")
    parser.add_argument("--database", default=None, help="an existing PostgreSQL server's URL "
                        "(default: $EVERYSTEP_BENCH_DATABASE_URL, else a durable throwaway cluster)")
    args = parser.parse_args(argv)
    options = {"a": shlex.split(args.a_args), "b": shlex.split(args.b_args)}
    if args.a_rev and not against_commit.available(args.a_rev):
        parser.error(f"--a-rev {args.a_rev}: no such commit here")
    server = pg.start(args.database)
    try:
        url_a, url_b = server.create_database("cpu_pair_a"), server.create_database("cpu_pair_b")
        with contextlib.ExitStack() as stack:
            tree_a = stack.enter_context(against_commit.checked_out(args.a_rev)) if args.a_rev else ROOT
            against_commit.migrate(tree_a, url_a)
            esdb.migrate(url_b)
            print(f"load average at start: {pg.load_average()}", flush=True)
            sockets = stack.enter_context(tempfile.TemporaryDirectory(prefix="everystep-sock-"))
            out = measure(url_a, url_b, options, args.runs, args.reps, args.procs, Path(sockets), tree_a)
        print(f"load average at end: {pg.load_average()}")
    finally:
        server.close()
    label = {side: " ".join(options[side]) or "the defaults" for side in ("a", "b")}
    if args.a_rev:
        label["a"] = f"{args.a_rev} {label['a']}"
    print(f"--procs {args.procs}, {args.runs} noop3 runs per side and repetition, {args.reps} paired repetitions")
    for side in ("a", "b"):
        print(f"{side} ({label[side]}): {out[side].cell(0)} µs of CPU per run, "
              f"{out[side + '_rate'].cell(0)} runs/s")
    print(f"CPU per run, b ÷ a: {out['ratio'].cell(3)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
