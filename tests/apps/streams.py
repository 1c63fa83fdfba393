"""Workflows that write streams (tests/test_streams*.py, the console's
browser test, bench case 19)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import everystep
from everystep import StreamRefused, step, workflow


@step
def note(value: Any) -> Any:
    return value


@workflow
def reporter(count: int) -> int:
    """Writes ``count`` values from its body (each a recorded step), then
    closes the stream and records one step more."""
    for index in range(count):
        everystep.write_stream("progress", {"done": index + 1, "of": count})
    everystep.close_stream("progress")
    return int(note(count))


@step
def produce(count: int, key: str) -> int:
    for index in range(count):
        everystep.write_stream(key, index)
    return count


@workflow
def producing(count: int, key: str = "lines") -> int:
    """Writes ``count`` values from inside one step."""
    return int(produce(count, key))


@step
def gated_lines(directory: str) -> str:
    """Writes three lines tagged with its process, says so in a file, then
    waits for the test's gate (a kill arrives meanwhile)."""
    for index in range(3):
        everystep.write_stream("log", f"line {index + 1} from {os.getpid()}")
    Path(directory, f"wrote.{os.getpid()}").touch()
    while not Path(directory, "gate").exists():
        time.sleep(0.02)
    return "written"


@workflow
def gated(directory: str) -> str:
    """One step that streams, then waits at a gate."""
    return str(gated_lines(directory))


@workflow
def write_after_close() -> str:
    everystep.write_stream("s", 1)
    everystep.close_stream("s")
    try:
        everystep.write_stream("s", 2)
    except StreamRefused as exc:
        return str(exc)
    return "written"


@workflow
def unstorable() -> None:
    everystep.write_stream("s", object())


@step
def unstorable_in_step() -> None:
    everystep.write_stream("s", {1, 2})


@workflow
def unstorable_from_step() -> None:
    unstorable_in_step()


@workflow
def oversized(size: int) -> str:
    try:
        everystep.write_stream("s", "x" * size)
    except StreamRefused as exc:
        return str(exc)
    return "written"


@workflow
def bounded(count: int) -> str:
    """Writes until its stream's bound refuses a value."""
    try:
        for index in range(count):
            everystep.write_stream("s", index)
    except StreamRefused as exc:
        return str(exc)
    return "all written"


@step
async def produce_async(count: int) -> int:
    for index in range(count):
        await everystep.write_stream_async("a", index)
    return count


@workflow
async def async_producing(count: int) -> int:
    await everystep.write_stream_async("a", "start")
    written = await produce_async(count)
    await everystep.close_stream_async("a")
    return int(written)


@workflow
def slow_lines(count: int, pause: float) -> int:
    """A run in flight for a while: a step writes a line every ``pause``
    seconds (the console's live view)."""
    return int(paced(count, pause))


@step
def paced(count: int, pause: float) -> int:
    for index in range(count):
        everystep.write_stream("log", f"line {index + 1}")
        time.sleep(pause)
    return count


#: Attempts of ``flaky_lines`` so far, in this process.
FLAKY_ATTEMPTS: list[int] = []


@step(retries=1, backoff=0, jitter=False)
def flaky_lines() -> int:
    """Writes two lines, and fails on its first attempt."""
    FLAKY_ATTEMPTS.append(len(FLAKY_ATTEMPTS) + 1)
    attempt = len(FLAKY_ATTEMPTS)
    everystep.write_stream("log", f"attempt {attempt} line 1")
    everystep.write_stream("log", f"attempt {attempt} line 2")
    if attempt == 1:
        raise RuntimeError("first attempt fails")
    return attempt


@workflow
def retried() -> int:
    return int(flaky_lines())
