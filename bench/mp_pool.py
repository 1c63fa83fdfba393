"""The bare ``multiprocessing`` peer of case 17: a fork pool of ``N``
processes started after ``bench.bigapp`` is imported, mapping its task over
``RUNS`` seeds (one at a time per process, like the others); then, with the
pool still alive, the memory of this process and its children
(``bench.footprint``) as one JSON line.

``python -m bench.mp_pool N RUNS``
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys

from bench import bigapp, footprint


def main(argv: list[str]) -> int:
    procs, runs = int(argv[0]), int(argv[1])
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        results = pool.map(bigapp.churn, range(runs), chunksize=1)
        tree = footprint.tree(os.getpid())
        pool.terminate()
    print(json.dumps({"tree": tree, "heap": bigapp.HEAP_BYTES, "runs": len(results),
                      "pids": len({result["pid"] for result in results})}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
