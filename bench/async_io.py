"""Case 14, async I/O: runs that each make 10 I/O calls of 20 ms, written
async (``await gather`` of async steps on the run's event loop) against the
same workflow written sync (``parallel`` of sync steps, a thread each).

The I/O is a request to a local TCP server (in this process, on
127.0.0.1) that answers each request 20 ms after it arrives. Each run's 10
calls are 10 steps in one fork, so both forms wait about 20 ms per run and
record the same 10 rows; what differs is the machinery: tasks on one loop
against a thread per branch. Executed in this process (``runner.execute``
of claimed runs, as a supervisor child does, one run at a time), on
PostgreSQL and SQLite.

Paired: each repetition times ``runs`` runs of each form on the same
database, the order alternating between repetitions, and the ratio is taken
within the repetition.

``python -m bench.async_io --database URL [--runs N] [--reps N]``
runs it alone.
"""

from __future__ import annotations

import asyncio
import socket
import socketserver
import threading
import time
from typing import Any

from everystep import gather, parallel, step, workflow
from everystep.store import connect

from . import paired_forms
from .context import Context
from .report import Section
from .stats import Series

CLAIMER = "bench-async"
CALLS = 10
DELAY = 0.020


class _Slow(socketserver.StreamRequestHandler):
    """Answers one line with ``ok`` after ``DELAY`` seconds."""

    def handle(self) -> None:
        self.rfile.readline()
        time.sleep(DELAY)
        self.wfile.write(b"ok\n")


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


_port = {"value": 0}


@step
async def call_async(index: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", _port["value"])
    try:
        writer.write(f"{index}\n".encode())
        await writer.drain()
        return (await reader.readline()).decode().strip()
    finally:
        writer.close()
        await writer.wait_closed()


@step
def call_sync(index: int) -> str:
    with socket.create_connection(("127.0.0.1", _port["value"])) as conn:
        conn.sendall(f"{index}\n".encode())
        return conn.makefile("rb").readline().decode().strip()


@workflow(name="bench.case14.ten_awaited")
async def ten_awaited(label: str) -> Any:
    return await gather(*[call_async(index) for index in range(CALLS)])


@workflow(name="bench.case14.ten_threaded")
def ten_threaded(label: str) -> Any:
    return parallel(*[lambda index=index: call_sync(index) for index in range(CALLS)])


FORMS = {"async": ten_awaited, "sync": ten_threaded}


def measure(url: str, runs: int, reps: int) -> dict[str, Series]:
    """ms per run of each form, and sync ÷ async within each repetition."""
    server = _Server(("127.0.0.1", 0), _Slow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _port["value"] = server.server_address[1]
    store = connect(url)
    try:
        store.migrate()
        out = paired_forms.alternate(store, FORMS, runs, reps, CLAIMER)
    finally:
        store.close()
        server.shutdown()
        server.server_close()
        thread.join(10)
    return out


def run(ctx: Context) -> None:
    paired_forms.run_both(ctx, "case14", measure, ("async", "sync"), "async.db")


def section(ctx: Context) -> Section:
    out = ctx.results.get("case14", {})
    section = Section(
        "case14", "Case 14 — async I/O: gather against parallel",
        method=(
            f"In process, `runner.execute` of claimed runs that each make {CALLS} requests to a local TCP "
            f"server answering after {DELAY * 1000:.0f} ms, as {CALLS} steps in one fork: an async workflow "
            f"awaiting `gather` of async steps (tasks on the run's loop) against the same workflow written "
            "sync with `parallel` of sync steps (a thread per branch). " + paired_forms.how(out)
        ),
    )
    table = paired_forms.table(out, ["database", "async, ms per run", "sync, ms per run", "sync ÷ async (paired)"],
                               ("async", "sync"))
    section.tables.append(table)
    return section


if __name__ == "__main__":
    paired_forms.main("python -m bench.async_io", measure)
