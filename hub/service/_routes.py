"""The API's routes: which path runs which handler, and the service's own endpoints.

A route carries its OpenAPI description beside its handler, so the description cannot drift
from what is served.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from hub import inventory as inv
from hub.service._api import (
    DB_UNAVAILABLE,
    DEFAULT_LIMIT,
    DEFAULT_RUNS,
    HEALTH_LEVELS,
    MAX_LIMIT,
    MAX_RUNS,
    METRICS_CONTENT_TYPE,
    SEVERITIES,
    STATES,
    VENDORS,
    ApiError,
    Handler,
    Params,
    Query,
    Raw,
    Response,
    allocations,
    capacity,
    clusters,
    events,
    gpu,
    gpu_history,
    gpus,
    idle,
    log,
    nodes,
    page_items,
    public_error,
    scoped_cluster,
    sync_runs,
    text_key,
    usage,
)
from hub.service._auth import FULL, Authenticator, Caller, Scope, Unauthorized
from hub.service._openapi import TEXT_PARAM, _list_of, _param, _ref, openapi_document
from hub.service._page import (
    SectionSource,
    page_data,
    render_page,
    search_text,
    unavailable_data,
)
from hub.service._session import (
    HTML,
    MAX_TOKEN,
    FormPost,
    Login,
    Sessions,
    redirect,
    wants_html,
)

# -- routes and the OpenAPI description -------------------------------------------------------

CLUSTER_PARAM = _param("cluster", "Only this cluster.")
LIMIT_PARAM = _param("limit", f"Page size (1-{MAX_LIMIT}).",
                     {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                      "default": DEFAULT_LIMIT})
CONTINUE_PARAM = _param("continue", "The 'continue' token of the previous page.")
LIMIT_RUNS = _param("limit", f"Number of runs (1-{MAX_RUNS}).",
                    {"type": "integer", "minimum": 1, "maximum": MAX_RUNS,
                     "default": DEFAULT_RUNS})


PERIOD_PARAMS = (
    _param("since", "The last DURATION (default 24h)."),
    _param("from", "Start (ISO-8601, UTC), instead of since."),
    _param("until", "End (ISO-8601, UTC)."),
)


@dataclass(frozen=True)
class Route:
    path: str  # OpenAPI path; a trailing "{name}" takes the rest of the path, percent-decoded
    handler: Handler
    summary: str
    response: dict[str, Any] | None  # the 200's schema; None: no 200 (a form post)
    parameters: tuple[dict[str, Any], ...] = ()
    content_type: str = "application/json"
    errors: tuple[int, ...] = (400,)
    public: bool = False  # answered without a token (/healthz; /metrics when opened)
    method: str = "get"  # "post": a form post (sign-in, sign-out), handler(FormPost)
    #: OpenAPI responses beside (or instead of) the generated ones, and a request body
    responses: dict[str, Any] | None = None
    request_body: dict[str, Any] | None = None
    _scoped: bool = field(init=False, repr=False, compare=False, default=False)
    _wants_caller: bool = field(init=False, repr=False, compare=False, default=False)

    @property
    def prefix(self) -> str | None:
        head, sep, _ = self.path.partition("{")
        return head if sep else None

    @property
    def suffix(self) -> str:
        """What follows the path parameter (``/history``), '' when it ends the path."""
        return self.path.partition("}")[2]

    @property
    def scoped(self) -> bool:
        """Whether the handler takes the caller's scope. One that does not is unrestricted
        callers' only: a new endpoint is closed to scoped tokens until it applies a scope."""
        return self._scoped

    @property
    def wants_caller(self) -> bool:
        return self._wants_caller

    def matches(self, path: str) -> bool:
        prefix = self.prefix
        if prefix is None:
            return path == self.path
        return path.startswith(prefix) and path.endswith(self.suffix)

    def __post_init__(self) -> None:  # looked up once, not on every request
        names = inspect.signature(self.handler).parameters
        object.__setattr__(self, "_scoped", "scope" in names)
        object.__setattr__(self, "_wants_caller", "caller" in names)


@dataclass
class Router:
    """Finds a route for a path, lets the caller in (or not) and turns whatever the handler
    does into (status, body)."""

    engine: Engine
    routes: list[Route] = field(default_factory=list)
    auth: Authenticator = field(default_factory=Authenticator)
    metrics_open: bool = True
    #: called with "unauthenticated" or "forbidden" on every refused request (a metric)
    on_refused: Callable[[str], None] = lambda reason: None
    #: browser sign-in (/login, sessions); None: bearer tokens only
    login: Login | None = None

    def methods(self, path: str) -> list[str]:
        """The methods a path answers (the Allow header of a 405). An unknown path is
        answered like a GET path, so a 405 tells a stranger nothing either."""
        found = {r.method for r in self.routes if r.matches(path)}
        return (["GET", "HEAD"] if not found or "get" in found else []) + (
            ["POST"] if "post" in found else [])

    def resolve(self, path: str, method: str = "get") -> tuple[Route, dict[str, str]] | None:
        for route in self.routes:
            if route.method == method and route.matches(path):
                prefix = route.prefix
                if prefix is None:
                    return route, {}
                name = route.path[len(prefix):].split("}")[0].strip("{")
                return route, {name: unquote(path[len(prefix):len(path) - len(route.suffix)])}
        return None

    def is_public(self, route: Route) -> bool:
        return route.public or (route.path == "/metrics" and self.metrics_open)

    def _caller(self, authorization: str | None, cookie: str | None
                ) -> tuple[Caller | None, bool]:
        """Who asks, and whether through a browser session. A bearer token wins over a
        cookie; without either (or with a session that ended) Unauthorized."""
        if not self.auth.enabled:
            return None, False
        if authorization or self.login is None:
            scope = self.auth.authenticate(authorization)
            return Caller(scope, scope.name), False
        return self.login.caller(cookie)[0], True

    def handle(self, path: str, query: Query, authorization: str | None = None, *,
               cookie: str | None = None, accept: str | None = None) -> Response:
        found = self.resolve(path)
        caller, by_session = None, False
        if found is None or not self.is_public(found[0]):
            try:  # before the 404: an unknown path tells a stranger nothing either
                caller, by_session = self._caller(authorization, cookie)
            except Unauthorized as exc:
                if path == "/" and self.login is not None and wants_html(accept):
                    return 303, redirect("/login")  # a browser: to the sign-in form
                self.on_refused("unauthenticated")
                log.info("refused %s: %s", path, exc)
                return 401, {"error": "authentication required: send a valid bearer token"}
        if found is None:
            return 404, {"error": f"no such path {path[:200]!r}: see /api/v1/openapi.json"}
        route, params = found
        scope = FULL if caller is None else caller.scope
        try:
            if scope.empty and not self.is_public(route):
                raise ApiError(403, "your token maps to no scope (ask for your group to be "
                                    "added to the scopes file)")
            kwargs: dict[str, Any] = dict(params)
            if route.wants_caller:  # the page shows who is signed in
                kwargs.update(caller=caller, by_session=by_session)
            if route.scoped:
                return route.handler(query, self.engine, **kwargs, scope=scope)
            if not scope.unrestricted and not self.is_public(route):
                raise ApiError(403, "this endpoint is outside your scope")
            return route.handler(query, self.engine, **params)
        except ApiError as exc:
            if exc.status == 403:
                self.on_refused("forbidden")
                log.info("forbidden for %s: %s %s", scope.name, path, exc.message)
            return exc.status, {"error": exc.message}
        except sa.exc.SQLAlchemyError as exc:
            detail = database_error(exc)
            log.warning("serving %s: %s", path, detail)
            return 503, {"error": public_error(detail)}
        except Exception:
            log.exception("internal error serving %s", path)
            return 500, {"error": "internal error (see the service log)"}


    def handle_post(self, path: str, post: FormPost) -> Response:
        """A form post (sign-in, sign-out). The HTTP layer answers 405 to any other."""
        found = self.resolve(path, "post")
        if found is None:
            return 404, {"error": f"no such path {path[:200]!r}: see /api/v1/openapi.json"}
        try:
            return found[0].handler(post)
        except Exception:
            log.exception("internal error serving POST %s", path)
            return 500, {"error": "internal error (see the service log)"}


def database_error(exc: BaseException) -> str:
    """A one-line reason for a failed database read, without the URL or the statement."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if "no such table" in first or type(orig).__name__ == "UndefinedTable":
        return "the inventory is empty: no sync has completed yet"
    return f"{DB_UNAVAILABLE}: {first}"


def build_router(engine: Engine, *, health: Callable[[], tuple[bool, dict[str, Any]]],
                 findings: Callable[[], tuple[list[dict[str, Any]], float | None]],
                 metrics: Callable[[], bytes],
                 page_sections: Sequence[SectionSource] = (),
                 check_failure: Callable[[], tuple[float, str] | None] = lambda: None,
                 auth: Authenticator | None = None, metrics_open: bool = True,
                 on_refused: Callable[[str], None] = lambda reason: None,
                 sessions: Sessions | None = None, secure_cookies: bool = False,
                 prices: Any = None) -> Router:
    """All routes: the inventory handlers above plus the service's own state, passed in.

    ``health`` answers (ok, details); ``findings`` the latest findings and when they were
    made (epoch seconds, None before the first); ``metrics`` the Prometheus exposition;
    ``page_sections`` more sections of the live page (usage, idle, capacity) where available.
    ``check_failure`` when and why the latest checks could not run (None if they did).
    With authentication configured a browser signs in at /login into ``sessions`` (a
    fresh store by default); ``secure_cookies`` marks the cookie Secure (the service speaks
    TLS). ``prices`` (hub.usage.Prices, `serve --prices`) prices /api/v1/usage.
    """

    def healthz(query: Query, engine: Engine) -> Response:
        Params(query, [])
        ok, details = health()
        return (200 if ok else 503), details

    def metrics_(query: Query, engine: Engine) -> Response:
        Params(query, [])
        return 200, Raw(metrics(), METRICS_CONTENT_TYPE)

    def findings_(query: Query, engine: Engine, *, scope: Scope) -> Response:
        params = Params(query, ["severity", "cluster", "limit", "continue"])
        severity = params.choice("severity", SEVERITIES)
        cluster = scoped_cluster(params, scope)
        items, generated = findings()
        # A finding without a cluster is about the whole fleet: only for whole-fleet callers.
        selected = [f for f in items
                    if (severity is None or f.get("severity") == severity)
                    and (cluster is None or f.get("cluster") == cluster)
                    and (scope.clusters is None or scope.allows_cluster(f.get("cluster")))]
        when = dt.datetime.fromtimestamp(generated, dt.UTC) if generated is not None else None
        failed = check_failure()
        last_failure = None if failed is None else {  # no hub URL or driver text to callers
            "at": dt.datetime.fromtimestamp(failed[0], dt.UTC), "error": public_error(failed[1])}
        # each finding carries the time of the check it comes from
        page = page_items([{**f, "checked_at": when} for f in selected],
                          text_key("cluster", "node", "gpu", "check", "message"),
                          params, "f1", 5)
        return 200, {**page, "generated_at": when, "last_check_failed": last_failure}

    def page(query: Query, engine: Engine, *, scope: Scope, caller: Caller | None = None,
             by_session: bool = False) -> Response:
        search = search_text(query)
        items, generated = findings()
        who = {"signed_in": caller.name if caller is not None else None,
               "can_sign_out": by_session}
        try:
            data = page_data(engine, search=search, findings=items, findings_at=generated,
                             extra=page_sections, scope=scope)
        except sa.exc.SQLAlchemyError as exc:
            return 503, render_page({**unavailable_data(search, database_error(exc)), **who})
        return 200, render_page({**data, **who})

    auth = auth or Authenticator()
    if sessions is None:  # not `or`: an empty store is falsy (it has a length)
        sessions = Sessions()
    login = (Login(auth, sessions, secure=secure_cookies, on_refused=on_refused)
             if auth.enabled else None)
    router = Router(engine, auth=auth, metrics_open=metrics_open, on_refused=on_refused,
                    login=login)

    def openapi(query: Query, engine: Engine, *, scope: Scope) -> Response:
        Params(query, [])
        return 200, openapi_document(router.routes, secured=router.auth.enabled,
                                     metrics_open=router.metrics_open)

    paging = (LIMIT_PARAM, CONTINUE_PARAM)
    router.routes = [
        Route("/", page, "The live page of the fleet (HTML, read-only): clusters and their "
              "freshness, stale GPUs, GPUs with findings, findings; search with q.",
              {"type": "string"}, (_param("q", "A GPU UUID (or its start), a node or a "
                                            "namespace to look up."),),
              content_type="text/html; charset=utf-8", errors=(400, 503),
              responses={"303": SEE_LOGIN} if login is not None else None),
        Route("/healthz", healthz, "Whether the last sync succeeded within two intervals "
              "(200) or not (503, with the reason).", _ref("Health"), errors=(400, 503),
              public=True),
        Route("/metrics", metrics_, "Prometheus metrics of the service and the inventory.",
              {"type": "string"}, content_type=METRICS_CONTENT_TYPE),
        Route("/api/v1/openapi.json", openapi, "This description (OpenAPI 3.1).",
              {"type": "object"}),
        Route("/api/v1/clusters", clusters, "Clusters: active nodes and physical GPUs, "
              "state, last sample; paged.", _list_of("Cluster"), (CLUSTER_PARAM, *paging),
              errors=(400, 503)),
        Route("/api/v1/nodes", nodes, "Nodes: active physical GPUs, state, last sample; paged.",
              _list_of("Node"), (CLUSTER_PARAM, *paging), errors=(400, 503)),
        Route("/api/v1/gpus", gpus, "GPUs, one item per physical GPU and one per MIG slice, "
              "in (cluster, node, uuid, slice) order; paged.", _list_of("Gpu"), (
                  CLUSTER_PARAM,
                  _param("node", "Only this node."),
                  _param("state", "Only GPUs in this state.",
                         {"type": "string", "enum": list(STATES)}),
                  _param("vendor", "Only this vendor.", {"type": "string", "enum": list(VENDORS)}),
                  _param("health", "Only GPUs of this health (XID, ECC, row remapping).",
                         {"type": "string", "enum": list(HEALTH_LEVELS)}),
                  *paging,
              ), errors=(400, 503)),
        Route("/api/v1/gpus/{uuid}/history", gpu_history, "One GPU's story: where it is, its "
              "MIG slices, events, allocations and recent usage rows.", _ref("GpuHistory"),
              (_param("uuid", "GPU uuid, percent-encoded.", where="path"),),
              errors=(400, 404, 503)),
        Route("/api/v1/gpus/{uuid}", gpu, "One GPU (the physical device) with its MIG "
              "slices. A uuid seen on several nodes answers the active, most recently seen "
              "one and lists the others in also_seen_on.", _ref("GpuDetail"),
              (_param("uuid", "GPU uuid, percent-encoded ('/' as %2F).", where="path"),),
              errors=(400, 404, 503)),
        Route("/api/v1/allocations", allocations, "Which pods use which GPU; a namespace "
              "outside the caller's scope appears as 'other' without names; paged.",
              _list_of("Allocation"), (CLUSTER_PARAM,
                                       _param("namespace", "Only this namespace."), *paging),
              errors=(400, 503)),
        Route("/api/v1/findings", findings_, "Findings of the latest checks (empty until "
              "checks are configured); paged.", {**_list_of("Finding"), "properties": {
                  **_list_of("Finding")["properties"],
                  "generated_at": {"type": ["string", "null"], "format": "date-time"},
                  "last_check_failed": {
                      "type": ["object", "null"],
                      "description": "When and why the latest checks could not run (the "
                                     "hub unreachable, ...); null when they ran since.",
                      "properties": {"at": {"type": "string", "format": "date-time"},
                                     "error": {"type": "string"}}}}},
              (_param("severity", "Only this severity.",
                      {"type": "string", "enum": list(SEVERITIES)}), CLUSTER_PARAM, *paging)),
        Route("/api/v1/usage", functools.partial(usage, prices=prices),
              "GPU-hours per group from the usage ledger (see docs/usage.md for each "
              "figure; cost with `serve --prices`).", _list_of("Usage"),
              (*PERIOD_PARAMS,
               _param("by", "Group by, comma-separated: cluster, namespace, model, node, gpu "
                      "(default namespace)."),
               _param("idle_threshold", "Utilisation % under which an allocated bucket is "
                      "idle (default 5).", {"type": "number", "minimum": 0, "maximum": 100})),
              errors=(400, 503)),
        Route("/api/v1/idle", idle, "Allocated GPUs and slices idle for at least 'for' in a "
              "row, most GPU-hours wasted first.", _list_of("Idle"),
              (*PERIOD_PARAMS,
               _param("threshold", "Utilisation % (default 5).",
                      {"type": "number", "minimum": 0, "maximum": 100}),
               _param("for", "Idle at least this long in a row (default 2h).")),
              errors=(400, 503)),
        Route("/api/v1/capacity", capacity, "GPU-equivalents per group now: total, active, "
              "stale, allocated, free.", _list_of("Capacity"),
              (_param("by", "Group by, comma-separated: model, cluster, node "
                      "(default model)."),), errors=(400, 503)),
        Route("/api/v1/events", events, "Inventory events, newest first; paged.",
              _list_of("Event"), (
                  _param("since", "Only events of the last DURATION (e.g. 7d)."),
                  CLUSTER_PARAM, _param("uuid", "Only this GPU."),
                  _param("type", "Only this type.",
                         {"type": "string", "enum": list(inv.EVENT_TYPES)}),
                  *paging),
              errors=(400, 503)),
        Route("/api/v1/sync-runs", sync_runs, "Sync runs, latest first.",
              _list_of("SyncRun"), (LIMIT_RUNS,), errors=(400, 503)),
    ]
    if login is not None:
        router.routes += login_routes(login)
    return router


def _html(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/html": {"schema": {
        "type": "string"}}}}


def _see_other(description: str, cookie: bool) -> dict[str, Any]:
    headers = {"Location": {"schema": {"type": "string"}, "required": True}}
    if cookie:
        headers["Set-Cookie"] = {"schema": {"type": "string"}, "required": True,
                                 "description": "The session cookie (HttpOnly, "
                                                "SameSite=Strict), or its removal."}
    return {**_html(description), "headers": headers}


SEE_LOGIN = _see_other("A browser (Accept: text/html) without a session: to /login.", False)
TOKEN_FORM = {"required": True, "content": {"application/x-www-form-urlencoded": {"schema": {
    "type": "object", "required": ["token"], "additionalProperties": False,
    "properties": {"token": {
        "type": "string", "minLength": 1, "maxLength": MAX_TOKEN,
        "pattern": TEXT_PARAM["pattern"],
        "description": "A static token or an OIDC access or ID token."}}}}}}


def login_routes(login: Login) -> list[Route]:
    """Sign-in and sign-out for browsers: HTML forms and redirects, no JSON."""
    return [
        Route("/login", login.form, "The sign-in form (HTML): paste a token; the browser "
              "then keeps a session cookie, never the token.", {"type": "string"},
              content_type=HTML, errors=(), public=True,
              responses={"400": _html("Parameters given (a token never goes in a URL).")}),
        Route("/login", login.submit, "Sign in with a token (form post): on success a "
              "session cookie and 303 to the page; a bad token answers the form again "
              "with 'sign-in failed' (401).", None, errors=(), public=True, method="post",
              request_body=TOKEN_FORM, responses={
                  "303": _see_other("Signed in: the session cookie, and to /.", True),
                  "400": _html("The form could not be read."),
                  "401": _html("Sign-in failed (the same answer for any bad token)."),
                  "403": _html("A form sent from another site, or a token whose groups "
                               "map to no scope.")}),
        Route("/logout", login.logout, "Sign out (form post): the session ends, its cookie "
              "is removed; 303 to /login.", None, errors=(), public=True, method="post",
              responses={"303": _see_other("Signed out: to /login.", True),
                         "403": _html("A form sent from another site.")}),
    ]
