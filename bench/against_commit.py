"""Case 2's shape, this tree against an earlier commit, paired and interleaved:
the no-regression bar (a workflow that uses none of a round's features must
run at least as fast as before it).

The earlier commit is checked out into a temporary git worktree. Each side
gets its own database on one PostgreSQL server (the bench's durable
throwaway cluster, or ``--database``), migrated by its own code; every
repetition, each side in turn (the order alternating) schedules ``--runs``
``noop3`` runs with its own ``schedule()`` and works them off with its own
``everystep-supervisor --procs 2 --burst``. The rate is runs over the
database-stamped window (first ``claimed_at`` to last ``completed_at``), as
in case 2, and the ratio is taken within each repetition, so drift on a
shared machine hits both sides alike.

The same commit with other supervisor options is a paired A/B of an option:
``--base HEAD --base-args="--claim-ahead 1"`` measures this tree's default
against ``--claim-ahead 1`` (``--here-args`` adds options to this side).

``python -m bench.against_commit [--base REV] [--runs N] [--reps R] [--procs P]
[--base-args A] [--here-args A] [--database URL]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bench import esdb, pg  # noqa: E402
from bench.stats import Series  # noqa: E402

#: The code before the round that added waits, versions, transactional and
#: async steps: its claim and write path are the baseline.
DEFAULT_BASE = "b722e5f"

#: Run in a side's own tree: migrate its database, then schedule N noop3 runs.
_SCHEDULE = """
import sys
import everystep
from everystep.store import connect
from bench.workloads import noop3, payload
store = connect(sys.argv[1])
store.migrate()
for i in range(int(sys.argv[2])):
    everystep.schedule(noop3, payload(i), database=store)
store.close()
"""


def available(rev: str) -> bool:
    """Whether this repository holds ``rev`` (a shallow clone may not)."""
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{rev}^{{commit}}"], capture_output=True)
    return found.returncode == 0


@contextlib.contextmanager
def checked_out(rev: str) -> Iterator[Path]:
    """``rev`` in a temporary detached worktree of this repository."""
    with tempfile.TemporaryDirectory(prefix="everystep-base-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), rev], check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


def env_for(tree: Path) -> dict[str, str]:
    """The environment a process running ``tree``'s code gets."""
    environment = {key: value for key, value in os.environ.items() if key != "EVERYSTEP_DATABASE_URL"}
    environment["PYTHONPATH"] = str(tree)
    return environment


def migrate(tree: Path, url: str) -> None:
    """``url``'s schema as ``tree``'s code makes it."""
    subprocess.run([sys.executable, "-c", "import sys; from everystep.store import connect; "
                    "connect(sys.argv[1]).migrate()", url], env=env_for(tree), cwd=tree, check=True, timeout=300)


def burst(tree: Path, url: str, runs: int, procs: int, socket_path: str, options: Sequence[str] = ()) -> float:
    """One side's repetition: runs per second over the database's window;
    ``options``: more of the supervisor's command-line options."""
    with psycopg.connect(url, autocommit=True) as conn:
        with contextlib.suppress(psycopg.errors.UndefinedTable):
            conn.execute("TRUNCATE everystep_workflow CASCADE")
    env = env_for(tree)
    subprocess.run([sys.executable, "-c", _SCHEDULE, url, str(runs)], env=env, cwd=tree, check=True, timeout=600)
    subprocess.run([sys.executable, "-m", "supervisor.cli", "--app", "bench.workloads", "--procs", str(procs),
                    "--database", url, "--socket", socket_path, "--log-level", "warning", "--no-progress",
                    "--burst", *options], env=env, cwd=tree, check=True, timeout=60 + runs)
    window = esdb.span(url)
    esdb.expect_all_completed(window, runs, str(tree))
    if not window.seconds:
        raise RuntimeError(f"{tree}: the runs' window measured no time")
    return window.runs_per_second


def measure(base: Path, url_base: str, url_here: str, runs: int, reps: int, procs: int,
            sockets: Path, log: Callable[[str], None] = print,
            options: Mapping[str, Sequence[str]] | None = None) -> dict[str, Series]:
    """``reps`` paired repetitions (the order alternating), after one small
    warm-up burst per side: runs/s of each side and their ratio.
    ``options``: more supervisor options per side (``base``, ``here``)."""
    out = {key: Series() for key in ("base", "here", "ratio")}
    sides = [("base", base, url_base), ("here", ROOT, url_here)]
    extra = options or {}
    for side, tree, url in sides:  # warm up: each side's code and database once
        burst(tree, url, max(runs // 5, 50), procs, str(sockets / f"{side}.sock"), extra.get(side, ()))
    for rep in range(reps):
        rates: dict[str, float] = {}
        for side, tree, url in sides if rep % 2 == 0 else list(reversed(sides)):
            rates[side] = burst(tree, url, runs, procs, str(sockets / f"{side}.sock"), extra.get(side, ()))
        out["base"].add(rates["base"])
        out["here"].add(rates["here"])
        out["ratio"].add(rates["here"] / rates["base"])
        log(f"rep {rep + 1}: base {rates['base']:,.0f} runs/s, this tree {rates['here']:,.0f} runs/s, "
            f"ratio {rates['here'] / rates['base']:.3f}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.against_commit", description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"the earlier commit (default {DEFAULT_BASE})")
    parser.add_argument("--runs", type=int, default=2000, help="runs per side and repetition")
    parser.add_argument("--reps", type=int, default=6, help="paired repetitions")
    parser.add_argument("--procs", type=int, default=2, help="the supervisor's --procs")
    parser.add_argument("--base-args", default="", metavar="A",
                        help="more supervisor options for the earlier commit's side, "
                             "e.g. --base-args=\"--claim-ahead 1\"")
    parser.add_argument("--here-args", default="", metavar="A", help="more supervisor options for this tree's side")
    parser.add_argument("--database", default=None, help="an existing PostgreSQL server's URL "
                        "(default: $EVERYSTEP_BENCH_DATABASE_URL, else a durable throwaway cluster)")
    args = parser.parse_args(argv)
    server = pg.start(args.database)
    try:
        url_base, url_here = server.create_database("against_base"), server.create_database("against_here")
        print(f"load average at start: {pg.load_average()}", flush=True)
        with checked_out(args.base) as base, tempfile.TemporaryDirectory(prefix="everystep-sock-") as sockets:
            out = measure(base, url_base, url_here, args.runs, args.reps, args.procs, Path(sockets),
                          options={"base": shlex.split(args.base_args), "here": shlex.split(args.here_args)})
        print(f"load average at end: {pg.load_average()}")
    finally:
        server.close()
    base_label = " ".join([args.base, args.base_args]).strip()
    here_label = " ".join(["this tree", args.here_args]).strip()
    print(f"case 2 shape, --procs {args.procs}, {args.runs} runs per side, {args.reps} paired repetitions")
    print(f"{base_label}: {out['base'].cell(0)} runs/s")
    print(f"{here_label}: {out['here'].cell(0)} runs/s")
    print(f"ratio {here_label} / {base_label}: {out['ratio'].cell(3)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
