"""The API's routes: which path runs which handler, and the service's own endpoints.

A route carries its OpenAPI description beside its handler, so the description cannot drift
from what is served.
"""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import sqlalchemy as sa
from sqlalchemy.engine import Engine

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
    clusters,
    gpu,
    gpus,
    log,
    nodes,
    page_items,
    public_error,
    scoped_cluster,
    sync_runs,
    text_key,
)
from hub.service._auth import FULL, Authenticator, Scope, Unauthorized
from hub.service._openapi import _list_of, _param, _ref, openapi_document

# -- routes and the OpenAPI description -------------------------------------------------------

CLUSTER_PARAM = _param("cluster", "Only this cluster.")
LIMIT_PARAM = _param("limit", f"Page size (1-{MAX_LIMIT}).",
                     {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                      "default": DEFAULT_LIMIT})
CONTINUE_PARAM = _param("continue", "The 'continue' token of the previous page.")
LIMIT_RUNS = _param("limit", f"Number of runs (1-{MAX_RUNS}).",
                    {"type": "integer", "minimum": 1, "maximum": MAX_RUNS,
                     "default": DEFAULT_RUNS})


@dataclass(frozen=True)
class Route:
    path: str  # OpenAPI path; a trailing "{name}" takes the rest of the path, percent-decoded
    handler: Handler
    summary: str
    response: dict[str, Any]
    parameters: tuple[dict[str, Any], ...] = ()
    content_type: str = "application/json"
    errors: tuple[int, ...] = (400,)
    public: bool = False  # answered without a token (/healthz; /metrics when opened)
    _scoped: bool = field(init=False, repr=False, compare=False, default=False)

    @property
    def prefix(self) -> str | None:
        head, sep, _ = self.path.partition("{")
        return head if sep else None

    @property
    def scoped(self) -> bool:
        """Whether the handler takes the caller's scope. One that does not is unrestricted
        callers' only: a new endpoint is closed to scoped tokens until it applies a scope."""
        return self._scoped

    def __post_init__(self) -> None:  # looked up once, not on every request
        object.__setattr__(self, "_scoped",
                           "scope" in inspect.signature(self.handler).parameters)


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

    def resolve(self, path: str) -> tuple[Route, dict[str, str]] | None:
        for route in self.routes:
            prefix = route.prefix
            if prefix is None and path == route.path:
                return route, {}
            if prefix is not None and path.startswith(prefix):
                name = route.path[len(prefix):].strip("{}")
                return route, {name: unquote(path[len(prefix):])}
        return None

    def is_public(self, route: Route) -> bool:
        return route.public or (route.path == "/metrics" and self.metrics_open)

    def handle(self, path: str, query: Query, authorization: str | None = None) -> Response:
        found = self.resolve(path)
        scope = FULL
        if found is None or not self.is_public(found[0]):
            try:  # before the 404: an unknown path tells a stranger nothing either
                scope = self.auth.authenticate(authorization)
            except Unauthorized as exc:
                self.on_refused("unauthenticated")
                log.info("refused %s: %s", path, exc)
                return 401, {"error": "authentication required: send a valid bearer token"}
        if found is None:
            return 404, {"error": f"no such path {path[:200]!r}: see /api/v1/openapi.json"}
        route, params = found
        try:
            if scope.empty and not self.is_public(route):
                raise ApiError(403, "your token maps to no scope (ask for your group to be "
                                    "added to the scopes file)")
            if route.scoped:
                return route.handler(query, self.engine, **params, scope=scope)
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
                 check_failure: Callable[[], tuple[float, str] | None] = lambda: None,
                 auth: Authenticator | None = None, metrics_open: bool = True,
                 on_refused: Callable[[str], None] = lambda reason: None) -> Router:
    """All routes: the inventory handlers above plus the service's own state, passed in.

    ``health`` answers (ok, details); ``findings`` the latest findings and when they were
    made (epoch seconds, None before the first); ``metrics`` the Prometheus exposition;
    ``check_failure`` when and why the latest checks could not run (None if they did).
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

    router = Router(engine, auth=auth or Authenticator(), metrics_open=metrics_open,
                    on_refused=on_refused)

    def openapi(query: Query, engine: Engine, *, scope: Scope) -> Response:
        Params(query, [])
        return 200, openapi_document(router.routes, secured=router.auth.enabled,
                                     metrics_open=router.metrics_open)

    paging = (LIMIT_PARAM, CONTINUE_PARAM)
    router.routes = [
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
        Route("/api/v1/sync-runs", sync_runs, "Sync runs, latest first.",
              _list_of("SyncRun"), (LIMIT_RUNS,), errors=(400, 503)),
    ]
    return router
