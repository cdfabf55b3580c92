"""The service's HTTP face as a FastAPI app: routes, the door, errors, the description.

Everything a request meets, in order:

1. :class:`Guard` (pure ASGI): HEAD answered as GET without a body; headers larger than
   ``MAX_HEADER_BYTES`` (431) and bodies larger than ``MAX_BODY`` (413) refused before they
   are read; the headers every answer carries.
2. FastAPI's routing, with one strictness dependency on every route (:func:`strict_query`):
   an unknown or repeated parameter, or a control character in any parameter or path, is a
   400, never silently ignored (``?clustr=east`` returning the whole fleet looks right and
   is not).
3. :meth:`Gate.caller` through the ``identify`` dependency on every route that is not public:
   a bearer token or a browser session becomes a :class:`Caller`, or a 401.
4. The handler (``hub.service._api`` and the closures below), then :func:`confine` with the
   caller's scope (every route is registered through :func:`_guarded`, which adds both 3 and
   this step), then the response model.
5. Errors: every refusal and failure is ``{"error": "..."}`` JSON with a status the
   description declares (400 for any client mistake, 401, 403, 404, 405, 503 for the
   database, 500 for a bug), never a trace.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import logging
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

from hub import __version__
from hub.service import _api as api
from hub.service import _detail as detail
from hub.service import _models as models
from hub.service._api import (
    DB_UNAVAILABLE,
    METRICS_CONTENT_TYPE,
    PRINTABLE,
    ApiError,
    CallerScope,
    ReadEngine,
    identify,
    public_error,
)
from hub.service._auth import ANONYMOUS, FULL, Authenticator, Caller, Scope, Unauthorized
from hub.service._confine import confine
from hub.service._detail import DetailPage
from hub.service._memo import Memo
from hub.service._page import (
    MAX_SEARCH,
    SectionSource,
    _takes_scope,
    page_data,
    render_page,
    search_text,
    unavailable_data,
)
from hub.service._session import (
    COOKIE,
    MAX_FORM,
    MAX_TOKEN,
    DbSessions,
    Login,
    Sessions,
    redirect,
    wants_html,
)

log = logging.getLogger("gpufleet.api")

#: the largest request body accepted at all; the sign-in form reads at most MAX_FORM of it
MAX_BODY = 4 * MAX_FORM
#: seconds a client has to send the sign-in form's body once its headers are in
BODY_TIMEOUT = 10.0
#: the largest request head (h11 also refuses one that arrives incomplete beyond this)
MAX_HEADER_BYTES = 16 * 1024
#: at most this many query parameters (a page has six at most)
MAX_PARAMS = 50
COMMON_HEADERS = [(b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff")]


def database_error(exc: BaseException) -> str:
    """A one-line reason for a failed database read, without the URL or the statement."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if "no such table" in first or type(orig).__name__ == "UndefinedTable":
        return "the inventory is empty: no sync has completed yet"
    return f"{DB_UNAVAILABLE}: {first}"


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
    allowed = sorted({p.alias for p in _query_params(dependant)})
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


def _query_params(dependant: Any) -> list[Any]:
    if dependant is None:
        return []
    found = list(dependant.query_params)
    for sub in dependant.dependencies:
        found += _query_params(sub)
    return found


def _validation_message(request: Request, exc: RequestValidationError) -> str:
    """FastAPI's validation error as the one line a person reads: which parameter, what it
    must be (its bounds or choices, from the route's own declaration), what it was."""
    error = exc.errors()[0]
    loc = error.get("loc") or ()
    name = str(loc[-1]) if loc else "request"
    given = error.get("input")
    shown = repr(given[:32]) if isinstance(given, str) else repr(given)
    field = next((p for p in _query_params(getattr(request.scope.get("route"), "dependant",
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


# -- 4. routes: every one through _guarded ---------------------------------------------------------
@dataclass
class Page:
    """What the live page shows (confined like any answer), rendered after."""

    data: dict[str, Any]
    status: int = 200

    def response(self) -> Response:
        return render_page(self.data, self.status)


def _guarded(endpoint: Callable[..., Any], *, public: bool) -> Callable[..., Any]:
    """The endpoint as the app serves it: with the caller dependency (unless public), closed
    to scoped callers when it does not take ``scope``, and its answer confined to the
    caller's scope. FastAPI reads the signature, so the wrapper shows the endpoint's own
    parameters plus ``_caller``."""
    hints = typing.get_type_hints(endpoint, include_extras=True)
    signature = inspect.signature(endpoint)
    parameters = [p.replace(annotation=hints.get(p.name, p.annotation))
                  for p in signature.parameters.values()]
    takes_scope = "scope" in signature.parameters
    if not public:
        parameters.append(inspect.Parameter("_caller", inspect.Parameter.KEYWORD_ONLY,
                                            annotation=Annotated[Caller, Depends(identify)]))

    def finish(caller: Caller | None, result: Any) -> Any:
        if caller is not None:
            result = confine(result, caller.scope)
        return result.response() if isinstance(result, (Page, DetailPage)) else result

    def admit(kwargs: dict[str, Any]) -> Caller | None:
        caller = kwargs.pop("_caller", None)
        if caller is not None and not takes_scope and not caller.scope.unrestricted:
            raise ApiError(403, "this endpoint is outside your scope")
        return caller

    if inspect.iscoroutinefunction(endpoint):
        async def wrapper(**kwargs: Any) -> Any:
            caller = admit(kwargs)
            return finish(caller, await endpoint(**kwargs))
    else:
        # A synchronous handler (a database read) runs in the thread pool, its answer
        # confined there too; the wrapper itself is async so that FastAPI checks the answer
        # against its model on the way out without another trip through the pool.
        async def wrapper(**kwargs: Any) -> Any:  # type: ignore[misc]
            caller = admit(kwargs)
            return await run_in_threadpool(lambda: finish(caller, endpoint(**kwargs)))

    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters, return_annotation=inspect.Signature.empty)
    wrapper.__name__ = endpoint.__name__
    wrapper.__doc__ = endpoint.__doc__
    return wrapper


@dataclass(frozen=True)
class RouteInfo:
    """What the description says beyond the response model: errors and visibility."""

    public: bool
    errors: tuple[int, ...]


def route(app: FastAPI, path: str, endpoint: Callable[..., Any], model: Any, *,
          errors: tuple[int, ...] = (400,), public: bool = False, method: str = "GET",
          **options: Any) -> None:
    """The only way a route joins the app: through :func:`_guarded` (the caller, the scope
    step), with its summary from the endpoint's docstring and its errors for the description.
    """
    app.state.routes[(path.replace(":path}", "}"), method.lower())] = RouteInfo(public, errors)
    app.add_api_route(path, _guarded(endpoint, public=public), methods=[method],
                      response_model=model, summary=" ".join(
                          (endpoint.__doc__ or "").split("\n\n")[0].split()) or None,
                      **options)
    app.state.openapi = None  # described again on the next ask


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
    page_sections = [_kept(source, memo) for source in page_sections]
    app.state.routes = {}

    def add(path: str, endpoint: Callable[..., Any], model: Any, **options: Any) -> None:
        route(app, path, endpoint, model, **options)

    # -- the service's own endpoints ----------------------------------------------------------
    async def healthz() -> JSONResponse:
        """Whether the last sync succeeded within two intervals (200) or not (503, with the
        reason)."""
        ok, details = health()
        body = models.HealthBody.model_validate(details).model_dump(mode="json",
                                                                    exclude_unset=True)
        return JSONResponse(body, 200 if ok else 503)

    async def metrics_(request: Request) -> Response:
        """Prometheus metrics of the service and the inventory (OpenMetrics when asked, gzip
        when accepted)."""
        body, headers = await run_in_threadpool(
            metrics, request.headers.get("accept"), request.headers.get("accept-encoding"))
        return Response(body, headers=headers)

    def openapi(scope: CallerScope) -> dict[str, Any]:
        """This description (OpenAPI 3.1)."""
        return describe(app, secured=auth.enabled)

    def findings_(scope: CallerScope,
                  severity: Annotated[typing.Literal[models.SEVERITIES] | None,  # type: ignore[valid-type]
                                      api.Query(description="Only this severity.")] = None,
                  cluster: api.ClusterParam = None, limit: api.LimitParam = api.DEFAULT_LIMIT,
                  continue_: api.ContinueParam = None) -> dict[str, Any]:
        """Findings of the latest checks (empty until checks are configured); paged."""
        cluster = api.scoped_cluster(cluster, scope)
        items, generated = findings()
        selected = api.visible_findings(items, scope, severity=severity, cluster=cluster)
        when = dt.datetime.fromtimestamp(generated, dt.UTC) if generated is not None else None
        failed = check_failure()
        last_failure = None if failed is None else {  # no hub URL or driver text to callers
            "at": dt.datetime.fromtimestamp(failed[0], dt.UTC),
            "error": public_error(failed[1])}
        page = api.page_items([{**f, "checked_at": when} for f in selected],
                              api.text_key("cluster", "node", "gpu", "check", "message"),
                              continue_, limit, "f1", 5)
        return {**page, "generated_at": when, "last_check_failed": last_failure}

    def page(engine: ReadEngine, scope: CallerScope, request: Request,
             caller: Annotated[Caller, Depends(identify)],
             q: Annotated[str | None, api.Query(
                 description="A GPU UUID (or its start), a node or a namespace to look up.",
                 max_length=MAX_SEARCH + 64, pattern=api.TEXT_PATTERN)] = None) -> Page:
        """The live page of the fleet (HTML, read-only): clusters and their freshness, stale
        GPUs, GPUs with findings, findings; search with q."""
        search = search_text({"q": [q]} if q is not None else {})
        items, generated = findings()
        who = {"signed_in": caller.name if auth.enabled else None,
               "can_sign_out": bool(getattr(request.state, "by_session", False))}
        try:
            # kept until the inventory or the findings change (or 30 s): a page view is a
            # dozen reads and a few folds of the whole inventory
            with engine.connect() as conn:
                data = memo.get(conn, ("page", scope, search, generated, len(items)),
                                lambda: page_data(engine, search=search, findings=items,
                                                  findings_at=generated, extra=page_sections,
                                                  scope=scope))
        except sa.exc.SQLAlchemyError as exc:
            return Page({**unavailable_data(search, database_error(exc)), **who}, 503)
        return Page({**data, **who})

    html = {"content": {"text/html": {"schema": {"type": "string"}}}}
    add("/", page, None, errors=(400, 503), response_class=_Html,
        responses={"200": {"description": "OK", **html},
                   **({"303": _see_other("A browser (Accept: text/html) without a session: "
                                         "to /login.", False)} if login else {})})
    add("/healthz", healthz, models.HealthBody, public=True, errors=(400, 503))
    add("/metrics", metrics_, None, public=metrics_open, response_class=_Text,
        responses={"200": {"description": "OK", "content": {
            "text/plain": {"schema": {"type": "string"}},
            "application/openmetrics-text": {"schema": {"type": "string"}}}}})
    add("/api/v1/openapi.json", openapi, dict[str, Any])
    add("/api/v1/clusters", api.clusters, models.ClusterList, errors=(400, 503))
    add("/api/v1/nodes", api.nodes, models.NodeList, errors=(400, 503))
    add("/api/v1/gpus", api.gpus, models.GpuList, errors=(400, 503))
    add("/api/v1/gpus/{uuid:path}/history", api.gpu_history, models.GpuHistory,
        errors=(400, 404, 503))
    add("/api/v1/gpus/{uuid:path}", api.gpu, models.GpuDetail, errors=(400, 404, 503))
    add("/api/v1/allocations", api.allocations, models.AllocationList, errors=(400, 503))
    add("/api/v1/findings", findings_, models.FindingList)
    # a usage or capacity row carries the keys of its grouping only, not the others as null
    add("/api/v1/usage", api.usage, models.UsageList, errors=(400, 503),
        response_model_exclude_unset=True)
    add("/api/v1/idle", api.idle, models.IdleList, errors=(400, 503))
    add("/api/v1/capacity", api.capacity, models.CapacityList, errors=(400, 503),
        response_model_exclude_unset=True)
    add("/api/v1/events", api.events, models.EventList, errors=(400, 503))
    add("/api/v1/sync-runs", api.sync_runs, models.SyncRunList, errors=(400, 503))
    def cluster_page(engine: ReadEngine, scope: CallerScope,
                     cluster: Annotated[str, Path(pattern=api.TEXT_PATTERN)]) -> DetailPage:
        """One cluster: its nodes and GPUs (HTML), the JSON one click away."""
        with engine.connect() as conn:
            return detail.cluster_page(conn, cluster, scope)

    def node_page(engine: ReadEngine, scope: CallerScope,
                  cluster: Annotated[str, Path(pattern=api.TEXT_PATTERN)],
                  node: Annotated[str, Path(pattern=api.TEXT_PATTERN)]) -> DetailPage:
        """One node: its GPUs and the pods on them (HTML), the JSON one click away."""
        with engine.connect() as conn:
            return detail.node_page(conn, cluster, node, scope)

    def gpu_page(engine: ReadEngine, scope: CallerScope, uuid: api.UuidPath) -> DetailPage:
        """One GPU: where it is, its slices, pods, usage and events (HTML), the JSON one click
        away."""
        with engine.connect() as conn:
            return detail.gpu_page(conn, uuid, scope)

    # browser pages: in the app (and its scope step), not in the API's description
    for path, endpoint in (("/clusters/{cluster}", cluster_page),
                           ("/nodes/{cluster}/{node}", node_page),
                           ("/gpus/{uuid:path}", gpu_page)):
        add(path, endpoint, None, errors=(400, 404, 503), response_class=_Html,
            include_in_schema=False)
    if login is not None:
        _login_routes(app, add, login)
    _error_handlers(app, login)
    return app


def _kept(source: SectionSource, memo: Memo) -> SectionSource:
    """A page section kept in ``memo`` until the inventory changes (per scope): the usage
    sections fold the whole ledger and inventory on every page view otherwise."""
    takes_scope = _takes_scope(source)

    def kept(conn: Any, *, scope: Scope = FULL) -> Any:
        key = ("section", source, scope)
        if takes_scope:
            return memo.get(conn, key, lambda: source(conn, scope=scope))
        return memo.get(conn, key, lambda: source(conn))

    kept.__name__ = getattr(source, "__name__", "section")
    return kept


class _Html(Response):
    media_type = "text/html"


class _Text(Response):
    media_type = METRICS_CONTENT_TYPE.split(";")[0]


def _see_other(description: str, cookie: bool) -> dict[str, Any]:
    headers: dict[str, Any] = {"Location": {"schema": {"type": "string"}, "required": True}}
    if cookie:
        headers["Set-Cookie"] = {"schema": {"type": "string"}, "required": True,
                                 "description": "The session cookie (HttpOnly, "
                                                "SameSite=Strict), or its removal."}
    return {"description": description, "headers": headers,
            "content": {"text/html": {"schema": {"type": "string"}}}}


def _html(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/html": {"schema": {
        "type": "string"}}}}


TOKEN_FORM = {"required": True, "content": {"application/x-www-form-urlencoded": {"schema": {
    "type": "object", "required": ["token"], "additionalProperties": False,
    "properties": {"token": {
        "type": "string", "minLength": 1, "maxLength": MAX_TOKEN,
        "pattern": "^[^\\u0000-\\u001f\\u007f]*$",
        "description": "A static token or an OIDC access or ID token."}}}}}}


async def read_body(request: Request) -> bytes | None:
    """The request body, at most MAX_FORM bytes within BODY_TIMEOUT; None otherwise (a
    trickle or a flood is not read to its end)."""
    chunks: list[bytes] = []
    size = 0

    async def collect() -> bool:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_FORM:
                return False
            chunks.append(chunk)
        return True

    try:
        whole = await asyncio.wait_for(collect(), BODY_TIMEOUT)
    except TimeoutError:
        whole = False
    return b"".join(chunks) if whole else None


def _login_routes(app: FastAPI, add: Callable[..., None], login: Login) -> None:
    """Sign-in and sign-out for browsers: HTML forms and redirects, no JSON."""

    def form(request: Request) -> Response:
        """The sign-in form (HTML): paste a token; the browser then keeps a session cookie,
        never the token."""
        return login.form(request)

    async def submit(request: Request) -> Response:
        """Sign in with a token (form post): on success a session cookie and 303 to the
        page; a bad token answers the form again with 'sign-in failed' (401)."""
        body = await read_body(request)
        client = request.client.host if request.client is not None else ""
        response = await run_in_threadpool(login.submit, body, request.headers, client)
        if body is None:
            response.headers["Connection"] = "close"
        return response

    def logout(request: Request) -> Response:
        """Sign out (form post): the session ends, its cookie is removed; 303 to /login."""
        return login.logout(request.headers)

    add("/login", form, None, public=True, errors=(), response_class=_Html,
        responses={"200": {"description": "The form.", **_html("")},
                   "400": _html("Parameters given (a token never goes in a URL).")})
    add("/login", submit, None, public=True, errors=(), method="POST", response_class=_Html,
        openapi_extra={"requestBody": TOKEN_FORM}, responses={
            "303": _see_other("Signed in: the session cookie, and to /.", True),
            "400": _html("The form could not be read."),
            "401": _html("Sign-in failed (the same answer for any bad token)."),
            "403": _html("A form sent from another site, or a token whose groups map to no "
                         "scope."),
            "429": _html("Too many sign-in attempts from this client in a minute."),
            "503": _html("As many sessions live as the service keeps; try again later."),
            "413": {"description": "A body larger than the form can be.", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}})
    add("/logout", logout, None, public=True, errors=(), method="POST", response_class=_Html,
        responses={"303": _see_other("Signed out: to /login.", True),
                   "403": _html("A form sent from another site.")})


# -- 5. errors -------------------------------------------------------------------------------------
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

