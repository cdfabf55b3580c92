"""The service's HTTP face as a FastAPI app: the short factory that includes the routers,
the error answers and the description.

What a request meets, in order: the guard (hub/service/_guard.py: size limits, strict
parameters, the caller), the route of its router (hub/service/_routers.py, every one a
``ConfinedRouter``, hub/service/_routing.py, so the caller checks and the confine step are
on every route), the handler (hub/service/_api.py, taking what hub/service/_deps.py gives),
its response model (the hot routes' answers are encoded once and kept per scope instead:
hub/service/_wire.py), and on any refusal or failure the handlers here: ``{"error": "..."}``
JSON with a status the description declares (400 for any client mistake, 401, 403, 404,
405, 503 for the database, 500 for a bug), never a trace.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from hub import __version__
from hub.service import _models as models
from hub.service import _routers as routers_
from hub.service import _wire as wire
from hub.service._auth import Authenticator
from hub.service._errors import DB_UNAVAILABLE, ApiError, database_error, public_error
from hub.service._guard import Gate, Guard, query_params, strict_query
from hub.service._memo import LoopVersion, Memo
from hub.service._page import SectionSource
from hub.service._routing import RouteInfo, include
from hub.service._session import DbSessions, Login, Sessions, redirect, wants_html

log = logging.getLogger("gpufleet.api")


# -- errors ----------------------------------------------------------------------------------------
def _validation_message(request: Request, exc: RequestValidationError) -> str:
    """FastAPI's validation error as the one line a person reads: which parameter, what it
    must be (its bounds or choices, from the route's own declaration), what it was."""
    error = exc.errors()[0]
    loc = error.get("loc") or ()
    name = str(loc[-1]) if loc else "request"
    given = error.get("input")
    shown = repr(given[:32]) if isinstance(given, str) else repr(given)
    field = next((p for p in query_params(getattr(request.scope.get("route"), "dependant",
                                                       None)) if p.alias == name), None)
    if field is None:
        return f"invalid {name}: {error.get('msg', 'not valid')}"
    bounds = {type(m).__name__: m for m in field.field_info.metadata}
    low = getattr(bounds.get("Ge"), "ge", None)
    high = getattr(bounds.get("Le"), "le", None)
    annotation = field.field_info.annotation
    choices = [a for a in _flat_args(annotation) if isinstance(a, str)]
    if choices:
        return f"unknown {name} {shown}: choose one of {', '.join(choices)}"
    if int in _flat_args(annotation):
        return f"{name} must be a whole number from {low} to {high}, not {shown}"
    if float in _flat_args(annotation):
        return f"{name} must be a number from {low:g} to {high:g}, not {shown}"
    if "pattern" in error.get("type", "") or "pattern" in str(error.get("ctx", "")):
        return f"query parameter {name!r} must not contain control characters"
    return f"invalid {name} {shown}: {error.get('msg', 'not valid')}"


def _flat_args(annotation: Any) -> list[Any]:
    args = typing.get_args(annotation)
    if not args:
        return [annotation]
    out: list[Any] = []
    for arg in args:
        out += _flat_args(arg) if typing.get_args(arg) else [arg]
    return out


# -- the app factory ---------------------------------------------------------------------------
def build_app(engine: Engine, *, health: Callable[[], tuple[bool, dict[str, Any]]],
              findings: Callable[[], tuple[list[dict[str, Any]], float | None]],
              metrics: Callable[[str | None, str | None], tuple[bytes, dict[str, str]]],
              page_sections: Sequence[SectionSource] = (),
              check_failure: Callable[[], tuple[float, str] | None] = lambda: None,
              auth: Authenticator | None = None, metrics_open: bool = True,
              on_refused: Callable[[str], None] = lambda reason: None,
              sessions: Sessions | DbSessions | None = None,
              secure_cookies: bool = False, prices: Any = None,
              idle_rule: Any = None) -> FastAPI:
    """The whole API over a read-only ``engine`` and the service's state, passed in.

    ``health`` answers (ok, details); ``findings`` the latest findings and when they were
    made (epoch seconds, None before the first); ``metrics(accept, accept_encoding)`` the
    exposition and its headers; ``page_sections`` more sections of the live page;
    ``check_failure`` when and why the latest checks could not run (None if they did). With
    authentication configured a browser signs in at /login into ``sessions``;
    ``secure_cookies`` marks the cookie Secure (the service speaks TLS); ``prices``
    (hub.usage.Prices) adds showback cost to /api/v1/usage; ``idle_rule``
    (hub.usage.IdleRule, `serve --idle-threshold/--idle-for`) is the default of /api/v1/usage
    and /api/v1/idle, as it is of the page's sections.
    """
    auth = auth or Authenticator()
    if sessions is None:  # not `or`: an empty store is falsy (it has a length)
        sessions = Sessions()
    login = (Login(auth, sessions, secure=secure_cookies, on_refused=on_refused)
             if auth.enabled else None)
    app = FastAPI(title="gpufleet hub service", version=__version__, openapi_url=None,
                  docs_url=None, redoc_url=None, dependencies=[Depends(strict_query)],
                  description="Read-only view of the GPU inventory: GET and HEAD, and form "
                              "posts to sign a browser in and out.")
    app.state.engine = engine
    app.state.prices = prices
    app.state.idle_rule = idle_rule
    app.state.gate = Gate(auth, login, on_refused)
    app.state.memo = memo = Memo()
    app.state.answers = Memo(weigh=wire.weight, max_weight=wire.KEPT_BYTES,  # as bytes
                             largest=wire.KEPT_LARGEST, size=1024)
    app.state.loop_version = LoopVersion(engine)
    app.state.routes = {}
    routers = [
        routers_.pages_router(findings=findings, page_sections=page_sections, memo=memo,
                              signed_in=auth.enabled, login=login),
        routers_.meta_router(health=health, metrics=metrics, metrics_open=metrics_open,
                             describe=lambda request: describe(app, secured=auth.enabled)),
        routers_.inventory_router(),
        routers_.findings_router(findings, check_failure),
        routers_.usage_router(),
        routers_.history_router(),
        routers_.detail_pages_router(findings),
    ]
    if login is not None:
        routers.append(routers_.signin_router(login))
    for router in routers:
        include(app, router)
    _error_handlers(app, login)
    return app


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status, headers=headers)


def _allowed(app: FastAPI, path: str) -> str:
    """The Allow header for a path: GET and HEAD for any readable (or unknown) path, POST
    for the forms. An unknown path reads like a GET path, so a 405 tells a stranger nothing."""
    from starlette.routing import Match

    methods: set[str] = set()
    scope = {"type": "http", "path": path, "method": "GET"}
    for route in app.router.routes:
        match, _ = route.matches(scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", set()) or ())
    allowed = (["GET", "HEAD"] if not methods or "GET" in methods else []) + (
        ["POST"] if "POST" in methods else [])
    return ", ".join(allowed)


def _error_handlers(app: FastAPI, login: Login | None) -> None:
    gate: Gate = app.state.gate

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        if exc.status == 401:
            if (request.url.path == "/" and login is not None
                    and wants_html(request.headers.get("accept"))):
                return redirect("/login")  # a browser: to the sign-in form
            return _error(401, exc.message, {"WWW-Authenticate": 'Bearer realm="gpufleet"'})
        if exc.status == 403:
            gate.on_refused("forbidden")
            log.info("forbidden: %s %s", request.url.path[:200], exc.message)
        return _error(exc.status, exc.message)

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _error(400, _validation_message(request, exc))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        path = request.url.path
        if exc.status_code == 404 and request.method not in ("GET", "HEAD"):
            exc = StarletteHTTPException(405)
        if exc.status_code == 405:
            allowed = _allowed(app, path)
            # h11 frames the request, so a body we do not read never passes for a request;
            # the connection stays open (closing it under an unread body resets it, and the
            # client may lose this answer)
            return _error(405, f"method {request.method[:16]} not allowed here ({allowed}): "
                               "the API is read-only", {"Allow": allowed})
        if exc.status_code == 404:
            try:  # before the 404: an unknown path tells a stranger nothing either
                await run_in_threadpool(gate.caller, request)
            except ApiError as refused:
                return await api_error(request, refused)
            return _error(404, f"no such path {path[:200]!r}: see /api/v1/openapi.json")
        return _error(exc.status_code, str(exc.detail))

    async def database(request: Request, exc: Exception) -> Response:
        detail = database_error(exc)
        log.warning("serving %s: %s", request.url.path[:200], detail)
        return _error(503, public_error(detail) or DB_UNAVAILABLE)

    async def bug(request: Request, exc: Exception) -> Response:
        log.error("internal error serving %s", request.url.path[:200], exc_info=exc)
        return _error(500, "internal error (see the service log)")

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(sa.exc.SQLAlchemyError, database)
    app.add_exception_handler(Exception, bug)
    app.add_middleware(Guard)  # type: ignore[arg-type]


# -- the description ------------------------------------------------------------------------------
_STATUS_TEXT = {400: "Bad query parameters", 404: "Not found",
                401: "No valid bearer token", 403: "Outside the caller's scope",
                503: "Not available (inventory database or service not healthy)"}


def describe(app: FastAPI, *, secured: bool) -> dict[str, Any]:
    """OpenAPI 3.1 generated by FastAPI from the routes and their response models, with the
    error answers the app gives (400 for every client mistake, not FastAPI's 422), and the
    bearer scheme on every operation that is not public when access is configured."""
    cached = getattr(app.state, "openapi", None)
    if cached is not None and cached[0] == secured:
        return cached[1]
    doc = get_openapi(title=app.title, version=app.version, description=app.description,
                      routes=app.routes, openapi_version="3.1.0")
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["Error"] = models.Error.model_json_schema()
    paths: dict[str, Any] = {}
    for path, item in doc["paths"].items():
        clean = path.replace(":path}", "}")
        for method, operation in item.items():
            info = app.state.routes.get((clean, method), RouteInfo(False, (400,)))
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            errors = info.errors + ((401, 403) if secured and not info.public else ())
            for status in errors:
                responses.setdefault(str(status), {
                    "description": _STATUS_TEXT[status], "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/" + (
                            "HealthBody" if clean == "/healthz" and status == 503
                            else "Error")}}}})
            operation["operationId"] = _operation_id(method, clean)
            operation.pop("description", None)  # the summary says it
            operation["parameters"] = [_not_null(p) for p in operation.get("parameters", [])]
            if secured and not info.public:
                operation["security"] = [{"bearer": []}]
            paths.setdefault(clean, {})[method] = operation
    doc["paths"] = paths
    if secured:
        doc["components"]["securitySchemes"] = {"bearer": {
            "type": "http", "scheme": "bearer",
            "description": "A static token or an OIDC access token."}}
    app.state.openapi = (secured, doc)
    return doc


def _not_null(parameter: dict[str, Any]) -> dict[str, Any]:
    """A parameter's schema without FastAPI's ``null`` alternative (an optional parameter is
    absent, never null: a query string has no null), its description once."""
    schema = dict(parameter.get("schema", {}))
    options = [o for o in schema.pop("anyOf", []) if o != {"type": "null"}]
    if len(options) == 1:
        schema = {**options[0], **schema}
    elif options:
        schema["anyOf"] = options
    schema.pop("title", None)
    schema.pop("description", None)
    return {**parameter, "schema": schema}


def _operation_id(method: str, path: str) -> str:
    words = [w.strip("{}") for w in path.replace(".", "/").replace("-", "/").split("/") if w]
    name = "".join(w[:1].upper() + w[1:] for w in words if w not in ("api", "v1"))
    return method + (name or "Page")

