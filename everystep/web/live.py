"""Live pages: server-sent events, and exactly what drives them.

Each open page holds one ``text/event-stream`` (``/api/stream?view=…``) and
receives an ``update`` event carrying the same JSON its GET endpoint
returns, whenever that JSON changes. What makes the console look again:

- **A tick every ``TICK`` seconds** (0.5 s): each distinct view open in some
  browser is computed once per tick, whatever the number of tabs showing it
  (``Snapshots`` shares the computation). A view is a handful of indexed
  queries: a page of runs along the primary key or a status index, bounded
  counts (see ``counts``), one run with its steps, the runner table. This is
  what sees steps recorded and runs finishing: the engine's hot paths
  (claims, step records, terminal writes) send no notification, so they pay
  nothing for an open console.
- **On PostgreSQL, LISTEN** on the channels that already exist:
  ``everystep_scheduled`` (every ``schedule()`` notifies it) and
  ``everystep_request`` (operator requests). A notification triggers an
  extra tick, at most one per ``COALESCE`` seconds however fast runs are
  scheduled.
- **The console's own actions** trigger a tick at once.

On SQLite there is no LISTEN: the tick alone. When a stream breaks, the
browser polls the GET endpoint every two seconds until it reconnects; where
the server does not stream at all (a Django project under WSGI, by
default), pages only poll.
Between changes the stream sends a comment every ``PING`` seconds so
proxies keep it open.
"""

from __future__ import annotations

import asyncio
import json
import logging
import select
import threading
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from .. import serde
from ..errors import EverystepError
from ..store.channels import REQUEST_CHANNEL, SCHEDULED_CHANNEL
from ..store import Store
from ..stream_reader import StreamReader

logger = logging.getLogger("everystep.console")

TICK = 0.5
COALESCE = 0.1
PING = 15.0
RETRY_MS = 2000
LISTEN_RETRY = 2.0
CHANNELS = (SCHEDULED_CHANNEL, REQUEST_CHANNEL)


class Watcher:
    """The console's clock: a generation number bumped every tick, on
    NOTIFY and after actions; streams wait for the next generation."""

    def __init__(self, store: Store, tick: float = TICK) -> None:
        self.store = store
        self.tick = tick
        self.generation = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._listener: threading.Thread | None = None
        self._stop = threading.Event()
        self._bump_scheduled = False
        self._said_polling = False
        self.stopped = False

    def start(self) -> None:
        """Start ticking (and listening) on the running loop; idempotent, so
        the first stream starts it: a mounted app gets no lifespan events."""
        if self.stopped:
            return
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._ticker is not None and not self._ticker.done():
            return
        self._loop = loop
        self._changed = asyncio.Event()
        self._ticker = loop.create_task(self._tick_forever())
        if self.store.notifies and not self.store.wakes and not self._said_polling:
            self._said_polling = True  # behind a transaction pooler without a LISTEN URL
            logger.info("console: refreshing every %g s: %s", self.tick, self.store.listen_unavailable)
        if self.store.notifies and self.store.wakes and (self._listener is None or not self._listener.is_alive()):
            self._stop.clear()
            self._listener = threading.Thread(target=self._listen, name="everystep-console-listen", daemon=True)
            self._listener.start()

    def stop(self) -> None:
        """End every stream (from any thread): the server is shutting down."""
        self.stopped = True
        self._stop.set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._halt)
            except RuntimeError:  # closed meanwhile
                pass

    def _halt(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        self.bump()

    def bump(self) -> None:
        """A change may have happened: wake every stream (loop thread only)."""
        self.generation += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def bump_soon(self) -> None:
        """From any thread: one bump within ``COALESCE`` seconds."""
        loop = self._loop
        if loop is None or self._bump_scheduled:
            return
        self._bump_scheduled = True

        def fire() -> None:
            self._bump_scheduled = False
            self.bump()

        try:
            loop.call_soon_threadsafe(loop.call_later, COALESCE, fire)
        except RuntimeError:  # the loop is closed
            self._bump_scheduled = False

    async def wait(self, generation: int, timeout: float) -> int:
        """Until the generation moves past ``generation`` (or ``timeout``)."""
        if self.generation > generation or self._changed is None:
            return self.generation
        changed = self._changed
        try:
            await asyncio.wait_for(changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return self.generation

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            self.bump()

    def _listen(self) -> None:
        """LISTEN on PostgreSQL until stopped, reconnecting after failures."""
        warned = False
        while not self._stop.is_set():
            try:
                conn = self.store.listen()
                assert conn is not None
            except Exception as exc:
                if not warned:
                    logger.warning("console: LISTEN unavailable, refreshing on the tick only: %s", exc)
                    warned = True
                self._stop.wait(LISTEN_RETRY)
                continue
            warned = False
            try:
                while not self._stop.is_set():
                    readable, _, _ = select.select([conn.fileno()], [], [], 1.0)
                    if readable and any(channel in CHANNELS for channel, _ in conn.drain()):
                        self.bump_soon()
            except Exception as exc:
                logger.warning("console: LISTEN connection lost (%s); refreshing on the tick until it is back", exc)
            finally:
                conn.close()
            self._stop.wait(LISTEN_RETRY)


class Snapshots:
    """One computation per view per generation, shared by its streams."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[int, asyncio.Future[Any]]] = {}

    async def get(self, key: str, generation: int, compute: Callable[[], Any]) -> Any:
        entry = self._cache.get(key)
        if entry is None or entry[0] != generation:
            future = asyncio.ensure_future(asyncio.to_thread(compute))
            self._cache[key] = (generation, future)
            for other, (seen, _) in list(self._cache.items()):
                if seen < generation - 4:
                    del self._cache[other]
            entry = (generation, future)
        return await asyncio.shield(entry[1])


async def event_stream(watcher: Watcher, snapshots: Snapshots, key: str,
                       compute: Callable[[], Any]) -> AsyncGenerator[str, None]:
    """The SSE body for one view: an ``update`` whenever its data changes,
    an ``error`` event while it cannot be read, pings in between."""
    watcher.start()
    yield f"retry: {RETRY_MS}\n\n"
    last = None
    last_sent = time.monotonic()
    generation = watcher.generation
    while not watcher.stopped:
        try:
            data = await snapshots.get(key, generation, compute)
            body = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
            event = "update"
        except EverystepError as exc:
            body, event = json.dumps({"error": str(exc).splitlines()[0]}), "problem"
        if body != last:
            last, last_sent = body, time.monotonic()
            yield f"event: {event}\ndata: {body}\n\n"
        elif time.monotonic() - last_sent >= PING:
            last_sent = time.monotonic()
            yield ": ping\n\n"
        generation = await watcher.wait(generation, timeout=PING)


async def stream_events(reader: StreamReader, stopped: Callable[[], bool]) -> AsyncGenerator[str, None]:
    """The SSE body of one run's stream (``GET /api/runs/<id>/streams/<key>``):
    each value an event ``value`` whose ``id`` is its position (a browser
    reconnecting sends it back as ``Last-Event-ID``), then an event ``end``
    once the stream is closed or its run has ended; pings in between. The
    reader waits on the loop (PostgreSQL: its LISTEN socket), its reads in
    a worker thread; it is closed when the client goes away."""
    try:
        yield f"retry: {RETRY_MS}\n\n"
        last_sent = time.monotonic()
        while not stopped():
            try:
                batch = await asyncio.to_thread(reader.fetch)
            except EverystepError as exc:
                yield f"event: problem\ndata: {json.dumps({'error': str(exc).splitlines()[0]})}\n\n"
                await asyncio.sleep(RETRY_MS / 1000)
                continue
            for item in batch:
                data = json.dumps(serde.to_jsonable(item.value), separators=(",", ":"))
                yield f"id: {item.seq}\nevent: value\ndata: {data}\n\n"
                last_sent = time.monotonic()
            if reader.ended:
                yield f"id: {reader.last_seq}\nevent: end\ndata: {{}}\n\n"
                return
            if batch:
                continue
            if time.monotonic() - last_sent >= PING:
                last_sent = time.monotonic()
                yield ": ping\n\n"
            await reader.wait_async(PING)
    finally:
        reader.close()


__all__ = ["CHANNELS", "Snapshots", "Watcher", "event_stream", "stream_events"]
