"""The console as an ASGI application (Starlette), mountable in a host app.

Routes::

    GET  /                      runs            GET  /api/runs        ?status&workflow&q&before|after&limit
    GET  /runs/{id}             one run         GET  /api/runs/{id}
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
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import html
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import registry, relay
from ..admin import AdminError
from ..errors import EverystepError, RunNotFound, StoreUnavailable
from ..store import Store, connect
from . import actions
from .live import Snapshots, Watcher, event_stream
from .security import CSRF_COOKIE, Guard, who
from .views import BadRequest, RunFilter, Views

logger = logging.getLogger("everystep.console")

PAGES = {"runs": "Runs", "run": "Run", "runners": "Runners", "blocked": "Blocked runs"}
MAX_BODY = 1 << 20


class Console:
    """The state one console app holds: its store, views, clock and gate."""

    def __init__(self, store: Store, guard: Guard) -> None:
        self.store = store
        self.views = Views(store)
        self.watcher = Watcher(store)
        self.snapshots = Snapshots()
        self.guard = guard

    # -- plumbing ------------------------------------------------------------------------------

    async def call(self, fn: Callable[..., Any], *args: Any, status: int = 200) -> Response:
        """Run a blocking read or action in a thread; map errors to HTTP."""
        try:
            data = await asyncio.to_thread(fn, *args)
        except RunNotFound as exc:
            return _error(404, exc)
        except (BadRequest, ValueError) as exc:
            return _error(400, exc)
        except (AdminError, actions.ActionRefused) as exc:
            return _error(409, exc)
        except StoreUnavailable as exc:
            return _error(503, exc)
        except EverystepError as exc:
            return _error(409, exc)
        return JSONResponse(data, status_code=status, headers={"cache-control": "no-store"})

    # -- pages -----------------------------------------------------------------------------------

    async def page(self, request: Request, page: str) -> Response:
        run_id = str(request.path_params.get("run_id", ""))
        token, fresh = self.guard.csrf_for(request.scope)
        root = request.scope.get("root_path", "").rstrip("/")
        title = PAGES[page] + (f" {run_id[:8]}" if run_id else "")
        body = SHELL.format(
            title=html.escape(title), root=html.escape(root, quote=True), page=html.escape(page, quote=True),
            csrf=html.escape(token, quote=True), run=html.escape(run_id, quote=True),
            user=html.escape(str(request.scope.get("everystep.user", "")), quote=True),
        )
        response = HTMLResponse(body, headers={"cache-control": "no-store"})
        if fresh is not None:
            response.set_cookie(CSRF_COOKIE, fresh, httponly=True, samesite="strict", path=root or "/",
                                secure=request.url.scheme == "https")
        return response

    # -- reads ---------------------------------------------------------------------------------------

    def compute(self, view: str, params: Any) -> Callable[[], Any]:
        """The read behind a view, for GETs, streams and the polling fallback alike."""
        if view == "runs":
            RunFilter.parse(params)  # refuse bad filters before streaming
            return lambda: self.views.runs(params)
        if view == "run":
            run_id = str(params.get("id", ""))
            return lambda: self.views.run(run_id)
        if view == "runners":
            return self.views.runners
        if view == "blocked":
            return lambda: self.views.blocked(params)
        raise BadRequest(f"unknown view {view[:40]!r}; expected runs, run, runners or blocked")

    async def get_view(self, request: Request, view: str) -> Response:
        params = dict(request.query_params)
        if "run_id" in request.path_params:
            params["id"] = request.path_params["run_id"]
        try:
            compute = self.compute(view, params)
        except BadRequest as exc:
            return _error(400, exc)
        return await self.call(compute)

    async def meta(self, request: Request) -> Response:
        return await self.call(self.views.meta)

    async def stream(self, request: Request) -> Response:
        params = dict(request.query_params)
        view = params.pop("view", "")
        try:
            compute = self.compute(view, params)
        except BadRequest as exc:
            return _error(400, exc)
        key = view + "?" + json.dumps(sorted(params.items()))
        return StreamingResponse(
            event_stream(self.watcher, self.snapshots, key, compute), media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def get_request(self, request: Request) -> Response:
        def read() -> dict[str, Any]:
            found = self.store.get_request(_request_id(request))
            if found is None:
                raise RunNotFound(f"no request with id {request.path_params['request_id']}")
            return {**found.to_dict(), "outcome": relay.describe_outcome(found), "done": found.done}

        return await self.call(read)

    # -- actions ---------------------------------------------------------------------------------------

    async def run_action(self, request: Request) -> Response:
        action = request.path_params["action"]
        handler = actions.RUN_HANDLERS.get(action)
        if handler is None:
            return _error(404, f"unknown action {action[:40]!r}")
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        response = await self.call(handler, self.store, request.path_params["run_id"], body, who(request.scope),
                                   status=202 if action == "kill" else 200)
        self.after_action()
        return response

    async def runner_action(self, request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        response = await self.call(actions.runner_command, self.store, request.path_params["name"],
                                   request.path_params["command"], body, who(request.scope), status=202)
        self.after_action()
        return response

    async def expire_request(self, request: Request) -> Response:
        def expire() -> dict[str, Any]:
            request_id = _request_id(request)
            expired = self.store.expire_request(request_id)
            found = self.store.get_request(request_id)
            if found is None:
                raise RunNotFound(f"no request with id {request_id}")
            return {**found.to_dict(), "expired": expired, "outcome": relay.describe_outcome(found),
                    "done": found.done}

        return await self.call(expire)

    def after_action(self) -> None:
        self.views.counts.invalidate()
        self.watcher.bump()


def _request_id(request: Request) -> int:
    try:
        return int(request.path_params["request_id"])
    except ValueError:
        raise BadRequest("request ids are numbers") from None


async def _json_body(request: Request) -> dict[str, Any] | Response:
    raw = await request.body()
    if len(raw) > MAX_BODY:
        return _error(413, "request body too large")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        return _error(400, "the request body is not JSON")
    if not isinstance(body, dict):
        return _error(400, "the request body must be a JSON object")
    return body


def _error(status: int, error: BaseException | str) -> JSONResponse:
    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return JSONResponse({"error": message}, status_code=status, headers={"cache-control": "no-store"})


SHELL = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · everystep</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{root}/static/console.css">
<script type="module" src="{root}/static/js/main.js"></script>
</head>
<body data-page="{page}" data-root="{root}" data-csrf="{csrf}" data-run="{run}" data-user="{user}">
<header class="top">
  <a class="brand" href="{root}/">everystep</a>
  <nav>
    <a href="{root}/" data-nav="runs">Runs</a>
    <a href="{root}/blocked" data-nav="blocked">Blocked</a>
    <a href="{root}/runners" data-nav="runners">Runners</a>
  </nav>
  <span class="live" id="live" title="how this page is kept up to date">connecting…</span>
</header>
<main id="main"><noscript>The everystep console needs JavaScript.</noscript></main>
<div id="toasts" aria-live="polite"></div>
</body>
</html>
"""


def create_app(
    database_url: str | None = None,
    *,
    store: Store | None = None,
    auth_token: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
    csrf_secret: bytes | None = None,
    app_modules: str | Sequence[str] | None = None,
) -> Guard:
    """Build the console. ``database_url`` as everywhere (else
    ``EVERYSTEP_DATABASE_URL``, else the SQLite default), or an open
    ``store``. Without ``auth_token`` anyone who can reach it may act:
    mount it behind your own authentication, or give a token. Give
    ``csrf_secret`` when several processes serve it behind one address.
    ``app_modules``: import these so the console can read workflow sources
    and judge runs as check-deploy does (or import them in the host)."""
    registry.import_apps(app_modules)
    guard = Guard(None, auth_token=auth_token, allowed_hosts=allowed_hosts, csrf_secret=csrf_secret)
    console = Console(store or connect(database_url), guard)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        console.watcher.stop()

    routes = [
        Route("/", functools.partial(console.page, page="runs")),
        Route("/runs/{run_id:uuid}", functools.partial(console.page, page="run")),
        Route("/runners", functools.partial(console.page, page="runners")),
        Route("/blocked", functools.partial(console.page, page="blocked")),
        Route("/api/meta", console.meta),
        Route("/api/runs", functools.partial(console.get_view, view="runs")),
        Route("/api/runs/{run_id}", functools.partial(console.get_view, view="run")),
        Route("/api/runners", functools.partial(console.get_view, view="runners")),
        Route("/api/blocked", functools.partial(console.get_view, view="blocked")),
        Route("/api/stream", console.stream),
        Route("/api/requests/{request_id}", console.get_request),
        Route("/api/requests/{request_id}/expire", console.expire_request, methods=["POST"]),
        Route("/api/runs/{run_id}/{action}", console.run_action, methods=["POST"]),
        Route("/api/runners/{name}/{command}", console.runner_action, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(resources.files(__package__).joinpath("static"))), name="static"),
    ]
    guard.app = Starlette(routes=routes, lifespan=lifespan)
    guard.console = console
    return guard


__all__ = ["Console", "create_app"]
