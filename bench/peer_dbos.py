"""DBOS peer: the same workflow shapes as ``bench.workloads``, run by DBOS.

Run as a subprocess (``python -m bench.peer_dbos ROLE ...``) so that DBOS's
process-wide singleton, its threads and its imports never touch the harness.

Roles:
- ``setup``: launch once to create and migrate the system database and
  register the benchmark queue (``worker_concurrency``,
  ``polling_interval_sec``), then shut down;
- ``worker``: launch with a unique ``executor_id`` listening to the queue,
  write ``--ready FILE`` once launched, and exit once ``--expect`` workflows
  have finished and nothing is left ENQUEUED or PENDING;
- ``enqueue``: with every worker ready, enqueue N workflows with
  ``DBOSClient.enqueue_in_transaction`` in one transaction, so they all
  become visible at once (like everystep's pre-filled queue) and no worker
  starts ahead of the others because it launched sooner.

Timing is read from DBOS's own ``workflow_status`` rows by the harness
(first start to last completion), exactly like the everystep cases.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from dbos import DBOS, DBOSConfig

from bench.workloads import burn, payload

QUEUE = "esbench"
APP = "esbench"
VERSION = "bench"


@DBOS.step()
def dbos_noop(value: dict) -> dict:
    return value


@DBOS.workflow()
def dbos_noop3(args: dict) -> dict:
    a = dbos_noop(args)
    b = dbos_noop(a)
    return dbos_noop(b)


@DBOS.step()
def dbos_cpu_step(iterations: int) -> int:
    return burn(iterations)


@DBOS.workflow()
def dbos_cpu1(iterations: int) -> int:
    return dbos_cpu_step(iterations)


def _config(url: str, executor_id: str) -> DBOSConfig:
    config: DBOSConfig = {
        "name": APP,
        "system_database_url": url,
        "executor_id": executor_id,
        # Every process computes the same version from the same source; pin
        # it anyway so enqueuer and workers agree whatever the environment.
        "application_version": VERSION,
        "run_admin_server": False,
        "log_level": "WARNING",
    }
    return config


def _register(worker_concurrency: int | None, poll: float) -> None:
    DBOS.register_queue(
        QUEUE,
        worker_concurrency=worker_concurrency,
        polling_interval_sec=poll,
        on_conflict="always_update",
    )


def setup(url: str, worker_concurrency: int | None, poll: float) -> None:
    DBOS(config=_config(url, "setup"))
    DBOS.listen_queues([])
    DBOS.launch()
    _register(worker_concurrency, poll)
    DBOS.destroy()


def enqueue(url: str, kind: str, count: int, iterations: int) -> None:
    import sqlalchemy

    from dbos import DBOSClient

    client = DBOSClient(system_database_url=url, application_name=APP)
    engine = sqlalchemy.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    name = "dbos_noop3" if kind == "noop3" else "dbos_cpu1"
    options = {"queue_name": QUEUE, "workflow_name": name, "app_version": VERSION}
    try:
        with engine.begin() as conn:
            for i in range(count):
                args = (payload(i),) if kind == "noop3" else (iterations,)
                client.enqueue_in_transaction(conn, options, *args)  # type: ignore[arg-type]
    finally:
        client.destroy()
        engine.dispose()


def _progress(url: str) -> tuple[int, int]:
    """(finished, outstanding) workflows on the system database."""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status NOT IN ('ENQUEUED', 'PENDING', 'DELAYED')),"
            " count(*) FILTER (WHERE status IN ('ENQUEUED', 'PENDING', 'DELAYED'))"
            " FROM dbos.workflow_status"
        ).fetchone()
    return int(row[0]), int(row[1])


def worker(url: str, executor_id: str, expect: int, ready: str, timeout: float) -> int:
    DBOS(config=_config(url, executor_id))
    DBOS.listen_queues([QUEUE])
    DBOS.launch()
    with open(ready, "w") as marker:
        marker.write(executor_id)
    deadline = time.monotonic() + timeout
    code = 0
    try:
        while True:
            finished, outstanding = _progress(url)
            if finished >= expect and outstanding == 0:
                break
            if time.monotonic() > deadline:
                code = 1
                break
            time.sleep(0.05)
    finally:
        DBOS.destroy(workflow_completion_timeout_sec=5)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_dbos")
    parser.add_argument("role", choices=["setup", "enqueue", "worker"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--kind", choices=["noop3", "cpu1"], default="noop3")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=0)
    parser.add_argument("--executor-id", default="worker")
    parser.add_argument("--worker-concurrency", type=int, default=0)
    parser.add_argument("--poll", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--expect", type=int, default=0)
    parser.add_argument("--ready", default="")
    args = parser.parse_args(argv)
    logging.getLogger("dbos").setLevel(logging.WARNING)
    concurrency = args.worker_concurrency or None
    if args.role == "setup":
        setup(args.url, concurrency, args.poll)
        return 0
    if args.role == "enqueue":
        enqueue(args.url, args.kind, args.count, args.iterations)
        return 0
    return worker(args.url, args.executor_id, args.expect, args.ready, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
