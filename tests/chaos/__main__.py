"""``python -m tests.chaos``: the long chaos run (see harness.py).

Example: ``python -m tests.chaos --runs 2000 --duration 600 --seed 7``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.chaos.harness import ChaosConfig, run_chaos


def main() -> int:
    defaults = ChaosConfig()
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--runs", type=int, default=defaults.runs)
    parser.add_argument("--duration", type=float, default=defaults.duration, help="seconds of fault injection")
    parser.add_argument("--fault-every", type=float, default=defaults.fault_every)
    parser.add_argument("--supervisors", type=int, default=defaults.supervisors)
    parser.add_argument("--procs", type=int, default=defaults.procs)
    parser.add_argument("--lease", type=float, default=defaults.lease)
    parser.add_argument("--step-ms", type=int, default=defaults.step_ms)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--database", help="admin URL of an external server (no PostgreSQL restarts then)")
    parser.add_argument("--workdir", type=Path, help="where supervisor logs go (default: a temp dir)")
    parser.add_argument("--pooler", action="store_true",
                        help="through PgBouncer in transaction mode, with its RECONNECT, KILL and restarts as faults")
    parser.add_argument("--loops", type=int, default=2, help="looping runs that continue as new (default 2)")
    parser.add_argument("--loop-messages", type=int, default=defaults.loop_messages)
    parser.add_argument("--loop-every", type=int, default=defaults.loop_every)
    args = parser.parse_args()
    config = ChaosConfig(runs=args.runs, duration=args.duration, fault_every=args.fault_every,
                         supervisors=args.supervisors, procs=args.procs, lease=args.lease,
                         step_ms=args.step_ms, seed=args.seed, database=args.database, pooler=args.pooler,
                         loops=args.loops, loop_messages=args.loop_messages, loop_every=args.loop_every,
                         settle_timeout=max(180.0, args.runs * 0.5))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="everystep-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = run_chaos(config, workdir)
    print(report.line())
    for violation in report.violations:
        print(f"VIOLATION: {violation}", file=sys.stderr)
    print(f"supervisor logs: {workdir}", file=sys.stderr)
    return 1 if report.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
