"""Reading a run's stream from anywhere, as its values come.

``StreamReader`` reads the rows after the last seq it saw, in batches;
when there are none it waits for the next write, then reads again. It
stops at the stream's closing marker, or once the run has ended (no longer
scheduled, running or blocked) and a last read found nothing more, so a
value committed just before the run's end is never missed.

How it waits:

- On PostgreSQL, on a LISTEN connection of its own (``everystep_stream``,
  the run's id as payload), opened before its first read so no write
  between the two is missed; every write's commit wakes it. It still reads
  once a second without a notification (a reader must not hang on a lost
  one).
- Behind a transaction pooler without a LISTEN URL, on SQLite and on
  MariaDB: it polls every ``POLL`` seconds.

The same reader serves the Python iterator (``wait``, a blocking
``select``) and the console's server-sent events (``wait_async``, the
connection's socket watched by the event loop), so both see the same
order and the same end.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import select
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any

from .models import ACTIVE_STATUSES
from .store import Notifications, Store, StreamItem

#: Seconds between reads where nothing wakes a reader (SQLite, MariaDB, a
#: transaction pooler).
POLL = 0.02
#: Seconds a reader woken by NOTIFY waits at most before reading anyway.
NOTIFIED_POLL = 1.0
#: Rows read at once.
BATCH = 500


class StreamReader:
    """One reader of run ``run_id``'s stream ``key``, after seq ``after``.
    ``close()`` it (or exhaust it) to give back its LISTEN connection."""

    def __init__(self, store: Store, run_id: str, key: str, after: int = 0) -> None:
        self.store = store
        self.run_id = run_id
        self.key = key
        self.last_seq = after
        self.ended = False
        self._listener: Notifications | None = None
        self._listening = False
        self._buffer: deque[StreamItem] = deque()
        self._run_over = False

    def open(self) -> StreamReader:
        """Check the run exists (``RunNotFound``) and start listening."""
        self.store.get_run(self.run_id)
        if self.store.notifies:
            self._listener = self.store.listen_streams()
        self._listening = self._listener is not None
        return self

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def fetch(self) -> list[StreamItem]:
        """What was written since the last fetch (empty: nothing yet, or
        the stream is over: ``ended``). Blocks on the database only."""
        if self.ended:
            return []
        items = self.store.stream_items(self.run_id, self.key, self.last_seq, BATCH)
        if not items:
            if self._run_over:
                self.ended = True  # the run ended and a last read found nothing more
                return []
            run = self.store.get_run(self.run_id)
            if run.status not in ACTIVE_STATUSES:
                self._run_over = True
                return self.fetch()
            return []
        values = []
        for item in items:
            self.last_seq = item.seq
            if item.closed:
                self.ended = True
                break
            values.append(item)
        return values

    def _interval(self) -> float:
        return NOTIFIED_POLL if self._listening else POLL

    def wait(self, seconds: float) -> None:
        """Block until a write may have happened, at most ``seconds``."""
        seconds = min(seconds, self._interval())
        listener = self._listener
        if listener is None:
            time.sleep(seconds)
            return
        readable, _, _ = select.select([listener.fileno()], [], [], seconds)
        if readable:
            self._drain()

    async def wait_async(self, seconds: float) -> None:
        """``wait`` on the running event loop: the LISTEN connection's socket
        is watched by the loop, no thread held."""
        seconds = min(seconds, self._interval())
        listener = self._listener
        if listener is None:
            await asyncio.sleep(seconds)
            return
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        fd = listener.fileno()
        loop.add_reader(fd, woken.set)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(woken.wait(), seconds)
        finally:
            loop.remove_reader(fd)
        if woken.is_set():
            self._drain()

    def _drain(self) -> None:
        """Take what the LISTEN connection received (another run's writes
        only cost one read); a lost connection turns the reader to polling."""
        assert self._listener is not None
        try:
            self._listener.drain()
        except Exception:
            self.close()
            self._listening = False

    def items(self, timeout: float | None = None) -> Iterator[StreamItem]:
        """Every item in order, blocking for the next one up to ``timeout``
        seconds each (``TimeoutError`` past it; None: as long as it takes),
        until the stream is over. Closes the reader at its end."""
        try:
            while True:
                if self._buffer:
                    yield self._buffer.popleft()
                    continue
                if self.ended:
                    return
                give_up = time.monotonic() + (math.inf if timeout is None else timeout)
                while not self._buffer and not self.ended:
                    self._buffer.extend(self.fetch())
                    if self._buffer or self.ended:
                        break
                    left = give_up - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"run {self.run_id}: no value on stream {self.key!r} "
                                           f"within {timeout:g}s")
                    self.wait(left)
        finally:
            self.close()


def read(store: Store, run_id: str, key: str, timeout: float | None, after: int, items: bool) -> Iterator[Any]:
    """``everystep.read_stream``: checked and listening before it returns
    (``RunNotFound`` at the call, not at the first value)."""
    reader = StreamReader(store, run_id, key, after).open()
    found = reader.items(timeout)
    return found if items else (item.value for item in found)


async def read_async(reader: StreamReader, timeout: float | None, items: bool) -> AsyncIterator[Any]:
    """``everystep.read_stream_async``'s iterator over an opened reader: its
    database reads in a worker thread, its waits on the loop."""
    run_id, key = reader.run_id, reader.key
    try:
        while True:
            give_up = time.monotonic() + (math.inf if timeout is None else timeout)
            batch: list[StreamItem] = []
            while not batch and not reader.ended:
                batch = await asyncio.to_thread(reader.fetch)
                if batch or reader.ended:
                    break
                left = give_up - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"run {run_id}: no value on stream {key!r} within {timeout:g}s")
                await reader.wait_async(left)
            for item in batch:
                yield item if items else item.value
            if reader.ended:
                return
    finally:
        reader.close()


__all__ = ["BATCH", "NOTIFIED_POLL", "POLL", "StreamReader", "read", "read_async"]
