"""Async workflows and steps, and their sync twins over the same steps.

Imported in-process by ``tests/test_async.py`` and loaded by supervisors
(``--app tests.apps.async_steps``) in ``tests/test_async_supervised.py``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import everystep
from everystep import gather, parallel, step, workflow

CALLS: Counter[str] = Counter()
_lock = threading.Lock()


def called(label: str) -> None:
    with _lock:
        CALLS[label] += 1


@step
async def fetch(label: str) -> str:
    called(label)
    await asyncio.sleep(0)
    return f"fetched {label}"


@step
def compute(label: str) -> str:
    called(label)
    return f"computed {label}"


@step
async def fails(message: str) -> None:
    called(f"fail:{message}")
    await asyncio.sleep(0)
    raise ValueError(message)


@step(unsafe_to_repeat=True)
async def charge(amount: int) -> str:
    called(f"charge:{amount}")
    await asyncio.sleep(0)
    return f"charged {amount}"


ATTEMPTS: Counter[str] = Counter()


@step(retries=2, backoff=0, jitter=False)
async def flaky(label: str) -> str:
    ATTEMPTS[label] += 1
    if ATTEMPTS[label] < 2:
        raise ConnectionError(f"{label}: attempt {ATTEMPTS[label]} failed")
    return f"{label} after {ATTEMPTS[label]}"


# -- the same run, written both ways ---------------------------------------------


@workflow
def mixed_sync(n: int) -> Any:
    """A sync body: the async step runs on a loop of the calling thread."""
    first = fetch(f"a{n}")
    second = compute(f"b{n}")
    both = parallel(lambda: fetch(f"c{n}"), [lambda: compute(f"d{n}"), lambda: fetch(f"e{n}")])
    named = compute(f"f{n}", everystep_id="named")
    return [first, second, list(both), named]


@workflow
async def mixed_async(n: int) -> Any:
    """The async twin of ``mixed_sync``: the same steps, ids and rows."""
    first = await fetch(f"a{n}")
    second = await compute(f"b{n}")
    both = await gather(fetch(f"c{n}"), [lambda: compute(f"d{n}"), lambda: fetch(f"e{n}")])
    named = await compute(f"f{n}", everystep_id="named")
    return [first, second, list(both), named]


# -- gather's error rules ----------------------------------------------------------


@workflow
async def one_branch_fails() -> Any:
    try:
        await gather(fetch("ok"), fails("only one"), [lambda: fetch("s1"), lambda: fetch("s2")])
    except ValueError as exc:
        return f"caught {exc}"
    return "no error"


@workflow
async def two_branches_fail() -> Any:
    try:
        await gather(fails("one"), fetch("fine"), fails("two"))
    except ExceptionGroup as group:
        return sorted(str(error) for error in group.exceptions)
    return "no group"


@workflow
async def unsafe_and_retried() -> Any:
    return [await charge(5), await flaky("x")]


@workflow
async def sleeps_then_fetches() -> Any:
    await everystep.sleep_async(3600)
    return await fetch("after sleep")


@workflow
async def receives() -> Any:
    message = await everystep.recv_async("greeting", timeout=3600)
    return await fetch(f"got {message}")


# -- I/O: concurrent HTTP calls in one run ------------------------------------------


@step
async def http_get(port: int, path: str) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await writer.drain()
        response = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = response.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.0 200") and not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"GET {path}: {head[:40]!r}")
    return body.decode()


@workflow
async def fetch_many(port: int, count: int) -> Any:
    return list(await gather(*[http_get(port, f"/{index}") for index in range(count)]))


# -- under a supervisor ---------------------------------------------------------------


@step(timeout=1)
async def hangs_with_timeout(marker: str) -> None:
    Path(marker).write_text(str(os.getpid()))
    await asyncio.sleep(3600)


@step
async def hangs(marker: str) -> None:
    Path(marker).write_text(str(os.getpid()))
    await asyncio.sleep(3600)


@step
async def once(marker: str) -> str:
    """Writes ``marker`` (one line per execution) and returns."""
    with open(marker, "a") as out:
        out.write(f"{os.getpid()}\n")
    return "once"


@workflow
async def times_out(marker: str) -> Any:
    await hangs_with_timeout(marker)
    return "not reached"


@workflow
async def awaits_forever(before: str, marker: str) -> Any:
    """Records ``once`` then hangs in an async step: the child is killed
    mid-``await`` (SIGKILL, cancel)."""
    await once(before)
    await hangs(marker)
    return "not reached"


@workflow
async def awaits_a_file(before: str, marker: str, release: str) -> Any:
    """Records ``once``, then waits (polling, in ``await``) until ``release``
    exists: a killed child's run resumes here on its next claim."""
    await once(before)
    await wait_for_file(marker, release)
    return "done"


@step
async def wait_for_file(marker: str, release: str) -> str:
    with open(marker, "a") as out:
        out.write(f"{os.getpid()}\n")
    while not Path(release).exists():
        await asyncio.sleep(0.05)
    return "released"


@workflow
async def one_request(port: int, path: str) -> Any:
    """One awaited HTTP call: many such runs share a threaded worker's loop."""
    return await http_get(port, path)
