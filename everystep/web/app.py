"""The console as an ASGI application (Starlette), mountable in a host app.

Routes::

    GET  /                      runs            GET  /api/runs        ?status&workflow&q&before|after&limit
    GET  /runs/{id}             one run         GET  /api/runs/{id}
                                                GET  /api/runs/{id}/steps  ?after&limit  (a page of its steps)
                                                GET  /api/runs/{id}/streams/{key}  ?after  (SSE: its values,
                                                     Last-Event-ID resumes; everystep.read_stream's)
    GET  /runners               runners         GET  /api/runners
    GET  /blocked               blocked runs    GET  /api/blocked     ?before|after&limit
    GET  /static/…              JS and CSS      GET  /api/meta
                                                GET  /api/stream      ?view=runs|run|runners|blocked&…  (SSE)
                                                GET  /api/requests/{id}
    POST /api/runs/{id}/{resolve|requeue|rerun|kill}
    POST /api/runners/{name}/{kill|scale}
    POST /api/requests/{id}/expire

Pages are a small HTML shell that loads the console's own script (shipped
in the package, nothing fetched from elsewhere); the script reads the JSON
API and the stream. Errors are JSON ``{"error": "one line"}`` with 400 (bad
input), 404 (no such run), 409 (refused by the run's or runner's state) or
503 (database unreachable).

This module only routes: what each URL does is in ``handlers``, which the
Django views (``everystep.contrib.django.console``) call as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import registry
from ..store import Store, connect
from .handlers import NO_STORE, STATIC, STREAM_HEADERS, Console, Reply, Shell, page_html
from .security import CSRF_COOKIE, Guard, who


def _response(reply: Reply) -> Response:
    return Response(reply.body(), status_code=reply.status, media_type="application/json", headers=NO_STORE)


async def _off_loop(fn: Callable[..., Reply], *args: Any) -> Response:
    """A handler blocks on the database: run it in a thread."""
    return _response(await asyncio.to_thread(fn, *args))


class Routes:
    """The ASGI shell: Starlette requests in, the console's handlers called."""

    def __init__(self, console: Console, guard: Guard) -> None:
        self.console = console
        self.guard = guard

    async def page(self, request: Request, page: str) -> Response:
        token, fresh = self.guard.csrf_for(request.scope)
        root = request.scope.get("root_path", "").rstrip("/")
        shell = Shell(root=root, csrf=token, user=str(request.scope.get("everystep.user", "")))
        response = HTMLResponse(page_html(page, str(request.path_params.get("run_id", "")), shell), headers=NO_STORE)
        if fresh is not None:
            response.set_cookie(CSRF_COOKIE, fresh, httponly=True, samesite="strict", path=root or "/",
                                secure=request.url.scheme == "https")
        return response

    async def view(self, request: Request, view: str) -> Response:
        run_id = request.path_params.get("run_id")
        return await _off_loop(self.console.view, view, dict(request.query_params),
                               None if run_id is None else str(run_id))

    async def meta(self, request: Request) -> Response:
        return await _off_loop(self.console.meta)

    async def stream(self, request: Request) -> Response:
        body = self.console.stream(dict(request.query_params))
        if isinstance(body, Reply):
            return _response(body)
        return StreamingResponse(body, media_type="text/event-stream", headers=STREAM_HEADERS)

    async def run_stream(self, request: Request) -> Response:
        opened = await asyncio.to_thread(self.console.open_stream, str(request.path_params["run_id"]),
                                         str(request.path_params["key"]), request.query_params.get("after"),
                                         request.headers.get("last-event-id"))
        if isinstance(opened, Reply):
            return _response(opened)
        return StreamingResponse(self.console.stream_body(opened), media_type="text/event-stream",
                                 headers=STREAM_HEADERS)

    async def request(self, request: Request) -> Response:
        return await _off_loop(self.console.request, request.path_params["request_id"])

    async def expire_request(self, request: Request) -> Response:
        return await _off_loop(self.console.expire_request, request.path_params["request_id"])

    async def run_action(self, request: Request) -> Response:
        return await _off_loop(self.console.run_action, request.path_params["run_id"],
                               request.path_params["action"], await request.body(), who(request.scope))

    async def runner_action(self, request: Request) -> Response:
        return await _off_loop(self.console.runner_action, request.path_params["name"],
                               request.path_params["command"], await request.body(), who(request.scope))


def create_app(
    database_url: str | None = None,
    *,
    store: Store | None = None,
    auth_token: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
    csrf_secret: bytes | None = None,
    app_modules: str | Sequence[str] | None = None,
    read_database_url: str | None = None,
) -> Guard:
    """Build the console. ``database_url`` as everywhere (else
    ``EVERYSTEP_DATABASE_URL``, else the SQLite default), or an open
    ``store``. Without ``auth_token`` anyone who can reach it may act:
    mount it behind your own authentication, or give a token. Give
    ``csrf_secret`` when several processes serve it behind one address.
    ``app_modules``: import these so the console can read workflow sources
    and judge runs as check-deploy does (or import them in the host).
    ``read_database_url``: a read replica its pages read from, through a
    read-only store; actions still write to ``database_url``."""
    registry.import_apps(app_modules)
    guard = Guard(None, auth_token=auth_token, allowed_hosts=allowed_hosts, csrf_secret=csrf_secret)
    reads = connect(read_database_url, read_only=True) if read_database_url else None
    console = Console(store or connect(database_url), reads)
    shell = Routes(console, guard)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        console.watcher.stop()

    routes = [
        Route("/", functools.partial(shell.page, page="runs")),
        Route("/runs/{run_id:uuid}", functools.partial(shell.page, page="run")),
        Route("/runners", functools.partial(shell.page, page="runners")),
        Route("/blocked", functools.partial(shell.page, page="blocked")),
        Route("/api/meta", shell.meta),
        Route("/api/runs", functools.partial(shell.view, view="runs")),
        Route("/api/runs/{run_id}", functools.partial(shell.view, view="run")),
        Route("/api/runs/{run_id}/steps", functools.partial(shell.view, view="steps"), methods=["GET"]),
        Route("/api/runs/{run_id}/streams/{key:path}", shell.run_stream, methods=["GET"]),
        Route("/api/runners", functools.partial(shell.view, view="runners")),
        Route("/api/blocked", functools.partial(shell.view, view="blocked")),
        Route("/api/stream", shell.stream),
        Route("/api/requests/{request_id}", shell.request),
        Route("/api/requests/{request_id}/expire", shell.expire_request, methods=["POST"]),
        Route("/api/runs/{run_id}/{action}", shell.run_action, methods=["POST"]),
        Route("/api/runners/{name}/{command}", shell.runner_action, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
    ]
    guard.app = Starlette(routes=routes, lifespan=lifespan)
    guard.console = console
    return guard


__all__ = ["Console", "create_app"]
