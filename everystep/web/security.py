"""The console's gate: host check, authentication, CSRF, response headers.

One pure ASGI middleware (streaming responses pass through untouched):

- **Host**: with ``allowed_hosts`` (what ``everystep ui`` sets when bound to
  a loopback address) any other ``Host`` header is refused, so a web page
  cannot reach the console by DNS rebinding.
- **Authentication**: with a token, every request needs ``Authorization:
  Bearer TOKEN`` or basic auth with the token as the password (any user
  name, which is then logged as who acted); anything else gets 401 with a
  basic-auth challenge, so a browser asks once. Comparisons are constant
  time.
- **CSRF**: every request that changes something (not GET/HEAD/OPTIONS)
  must carry ``X-CSRF-Token``, the HMAC of the browser's random
  ``everystep_csrf`` cookie (HttpOnly, SameSite=Strict) under a per-app
  secret; pages embed it. Another site can neither read the cookie nor the
  page, nor send a custom header without a CORS preflight the console never
  grants; ``Origin`` and ``Sec-Fetch-Site`` are checked too. Requests
  authenticated with a Bearer header (which browsers never add on their
  own) are scripts and need no CSRF token.
- **Headers**: a strict Content-Security-Policy (scripts and styles only
  from the console itself, no inline code), ``nosniff``, no framing, no
  referrer.

Who made a request (``who(scope)``) is the user name (or ``token`` for a
Bearer token, ``local`` without authentication) and the client address.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlsplit

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

CSRF_COOKIE = "everystep_csrf"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in scope.get("headers", []):
        out[key.decode("latin-1").lower()] = value.decode("latin-1")
    return out


def _cookies(headers: dict[str, str]) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed cookie header: treat as none
        return {}
    return {key: morsel.value for key, morsel in jar.items()}


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8", "surrogateescape"))


def host_name(host_header: str) -> str:
    """The host part of a Host header (``[::1]:8765`` → ``[::1]``)."""
    if host_header.startswith("["):
        return host_header.split("]", 1)[0] + "]"
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def who(scope: Scope) -> str:
    client = scope.get("client") or ("?", 0)
    return f"{scope.get('everystep.user', 'unknown')} from {client[0]}"


class Guard:
    def __init__(self, app: ASGIApp | None, *, auth_token: str | None, allowed_hosts: Sequence[str] | None,
                 csrf_secret: bytes | None = None) -> None:
        self.app = app
        self.auth_token = auth_token
        self.allowed_hosts = {host.lower() for host in allowed_hosts} if allowed_hosts else None
        self.csrf_secret = csrf_secret or secrets.token_bytes(32)
        #: The console behind this gate (set by ``create_app``).
        self.console: Any = None

    # -- tokens ------------------------------------------------------------------------

    def csrf_token(self, cookie: str) -> str:
        return hmac.new(self.csrf_secret, cookie.encode(), hashlib.sha256).hexdigest()

    def csrf_for(self, scope: Scope) -> tuple[str, str | None]:
        """The token a page should embed, and a new cookie value to set if
        the browser has none yet."""
        cookie = _cookies(_headers(scope)).get(CSRF_COOKIE)
        fresh = None
        if not cookie or len(cookie) > 200:
            cookie = fresh = secrets.token_urlsafe(24)
        return self.csrf_token(cookie), fresh

    def _authenticate(self, headers: dict[str, str]) -> tuple[str, bool] | None:
        """(user, bearer) or None when the credentials are missing or wrong."""
        if self.auth_token is None:
            return "local", False
        scheme, _, value = headers.get("authorization", "").partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and value and _same(value, self.auth_token):
            return "token", True
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError, ValueError):
                return None
            if _same(password, self.auth_token):
                return (user.strip()[:64] or "basic"), False
        return None

    def _csrf_ok(self, scope: Scope, headers: dict[str, str]) -> str | None:
        """None if the request may change things, else why not."""
        origin = headers.get("origin")
        if origin and origin != "null" and urlsplit(origin).netloc.lower() != headers.get("host", "").lower():
            return "cross-origin request refused"
        if headers.get("sec-fetch-site") == "cross-site":
            return "cross-site request refused"
        cookie = _cookies(headers).get(CSRF_COOKIE)
        token = headers.get(CSRF_HEADER, "")
        if not cookie or not token or not _same(token, self.csrf_token(cookie)):
            return "missing or invalid CSRF token: reload the page"
        return None

    # -- ASGI --------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        assert self.app is not None, "Guard.app is set by create_app"
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        if self.allowed_hosts is not None and host_name(headers.get("host", "")).lower() not in self.allowed_hosts:
            await _refuse(send, 400, "invalid Host header")
            return
        identity = self._authenticate(headers)
        if identity is None:
            await _refuse(send, 401, "authentication required",
                          [(b"www-authenticate", b'Basic realm="everystep console", charset="UTF-8"')])
            return
        scope["everystep.user"], bearer = identity
        if scope["method"] not in SAFE_METHODS and not bearer:
            problem = self._csrf_ok(scope, headers)
            if problem is not None:
                await _refuse(send, 403, problem)
                return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + SECURITY_HEADERS
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _refuse(send: Any, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"), *SECURITY_HEADERS, *(extra or []),
    ]})
    await send({"type": "http.response.body", "body": body})


__all__ = ["CSRF_COOKIE", "CSRF_HEADER", "Guard", "LOOPBACK_HOSTS", "host_name", "who"]
