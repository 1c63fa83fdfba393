"""The console's Django views: who may, then the console's own handlers.

- Looking (pages, reads, the stream) needs ``everystep.view_run``; acting
  (every POST) needs ``everystep.operate_console``. Superusers have both.
- Anonymous visitors: pages redirect to ``LOGIN_URL``; the API answers
  403 with a JSON error (a script has no login page to follow).
- A user without the permission: 403 (Django's page, or the JSON error).
- POSTs are CSRF-protected by Django (``csrf_protect``, whether or not the
  project's middleware is on); pages hand the script Django's token and the
  header (``CSRF_HEADER_NAME``) to send it in.

The script's assets are the package's own files and need no login.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.middleware.csrf import get_token
from django.urls import reverse
from django.views.decorators.csrf import csrf_protect, ensure_csrf_cookie
from django.views.decorators.http import require_GET, require_POST
from django.views.static import serve

from everystep.web.handlers import NO_STORE, STATIC, Shell, page_html

from . import bridge

VIEW = "everystep.view_run"
OPERATE = "everystep.operate_console"

View = Callable[..., Any]


def allowed(permission: str, *, page: bool = False) -> Callable[[View], View]:
    """Let through users holding ``permission``; refuse the others (see above)."""
    def decorate(view: View) -> View:
        @functools.wraps(view)
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            user = request.user
            if not user.is_authenticated:
                if page:
                    return redirect_to_login(request.get_full_path())
                return bridge.refuse(403, "log in to use the everystep console")
            if not user.has_perm(permission):
                if page:
                    raise PermissionDenied(f"the everystep console needs the {permission} permission")
                return bridge.refuse(403, f"this needs the {permission} permission")
            return view(request, *args, **kwargs)

        return checked

    return decorate


def who(request: HttpRequest) -> str:
    return f"{request.user.get_username()} from {request.META.get('REMOTE_ADDR') or '?'}"


def root_of(request: HttpRequest) -> str:
    """Where this console is mounted (``/everystep``), from its URL namespace."""
    match = request.resolver_match
    namespace = match.namespace if match is not None else "everystep_console"
    return reverse(f"{namespace}:runs").rstrip("/")


def csrf_header() -> str:
    """Django's ``CSRF_HEADER_NAME`` (``HTTP_X_CSRFTOKEN``) as a header name."""
    name = str(settings.CSRF_HEADER_NAME)
    return (name[5:] if name.startswith("HTTP_") else name).replace("_", "-")


@require_GET
@ensure_csrf_cookie
@allowed(VIEW, page=True)
def page(request: HttpRequest, page: str, run_id: UUID | None = None) -> HttpResponse:
    shell = Shell(root=root_of(request), csrf=get_token(request), csrf_header=csrf_header(),
                  user=request.user.get_username(), stream=bridge.streams(request),
                  operate=request.user.has_perm(OPERATE))
    return bridge.secured(HttpResponse(page_html(page, str(run_id or ""), shell), headers=NO_STORE))


@require_GET
@allowed(VIEW)
def view(request: HttpRequest, view: str, run_id: str | None = None) -> HttpResponse:
    return bridge.respond(bridge.console().view(view, request.GET.dict(), run_id))


@require_GET
@allowed(VIEW)
def meta(request: HttpRequest) -> HttpResponse:
    return bridge.respond(bridge.console().meta())


@require_GET
@allowed(VIEW)
def stream(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    return bridge.stream_response(request, request.GET.dict())


@require_GET
@allowed(VIEW)
def run_stream(request: HttpRequest, run_id: str, key: str) -> HttpResponse | StreamingHttpResponse:
    return bridge.run_stream_response(request, run_id, key)


@require_GET
@allowed(VIEW)
def operator_request(request: HttpRequest, request_id: str) -> HttpResponse:
    return bridge.respond(bridge.console().request(request_id))


@require_POST
@csrf_protect
@allowed(OPERATE)
def expire_request(request: HttpRequest, request_id: str) -> HttpResponse:
    return bridge.respond(bridge.console().expire_request(request_id))


@require_POST
@csrf_protect
@allowed(OPERATE)
def run_action(request: HttpRequest, run_id: str, action: str) -> HttpResponse:
    return bridge.respond(bridge.console().run_action(run_id, action, request.body, who(request)))


@require_POST
@csrf_protect
@allowed(OPERATE)
def runner_action(request: HttpRequest, name: str, command: str) -> HttpResponse:
    return bridge.respond(bridge.console().runner_action(name, command, request.body, who(request)))


@require_GET
def static(request: HttpRequest, name: str) -> Any:
    return bridge.secured(serve(request, name, document_root=str(STATIC)))
