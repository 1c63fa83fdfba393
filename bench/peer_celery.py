"""Celery peer of case 17: the same app (``bench.bigapp``) and task, run by
Celery's prefork pool (``celery -A bench.celery_app worker -c N``), with
Redis as broker and result backend (``EVERYSTEP_BENCH_REDIS``, default
``redis://127.0.0.1:6379/15``).

The worker's main process imports ``bench.celery_app``, which imports the
app, then forks the pool: its children start sharing the app's heap, as
everystep's do. This module is the harness's side (the command, the client,
the burst) and never imports the app itself.

The client runs in a process of its own (``python -m bench.peer_celery``,
``client_cmd``): kombu registers an after-fork hook for its connection
pool that closes the parent's channels in every child forked after it, and
the harness forks later cases' processes (the MariaDB baseline's clients),
which would then block reading the broker's socket.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import psutil

from celery import Celery

from . import procs

REDIS_ENV = "EVERYSTEP_BENCH_REDIS"
DEFAULT_REDIS = "redis://127.0.0.1:6379/15"
TASK = "bench16.churn"


def make_app() -> Celery:
    url = os.environ.get(REDIS_ENV, DEFAULT_REDIS)
    app = Celery("bench16", broker=url, backend=url)
    app.conf.update(worker_hijack_root_logger=False, result_expires=3600, worker_prefetch_multiplier=1,
                    broker_connection_retry_on_startup=True)
    return app


def worker_cmd(nprocs: int, queue: str) -> list[str]:
    """Celery's prefork worker, ``nprocs`` processes, on its own queue."""
    return procs.python("-m", "celery", "-A", "bench.celery_app", "worker", "--pool", "prefork",
                        "--concurrency", str(nprocs), "--queues", queue, "--hostname", f"{queue}@%h",
                        "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING")


def client_cmd(queue: str, nprocs: int, runs: int, worker_pid: int) -> list[str]:
    """The client's process: waits for the worker, sends the burst, prints
    ``{"heap": …, "pids": …}`` as its last line."""
    return procs.python("-m", "bench.peer_celery", queue, str(nprocs), str(runs), str(worker_pid))


def wait_ready(app: Celery, worker_pid: int, nprocs: int, timeout: float) -> None:
    """Until the worker answers a ping and its pool has ``nprocs`` processes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            worker = psutil.Process(worker_pid)
            alive = worker.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            alive = False
        if not alive:
            raise procs.BenchError("celery worker exited")
        replies = app.control.ping(timeout=1.0) or []
        if replies and len(worker.children()) >= nprocs:
            return
        time.sleep(0.5)
    raise procs.BenchError(f"celery worker not ready within {timeout:.0f}s")


def run_burst(app: Celery, queue: str, runs: int, timeout: float) -> list[dict[str, Any]]:
    """Send ``runs`` tasks, wait for every result."""
    pending = [app.send_task(TASK, args=[seed], queue=queue) for seed in range(runs)]
    deadline = time.monotonic() + timeout
    results = []
    for result in pending:
        results.append(result.get(timeout=max(deadline - time.monotonic(), 1.0)))
    return results


def main(argv: list[str]) -> int:
    queue, nprocs, runs, worker_pid = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    app = make_app()
    wait_ready(app, worker_pid, nprocs, timeout=300)
    results = run_burst(app, queue, runs, timeout=600)
    time.sleep(0.5)  # the last acknowledgements settle; every worker is idle
    print(json.dumps({"heap": results[0]["heap"], "pids": len({r["pid"] for r in results})}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
