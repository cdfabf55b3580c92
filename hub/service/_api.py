"""The hub service's API handlers: a read-only JSON API over the inventory.

Each handler is a plain function whose parameters say what it takes: typed query parameters,
the read-only ``engine`` and the caller's ``scope``, all from ``hub.service._deps``. It
returns plain data shaped like its response model (``hub.service._models``), which its
router (``hub.service._routers``) checks and encodes; the hot routes are declared ``keep``
there, and the one request pipeline (``hub.service._routing``) then encodes an answer once
and keeps it per scope until the inventory changes, so a handler never says whether it is
cached. Either way it passes the one scope step (``hub.service._confine``) on the way out.

Items carry the same field names as ``gpufleet inventory ... -o json`` because they come from
the same columns (``hub.inventory``'s lists and ``GPU_COLUMNS``). The GPU list is paged with a
keyset on the table's primary key, in SQL: a page costs the same on the first and the
thousandth page, and a GPU added or removed between two pages neither repeats nor shifts the
others. Nothing here writes: the engine refuses writes at the connection level.

No response carries a secret: the database URL, the hub token and its URL never appear.

Scopes: a handler narrows its reads to the caller's ``scope`` (in SQL where it pages, so
pages stay exact) and refuses a ``cluster`` filter outside it (403); whatever it returns is
confined again before it leaves. Whether a scoped caller reaches a handler at all is its
route's declared visibility (hub/service/_routing.py), never its parameters.
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
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

from fastapi import Depends, Query, Request

from hub import inventory as inv
from hub import usage as answers
from hub.common import InputError, json_number
from hub.inventory import gpu_detail, page_gpus
from hub.service._auth import Scope
from hub.service._deps import (
    DEFAULT_LIMIT,
    MAX_TOKEN,
    TEXT_PATTERN,
    CallerScope,
    ClusterParam,
    ContinueParam,
    FromParam,
    LimitParam,
    ReadEngine,
    SinceParam,
    UntilParam,
    UuidPath,
    idle_rule_of,
    prices_of,
)
from hub.service._deps import text_param as _text
from hub.service._errors import ApiError, public_error
from hub.service._models import HEALTH_LEVELS, STATES, VENDORS

log = logging.getLogger("gpufleet.api")

DEFAULT_RUNS = 20
MAX_RUNS = 1000
#: the longest look-back a client may ask for (since=...): longer is a mistake, not a wish
MAX_SINCE = 100 * 365 * 86400.0
#: Prometheus text format 0.0.4: what every Prometheus (2.42 included) parses.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_PAGE_KEY = secrets.token_bytes(32)
#: an event id: digits that fit PostgreSQL's bigint
EVENT_ID = re.compile(r"[0-9]{1,18}")


# -- continue tokens and paging ------------------------------------------------------------------
def encode_token(key: Sequence[Any], kind: str = "g1") -> str:
    """Opaque continue token: the key of the last item sent, base64url of JSON. ``kind`` names
    the listing, so one endpoint's token is refused by another."""
    raw = json.dumps([kind, *key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str, kind: str = "g1", size: int = 4) -> tuple[Any, ...]:
    """A token of ours, or a 400: too long, not base64 of a flat JSON list of strings (a
    deeply nested one is refused before the JSON parser recurses into it)."""
    data: Any = None
    if len(token) <= MAX_TOKEN:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            if raw.count(b"[") <= 1:
                data = json.loads(raw)
        except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):
            data = None
    if (not isinstance(data, list) or len(data) != size + 1 or data[0] != kind
            or not all(isinstance(v, str) and "\x00" not in v for v in data[1:])):
        # a NUL is refused here, not by PostgreSQL (a 503 there, a 200 on SQLite)
        raise ApiError(400, "invalid continue token (pass the 'continue' value of the "
                            "previous page unchanged)")
    return tuple(data[1:])


def page_items(items: list[dict[str, Any]], key: Callable[[Mapping[str, Any]], tuple[str, ...]],
               token: str | None, limit: int, kind: str, size: int,
               present: Callable[[dict[str, Any]], dict[str, Any]] | None = None
               ) -> dict[str, Any]:
    """Keyset paging of a short list already read whole (clusters, nodes, findings): the same
    ``limit``/``continue`` contract as /gpus, so a client pages every listing alike.

    ``key`` must be unique per item; ``present`` turns a page's rows into what is sent
    (masking), after the keys are taken, so masked rows that look alike still page right.
    """
    ordered = sorted(items, key=key)
    if token:
        after = decode_token(token, kind, size)
        ordered = [i for i in ordered if key(i) > after]
    page = ordered[:limit]
    more = len(ordered) > limit
    shown = [present(i) for i in page] if present is not None else page
    return _listing(shown, encode_token(key(page[-1]), kind) if more else None)


def text_key(*names: str) -> Callable[[Mapping[str, Any]], tuple[str, ...]]:
    return lambda item: tuple(str(item.get(n) or "") for n in names)


# -- handlers -----------------------------------------------------------------------------------
def _listing(items: list[Any], token: str | None = None) -> dict[str, Any]:
    return {"items": items, "continue": token}


def scoped_cluster(cluster: str | None, scope: Scope) -> str | None:
    """The ``cluster`` filter ('' is none), refused (403) when it names a cluster outside the
    scope."""
    if cluster and not scope.allows_cluster(cluster):
        raise ApiError(403, "cluster outside your scope")
    return cluster or None


def clusters(request: Request, engine: ReadEngine, scope: CallerScope,
             cluster: ClusterParam = None, limit: LimitParam = DEFAULT_LIMIT,
             continue_: ContinueParam = None) -> dict[str, Any]:
    """Clusters: active nodes and physical GPUs, state, last sample; paged."""
    cluster = scoped_cluster(cluster, scope)
    with engine.connect() as conn:  # a count over every GPU: shared by every page
        rows = request.app.state.memo.get(conn, ("clusters", cluster),
                                          lambda: inv.list_clusters(conn, cluster))
    items = [c for c in rows if scope.allows_cluster(c["cluster"])]
    return page_items(items, text_key("cluster"), continue_, limit, "c1", 1)


def nodes(request: Request, engine: ReadEngine, scope: CallerScope,
          cluster: ClusterParam = None, limit: LimitParam = DEFAULT_LIMIT,
          continue_: ContinueParam = None) -> dict[str, Any]:
    """Nodes: active physical GPUs, state, last sample; paged."""
    cluster = scoped_cluster(cluster, scope)
    with engine.connect() as conn:  # a count over every GPU: shared by every page
        rows = request.app.state.memo.get(conn, ("nodes", cluster),
                                          lambda: inv.list_nodes(conn, cluster))
    items = [n for n in rows if scope.allows_cluster(n["cluster"])]
    return page_items(items, text_key("cluster", "node"), continue_, limit, "n1", 2)


def gpus(engine: ReadEngine, scope: CallerScope, cluster: ClusterParam = None,
         node: Annotated[str | None, _text("Only this node.")] = None,
         state: Annotated[Literal[STATES] | None,  # type: ignore[valid-type]
                          Query(description="Only GPUs in this state.")] = None,
         vendor: Annotated[Literal[VENDORS] | None,  # type: ignore[valid-type]
                           Query(description="Only this vendor.")] = None,
         health: Annotated[Literal[HEALTH_LEVELS] | None,  # type: ignore[valid-type]
                           Query(description="Only GPUs of this health (XID, ECC, row "
                                             "remapping).")] = None,
         limit: LimitParam = DEFAULT_LIMIT, continue_: ContinueParam = None
         ) -> dict[str, Any]:
    """GPUs, one item per physical GPU and one per MIG slice, in (cluster, node, uuid, slice)
    order; paged."""
    after = decode_token(continue_) if continue_ else None
    cluster = scoped_cluster(cluster, scope)
    with engine.connect() as conn:
        items, last = page_gpus(conn, limit=limit, after=after, within=scope.clusters,
                                cluster=cluster, node=node or None, state=state,
                                vendor=vendor, health=health)
    return _listing(items, encode_token(last) if last else None)


def gpu(engine: ReadEngine, scope: CallerScope, uuid: UuidPath) -> dict[str, Any]:
    """One GPU (the physical device) with its MIG slices. A uuid seen on several nodes
    answers the active, most recently seen one and lists the others in also_seen_on."""
    with engine.connect() as conn:
        found = gpu_detail(conn, uuid, clusters=scope.clusters) if uuid else None
    if found is None:  # outside the scope reads like unknown: no hint that it exists
        raise ApiError(404, f"unknown GPU {uuid[:128]!r}")
    return found


def allocations(engine: ReadEngine, scope: CallerScope, cluster: ClusterParam = None,
                namespace: Annotated[str | None, _text("Only this namespace.")] = None,
                limit: LimitParam = DEFAULT_LIMIT, continue_: ContinueParam = None
                ) -> dict[str, Any]:
    """Which pods use which GPU; a namespace outside the caller's scope appears as 'other'
    without names; paged."""
    cluster = scoped_cluster(cluster, scope)
    namespace = namespace or None
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

    return page_items(items, key, continue_, limit, "a1", 5, present=scope.mask_allocation)


def sync_runs(engine: ReadEngine, scope: CallerScope,
              limit: Annotated[int, Query(ge=1, le=MAX_RUNS,
                                          description=f"Number of runs (1-{MAX_RUNS}).")
                               ] = DEFAULT_RUNS) -> dict[str, Any]:
    """Sync runs, latest first."""
    if not scope.fleet_counts:
        raise ApiError(403, "fleet-wide figures are outside your scope")
    with engine.connect() as conn:
        runs = inv.list_sync_runs(conn, limit)
    return _listing([{**r, "error": public_error(r.get("error"))} for r in runs])


def visible_findings(items: Sequence[Mapping[str, Any]], scope: Scope, *,
                     severity: str | None = None,
                     cluster: str | None = None) -> list[Mapping[str, Any]]:
    """The findings ``scope`` may read: /api/v1/findings and the live page (its count badge,
    its "GPUs with findings", its list) all go through here, so they cannot disagree.

    A finding without a cluster is about the whole fleet: only for whole-fleet callers. A
    finding about another team's pod names it in words: not for this caller at all."""
    return [f for f in items
            if (severity is None or f.get("severity") == severity)
            and (cluster is None or f.get("cluster") == cluster)
            and (scope.clusters is None or scope.allows_cluster(f.get("cluster")))
            and (f.get("namespace") is None or scope.allows_namespace(f.get("namespace")))]


# -- usage, idle, capacity, events, history (issue 12) ---------------------------------------
def look_back(since: str, now: dt.datetime) -> dt.datetime:
    """``now - since`` for a DURATION; a 400 for one that is not, or longer than a century
    (before the year 1 a datetime overflows, and no ledger is that old)."""
    return now - dt.timedelta(seconds=_duration("since", since))


def _duration(name: str, text: str) -> float:
    """A DURATION query parameter in seconds; a 400 naming it for one that is not, or one
    longer than a century."""
    from hub.common import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise ApiError(400, f"{name}: {exc}") from None
    if seconds > MAX_SINCE:
        raise ApiError(400, f"{name}: {text[:32]!r} is longer than {MAX_SINCE / 86400:.0f}d")
    return seconds


def _period(since: str | None, from_: str | None, until: str | None
            ) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) from ``since`` (a duration, default 24h) or ``from``/``until`` (ISO)."""
    since, from_, until = since or None, from_ or None, until or None
    if since is not None and (from_ or until):
        raise ApiError(400, "since and from/until exclude each other")
    now = inv.now_utc()

    def when(name: str, text: str) -> dt.datetime:
        try:
            value = dt.datetime.fromisoformat(text)
            return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value
        except (ValueError, OverflowError):
            raise ApiError(400, f"{name} {text[:64]!r} is not an ISO-8601 time") from None

    if from_ or until:
        start = when("from", from_) if from_ else dt.datetime.min
        end = when("until", until) if until else now
        if end <= start:
            raise ApiError(400, "until must be after from")
        return start, end
    return look_back(since or "24h", now), now + dt.timedelta(seconds=1)


def _by(by: str | None, choices: Sequence[str], default: str) -> list[str]:
    """``by=cluster,model``: one or more group names, comma-separated."""
    names = (by or default).split(",")
    for name in names:
        if name not in choices:
            raise ApiError(400, f"unknown by {name[:64]!r}: choose from {', '.join(choices)}")
    return names


def _usage_groups() -> list[str]:
    return list(answers.GROUPS)


def _capacity_groups() -> list[str]:
    return list(answers.CAPACITY_GROUPS)


def usage(engine: ReadEngine, scope: CallerScope, since: SinceParam = None,
          from_: FromParam = None, until: UntilParam = None,
          by: Annotated[str | None, _text(
              "Group by, comma-separated: cluster, namespace, model, node, gpu (default "
              "namespace).", max_length=128)] = None,
          idle_threshold: Annotated[float | None, Query(
              ge=0, le=100, allow_inf_nan=False, description="Utilisation % under which an "
              "allocated bucket is idle (default: the service's --idle-threshold, 5).")
          ] = None,
          idle_for: Annotated[str | None, Query(
              pattern=TEXT_PATTERN, max_length=64,
              description="Allocated time counts as idle only in runs at least this long "
              "(default: the service's --idle-for, 2h); what /api/v1/idle?for= lists.")
          ] = None,
          prices: Annotated[Any, Depends(prices_of)] = None,
          rule: Annotated[Any, Depends(idle_rule_of)] = None) -> dict[str, Any]:
    """GPU-hours per group from the usage ledger (see docs/usage.md for each figure). A
    scoped caller's GPU-hours count only its clusters' and namespaces' ledger rows. With
    `serve --prices`, each group also has cost and unpriced_gpu_hours (showback)."""
    start, end = _period(since, from_, until)
    groups = _by(by, _usage_groups(), "namespace")
    for_s = _idle_for("idle_for", idle_for, rule)
    with engine.connect() as conn:
        return _listing(answers.usage_summary(
            conn, start, end, groups,
            rule.threshold if idle_threshold is None else idle_threshold, idle_for=for_s,
            clusters=scope.clusters, namespaces=scope.namespaces, prices=prices))


def _idle_for(name: str, text: str | None, rule: Any) -> float:
    """An idle run's least length from the query (a DURATION), else the service's rule."""
    return float(rule.for_seconds) if text is None else _duration(name, text)


def idle(engine: ReadEngine, scope: CallerScope, since: SinceParam = None,
         from_: FromParam = None, until: UntilParam = None,
         threshold: Annotated[float | None, Query(
             ge=0, le=100, allow_inf_nan=False, description="Utilisation % (default 5).")
         ] = None,
         for_: Annotated[str | None, Query(
             alias="for", pattern=TEXT_PATTERN, max_length=64,
             description="Idle at least this long in a row (default: the service's "
             "--idle-for, 2h).")] = None,
         rule: Annotated[Any, Depends(idle_rule_of)] = None) -> dict[str, Any]:
    """Allocated GPUs and slices idle for at least 'for' in a row, most GPU-hours wasted
    first."""
    start, end = _period(since, from_, until)
    for_s = _idle_for("for", for_, rule)
    with engine.connect() as conn:
        return _listing(answers.idle_allocated(
            conn, start, end, threshold=rule.threshold if threshold is None else threshold,
            for_seconds=for_s, clusters=scope.clusters, namespaces=scope.namespaces))


def capacity(request: Request, engine: ReadEngine, scope: CallerScope,
             by: Annotated[str | None, _text("Group by, comma-separated: model, cluster, node "
                                             "(default model).", max_length=128)] = None,
             fits: Annotated[int | None, Query(
                 ge=1, le=answers.MAX_FITS,
                 description="Where a job of this many GPUs (or slices of 'mig') fits now "
                 "on one node, per cluster: fits, fragmented, short or stale.")] = None,
             model: Annotated[str | None, _text(
                 "With fits: only GPUs of this model or family (e.g. H100).",
                 max_length=128)] = None,
             mig: Annotated[str | None, _text(
                 "With fits: slices of this MIG profile (e.g. 3g.40gb) instead of whole "
                 "GPUs.", max_length=64)] = None,
             rule: Annotated[Any, Depends(idle_rule_of)] = None) -> dict[str, Any]:
    """GPU-equivalents per group now: total, active, stale, failed, allocated, cordoned,
    free, reclaimable (docs/usage.md). With ``fits``: per cluster, whether a job of that
    many GPUs fits on one node now (the nodes that can take it), as `gpufleet capacity
    --fits` answers. A scoped caller's groups and clusters are its own; ``fleet`` totals
    the whole fleet in numbers without names when its scope allows fleet counts."""
    groups = _by(by, _capacity_groups(), "model")
    try:
        answers.check_fits(fits, mig, model)
    except InputError as exc:
        raise ApiError(400, str(exc).replace("--", "")) from None
    memo = request.app.state.memo
    rule = rule or answers.IdleRule()
    idle = {"idle_threshold": rule.threshold, "idle_for": rule.for_seconds}
    within = None if scope.clusters is None else tuple(sorted(scope.clusters))
    now = inv.now_utc()
    with engine.connect() as conn:
        if fits is not None:
            found = answers.read_fleet(conn, clusters=scope.clusters, now=now, **idle)
            return {**_listing(answers.fits(found, fits, model=model, mig=mig)), "fleet": None}
        items = memo.get(conn, ("capacity", tuple(groups), within),
                         lambda: answers.capacity(conn, groups, clusters=scope.clusters,
                                                  now=now, **idle))
        # the items of a whole-fleet caller are the fleet already: one read, not two
        fleet_rows = (items if scope.clusters is None else memo.get(
            conn, ("capacity", ("model",), None),
            lambda: answers.capacity(conn, ["model"], now=now, **idle))
            if scope.fleet_counts else None)
    fleet = None if fleet_rows is None or not scope.fleet_counts else {  # no float noise
        k: json_number(sum(r[k] or 0 for r in fleet_rows))
        for k in answers.CAPACITY_FIGURES}
    return {**_listing(items), "fleet": fleet}


def placement_scores(engine: ReadEngine, scope: CallerScope,
                     full_at: Annotated[float | None, Query(
                         ge=1, le=1_000_000, allow_inf_nan=False,
                         description="Free GPUs that score 100 (default 64).")] = None,
                     rule: Annotated[Any, Depends(idle_rule_of)] = None) -> dict[str, Any]:
    """The ACM placement scores per cluster as `gpufleet placement scores` renders them
    (the AddOnPlacementScore's status), for the caller's clusters."""
    rule = rule or answers.IdleRule()
    with engine.connect() as conn:
        objects = answers.placement_scores(
            conn, now=inv.now_utc(), full_at=full_at or answers.FULL_AT,
            clusters=scope.clusters, idle_threshold=rule.threshold,
            idle_for=rule.for_seconds)
    return _listing([{"cluster": o["metadata"]["namespace"], "name": o["metadata"]["name"],
                      "scores": o["status"]["scores"],
                      "valid_until": o["status"]["validUntil"]} for o in objects])


def events(engine: ReadEngine, scope: CallerScope,
           since: Annotated[str | None, _text("Only events of the last DURATION (e.g. 7d).",
                                              max_length=64)] = None,
           cluster: ClusterParam = None,
           uuid: Annotated[str | None, _text("Only this GPU.")] = None,
           type: Annotated[Literal[tuple(inv.EVENT_TYPES)] | None,  # type: ignore[valid-type]
                           Query(description="Only this type.")] = None,
           limit: LimitParam = DEFAULT_LIMIT, continue_: ContinueParam = None
           ) -> dict[str, Any]:
    """Inventory events, newest first; paged by a keyset on the event id (written in time
    order); a scoped caller sees only its clusters' events."""
    cluster = scoped_cluster(cluster, scope)
    before = None
    if continue_:
        last = decode_token(continue_)
        if not EVENT_ID.fullmatch(last[0]) or any(last[1:]):
            raise ApiError(400, "invalid continue token (pass the 'continue' value of the "
                                "previous page unchanged)")
        before = int(last[0])
    with engine.connect() as conn:
        items, last_id = inv.page_events(
            conn, since=look_back(since, inv.now_utc()) if since else None, cluster=cluster,
            clusters=scope.clusters, uuid=uuid or None, type=type, limit=limit, before=before)
    next_token = encode_token([str(last_id), "", "", ""]) if last_id is not None else None
    return _listing(items, next_token)


def gpu_history(engine: ReadEngine, scope: CallerScope, uuid: UuidPath) -> dict[str, Any]:
    """One GPU's story: where it is, its MIG slices, events, allocations and recent usage
    rows. A GPU outside the caller's clusters reads as unknown (404), as /gpus/{uuid} does."""
    with engine.connect() as conn:
        found = answers.gpu_history(conn, uuid) if uuid else None
    if found is None or not scope.allows_cluster(found["gpu"].get("cluster")):
        raise ApiError(404, f"unknown GPU {uuid[:128]!r}")
    return found


# -- a GPU's life: fleet states and lemons (issue 38) --------------------------------------------
def states(engine: ReadEngine, scope: CallerScope,
           by: Annotated[str | None, _text("Group by, comma-separated: cluster, model, "
                                           "namespace (default: the whole fleet).",
                                           max_length=128)] = None,
           rule: Annotated[Any, Depends(idle_rule_of)] = None) -> dict[str, Any]:
    """Physical GPUs delivered, healthy, reserved and active (reserved and not idle by the
    service's idle rule), with Healthy, Reserved ⊆ Delivered and Active ⊆ Reserved in every
    group. A namespace-scoped caller counts the GPUs its namespaces reserve."""
    keys = tuple(_by(by, inv.STATE_BY, "")) if by else ()
    if len(set(keys)) != len(keys):
        raise ApiError(400, "by: each group once")
    with engine.connect() as conn:
        idle = answers.idle_now(conn, inv.now_utc(), threshold=rule.threshold,
                                for_seconds=rule.for_seconds, clusters=scope.clusters)
        return _listing(inv.fleet_states(conn, by=keys, idle=idle, clusters=scope.clusters,
                                         namespaces=scope.namespaces))


def lemons(engine: ReadEngine, scope: CallerScope,
           since: Annotated[str | None, _text("Look back this long (a DURATION, default "
                                              "90d).", max_length=64)] = None,
           by: Annotated[Literal["gpu", "node", "slot", "model"], Query(
               description="Rank GPUs, nodes, slots or models (default gpu).")] = "gpu"
           ) -> dict[str, Any]:
    """GPUs (nodes, slots, models) by failures per GPU-month in service, with the evidence
    of each row; a namespace-scoped caller sees only the GPUs its namespaces hold or held,
    and another team's namespace in the evidence as 'other'."""
    seconds = _duration("since", since) if since else inv.LEMON_SINCE_S
    if seconds <= 0:
        raise ApiError(400, "since must be greater than 0")
    with engine.connect() as conn:
        uuids = (inv.reserved_by(conn, scope.namespaces)
                 if scope.namespaces is not None else None)
        rows = inv.lemons(conn, since=seconds, by=by, now=inv.now_utc(),
                          clusters=scope.clusters, uuids=uuids)
    if scope.namespaces is not None:
        rows = inv.mask_evidence(rows, scope.namespaces)
    return _listing(rows)
