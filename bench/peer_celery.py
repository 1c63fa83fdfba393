"""Celery peer of case 16: the same app (``bench.bigapp``) and task, run by
Celery's prefork pool (``celery -A bench.celery_app worker -c N``), with
Redis as broker and result backend (``EVERYSTEP_BENCH_REDIS``, default
``redis://127.0.0.1:6379/15``).

The worker's main process imports ``bench.celery_app``, which imports the
app, then forks the pool: its children start sharing the app's heap, as
everystep's do. This module is the harness's side (the command, the client,
the burst) and never imports the app itself.
"""

from __future__ import annotations

import os
import time
from typing import Any

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


def wait_ready(app: Celery, proc: procs.Proc, nprocs: int, timeout: float) -> None:
    """Until the worker answers a ping and its pool has ``nprocs`` processes."""
    deadline = time.monotonic() + timeout
    import psutil

    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise procs.BenchError(f"celery worker exited with {proc.popen.returncode}\n{procs.tail(proc.log)}")
        replies = app.control.ping(timeout=1.0) or []
        if replies and len(psutil.Process(proc.pid).children()) >= nprocs:
            return
        time.sleep(0.5)
    raise procs.BenchError(f"celery worker not ready within {timeout:.0f}s\n{procs.tail(proc.log)}")


def run_burst(app: Celery, queue: str, runs: int, timeout: float) -> list[dict[str, Any]]:
    """Send ``runs`` tasks, wait for every result."""
    pending = [app.send_task(TASK, args=[seed], queue=queue) for seed in range(runs)]
    deadline = time.monotonic() + timeout
    results = []
    for result in pending:
        results.append(result.get(timeout=max(deadline - time.monotonic(), 1.0)))
    return results
