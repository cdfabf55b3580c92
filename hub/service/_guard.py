"""The request's guard: everything a request meets before and around its handler, apart
from routing itself.

1. :class:`Guard` (pure ASGI): HEAD answered as GET without a body; headers larger than
   ``MAX_HEADER_BYTES`` (431) and bodies larger than ``MAX_BODY`` (413) refused before they
   are read; the headers every answer carries.
2. :func:`strict_query`, one dependency on every route: an unknown or repeated parameter
   (more than ``MAX_PARAMS``), or a control character in any parameter or path, is a 400,
   never silently ignored (``?clustr=east`` returning the whole fleet looks right and is not).
3. :class:`Gate`, through the ``identify`` dependency (hub.service._deps) on every route that
   is not public: a bearer token or a browser session becomes a :class:`Caller`, or a 401.
4. :func:`admit` and :func:`confined`, the caller checks that
   :class:`~hub.service._routing.ConfinedRouter` attaches to every route: a scoped caller is
   refused (403) a route not declared ``scoped``, and every answer passes through
   :func:`~hub.service._confine.confine` with the caller's scope on its way out.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

from hub.service._auth import ANONYMOUS, Authenticator, Caller, Unauthorized
from hub.service._confine import confine
from hub.service._errors import ApiError
from hub.service._session import COOKIE, MAX_FORM, Login, wants_html

log = logging.getLogger("gpufleet.api")

#: public (no caller asked for), scoped (any caller, the answer confined to its scope) or
#: fleet (whole-fleet callers only: the default, so an undeclared route answers no team)
Visibility = Literal["public", "scoped", "fleet"]
#: the largest request body accepted at all; the sign-in form reads at most MAX_FORM of it
MAX_BODY = 4 * MAX_FORM
#: the largest request head (h11 also refuses one that arrives incomplete beyond this)
MAX_HEADER_BYTES = 16 * 1024
#: at most this many query parameters (a page has six at most)
MAX_PARAMS = 50
COMMON_HEADERS = [(b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff")]
#: No control characters (NUL above all: PostgreSQL refuses it in a text parameter).
PRINTABLE = re.compile(r"[^\x00-\x1f\x7f]*")


# -- 1. the ASGI guard ----------------------------------------------------------------------------
class Guard:
    """HEAD as GET without a body, oversized bodies refused unread, common headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        head = scope["method"] == "HEAD"
        if head:
            scope = {**scope, "method": "GET"}
        if sum(len(k) + len(v) + 4 for k, v in scope.get("headers", [])) > MAX_HEADER_BYTES:
            await _send_json(send, 431, f"request headers larger than {MAX_HEADER_BYTES} "
                                        "bytes", head=head)
            return
        length = _header(scope, b"content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
            await _send_json(send, 413, f"request body larger than {MAX_BODY} bytes",
                             head=head)
            return

        async def guarded_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message = {**message, "headers": [
                    *message.get("headers", []),
                    *(h for h in COMMON_HEADERS if h[0] not in names)]}
            elif message["type"] == "http.response.body" and head:
                message = {**message, "body": b""}
            await send(message)

        await self.app(scope, receive, guarded_send)


def _header(scope: AsgiScope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None


async def _send_json(send: Send, status: int, error: str, *, head: bool = False) -> None:
    body = JSONResponse({"error": error}).body
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"), *COMMON_HEADERS]})
    await send({"type": "http.response.body", "body": b"" if head else body})


# -- 2. strict parameters --------------------------------------------------------------------------
async def strict_query(request: Request) -> None:
    """Unknown, repeated or control-character parameters are a 400 naming the parameter.
    (async: pure computation, no trip through the thread pool)"""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    allowed = sorted({p.alias for p in query_params(dependant)})
    items = request.query_params.multi_items()
    if len(items) > MAX_PARAMS:
        raise ApiError(400, f"too many query parameters (at most {MAX_PARAMS})")
    seen: set[str] = set()
    for name, value in items:
        if name not in allowed:
            hint = f" (allowed: {', '.join(allowed)})" if allowed else " (none allowed)"
            raise ApiError(400, f"unknown query parameter {name[:64]!r}{hint}")
        if name in seen:
            raise ApiError(400, f"query parameter {name!r} given more than once")
        seen.add(name)
        if not PRINTABLE.fullmatch(value):
            raise ApiError(400, f"query parameter {name!r} must not contain control characters")
    for name, value in request.path_params.items():
        if isinstance(value, str) and not PRINTABLE.fullmatch(value):
            raise ApiError(400, f"{name} must not contain control characters")


def query_params(dependant: Any) -> list[Any]:
    if dependant is None:
        return []
    found = list(dependant.query_params)
    for sub in dependant.dependencies:
        found += query_params(sub)
    return found


# -- 3. the door --------------------------------------------------------------------------------
@dataclass
class Gate:
    """Who is asking: a bearer token (it wins) or a browser session; the only place a request
    becomes a caller."""

    auth: Authenticator
    login: Login | None
    on_refused: Callable[[str], None]

    def caller(self, request: Request) -> Caller:
        if not self.auth.enabled:
            return ANONYMOUS
        authorization = request.headers.get("authorization")
        try:
            if authorization or self.login is None:
                caller = self.auth.bearer(authorization)
            else:
                caller = self.login.caller(request.headers.get("cookie"))[0]
                request.state.by_session = True
        except Unauthorized as exc:
            if (self.login is not None and not authorization
                    and COOKIE not in (request.headers.get("cookie") or "")
                    and wants_html(request.headers.get("accept"))):
                # a browser's first visit: it shows no credentials yet and goes to the
                # sign-in form; not a refusal (the refused counter and log are for those)
                log.debug("no credentials yet for %s: to /login", request.url.path[:200])
            else:
                self.on_refused("unauthenticated")
                log.info("refused %s: %s", request.url.path[:200], exc)
            raise ApiError(401, "authentication required: send a valid bearer token") from None
        if caller.scope.empty:
            raise ApiError(403, "your token maps to no scope (ask for your group to be added "
                                "to the scopes file)")
        return caller


# -- 4. the caller checks every route gets -------------------------------------------------------
def admit(caller: Caller | None, visibility: Visibility) -> None:
    """A 403 for a scoped caller on a route not declared ``scoped`` (``caller`` is None on a
    public route: nobody was asked)."""
    if caller is not None and visibility == "fleet" and not caller.scope.unrestricted:
        raise ApiError(403, "this endpoint is outside your scope")


def confined(caller: Caller | None, answer: Any) -> Any:
    """The answer as the caller may see it (as it is on a public route)."""
    return answer if caller is None else confine(answer, caller.scope)
