"""The console's handlers as Django responses, under ASGI and WSGI alike.

- ``console()``: the process's ``Console`` for ``EVERYSTEP["DATABASE"]``,
  on everystep's own Store for that database (actions need transactions of
  their own, as the admin's resolve does), built on first use.
- ``respond``: a handler's ``Reply`` as a JSON response.
- ``stream_response``: the live stream. Under ASGI the console's async SSE
  body is served as is, on the server's event loop. Under WSGI there is no
  loop, and Django would buffer an async body forever: the same body runs
  on one event loop in a daemon thread (``LoopThread``) and the request's
  thread takes its chunks one by one, so each open page holds that thread
  for as long as it is open (hence ``EVERYSTEP["CONSOLE_STREAM"]``: by
  default WSGI pages poll instead). ``run_stream_response``: a run's
  stream (``GET api/runs/<id>/streams/<key>``) served the same way.
- ``secured``: the console's own security headers (its strict
  Content-Security-Policy among them) on every response it makes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Iterator, Mapping
from typing import Any

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from everystep.web.handlers import NO_STORE, STREAM_HEADERS, Console, Reply
from everystep.web.security import SECURITY_HEADERS

from .. import conf, database

#: Seconds a closing WSGI stream waits for its body to wind down.
CLOSE_TIMEOUT = 5.0

_consoles: dict[int, Console] = {}
_lock = threading.Lock()


def console() -> Console:
    """The console over the configured database (one per Store)."""
    store = database.store()
    with _lock:
        found = _consoles.get(id(store))
        if found is None or found.store is not store:
            found = _consoles[id(store)] = Console(store)
        return found


def secured(response: HttpResponse | StreamingHttpResponse) -> Any:
    for name, value in SECURITY_HEADERS:
        response.headers[name.decode()] = value.decode()
    return response


def respond(reply: Reply) -> HttpResponse:
    response = HttpResponse(reply.body(), status=reply.status, content_type="application/json", headers=NO_STORE)
    return secured(response)


def refuse(status: int, message: str) -> HttpResponse:
    return respond(Reply(status, {"error": message}))


def is_asgi(request: HttpRequest) -> bool:
    from django.core.handlers.asgi import ASGIRequest

    return isinstance(request, ASGIRequest)


def streams(request: HttpRequest) -> bool:
    """Whether this server streams live updates (see ``conf``)."""
    setting = conf.get().console_stream
    return is_asgi(request) if setting is None else setting


def stream_response(request: HttpRequest, params: Mapping[str, Any]) -> HttpResponse | StreamingHttpResponse:
    if not streams(request):
        return refuse(404, "live updates are off on this server (EVERYSTEP['CONSOLE_STREAM']): poll the API")
    current = console()
    body = current.stream(params)
    if isinstance(body, Reply):
        return respond(body)
    content: Any = body if is_asgi(request) else loop_thread().iterate(body)
    return secured(StreamingHttpResponse(content, content_type="text/event-stream", headers=STREAM_HEADERS))


def run_stream_response(request: HttpRequest, run_id: str, key: str) -> HttpResponse | StreamingHttpResponse:
    """A run's stream as server-sent events (``everystep.read_stream``'s),
    where this server streams."""
    if not streams(request):
        return refuse(404, "live updates are off on this server (EVERYSTEP['CONSOLE_STREAM']): read the stream "
                           "with everystep.read_stream or `everystep stream`")
    current = console()
    opened = current.open_stream(run_id, key, request.GET.get("after"), request.headers.get("last-event-id"))
    if isinstance(opened, Reply):
        return respond(opened)
    body = current.stream_body(opened)
    content: Any = body if is_asgi(request) else loop_thread().iterate(body)
    return secured(StreamingHttpResponse(content, content_type="text/event-stream", headers=STREAM_HEADERS))


class LoopThread:
    """One event loop on a daemon thread, serving streams to WSGI threads."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="everystep-console-streams", daemon=True)
        self.thread.start()

    def iterate(self, body: AsyncGenerator[str, None]) -> Iterator[str]:
        """``body``'s chunks, run on the loop, taken from the calling thread.
        Closing the iterator (the WSGI server does when the client left)
        closes ``body``."""

        async def next_chunk() -> str | None:
            try:
                return await body.__anext__()
            except StopAsyncIteration:
                return None

        async def close() -> None:
            await body.aclose()

        try:
            while (chunk := asyncio.run_coroutine_threadsafe(next_chunk(), self.loop).result()) is not None:
                yield chunk
        finally:
            try:
                asyncio.run_coroutine_threadsafe(close(), self.loop).result(CLOSE_TIMEOUT)
            except Exception:  # the loop is gone or the body would not end: nothing left to free
                pass


_loop_thread: LoopThread | None = None


def loop_thread() -> LoopThread:
    """The process's stream loop for WSGI, started on first use."""
    global _loop_thread
    with _lock:
        if _loop_thread is None:
            _loop_thread = LoopThread()
        return _loop_thread


__all__ = ["LoopThread", "console", "refuse", "respond", "run_stream_response", "secured", "stream_response",
           "streams"]
