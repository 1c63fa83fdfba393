"""The console's requests, apart from any web framework.

Two servers answer the console's URLs: the ASGI app (``app``, what
``everystep ui`` runs) and the Django views
(``everystep.contrib.django.console``). Both are thin shells over this
module: they route, check who may do what (each in its own way), turn the
request into plain values (path parameters, query parameters, the raw
body, who asks) and a ``Reply`` back into a response. So every read, every
action, every error mapping and the page shell exist once.

Handlers block on the database: the ASGI app runs them in a thread, Django
in its request thread. ``stream`` returns the async SSE body (``live``);
the shells serve it on their own event loop.
"""

from __future__ import annotations

import html
import json
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .. import streams
from ..admin import AdminError
from ..errors import EverystepError, RunNotFound, StoreUnavailable
from ..store import Store
from ..stream_reader import StreamReader
from . import actions
from .live import Snapshots, Watcher, event_stream, stream_events
from .views import BadRequest, RunFilter, Views

PAGES = {"runs": "Runs", "run": "Run", "runners": "Runners", "blocked": "Blocked runs"}
MAX_BODY = 1 << 20
#: Headers of every JSON reply and every stream.
NO_STORE = {"cache-control": "no-store"}
STREAM_HEADERS = {"cache-control": "no-store", "x-accel-buffering": "no"}
#: The console's script and style, shipped in the package.
STATIC = resources.files(__package__).joinpath("static")


@dataclass(frozen=True)
class Reply:
    """An answer: an HTTP status and the JSON-ready data (``{"error": …}``
    for a refusal)."""

    status: int
    data: Any

    def body(self) -> bytes:
        return json.dumps(self.data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def error(status: int, problem: BaseException | str) -> Reply:
    """A refusal carrying one line."""
    message = str(problem).strip().splitlines()[0] if str(problem).strip() else type(problem).__name__
    return Reply(status, {"error": message})


def parse_body(raw: bytes) -> dict[str, Any] | Reply:
    """An action's JSON object body (empty means ``{}``), or the refusal."""
    if len(raw) > MAX_BODY:
        return error(413, "request body too large")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        return error(400, "the request body is not JSON")
    if not isinstance(body, dict):
        return error(400, "the request body must be a JSON object")
    return body


class Console:
    """What one console holds, whichever server answers for it: its store,
    views (with their caches), clock and shared stream snapshots.

    ``reads``: a store its views read instead (a read replica); actions,
    requests and LISTEN stay on ``store``, the primary. A view then lags
    the primary by the replica's delay, and a change it was woken for may
    show at the next tick."""

    def __init__(self, store: Store, reads: Store | None = None) -> None:
        self.store = store
        self.views = Views(reads or store)
        self.watcher = Watcher(store)
        self.snapshots = Snapshots()

    # -- plumbing ------------------------------------------------------------------------------

    def answer(self, fn: Callable[..., Any], *args: Any, status: int = 200) -> Reply:
        """Run a read or an action; map its errors to HTTP statuses."""
        try:
            return Reply(status, fn(*args))
        except RunNotFound as exc:
            return error(404, exc)
        except (BadRequest, ValueError) as exc:
            return error(400, exc)
        except (AdminError, actions.ActionRefused) as exc:
            return error(409, exc)
        except StoreUnavailable as exc:
            return error(503, exc)
        except EverystepError as exc:
            return error(409, exc)

    # -- reads ---------------------------------------------------------------------------------------

    def compute(self, view: str, params: Mapping[str, Any]) -> Callable[[], Any]:
        """The read behind a view, for GETs, streams and the polling fallback alike."""
        if view == "runs":
            RunFilter.parse(params)  # refuse bad filters before streaming
            return lambda: self.views.runs(params)
        if view == "run":
            run_id = str(params.get("id", ""))
            return lambda: self.views.run(run_id)
        if view == "steps":
            run_id = str(params.get("id", ""))
            return lambda: self.views.steps(run_id, params)
        if view == "runners":
            return self.views.runners
        if view == "blocked":
            return lambda: self.views.blocked(params)
        raise BadRequest(f"unknown view {view[:40]!r}; expected runs, run, steps, runners or blocked")

    def view(self, view: str, params: Mapping[str, Any], run_id: str | None = None) -> Reply:
        """``GET /api/runs``, ``/api/runs/{id}``, ``/api/runs/{id}/steps``, ``/api/runners``, ``/api/blocked``."""
        params = dict(params)
        if run_id is not None:
            params["id"] = run_id
        try:
            compute = self.compute(view, params)
        except BadRequest as exc:
            return error(400, exc)
        return self.answer(compute)

    def meta(self) -> Reply:
        return self.answer(self.views.meta)

    def stream(self, params: Mapping[str, Any]) -> AsyncGenerator[str, None] | Reply:
        """``GET /api/stream?view=…``: the SSE body to serve, or the refusal."""
        params = dict(params)
        view = str(params.pop("view", ""))
        try:
            compute = self.compute(view, params)
        except BadRequest as exc:
            return error(400, exc)
        key = view + "?" + json.dumps(sorted(params.items()))
        return event_stream(self.watcher, self.snapshots, key, compute)

    def open_stream(self, run_id: str, key: str, after: str | None,
                    last_event_id: str | None) -> StreamReader | Reply:
        """``GET /api/runs/{id}/streams/{key}``, its blocking part: the run
        checked and a reader listening, resuming after ``Last-Event-ID``
        (or ``?after=``); or the refusal. Reads the primary: a stream is
        live, a replica's delay would hold every value back."""
        position = last_event_id if last_event_id not in (None, "") else after
        try:
            streams.key_checked(key, "a stream")
            start = 0 if position in (None, "") else int(str(position))
            if start < 0:
                raise ValueError
        except EverystepError as exc:
            return error(400, exc)
        except ValueError:
            return error(400, f"a stream position is a whole number, 0 or more, not {str(position)[:40]!r}")
        reader = StreamReader(self.store, run_id, key, start)
        reply = self.answer(reader.open)
        if reply.status != 200:
            return reply
        return reader

    def stream_body(self, reader: StreamReader) -> AsyncGenerator[str, None]:
        """The SSE body of an opened stream reader (``live.stream_events``)."""
        return stream_events(reader, lambda: self.watcher.stopped)

    def request(self, request_id: str) -> Reply:
        """``GET /api/requests/{id}``: an operator request and its outcome."""
        def read() -> dict[str, Any]:
            found = self.store.get_request(_request_id(request_id))
            if found is None:
                raise RunNotFound(f"no request with id {request_id}")
            return {**found.to_dict(), "outcome": actions.outcome(found), "done": found.done}

        return self.answer(read)

    # -- actions ---------------------------------------------------------------------------------------

    def run_action(self, run_id: str, action: str, raw: bytes, who: str) -> Reply:
        """``POST /api/runs/{id}/{action}``."""
        handler = actions.RUN_HANDLERS.get(action)
        if handler is None:
            return error(404, f"unknown action {action[:40]!r}")
        body = parse_body(raw)
        if isinstance(body, Reply):
            return body
        reply = self.answer(handler, self.store, run_id, body, who, status=202 if action == "kill" else 200)
        self.after_action()
        return reply

    def runner_action(self, name: str, command: str, raw: bytes, who: str) -> Reply:
        """``POST /api/runners/{name}/{command}``."""
        body = parse_body(raw)
        if isinstance(body, Reply):
            return body
        reply = self.answer(actions.runner_command, self.store, name, command, body, who, status=202)
        self.after_action()
        return reply

    def expire_request(self, request_id: str) -> Reply:
        """``POST /api/requests/{id}/expire``: stop waiting for a reply."""
        def expire() -> dict[str, Any]:
            number = _request_id(request_id)
            expired = self.store.expire_request(number)
            found = self.store.get_request(number)
            if found is None:
                raise RunNotFound(f"no request with id {request_id}")
            return {**found.to_dict(), "expired": expired, "outcome": actions.outcome(found),
                    "done": found.done}

        return self.answer(expire)

    def after_action(self) -> None:
        """An action may have changed what pages show: refresh them now."""
        self.views.counts.invalidate()
        self.watcher.bump_soon()


def _request_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise BadRequest("request ids are numbers") from None


# -- the page shell ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shell:
    """What a page tells the console's script: where the console is
    mounted (``root``, no trailing slash), the CSRF token and the header
    carrying it, whether to stream or poll, whether actions are allowed."""

    root: str
    csrf: str
    csrf_header: str = "x-csrf-token"
    user: str = ""
    stream: bool = True
    operate: bool = True


def page_html(page: str, run_id: str, shell: Shell) -> str:
    """The HTML of a page: a small shell that loads the console's script."""
    title = PAGES[page] + (f" {run_id[:8]}" if run_id else "")

    def attr(value: str) -> str:
        return html.escape(value, quote=True)

    return SHELL.format(
        title=html.escape(title), root=attr(shell.root), page=attr(page), csrf=attr(shell.csrf),
        csrf_header=attr(shell.csrf_header), run=attr(run_id), user=attr(shell.user),
        stream="on" if shell.stream else "off", operate="yes" if shell.operate else "no",
    )


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
<body data-page="{page}" data-root="{root}" data-csrf="{csrf}" data-csrf-header="{csrf_header}" data-run="{run}"
 data-user="{user}" data-stream="{stream}" data-operate="{operate}">
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


__all__ = ["Console", "NO_STORE", "PAGES", "Reply", "STATIC", "STREAM_HEADERS", "Shell", "error", "page_html",
           "parse_body"]
