"""Procrastinate peer: 2,000 one-step jobs (the ``noop`` payload of
``bench.workloads``), deferred first (``batch_defer``), then worked off by
worker processes started afterwards (``wait=False``: each exits once the
queue is empty).

Run as a subprocess (``python -m bench.peer_procrastinate ROLE ...``).
Configured as Procrastinate's docs recommend for throughput: one worker per
process, several processes, and an ``async`` task so each worker can run
many jobs concurrently (``concurrency``); LISTEN/NOTIFY on (the default),
jobs kept in the table after completion (the default) so the harness can
read their ``started``/``succeeded`` events.
"""

from __future__ import annotations

import argparse
import logging
import sys

from procrastinate import App, PsycopgConnector

from bench.workloads import payload

QUEUE = "esbench"


def make_app(url: str) -> App:
    return App(connector=PsycopgConnector(conninfo=url))


def _tasks(app: App):  # type: ignore[no-untyped-def]
    @app.task(name="esbench_noop", queue=QUEUE)
    async def esbench_noop(i: int, tag: str) -> dict:
        return {"i": i, "tag": tag}

    return esbench_noop


def setup(url: str) -> None:
    app = make_app(url)
    with app.open():
        app.schema_manager.apply_schema()


def defer(url: str, count: int) -> None:
    app = make_app(url)
    task = _tasks(app)
    with app.open():
        # batch_defer: one INSERT (one transaction) per chunk.
        for start in range(0, count, 500):
            task.batch_defer(*[payload(i) for i in range(start, min(count, start + 500))])


def worker(url: str, name: str, concurrency: int) -> None:
    app = make_app(url)
    _tasks(app)
    app.run_worker(queues=[QUEUE], name=name, concurrency=concurrency, wait=False,
                   install_signal_handlers=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_procrastinate")
    parser.add_argument("role", choices=["setup", "defer", "worker"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--name", default="worker")
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.role == "setup":
        setup(args.url)
    elif args.role == "defer":
        defer(args.url, args.count)
    else:
        worker(args.url, args.name, args.concurrency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
