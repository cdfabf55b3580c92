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

Scopes: a handler that declares a keyword ``scope`` (a ``hub.service._auth.Scope``) gets the
caller's and must apply it: ``scoped_cluster`` for a ``cluster`` filter (403 outside),
``scope.allows_cluster`` on every row, ``scope.mask_allocation`` on rows that name a
namespace or pod (another team's become "other"). A handler without ``scope`` is served only
to unrestricted callers, so a new endpoint is closed to teams until it applies the scope.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import json
import logging
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from hub import inventory as inv
from hub.service._auth import FULL, Scope
from hub.store import PROFILES

log = logging.getLogger("gpufleet.api")

DEFAULT_LIMIT = 500
MAX_LIMIT = 5000
DEFAULT_RUNS = 20
MAX_RUNS = 1000
STATES = (inv.ACTIVE, inv.STALE)
SEVERITIES = ("error", "warning", "info")
VENDORS = tuple(p.vendor for p in PROFILES)
HEALTH_LEVELS = inv.HEALTH_LEVELS
#: Prometheus text format 0.0.4: what every Prometheus (2.42 included) parses.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_PAGE_KEY = secrets.token_bytes(32)
DB_UNAVAILABLE = "inventory database unavailable"
DIGITS = re.compile(r"[0-9]{1,9}")
#: No control characters (NUL above all: PostgreSQL refuses it in a text parameter).
URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+")
PRINTABLE = re.compile(r"[^\x00-\x1f\x7f]*")

Query = Mapping[str, list[str]]
Response = tuple[int, Any]
Handler = Callable[..., Response]
GPU_KEY = (inv.gpus.c.cluster, inv.gpus.c.node, inv.gpus.c.uuid,
           inv.gpus.c.slice_key)


class ApiError(Exception):
    """A request the API refuses: its status and a one-line message for ``{"error": ...}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Raw:
    """A non-JSON body (the /metrics exposition, the HTML page) and headers of its own."""

    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


# -- read-only engine -------------------------------------------------------------------------
def read_only_engine(url: str | None) -> Engine:
    """An inventory engine that cannot write, so no API bug can alter the inventory.

    SQLite: ``PRAGMA query_only`` on every connection. PostgreSQL: every transaction starts
    read-only (``default_transaction_read_only``), set as a connection option so that no
    rollback can undo it, and a connect timeout so a dead server fails a request rather than
    hanging it.
    """
    engine = inv.make_engine(url, create=True)
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
        """The value, or None when absent or empty: ``cluster=`` means no filter, as the
        schema (a plain string) allows."""
        value = self._one(name)
        return value or None

    def _one(self, name: str) -> str | None:
        values = self.query.get(name)
        if not values:
            return None
        if len(values) > 1:
            raise ApiError(400, f"query parameter {name!r} given more than once")
        if not PRINTABLE.fullmatch(values[0]):
            raise ApiError(400, f"query parameter {name!r} must not contain control characters")
        return values[0]

    def choice(self, name: str, choices: Sequence[str]) -> str | None:
        value = self._one(name)
        if value is not None and value not in choices:
            raise ApiError(400, f"unknown {name} {value[:64]!r}: choose one of "
                                f"{', '.join(choices)}")
        return value

    def integer(self, name: str, default: int, maximum: int) -> int:
        """ASCII digits only (``str.isdigit`` takes '²'), checked before ``int`` ever sees a
        long string."""
        value = self._one(name)
        if value is None:
            return default
        if not DIGITS.fullmatch(value) or not 1 <= int(value) <= maximum:
            raise ApiError(400, f"{name} must be a whole number from 1 to {maximum}, "
                                f"not {value[:32]!r}")
        return int(value)


def encode_token(key: Sequence[Any], kind: str = "g1") -> str:
    """Opaque continue token: the key of the last item sent, base64url of JSON. ``kind`` names
    the listing, so one endpoint's token is refused by another."""
    raw = json.dumps([kind, *key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str, kind: str = "g1", size: int = 4) -> tuple[Any, ...]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        data = None
    if (not isinstance(data, list) or len(data) != size + 1 or data[0] != kind
            or not all(isinstance(v, str) for v in data[1:])):
        raise ApiError(400, "invalid continue token (pass the 'continue' value of the "
                            "previous page unchanged)")
    return tuple(data[1:])


def page_items(items: list[dict[str, Any]], key: Callable[[Mapping[str, Any]], tuple[str, ...]],
               params: Params, kind: str, size: int,
               present: Callable[[dict[str, Any]], dict[str, Any]] | None = None
               ) -> dict[str, Any]:
    """Keyset paging of a short list already read whole (clusters, nodes, findings): the same
    ``limit``/``continue`` contract as /gpus, so a client pages every listing alike.

    ``key`` must be unique per item; ``present`` turns a page's rows into what is sent
    (masking), after the keys are taken, so masked rows that look alike still page right.
    """
    token = params.text("continue")
    limit = params.integer("limit", DEFAULT_LIMIT, MAX_LIMIT)
    ordered = sorted(items, key=key)
    if token is not None:
        after = decode_token(token, kind, size)
        ordered = [i for i in ordered if key(i) > after]
    page = ordered[:limit]
    more = len(ordered) > limit
    shown = [present(i) for i in page] if present is not None else page
    return _listing(shown, encode_token(key(page[-1]), kind) if more else None)


def text_key(*names: str) -> Callable[[Mapping[str, Any]], tuple[str, ...]]:
    return lambda item: tuple(str(item.get(n) or "") for n in names)


# -- inventory reads ----------------------------------------------------------------------------
def page_gpus(conn: Connection, *, cluster: str | None = None, node: str | None = None,
              state: str | None = None, vendor: str | None = None,
              health: str | None = None, limit: int = DEFAULT_LIMIT,
              after: Sequence[str] | None = None, within: frozenset[str] | None = None
              ) -> tuple[list[dict[str, Any]], tuple[str, ...] | None]:
    """One page of GPUs (physical and MIG slices) in primary-key order, and the key to go on.

    Keyset paging: ``WHERE (cluster, node, uuid, slice_key) > :after ORDER BY ... LIMIT n+1``
    rides the primary-key index on both databases. The extra row only tells whether another
    page exists, so the last page says so itself instead of a trailing empty one.
    """
    table = inv.gpus
    stmt = sa.select(table)
    for column, value in (("cluster", cluster), ("node", node), ("state", state),
                          ("vendor", vendor), ("health", health)):
        if value is not None:
            stmt = stmt.where(table.c[column] == value)
    if within is not None:  # a scope: only these clusters, in SQL so paging stays exact
        stmt = stmt.where(table.c.cluster.in_(sorted(within)))
    if after is not None:
        stmt = stmt.where(sa.tuple_(*GPU_KEY) > sa.tuple_(*(sa.literal(v) for v in after)))
    rows = conn.execute(stmt.order_by(*GPU_KEY).limit(limit + 1)).mappings().all()
    more = len(rows) > limit
    rows = rows[:limit]
    last = tuple(rows[-1][c.name] for c in GPU_KEY) if more else None
    return [inv.gpu_item(r) for r in rows], last


def gpu_detail(conn: Connection, uuid: str, scope: Scope = FULL) -> dict[str, Any] | None:
    """A GPU by uuid with its MIG slices; None when unknown.

    A uuid normally lives on one node. When it appears on several (a GPU moved between nodes,
    or an exporter that reports a serial-derived id twice), the answer is deterministic: the
    node whose physical row is active, then the most recently seen, then primary-key order;
    the other places are listed in ``also_seen_on`` so nothing is hidden.
    """
    table = inv.gpus
    rows = conn.execute(
        sa.select(table).where(table.c.uuid == uuid).order_by(*GPU_KEY)
    ).mappings().all()
    rows = [r for r in rows if scope.allows_cluster(r["cluster"])]
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
    ordered.sort(key=lambda item: physical_of(item[1])["state"] != inv.ACTIVE)
    chosen = ordered[0][1]
    physical = next((r for r in chosen if r["slice_key"] == ""), None)
    others = []
    for (cluster, node), group in ordered[1:]:
        first = physical_of(group)
        others.append({"cluster": cluster, "node": node, "state": first["state"],
                       "last_seen": first["last_seen"]})
    return {
        "gpu": inv.gpu_item(physical) if physical is not None else None,
        "slices": [inv.gpu_item(r) for r in chosen if r["slice_key"] != ""],
        "also_seen_on": others,
    }


def gpu_counts(conn: Connection) -> list[tuple[str, str, int]]:
    """Physical GPUs by (cluster, state), every known state present for every cluster."""
    table = inv.gpus
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


def scoped_cluster(params: Params, scope: Scope) -> str | None:
    """The ``cluster`` filter, refused (403) when it names a cluster outside the scope."""
    cluster = params.text("cluster")
    if cluster is not None and not scope.allows_cluster(cluster):
        raise ApiError(403, "cluster outside your scope")
    return cluster


def clusters(query: Query, engine: Engine, *, scope: Scope) -> Response:
    params = Params(query, ["cluster", "limit", "continue"])
    cluster = scoped_cluster(params, scope)
    with engine.connect() as conn:
        items = [c for c in inv.list_clusters(conn, cluster) if scope.allows_cluster(c["cluster"])]
    return 200, page_items(items, text_key("cluster"), params, "c1", 1)


def nodes(query: Query, engine: Engine, *, scope: Scope) -> Response:
    params = Params(query, ["cluster", "limit", "continue"])
    cluster = scoped_cluster(params, scope)
    with engine.connect() as conn:
        items = [n for n in inv.list_nodes(conn, cluster) if scope.allows_cluster(n["cluster"])]
    return 200, page_items(items, text_key("cluster", "node"), params, "n1", 2)


def gpus(query: Query, engine: Engine, *, scope: Scope) -> Response:
    params = Params(query, ["cluster", "node", "state", "vendor", "health", "limit",
                            "continue"])
    token = params.text("continue")
    after = decode_token(token) if token is not None else None
    filters = {
        "cluster": scoped_cluster(params, scope),
        "node": params.text("node"),
        "state": params.choice("state", STATES),
        "vendor": params.choice("vendor", VENDORS),
        "health": params.choice("health", HEALTH_LEVELS),
    }
    limit = params.integer("limit", DEFAULT_LIMIT, MAX_LIMIT)
    with engine.connect() as conn:
        items, last = page_gpus(conn, limit=limit, after=after, within=scope.clusters,
                                **filters)
    return 200, _listing(items, encode_token(last) if last else None)


def gpu(query: Query, engine: Engine, uuid: str, *, scope: Scope) -> Response:
    Params(query, [])
    if not uuid or not PRINTABLE.fullmatch(uuid):
        raise ApiError(404, "unknown GPU")
    with engine.connect() as conn:
        found = gpu_detail(conn, uuid, scope)
    if found is None:  # outside the scope reads like unknown: no hint that it exists
        raise ApiError(404, f"unknown GPU {uuid[:128]!r}")
    return 200, found


def allocations(query: Query, engine: Engine, *, scope: Scope) -> Response:
    """Who uses which GPU. Another team's allocation on a visible GPU stays, as "other"."""
    params = Params(query, ["cluster", "namespace", "limit", "continue"])
    cluster = scoped_cluster(params, scope)
    namespace = params.text("namespace")
    if namespace is not None and not scope.allows_namespace(namespace):
        raise ApiError(403, "namespace outside your scope")
    with engine.connect() as conn:
        rows = inv.list_allocations(conn, cluster)
    items = [r for r in rows if scope.allows_cluster(r["cluster"])
             and (namespace is None or r["namespace"] == namespace)]

    def key(row: Mapping[str, Any]) -> tuple[str, ...]:
        # Unique per allocation, yet a continue token (readable base64) must not carry
        # another team's names: theirs are a keyed hash, stable for this process.
        ident = f"{row['namespace']}/{row['pod']}/{row['container'] or ''}"
        if not scope.allows_namespace(row["namespace"]):
            ident = "~" + hmac.new(_PAGE_KEY, ident.encode(), hashlib.sha256).hexdigest()[:32]
        return (row["cluster"], row["node"], row["uuid"], row["mig_profile"] or "", ident)

    return 200, page_items(items, key, params, "a1", 5, present=scope.mask_allocation)


def sync_runs(query: Query, engine: Engine, *, scope: Scope) -> Response:
    limit = Params(query, ["limit"]).integer("limit", DEFAULT_RUNS, MAX_RUNS)
    if not scope.fleet_counts:
        raise ApiError(403, "fleet-wide figures are outside your scope")
    with engine.connect() as conn:
        runs = inv.list_sync_runs(conn, limit)
    return 200, _listing([{**r, "error": public_error(r.get("error"))} for r in runs])


def public_error(text: str | None) -> str | None:
    """An error as callers may read it: no URL (the hub's address), no secret, one short line.
    The full text stays in the log and the database."""
    if not text:
        return text
    if text.startswith(DB_UNAVAILABLE):  # the driver's line names host, port and user
        return f"{DB_UNAVAILABLE} (details in the service log)"
    line = URL.sub("<url>", text.splitlines()[0])
    return line[:200]


# -- usage, idle, capacity, events, history (issue 12) ---------------------------------------
def _period(params: Params) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) from ``since`` (a duration, default 24h) or ``from``/``until`` (ISO)."""
    from hub.common import parse_duration

    since, from_, until = params.text("since"), params.text("from"), params.text("until")
    if since is not None and (from_ or until):
        raise ApiError(400, "since and from/until exclude each other")
    now = inv.now_utc()

    def when(name: str, text: str) -> dt.datetime:
        try:
            value = dt.datetime.fromisoformat(text)
        except ValueError:
            raise ApiError(400, f"{name} {text!r} is not an ISO-8601 time") from None
        return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value

    if from_ or until:
        start = when("from", from_) if from_ else dt.datetime.min
        end = when("until", until) if until else now
        if end <= start:
            raise ApiError(400, "until must be after from")
        return start, end
    try:
        seconds = parse_duration(since or "24h")
    except ValueError as exc:
        raise ApiError(400, f"since: {exc}") from None
    return now - dt.timedelta(seconds=seconds), now + dt.timedelta(seconds=1)


def _by(params: Params, choices: Sequence[str], default: str) -> list[str]:
    """``by=cluster,model``: one or more group names, comma-separated."""
    names = (params.text("by") or default).split(",")
    for name in names:
        if name not in choices:
            raise ApiError(400, f"unknown by {name!r}: choose from {', '.join(choices)}")
    return names


def _percent(params: Params, name: str, default: float) -> float:
    text = params.text(name)
    try:
        value = float(text) if text is not None else default
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100:
        raise ApiError(400, f"{name} must be a number from 0 to 100, not {text!r}")
    return value


def usage(query: Query, engine: Engine, *, scope: Scope, prices: Any = None) -> Response:
    """A scoped caller's GPU-hours count only its clusters' and namespaces' ledger rows.
    ``prices`` (hub.usage.Prices, `serve --prices`) adds each group's cost."""
    from hub import usage as answers

    params = Params(query, ["since", "from", "until", "by", "idle_threshold"])
    start, end = _period(params)
    by = _by(params, list(answers.GROUPS), "namespace")
    threshold = _percent(params, "idle_threshold", 5.0)
    with engine.connect() as conn:
        return 200, _listing(answers.usage_summary(
            conn, start, end, by, threshold, clusters=scope.clusters,
            namespaces=scope.namespaces, prices=prices))


def idle(query: Query, engine: Engine, *, scope: Scope) -> Response:
    from hub import usage as answers
    from hub.common import parse_duration

    params = Params(query, ["since", "from", "until", "threshold", "for"])
    start, end = _period(params)
    threshold = _percent(params, "threshold", 5.0)
    try:
        for_s = parse_duration(params.text("for") or "2h")
    except ValueError as exc:
        raise ApiError(400, f"for: {exc}") from None
    with engine.connect() as conn:
        return 200, _listing(answers.idle_allocated(
            conn, start, end, threshold=threshold, for_seconds=for_s,
            clusters=scope.clusters, namespaces=scope.namespaces))


def capacity(query: Query, engine: Engine, *, scope: Scope) -> Response:
    """Fleet-wide GPU-equivalents (counts only, no names) unless the scope hides fleet counts,
    in which case only its clusters are counted."""
    from hub import usage as answers

    params = Params(query, ["by"])
    by = _by(params, list(answers.CAPACITY_GROUPS), "model")
    clusters = None if scope.fleet_counts else scope.clusters
    with engine.connect() as conn:
        return 200, _listing(answers.capacity(conn, by, clusters=clusters))


def events(query: Query, engine: Engine, *, scope: Scope) -> Response:
    """Events newest first, paged by a keyset on the event id (written in time order); a
    scoped caller sees only its clusters' events."""
    from hub.common import parse_duration

    params = Params(query, ["since", "cluster", "uuid", "type", "limit", "continue"])
    table = inv.events
    stmt = sa.select(table)
    since = params.text("since")
    if since is not None:
        try:
            cut = inv.now_utc() - dt.timedelta(seconds=parse_duration(since))
        except ValueError as exc:
            raise ApiError(400, f"since: {exc}") from None
        stmt = stmt.where(table.c.at >= cut)
    cluster = scoped_cluster(params, scope)
    if cluster is not None:
        stmt = stmt.where(table.c.cluster == cluster)
    if scope.clusters is not None:
        stmt = stmt.where(table.c.cluster.in_(sorted(scope.clusters)))
    uuid = params.text("uuid")
    if uuid is not None:
        stmt = stmt.where(table.c.uuid == uuid)
    type_ = params.choice("type", inv.EVENT_TYPES)
    if type_ is not None:
        stmt = stmt.where(table.c.type == type_)
    token = params.text("continue")
    if token is not None:
        last = decode_token(token)
        if not last[0].isdigit():
            raise ApiError(400, "invalid continue token (pass the 'continue' value of the "
                                "previous page unchanged)")
        stmt = stmt.where(table.c.id < int(last[0]))
    limit = params.integer("limit", DEFAULT_LIMIT, MAX_LIMIT)
    with engine.connect() as conn:
        rows = conn.execute(stmt.order_by(table.c.id.desc()).limit(limit + 1)).mappings().all()
    more = len(rows) > limit
    rows = rows[:limit]
    next_token = encode_token([str(rows[-1]["id"]), "", "", ""]) if more else None
    return 200, _listing([inv.event_item(r) for r in rows], next_token)


def gpu_history(query: Query, engine: Engine, uuid: str, *, scope: Scope) -> Response:
    """A GPU outside the caller's clusters reads as unknown (404), as /gpus/{uuid} does;
    inside, other teams' pods are "other" and only the scope's clusters' events show."""
    from hub import usage as answers

    Params(query, [])
    with engine.connect() as conn:
        found = answers.gpu_history(conn, uuid)
    if found is None or not scope.allows_cluster(found["gpu"].get("cluster")):
        raise ApiError(404, f"unknown GPU {uuid!r}")
    if scope.unrestricted:
        return 200, found
    return 200, {
        **found,
        "slices": [s for s in found["slices"] if scope.allows_cluster(s.get("cluster"))],
        "events": [e for e in found["events"] if scope.allows_cluster(e.get("cluster"))],
        "allocations": [scope.mask_allocation(a) for a in found["allocations"]
                        if scope.allows_cluster(a.get("cluster"))],
        "usage": [scope.mask_allocation(u) for u in found["usage"]
                  if scope.allows_cluster(u.get("cluster"))],
    }
