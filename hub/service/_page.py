"""The live page of ``gpufleet serve`` at ``/``: the fleet at a glance, for people.

Clusters and their freshness, failed and degraded GPUs, stale GPUs (one line per cluster),
GPUs named by findings, the findings, charts of usage, utilisation, idle GPUs and capacity,
and a search by GPU UUID, node or namespace.

Read-only and server-rendered from the report's templates (templates/report: one layout, one
set of tables), with no script and no external asset, so it works offline and behind the
strictest Content-Security-Policy. Every number on it comes from the same functions the JSON
API answers with (``hub.inventory``'s lists, :func:`~hub.inventory.page_gpus`, the
scheduler's findings), so the page and the API cannot disagree, and whatever limits what a
caller may see in the API limits the page too.

The page is a list of :class:`Section` s, each made by a plain function of the data. Sections
that depend on parts not every installation has (usage, idle GPUs, capacity) are passed in as
more such functions (``extra``), each declaring who it is for (:func:`section_source`, as a
route declares its visibility), and a function answering None leaves its section out.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from starlette.responses import HTMLResponse

from hub import common, usage
from hub import inventory as inv
from hub.common import html_environment, human_duration, iso
from hub.inventory import page_gpus
from hub.service._api import visible_findings
from hub.service._auth import FULL, Scope
from hub.service._errors import ApiError

#: rows per section; the section links to the API for the rest
PAGE_ROWS = 200
MAX_SEARCH = 253  # a Kubernetes name's length limit: no UUID, node or namespace is longer
#: nothing but this page's own inline style: no script, no image, no font, no other origin
PAGE_CSP = ("default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
            "base-uri 'none'; frame-ancestors 'none'")
API_LINKS = ("/api/v1/clusters", "/api/v1/nodes", "/api/v1/gpus", "/api/v1/findings",
             "/api/v1/sync-runs", "/api/v1/openapi.json", "/healthz", "/metrics")
SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}
UNHEALTHY = [level for level in ("failed", "degraded") if level in inv.HEALTH_LEVELS]
Finding = Mapping[str, Any]
Query = Mapping[str, list[str]]
Source = TypeVar("Source", bound=Callable[..., Any])


@dataclass
class Section:
    """One table of the page: ``columns`` are (key, heading); ``api`` the JSON behind it;
    ``total`` the number of rows the API has (more than shown when it exceeds PAGE_ROWS)."""

    id: str
    title: str
    columns: list[tuple[str, str]]
    rows: list[dict[str, Any]]
    empty: str
    api: str | None = None
    total: int | None = None
    #: an inline-SVG chart (hub.common's chart functions, HTML) shown above the rows; drawn
    #: from data already limited to the caller's scope, so it is passed through as it is
    figure: str | None = None

    @property
    def more(self) -> int:
        return max(0, (self.total or 0) - len(self.rows))


#: ``(conn)``, or ``(conn, *, scope)`` for a source declared ``scoped`` (:func:`section_source`)
SectionSource = Callable[..., Section | None]
#: Who a section of the page is for, declared as a route's visibility is (never inferred
#: from its parameters): ``scoped``, any caller, the source called with the caller's scope
#: and reading only what it covers (then confined like every answer); ``fleet``, whole-fleet
#: callers only, the section left off a scoped caller's page. ``fleet`` is the default, so a
#: section added without a thought shows no team what it has not learnt to filter (a chart
#: is drawn before the page is confined, and no confine step can redraw it).
SectionVisibility = Literal["scoped", "fleet"]
_VISIBILITY = "__gpufleet_section_visibility__"


def section_source(*, visibility: SectionVisibility) -> Callable[[Source], Source]:
    """Declare a page section source's visibility (a decorator)."""
    def declare(source: Source) -> Source:
        setattr(source, _VISIBILITY, visibility)
        return source
    return declare


def visibility_of(source: SectionSource) -> SectionVisibility:
    """A source's declared visibility (through ``functools.partial``); ``fleet`` if none."""
    while isinstance(source, functools.partial):
        source = source.func
    return getattr(source, _VISIBILITY, "fleet")


def scoped_section(section: Section, scope: Scope) -> Section:
    """A section as a scoped caller may see it: rows of other clusters gone, other teams'
    pods named "other" (the same rule as the API's allocations)."""
    if scope.unrestricted:
        return section
    rows = [scope.mask_allocation(r) if "namespace" in r else r for r in section.rows
            if "cluster" not in r or scope.allows_cluster(r.get("cluster"))]
    return Section(section.id, section.title, section.columns, rows, section.empty,
                   section.api, len(rows) if section.total is not None else None,
                   section.figure)


def _gpu_href(uuid: str) -> str:
    """The GPU's page (its history and usage, the JSON one click away)."""
    return "/gpus/" + quote(uuid, safe="")


def _age(now: dt.datetime, when: dt.datetime | None) -> str:
    return human_duration(None if when is None else max(0.0, (now - when).total_seconds()))


def clusters_section(conn: Connection, now: dt.datetime) -> Section:
    """Every cluster with its active nodes and GPUs and the age of its newest sample."""
    rows = [{**c, "age": _age(now, c["last_sample_at"]),
             "last_sample_at": iso(c["last_sample_at"]),
             "_href": "/clusters/" + quote(c["cluster"], safe="")}
            for c in inv.list_clusters(conn)]
    return Section("clusters", "Clusters", [
        ("cluster", "Cluster"), ("state", "State"), ("nodes", "Active nodes"),
        ("gpus", "Active GPUs"), ("last_sample_at", "Newest sample"), ("age", "Age"),
        ("naming", "dcgm naming"), ("seen_through", "Seen through"),
        ("cards", "Cards (node-exporter)")],
        rows, "No clusters in the inventory yet.", "/api/v1/clusters", len(rows))


GPU_COLUMNS = [("uuid", "GPU"), ("cluster", "Cluster"), ("node", "Node"),
               ("mig_profile", "MIG slice"), ("model", "Model"), ("state", "State"),
               ("last_sample_at", "Newest sample")]


def _gpu_row(gpu: Mapping[str, Any]) -> dict[str, Any]:
    return {**gpu, "last_sample_at": iso(gpu["last_sample_at"]), "_href": _gpu_href(gpu["uuid"])}


def stale_clusters_section(conn: Connection, *, scope: Scope = FULL) -> Section:
    """Stale GPUs collapsed to one line per cluster with how many, newest first by count:
    a switched-off cluster is one line (with a bar), not a page of GPU rows. The rows link
    to the cluster's stale GPUs in the API."""
    g = inv.gpus
    stmt = (sa.select(g.c.cluster, sa.func.count().label("stale_gpus"),
                      sa.func.count(sa.distinct(g.c.node)).label("nodes"),
                      sa.func.max(g.c.last_sample_at).label("last_sample_at"))
            .where(g.c.state == inv.STALE).group_by(g.c.cluster))
    if scope.clusters is not None:
        stmt = stmt.where(g.c.cluster.in_(sorted(scope.clusters)))
    states = {c["cluster"]: c["state"] for c in inv.list_clusters(conn)}
    rows = [{"cluster": r.cluster, "state": states.get(r.cluster), "stale_gpus": r.stale_gpus,
             "nodes": r.nodes, "last_sample_at": iso(r.last_sample_at),
             "_href": "/clusters/" + quote(r.cluster, safe="")}
            for r in sorted(conn.execute(stmt), key=lambda r: (-r.stale_gpus, r.cluster))]
    return Section("stale-clusters", "Stale GPUs by cluster", [
        ("cluster", "Cluster"), ("state", "Cluster state"), ("stale_gpus", "Stale GPUs"),
        ("nodes", "Nodes"), ("last_sample_at", "Newest sample")],
        rows[:PAGE_ROWS], "No stale GPU.", "/api/v1/gpus?state=stale", len(rows),
        _figure(common.stale_clusters_chart(rows[:PAGE_ROWS])) if rows else None)


HEALTH_COLUMNS = [("uuid", "GPU"), ("cluster", "Cluster"), ("node", "Node"),
                  ("mig_profile", "MIG slice"), ("model", "Model"), ("health", "Health"),
                  ("health_reasons", "Why"), ("state", "State")]


def health_section(conn: Connection, level: str) -> Section:
    """GPUs whose exporter reports them ``failed`` or ``degraded`` (XID, ECC, row remapping),
    as /api/v1/gpus?health=LEVEL pages them."""
    items, _ = page_gpus(conn, health=level, limit=PAGE_ROWS)
    total = conn.execute(sa.select(sa.func.count()).select_from(inv.gpus)
                         .where(inv.gpus.c.health == level)).scalar_one()
    return Section(f"{level}-gpus", f"{level.capitalize()} GPUs", HEALTH_COLUMNS,
                   [_gpu_row(g) for g in items], f"No {level} GPU.",
                   f"/api/v1/gpus?health={level}", total)


def findings_gpus_section(findings: Sequence[Finding]) -> Section:
    """GPUs named by a finding of the latest checks, worst first, one row per GPU."""
    by_gpu: dict[tuple[str, str, str], dict[str, Any]] = {}
    for f in findings:
        if not f.get("gpu"):
            continue
        key = (str(f.get("cluster") or ""), str(f.get("node") or ""), str(f["gpu"]))
        row = by_gpu.setdefault(key, {"uuid": key[2], "cluster": key[0], "node": key[1],
                                      "severity": f.get("severity", "error"), "checks": [],
                                      "_href": _gpu_href(key[2])})
        if SEVERITY_RANK.get(f.get("severity", ""), 9) < SEVERITY_RANK.get(row["severity"], 9):
            row["severity"] = f["severity"]
        if f.get("check") not in row["checks"]:
            row["checks"].append(f.get("check"))
    rows = sorted(by_gpu.values(), key=lambda r: (SEVERITY_RANK.get(r["severity"], 9),
                                                 r["cluster"], r["node"], r["uuid"]))
    for row in rows:
        row["checks"] = ", ".join(str(c) for c in row["checks"])
    return Section("gpus-with-findings", "GPUs with findings", [
        ("uuid", "GPU"), ("cluster", "Cluster"), ("node", "Node"), ("severity", "Worst"),
        ("checks", "Checks")], rows[:PAGE_ROWS], "No GPU has a finding.",
        "/api/v1/findings", len(rows))


def search_sections(conn: Connection, text: str, *, scope: Scope = FULL) -> list[Section]:
    """GPUs whose UUID starts with ``text`` or whose node is ``text``, and the allocations of
    namespace ``text``: the three things an operator pastes into a search box. Read within
    ``scope`` in SQL, as /api/v1/gpus and /api/v1/allocations read: another team's namespace
    finds nothing (not even which GPU it uses, nor since when)."""
    table = inv.gpus
    pattern = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    cond = sa.or_(table.c.uuid.like(pattern, escape="\\"), table.c.node == text)
    if scope.clusters is not None:
        cond = sa.and_(cond, table.c.cluster.in_(sorted(scope.clusters)))
    gpu_rows = conn.execute(
        sa.select(table).where(cond)
        .order_by(table.c.cluster, table.c.node, table.c.uuid, table.c.slice_key)
        .limit(PAGE_ROWS)).mappings().all()
    gpu_total = conn.execute(sa.select(sa.func.count()).select_from(table)
                             .where(cond)).scalar_one()
    alloc = inv.allocations
    alloc_rows = [{**dict(r), "last_seen": iso(r["last_seen"]), "_href": _gpu_href(r["uuid"])}
                  for r in conn.execute(
                      sa.select(alloc.c.uuid, alloc.c.cluster, alloc.c.node, alloc.c.namespace,
                                alloc.c.pod, alloc.c.container, alloc.c.last_seen)
                      .where(alloc.c.namespace == text,
                             sa.true() if scope.allows_namespace(text) else sa.false(),
                             sa.true() if scope.clusters is None
                             else alloc.c.cluster.in_(sorted(scope.clusters)))
                      .order_by(alloc.c.cluster, alloc.c.node, alloc.c.pod)
                      .limit(PAGE_ROWS)).mappings()]
    return [
        Section("search-gpus", f"GPUs matching “{text}” (UUID or node)", GPU_COLUMNS,
                [_gpu_row(inv.gpu_item(r)) for r in gpu_rows], "No GPU matches.",
                None, gpu_total),
        Section("search-allocations", f"Pods of namespace “{text}” on GPUs", [
            ("uuid", "GPU"), ("cluster", "Cluster"), ("node", "Node"),
            ("namespace", "Namespace"), ("pod", "Pod"), ("container", "Container"),
            ("last_seen", "Last seen")], alloc_rows, "No allocation in this namespace.",
            None, len(alloc_rows)),
    ]


def search_text(query: Query) -> str | None:
    """The ``q`` parameter: optional, once, at most MAX_SEARCH characters; blank = none."""
    unknown = sorted(set(query) - {"q"})
    if unknown:
        raise ApiError(400, f"unknown query parameter {unknown[0]!r} (allowed: q)")
    values = query.get("q") or []
    if len(values) > 1:
        raise ApiError(400, "query parameter 'q' given more than once")
    text = values[0].strip() if values else ""
    if len(text) > MAX_SEARCH or any(not ch.isprintable() for ch in text):
        raise ApiError(400, f"q must be at most {MAX_SEARCH} printable characters")
    return text or None


def page_data(engine: Engine, *, search: str | None, findings: Sequence[Finding],
              findings_at: float | None, now: dt.datetime | None = None,
              extra: Sequence[SectionSource] = (), scope: Scope = FULL) -> dict[str, Any]:
    """Everything the page shows, as plain data (one read-only connection), for ``scope``:
    a team's token sees its clusters and its pods, as in the API."""
    now = now or inv.now_utc()
    # the findings /api/v1/findings gives this caller: the badge, "GPUs with findings" and
    # the list are all counted from these, never from the fleet's
    findings = visible_findings(findings, scope)
    with engine.connect() as conn:
        sections = [clusters_section(conn, now),
                    *(health_section(conn, level) for level in UNHEALTHY),
                    stale_clusters_section(conn, scope=scope),
                    findings_gpus_section(findings)]
        for source in extra:
            visibility = visibility_of(source)
            if visibility == "fleet" and not scope.unrestricted:
                continue
            section = source(conn, scope=scope) if visibility == "scoped" else source(conn)
            if section is not None:
                sections.append(section)
        found = search_sections(conn, search, scope=scope) if search else []
    sections = [scoped_section(s, scope) for s in sections]
    found = [scoped_section(s, scope) for s in found]
    counts = {s: sum(1 for f in findings if f.get("severity") == s) for s in SEVERITY_RANK}
    checked = (dt.datetime.fromtimestamp(findings_at, dt.UTC).replace(tzinfo=None)
               if findings_at is not None else None)
    return {"generated_at": iso(now), "search": search or "", "results": found,
            "sections": sections, "findings": list(findings), "finding_counts": counts,
            "findings_at": iso(checked), "api_links": API_LINKS, "notice": None,
            "signed_in": None, "can_sign_out": False}


def unavailable_data(search: str | None, notice: str) -> dict[str, Any]:
    """The page when the inventory cannot be read (before the first sync, database down):
    the same page, empty, saying why, rather than a JSON error in a browser."""
    return {"generated_at": iso(inv.now_utc()), "search": search or "", "results": [],
            "sections": [], "findings": [], "finding_counts": dict.fromkeys(SEVERITY_RANK, 0),
            "findings_at": None, "api_links": API_LINKS, "notice": notice,
            "signed_in": None, "can_sign_out": False}


def render_page(data: Mapping[str, Any], status: int = 200) -> HTMLResponse:
    html = html_environment().get_template("fleet.html.j2").render(**data)
    return HTMLResponse(html, status, headers={"Content-Security-Policy": PAGE_CSP})


# -- usage, idle and capacity (issue "usage and capacity"): sections from the usage ledger ----
USAGE_WINDOW = dt.timedelta(hours=24)


def _window(now: dt.datetime | None = None) -> tuple[dt.datetime, dt.datetime]:
    end = now or inv.now_utc()
    return end - USAGE_WINDOW, end


def _idle_query(rule: Any, prefix: str = "") -> str:
    """The idle rule as the API's query parameters, so a section's JSON link answers with
    the rule the section used (usage: idle_threshold/idle_for; idle: threshold/for)."""
    from hub.common import format_duration

    return (f"&{prefix}threshold={rule.threshold:g}"
            f"&{prefix}for={format_duration(rule.for_seconds)}")


@section_source(visibility="scoped")
def usage_section(conn: Connection, *, scope: Scope = FULL,
                  rule: Any = None) -> Section | None:
    """GPU-hours by namespace over the last 24 h (None before any usage was collected)."""
    rule = rule or usage.IdleRule()
    rows = usage.usage_summary(conn, *_window(), by=("namespace",), clusters=scope.clusters,
                               namespaces=scope.namespaces, idle_threshold=rule.threshold,
                               idle_for=rule.for_seconds)
    if not rows:
        return None
    shown = [{**r, "namespace": r.get("namespace") or "(unallocated)",
              **{k: round(r[k], 2) for k in ("gpu_hours", "busy_gpu_hours",
                                             "idle_allocated_gpu_hours") if r.get(k) is not None}}
             for r in sorted(rows, key=lambda r: -r["gpu_hours"])]
    return Section("usage", "GPU-hours by namespace, last 24 h", [
        ("namespace", "Namespace"), ("gpu_hours", "GPU-hours"),
        ("busy_gpu_hours", "Busy GPU-hours"),
        ("idle_allocated_gpu_hours", "Idle allocated GPU-hours"),
        ("allocation_basis", "Allocated time")],
        shown[:PAGE_ROWS], "No usage collected.",
        "/api/v1/usage?by=namespace&since=24h" + _idle_query(rule, "idle_"), len(shown))


@section_source(visibility="scoped")
def idle_section(conn: Connection, *, scope: Scope = FULL,
                 rule: Any = None) -> Section | None:
    """Allocated GPUs idle for the rule's time in a row (2 h unless `serve --idle-for`)
    within the last 24 h: the list to reclaim. Read by the same function and rule as the
    usage section's idle GPU-hours, which its title repeats, so the two cannot disagree."""
    rule = rule or usage.IdleRule()
    rows = usage.idle_allocated(conn, *_window(), threshold=rule.threshold,
                                for_seconds=rule.for_seconds, clusters=scope.clusters,
                                namespaces=scope.namespaces)
    shown = [{**r, "idle_since": iso(r.get("idle_since")), "_href": _gpu_href(r["uuid"])}
             for r in rows]
    wasted = round(sum(r["wasted_gpu_hours"] for r in rows), 2)
    return Section("idle", f"Idle allocated GPUs (under {rule.threshold:g}% for "
                   f"{human_duration(rule.for_seconds)} or more), last 24 h: {wasted:g} "
                   "idle GPU-hours", [
        ("cluster", "Cluster"), ("node", "Node"), ("uuid", "GPU"), ("slice", "Slice"),
        ("namespace", "Namespace"), ("pod", "Pod"), ("idle_since", "Idle since"),
        ("wasted_gpu_hours", "GPU-hours wasted")],
        shown[:PAGE_ROWS], "No idle allocated GPU.",
        "/api/v1/idle?since=24h" + _idle_query(rule), len(shown))


@section_source(visibility="scoped")
def capacity_section(conn: Connection, *, scope: Scope = FULL) -> Section | None:
    """GPU-equivalents by model now: total, active, stale, allocated, free, over the caller's
    clusters: the items of /api/v1/capacity, which it links to (the fleet's totals are that
    answer's ``fleet``, for a caller whose scope allows them)."""
    rows = usage.capacity(conn, ("model",), clusters=scope.clusters,  # /api/v1/capacity's
                          now=inv.now_utc())
    if not rows:
        return None
    return Section("capacity", "Capacity by model (GPU-equivalents; free: reporting, healthy, "
                   "not allocated, not cordoned)", [
        ("model", "Model"), ("total", "Total"), ("active", "Active"), ("stale", "Stale"),
        ("failed", "Failed"),
        ("allocated", "Allocated"), ("reclaimable", "Reclaimable (idle)"),
        ("cordoned", "Cordoned"), ("free", "Free")],
        [{**r, "model": r.get("model") or "unknown"} for r in rows][:PAGE_ROWS],
        "No GPUs.", "/api/v1/capacity?by=model", len(rows))


@section_source(visibility="scoped")
def states_section(conn: Connection, *, scope: Scope = FULL,
                   rule: Any = None) -> Section | None:
    """Delivered, healthy, reserved and active GPUs by cluster (issue 38): the items of
    /api/v1/states?by=cluster, read by the same function with the caller's scope."""
    rule = rule or usage.IdleRule()
    idle = usage.idle_now(conn, inv.now_utc(), threshold=rule.threshold,
                          for_seconds=rule.for_seconds, clusters=scope.clusters)
    rows = inv.fleet_states(conn, by=("cluster",), idle=idle, clusters=scope.clusters,
                            namespaces=scope.namespaces)
    if not rows:
        return None
    return Section("states", "Fleet states (physical GPUs)", [
        ("cluster", "Cluster"), ("delivered", "Delivered"), ("healthy", "Healthy"),
        ("reserved", "Reserved"), ("active", "Active")], rows[:PAGE_ROWS], "No GPUs.",
        "/api/v1/states?by=cluster", len(rows))


@section_source(visibility="scoped")
def lemons_section(conn: Connection, *, scope: Scope = FULL) -> Section | None:
    """GPUs by failures per GPU-month in service over 90 days (issue 38): the ranking of
    /api/v1/lemons, a namespace-scoped caller's own GPUs only."""
    uuids = inv.reserved_by(conn, scope.namespaces) if scope.namespaces is not None else None
    rows = inv.lemons(conn, since=inv.LEMON_SINCE_S, by="gpu", now=inv.now_utc(),
                      clusters=scope.clusters, uuids=uuids)
    if scope.namespaces is not None:
        rows = inv.mask_evidence(rows, scope.namespaces)
    shown = [{**r, "evidence": "; ".join(e["what"] for e in r["evidence"][-3:]),
              "_href": _gpu_href(r["uuid"])} for r in rows]
    return Section("lemons", "GPUs that fail most, last 90 days", [
        ("cluster", "Cluster"), ("node", "Node"), ("uuid", "GPU"), ("model", "Model"),
        ("failures", "Failures"), ("per_gpu_month", "A GPU-month"),
        ("evidence", "Latest evidence")], shown[:PAGE_ROWS], "No GPU failed.",
        "/api/v1/lemons", len(shown))


# -- charts (issue 22): one section per chart, each drawn from data read for the scope ------
#: days of the GPU-hours-per-day chart, today included
CHART_DAYS = 14


def _figure(html: str) -> str:
    from markupsafe import Markup

    return Markup(html)  # built by hub.common's chart functions, which escape every text


@section_source(visibility="scoped")
def usage_by_day_chart(conn: Connection, *, scope: Scope = FULL,
                       rule: Any = None) -> Section | None:
    """Chart: GPU-hours per day by namespace (stacked), the last CHART_DAYS days."""
    rule = rule or usage.IdleRule()
    now = inv.now_utc()
    first = inv.day_of(now) - (CHART_DAYS - 1) * inv.DAY
    rows = usage.daily_by_namespace(conn, first, now, clusters=scope.clusters,
                                    namespaces=scope.namespaces,
                                    idle_threshold=rule.threshold, idle_for=rule.for_seconds)
    if not rows:
        return None
    return Section("usage-by-day", f"GPU-hours per day by namespace, last {CHART_DAYS} days",
                   [], [], "", f"/api/v1/usage?by=namespace&since={CHART_DAYS}d", None,
                   _figure(common.gpu_hours_by_day_chart(
                       rows, days=usage.day_starts(first, now), chart_id="usage-by-day-chart")))


@section_source(visibility="scoped")
def utilisation_chart(conn: Connection, *, scope: Scope = FULL) -> Section | None:
    """Chart: fleet utilisation and SM activity per bucket over the last 24 h."""
    start, end = _window()
    points = usage.utilisation_over_time(conn, start, end, clusters=scope.clusters,
                                         namespaces=scope.namespaces)
    if not points:
        return None
    return Section("utilisation", "Utilisation and SM activity, last 24 h", [], [], "",
                   "/api/v1/usage?by=cluster&since=24h", None,
                   _figure(common.utilisation_chart(points, start=start, end=end,
                                                    chart_id="utilisation-chart")))


@section_source(visibility="scoped")
def idle_chart(conn: Connection, *, scope: Scope = FULL, rule: Any = None) -> Section | None:
    """Chart: idle allocated GPU-hours by namespace over the last 24 h, the figure of the
    usage table (`usage --by namespace`), an aggregate the database sums."""
    rule = rule or usage.IdleRule()
    rows = usage.usage_summary(conn, *_window(), by=("namespace",), clusters=scope.clusters,
                               namespaces=scope.namespaces, idle_threshold=rule.threshold,
                               idle_for=rule.for_seconds)
    if not any(r.get("idle_allocated_gpu_hours") for r in rows):
        return None
    return Section("idle-chart", "Idle allocated GPU-hours by namespace, last 24 h", [], [],
                   "", "/api/v1/usage?by=namespace&since=24h" + _idle_query(rule, "idle_"),
                   None, _figure(common.idle_gpu_hours_chart(rows, chart_id="idle-chart-figure",
                                                       table=True)))


@section_source(visibility="scoped")
def capacity_chart(conn: Connection, *, scope: Scope = FULL) -> Section | None:
    """Chart: GPU-equivalents by model, allocated / free / stale (the capacity table's
    figures, scoped the same way)."""
    rows = usage.capacity(conn, ("model",), clusters=scope.clusters)  # as the table's
    if not rows:
        return None
    return Section("capacity-chart", "Capacity by model: allocated, free, stale", [], [], "",
                   "/api/v1/capacity?by=model", None,
                   _figure(common.capacity_chart(rows, chart_id="capacity-chart-figure",
                                                 table=True)))


#: The usage sections `serve` shows on its page, each chart above the table it draws.
USAGE_SECTIONS: tuple[SectionSource, ...] = (
    usage_by_day_chart, utilisation_chart, usage_section,
    idle_chart, idle_section,
    capacity_chart, capacity_section,
    states_section, lemons_section,
)


def usage_sections(rule: Any = None) -> tuple[SectionSource, ...]:
    """USAGE_SECTIONS answering with ``rule`` (hub.usage.IdleRule: `serve --idle-threshold
    /--idle-for`), so the page's idle figures are the CLI's and the API's."""
    if rule is None:
        return USAGE_SECTIONS
    return tuple(functools.partial(source, rule=rule)
                 if "rule" in inspect_parameters(source) else source
                 for source in USAGE_SECTIONS)


def inspect_parameters(source: SectionSource) -> Mapping[str, Any]:
    import inspect

    try:
        return inspect.signature(source).parameters
    except (TypeError, ValueError):
        return {}
