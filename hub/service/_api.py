"""The hub service's HTTP face: a read-only JSON API over the inventory, /healthz and /metrics.

Plain ``http.server`` and a table of routes, no web framework: the API is a handful of GET
endpoints that each run one indexed query. A route's handler is a plain function
``(query, engine, **path_params) -> (status, body)``: ``query`` is the parsed query string
(``{name: [values]}``) and ``engine`` a read-only engine, so handlers are tested like any other
function and the HTTP layer only encodes what they return.

Items carry the same field names as ``gpufleet inventory ... -o json`` because they come from
the same columns (``hub.inventory``'s lists and ``GPU_COLUMNS``). The GPU list is paged with a
keyset on the table's primary key, in SQL: a page costs the same on the first and the
thousandth page, and a GPU added or removed between two pages neither repeats nor shifts the
others. Nothing here writes: the engine refuses writes at the connection level.

No response carries a secret: the database URL, the hub token and its URL never appear.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import http.server
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from hub import __version__
from hub.common._httpserve import BackgroundHTTPServer
from hub.common._output import iso
from hub.inventory import _db as inventory
from hub.inventory._health import LEVELS as HEALTH_LEVELS
from hub.store._vendors import PROFILES

log = logging.getLogger("gpufleet.api")

DEFAULT_LIMIT = 500
MAX_LIMIT = 5000
DEFAULT_RUNS = 20
MAX_RUNS = 1000
STATES = (inventory.ACTIVE, inventory.STALE)
SEVERITIES = ("error", "warning", "info")
VENDORS = tuple(p.vendor for p in PROFILES)
#: Prometheus text format 0.0.4: what every Prometheus (2.42 included) parses.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Query = Mapping[str, list[str]]
Response = tuple[int, Any]
Handler = Callable[..., Response]
GPU_KEY = (inventory.gpus.c.cluster, inventory.gpus.c.node, inventory.gpus.c.uuid,
           inventory.gpus.c.slice_key)


class ApiError(Exception):
    """A request the API refuses: its status and a one-line message for ``{"error": ...}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Raw:
    """A non-JSON body (the /metrics exposition)."""

    body: bytes
    content_type: str


# -- read-only engine -------------------------------------------------------------------------
def read_only_engine(url: str | None) -> Engine:
    """An inventory engine that cannot write, so no API bug can alter the inventory.

    SQLite: ``PRAGMA query_only`` on every connection. PostgreSQL: every transaction starts
    read-only (``default_transaction_read_only``), set as a connection option so that no
    rollback can undo it, and a connect timeout so a dead server fails a request rather than
    hanging it.
    """
    engine = inventory.make_engine(url, create=True)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _query_only(dbapi_conn: Any, record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA query_only = ON")
            cur.close()

    elif engine.dialect.name == "postgresql":

        @event.listens_for(engine, "do_connect")
        def _read_only(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
            options = cparams.get("options", "")
            cparams["options"] = f"{options} -c default_transaction_read_only=on".strip()
            cparams.setdefault("connect_timeout", 5)

    return engine


# -- query parameters -------------------------------------------------------------------------
class Params:
    """The query string of one request, checked strictly.

    An unknown or repeated parameter is a 400, not ignored: ``?clustr=east`` silently
    returning the whole fleet is the kind of answer that looks right and is not.
    """

    def __init__(self, query: Query, allowed: Iterable[str]) -> None:
        allowed = tuple(allowed)
        for name in sorted(query):
            if name not in allowed:
                hint = f" (allowed: {', '.join(allowed)})" if allowed else " (none allowed)"
                raise ApiError(400, f"unknown query parameter {name!r}{hint}")
        self.query = query

    def text(self, name: str) -> str | None:
        values = self.query.get(name)
        if not values:
            return None
        if len(values) > 1:
            raise ApiError(400, f"query parameter {name!r} given more than once")
        if values[0] == "":
            raise ApiError(400, f"query parameter {name!r} must not be empty")
        return values[0]

    def choice(self, name: str, choices: Sequence[str]) -> str | None:
        value = self.text(name)
        if value is not None and value not in choices:
            raise ApiError(400, f"unknown {name} {value!r}: choose one of {', '.join(choices)}")
        return value

    def integer(self, name: str, default: int, maximum: int) -> int:
        value = self.text(name)
        if value is None:
            return default
        if not value.isdigit() or not 1 <= int(value) <= maximum:
            raise ApiError(400, f"{name} must be a whole number from 1 to {maximum}, "
                                f"not {value!r}")
        return int(value)


def encode_token(key: Sequence[str]) -> str:
    """Opaque continue token: the primary key of the last item sent, base64url of JSON."""
    raw = json.dumps(["g1", *key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str) -> tuple[str, str, str, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        data = None
    if (not isinstance(data, list) or len(data) != 5 or data[0] != "g1"
            or not all(isinstance(v, str) for v in data[1:])):
        raise ApiError(400, "invalid continue token (pass the 'continue' value of the "
                            "previous page unchanged)")
    return data[1], data[2], data[3], data[4]


# -- inventory reads ----------------------------------------------------------------------------
def page_gpus(conn: Connection, *, cluster: str | None = None, node: str | None = None,
              state: str | None = None, vendor: str | None = None,
              health: str | None = None, limit: int = DEFAULT_LIMIT,
              after: Sequence[str] | None = None
              ) -> tuple[list[dict[str, Any]], tuple[str, ...] | None]:
    """One page of GPUs (physical and MIG slices) in primary-key order, and the key to go on.

    Keyset paging: ``WHERE (cluster, node, uuid, slice_key) > :after ORDER BY ... LIMIT n+1``
    rides the primary-key index on both databases. The extra row only tells whether another
    page exists, so the last page says so itself instead of a trailing empty one.
    """
    table = inventory.gpus
    stmt = sa.select(table)
    for column, value in (("cluster", cluster), ("node", node), ("state", state),
                          ("vendor", vendor), ("health", health)):
        if value is not None:
            stmt = stmt.where(table.c[column] == value)
    if after is not None:
        stmt = stmt.where(sa.tuple_(*GPU_KEY) > sa.tuple_(*(sa.literal(v) for v in after)))
    rows = conn.execute(stmt.order_by(*GPU_KEY).limit(limit + 1)).mappings().all()
    more = len(rows) > limit
    rows = rows[:limit]
    last = tuple(rows[-1][c.name] for c in GPU_KEY) if more else None
    return [inventory.gpu_item(r) for r in rows], last


def gpu_detail(conn: Connection, uuid: str) -> dict[str, Any] | None:
    """A GPU by uuid with its MIG slices; None when unknown.

    A uuid normally lives on one node. When it appears on several (a GPU moved between nodes,
    or an exporter that reports a serial-derived id twice), the answer is deterministic: the
    node whose physical row is active, then the most recently seen, then primary-key order;
    the other places are listed in ``also_seen_on`` so nothing is hidden.
    """
    table = inventory.gpus
    rows = conn.execute(
        sa.select(table).where(table.c.uuid == uuid).order_by(*GPU_KEY)
    ).mappings().all()
    if not rows:
        return None
    places: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        places.setdefault((row["cluster"], row["node"]), []).append(row)

    def physical_of(group: list[Mapping[str, Any]]) -> Mapping[str, Any]:
        return next((r for r in group if r["slice_key"] == ""), group[0])

    # Stable sorts, last key first: active before stale, then newest, then primary key.
    ordered = sorted(places.items(), key=lambda item: item[0])
    ordered.sort(key=lambda item: physical_of(item[1])["last_seen"] or dt.datetime.min,
                 reverse=True)
    ordered.sort(key=lambda item: physical_of(item[1])["state"] != inventory.ACTIVE)
    chosen = ordered[0][1]
    physical = next((r for r in chosen if r["slice_key"] == ""), None)
    others = []
    for (cluster, node), group in ordered[1:]:
        first = physical_of(group)
        others.append({"cluster": cluster, "node": node, "state": first["state"],
                       "last_seen": first["last_seen"]})
    return {
        "gpu": inventory.gpu_item(physical) if physical is not None else None,
        "slices": [inventory.gpu_item(r) for r in chosen if r["slice_key"] != ""],
        "also_seen_on": others,
    }


def gpu_counts(conn: Connection) -> list[tuple[str, str, int]]:
    """Physical GPUs by (cluster, state), every known state present for every cluster."""
    table = inventory.gpus
    rows = conn.execute(
        sa.select(table.c.cluster, table.c.state, sa.func.count())
        .where(table.c.slice_key == "")
        .group_by(table.c.cluster, table.c.state)
    ).all()
    counts = {(c, s): n for c, s, n in rows}
    for cluster in {c for c, _ in counts}:
        for state in STATES:
            counts.setdefault((cluster, state), 0)
    return sorted((c, s, n) for (c, s), n in counts.items())


# -- handlers -----------------------------------------------------------------------------------
def _listing(items: list[Any], token: str | None = None) -> dict[str, Any]:
    return {"items": items, "continue": token}


def clusters(query: Query, engine: Engine) -> Response:
    cluster = Params(query, ["cluster"]).text("cluster")
    with engine.connect() as conn:
        return 200, _listing(inventory.list_clusters(conn, cluster))


def nodes(query: Query, engine: Engine) -> Response:
    cluster = Params(query, ["cluster"]).text("cluster")
    with engine.connect() as conn:
        return 200, _listing(inventory.list_nodes(conn, cluster))


def gpus(query: Query, engine: Engine) -> Response:
    params = Params(query, ["cluster", "node", "state", "vendor", "health", "limit",
                            "continue"])
    token = params.text("continue")
    after = decode_token(token) if token is not None else None
    filters = {
        "cluster": params.text("cluster"),
        "node": params.text("node"),
        "state": params.choice("state", STATES),
        "vendor": params.choice("vendor", VENDORS),
        "health": params.choice("health", HEALTH_LEVELS),
    }
    limit = params.integer("limit", DEFAULT_LIMIT, MAX_LIMIT)
    with engine.connect() as conn:
        items, last = page_gpus(conn, limit=limit, after=after, **filters)
    return 200, _listing(items, encode_token(last) if last else None)


def gpu(query: Query, engine: Engine, uuid: str) -> Response:
    Params(query, [])
    if not uuid:
        raise ApiError(404, "no GPU uuid in the path (GET /api/v1/gpus/{uuid})")
    with engine.connect() as conn:
        found = gpu_detail(conn, uuid)
    if found is None:
        raise ApiError(404, f"unknown GPU {uuid!r}")
    return 200, found


def sync_runs(query: Query, engine: Engine) -> Response:
    limit = Params(query, ["limit"]).integer("limit", DEFAULT_RUNS, MAX_RUNS)
    with engine.connect() as conn:
        return 200, _listing(inventory.list_sync_runs(conn, limit))


# -- routes and the OpenAPI description -------------------------------------------------------
def _param(name: str, description: str, schema: dict[str, Any] | None = None,
           where: str = "query") -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path",
            "description": description, "schema": schema or {"type": "string"}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _list_of(name: str) -> dict[str, Any]:
    return {"type": "object", "required": ["items", "continue"], "properties": {
        "items": {"type": "array", "items": _ref(name)},
        "continue": {"type": ["string", "null"],
                     "description": "Token of the next page; null on the last page."},
    }}


CLUSTER_PARAM = _param("cluster", "Only this cluster.")
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

    @property
    def prefix(self) -> str | None:
        head, sep, _ = self.path.partition("{")
        return head if sep else None


@dataclass
class Router:
    """Finds a route for a path and turns whatever the handler does into (status, body)."""

    engine: Engine
    routes: list[Route] = field(default_factory=list)

    def resolve(self, path: str) -> tuple[Route, dict[str, str]] | None:
        for route in self.routes:
            prefix = route.prefix
            if prefix is None and path == route.path:
                return route, {}
            if prefix is not None and path.startswith(prefix):
                name = route.path[len(prefix):].strip("{}")
                return route, {name: unquote(path[len(prefix):])}
        return None

    def handle(self, path: str, query: Query) -> Response:
        found = self.resolve(path)
        if found is None:
            return 404, {"error": f"no such path {path!r}: see /api/v1/openapi.json"}
        route, params = found
        try:
            return route.handler(query, self.engine, **params)
        except ApiError as exc:
            return exc.status, {"error": exc.message}
        except sa.exc.SQLAlchemyError as exc:
            return 503, {"error": database_error(exc)}
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
    return f"inventory database unavailable: {first}"


def build_router(engine: Engine, *, health: Callable[[], tuple[bool, dict[str, Any]]],
                 findings: Callable[[], tuple[list[dict[str, Any]], float | None]],
                 metrics: Callable[[], bytes]) -> Router:
    """All routes: the inventory handlers above plus the service's own state, passed in.

    ``health`` answers (ok, details); ``findings`` the latest findings and when they were
    made (epoch seconds, None before the first); ``metrics`` the Prometheus exposition.
    """

    def healthz(query: Query, engine: Engine) -> Response:
        Params(query, [])
        ok, details = health()
        return (200 if ok else 503), details

    def metrics_(query: Query, engine: Engine) -> Response:
        Params(query, [])
        return 200, Raw(metrics(), METRICS_CONTENT_TYPE)

    def findings_(query: Query, engine: Engine) -> Response:
        params = Params(query, ["severity", "cluster"])
        severity = params.choice("severity", SEVERITIES)
        cluster = params.text("cluster")
        items, generated = findings()
        selected = [f for f in items
                    if (severity is None or f.get("severity") == severity)
                    and (cluster is None or f.get("cluster") == cluster)]
        when = dt.datetime.fromtimestamp(generated, dt.UTC) if generated is not None else None
        return 200, {**_listing(selected), "generated_at": when}

    router = Router(engine)

    def openapi(query: Query, engine: Engine) -> Response:
        Params(query, [])
        return 200, openapi_document(router.routes)

    router.routes = [
        Route("/healthz", healthz, "Whether the last sync succeeded within two intervals "
              "(200) or not (503, with the reason).", _ref("Health"), errors=(400, 503)),
        Route("/metrics", metrics_, "Prometheus metrics of the service and the inventory.",
              {"type": "string"}, content_type=METRICS_CONTENT_TYPE),
        Route("/api/v1/openapi.json", openapi, "This description (OpenAPI 3.1).",
              {"type": "object"}),
        Route("/api/v1/clusters", clusters, "Clusters: active nodes and physical GPUs, "
              "state, last sample.", _list_of("Cluster"), (CLUSTER_PARAM,),
              errors=(400, 503)),
        Route("/api/v1/nodes", nodes, "Nodes: active physical GPUs, state, last sample.",
              _list_of("Node"), (CLUSTER_PARAM,), errors=(400, 503)),
        Route("/api/v1/gpus", gpus, "GPUs, one item per physical GPU and one per MIG slice, "
              "in (cluster, node, uuid, slice) order; paged.", _list_of("Gpu"), (
                  CLUSTER_PARAM,
                  _param("node", "Only this node."),
                  _param("state", "Only GPUs in this state.",
                         {"type": "string", "enum": list(STATES)}),
                  _param("vendor", "Only this vendor.", {"type": "string", "enum": list(VENDORS)}),
                  _param("health", "Only GPUs of this health (XID, ECC, row remapping).",
                         {"type": "string", "enum": list(HEALTH_LEVELS)}),
                  _param("limit", f"Page size (1-{MAX_LIMIT}).",
                         {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                          "default": DEFAULT_LIMIT}),
                  _param("continue", "The 'continue' token of the previous page."),
              ), errors=(400, 503)),
        Route("/api/v1/gpus/{uuid}", gpu, "One GPU (the physical device) with its MIG "
              "slices. A uuid seen on several nodes answers the active, most recently seen "
              "one and lists the others in also_seen_on.", _ref("GpuDetail"),
              (_param("uuid", "GPU uuid, percent-encoded ('/' as %2F).", where="path"),),
              errors=(400, 404, 503)),
        Route("/api/v1/findings", findings_, "Findings of the latest checks (empty until "
              "checks are configured).", {**_list_of("Finding"), "properties": {
                  **_list_of("Finding")["properties"],
                  "generated_at": {"type": ["string", "null"], "format": "date-time"}}},
              (_param("severity", "Only this severity.",
                      {"type": "string", "enum": list(SEVERITIES)}), CLUSTER_PARAM)),
        Route("/api/v1/sync-runs", sync_runs, "Sync runs, latest first.",
              _list_of("SyncRun"), (LIMIT_RUNS,), errors=(400, 503)),
    ]
    return router


_TIME = {"type": ["string", "null"], "format": "date-time"}
_NUMBER = {"type": ["number", "null"]}
_TEXT = {"type": ["string", "null"]}
_GPU_TYPES: dict[str, dict[str, Any]] = {
    "cluster": {"type": "string"}, "node": {"type": "string"}, "uuid": {"type": "string"},
    "index": {"type": ["integer", "null"]}, "vendor": {"type": "string", "enum": list(VENDORS)},
    "state": {"type": "string", "enum": list(STATES)}, "first_seen": _TIME,
    "last_seen": _TIME, "last_sample_at": _TIME, "memory_total_mib": _NUMBER,
    "memory_used_mib": _NUMBER, "utilisation_pct": _NUMBER, "power_w": _NUMBER,
    "temperature_c": _NUMBER,
    "health": {"type": ["string", "null"], "enum": [*HEALTH_LEVELS, None]},
    "health_reasons": _TEXT,
}


def _object(columns: Sequence[str], types: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    return {"type": "object", "required": list(columns),
            "properties": {c: types.get(c, _TEXT) for c in columns}}


def _schemas() -> dict[str, Any]:
    counted = {"nodes": {"type": "integer"}, "gpus": {"type": "integer"},
               "state": _GPU_TYPES["state"], "last_seen": _TIME, "last_sample_at": _TIME,
               "cluster": {"type": "string"}, "node": {"type": "string"}}
    place = _object(["cluster", "node", "state", "last_seen"], counted)
    runs = {"id": {"type": "integer"}, "started_at": _TIME, "finished_at": _TIME,
            "status": {"type": "string", "enum": ["ok", "failed"]},
            "requests": {"type": "integer"}, "clusters": {"type": ["integer", "null"]},
            "nodes": {"type": ["integer", "null"]}, "gpus": {"type": ["integer", "null"]}}
    return {
        "Cluster": _object(inventory.CLUSTER_COLUMNS, counted),
        "Node": _object(inventory.NODE_COLUMNS, counted),
        "Gpu": _object(inventory.GPU_COLUMNS, _GPU_TYPES),
        "GpuDetail": {"type": "object", "required": ["gpu", "slices", "also_seen_on"],
                      "properties": {
                          "gpu": {"oneOf": [_ref("Gpu"), {"type": "null"}]},
                          "slices": {"type": "array", "items": _ref("Gpu")},
                          "also_seen_on": {"type": "array", "items": place}}},
        "SyncRun": _object(list(inventory.sync_runs.c.keys()), runs),
        "Finding": _object(["severity", "check", "cluster", "node", "gpu", "message"],
                           {"severity": {"type": "string", "enum": list(SEVERITIES)},
                            "check": {"type": "string"}, "message": {"type": "string"}}),
        "Health": {"type": "object", "required": ["status"], "properties": {
            "status": {"type": "string", "enum": ["ok", "unavailable"]},
            "reason": {"type": "string"}, "last_success": _TIME,
            "last_success_age_seconds": _NUMBER, "last_error": _TEXT,
            "consecutive_failures": {"type": "integer"},
            "interval_seconds": {"type": "number"}}},
        "Error": {"type": "object", "required": ["error"],
                  "properties": {"error": {"type": "string"}}},
    }


_STATUS_TEXT = {400: "Bad query parameters", 404: "Not found",
                503: "Not available (inventory database or service not healthy)"}


def openapi_document(routes: Sequence[Route]) -> dict[str, Any]:
    """OpenAPI 3.1 built from the route table itself, so no path goes undocumented."""
    paths: dict[str, Any] = {}
    for route in routes:
        responses: dict[str, Any] = {"200": {"description": "OK", "content": {
            route.content_type.split(";")[0]: {"schema": route.response}}}}
        for status in route.errors:
            responses[str(status)] = {"description": _STATUS_TEXT[status], "content": {
                "application/json": {"schema": _ref("Health" if route.path == "/healthz"
                                                     and status == 503 else "Error")}}}
        operation = {"summary": route.summary, "operationId": _operation_id(route.path),
                     "parameters": list(route.parameters), "responses": responses}
        paths[route.path] = {"get": operation}
    return {
        "openapi": "3.1.0",
        "info": {"title": "gpufleet hub service", "version": __version__,
                 "description": "Read-only view of the GPU inventory. Only GET and HEAD."},
        "paths": paths,
        "components": {"schemas": _schemas()},
    }


def _operation_id(path: str) -> str:
    words = [w.strip("{}") for w in path.replace(".", "/").replace("-", "/").split("/") if w]
    return "get" + "".join(w[:1].upper() + w[1:] for w in words if w not in ("api", "v1"))


# -- HTTP -------------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return iso(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def encode_json(body: Any) -> bytes:
    return (json.dumps(body, default=_plain, separators=(",", ":")) + "\n").encode()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ApiServer
    protocol_version = "HTTP/1.1"
    timeout = 60
    disable_nagle_algorithm = True

    def version_string(self) -> str:
        return "gpufleet"  # no Python version in the Server header

    def do_GET(self) -> None:
        self._dispatch(body=True)

    def do_HEAD(self) -> None:
        self._dispatch(body=False)

    def _refuse(self) -> None:
        self._send(405, encode_json({"error": f"method {self.command} not allowed: the API "
                                              "is read-only (GET, HEAD)"}),
                   "application/json", body=True, extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _refuse

    def _dispatch(self, body: bool) -> None:
        url = urlsplit(self.path)
        try:
            query = parse_qs(url.query, keep_blank_values=True, max_num_fields=50)
        except ValueError:
            status, payload = 400, {"error": "too many query parameters"}
        else:
            status, payload = self.server.router.handle(url.path, query)
        if isinstance(payload, Raw):
            self._send(status, payload.body, payload.content_type, body)
        else:
            self._send(status, encode_json(payload), "application/json", body)

    def _send(self, status: int, data: bytes, content_type: str, body: bool,
              extra: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class ApiServer(BackgroundHTTPServer):
    """Serves a router. Binding errors (port in use, bad host) raise OSError at once."""

    thread_name = "api-http"

    def __init__(self, router: Router, host: str, port: int) -> None:
        self.router = router
        super().__init__(host, port, _Handler)
