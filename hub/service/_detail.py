"""Pages of one cluster, one node and one GPU: where the live page's links lead.

Each is a few tables drawn from the same reads as the JSON API, with that JSON one click
away (the links at the top and under each table). They are plain data (:class:`DetailPage`)
until the app has confined them to the caller's scope (``hub.service._confine``), then
rendered with the report's layout and tables: no script, nothing from elsewhere. A cluster,
node or GPU outside the caller's scope reads as unknown (404), as in the API.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from starlette.responses import HTMLResponse, Response

from hub import inventory as inv
from hub import usage
from hub.common import counts_line, format_duration, html_environment, human_duration, iso
from hub.inventory import gpu_detail, page_gpus
from hub.service._api import encode_token, visible_findings
from hub.service._auth import Scope
from hub.service._confine import confine
from hub.service._page import PAGE_CSP, PAGE_ROWS, SEVERITY_RANK, Section

NODE_COLUMNS = [("node", "Node"), ("state", "State"), ("gpus", "Active GPUs"),
                ("stale_gpus", "Stale GPUs"), ("gpus_via", "GPUs published through"),
                ("last_sample_at", "Newest sample")]
ALLOCATION_COLUMNS = [("uuid", "GPU"), ("mig_profile", "MIG slice"), ("namespace", "Namespace"),
                      ("pod", "Pod"), ("container", "Container"), ("last_seen", "Last seen")]
EVENT_COLUMNS = [("at", "When"), ("type", "Event"), ("cluster", "Cluster"), ("node", "Node"),
                 ("slice", "Slice"), ("details", "Details")]
PLACEMENT_COLUMNS = [("cluster", "Cluster"), ("node", "Node"), ("slot", "Slot (PCI bus)"),
                     ("from", "From"), ("until", "Until")]
HEALTH_COLUMNS = [("at", "When"), ("cluster", "Cluster"), ("node", "Node"), ("old", "Was"),
                  ("new", "Became"), ("reasons", "Reasons")]
USAGE_COLUMNS = [("bucket_start", "Hour"), ("slice", "Slice"), ("namespace", "Namespace"),
                 ("pod", "Pod"), ("gpu_hours", "GPU-hours"),
                 ("avg_utilisation_pct", "Utilisation %"), ("energy_wh", "Energy Wh"),
                 ("allocation_basis", "Allocated time")]
FACT_COLUMNS = [("field", "Field"), ("value", "Value")]
#: GPU rows on one page of a cluster's page; the next page's link shows the rest
CLUSTER_GPU_ROWS = 32
#: the GPU tables of these pages: a MIG slice by its profile and instance (two 3g.40gb slices
#: of one GPU were two identical rows), and the exporter's health beside the state (a failed
#: GPU read "active")
DETAIL_GPU_COLUMNS = [("uuid", "GPU"), ("cluster", "Cluster"), ("node", "Node"),
                      ("mig_profile", "MIG slice"), ("mig_instance", "MIG instance"),
                      ("model", "Model"), ("state", "State"), ("health", "Health"),
                      ("health_reasons", "Why"), ("last_sample_at", "Newest sample")]
FINDING_COLUMNS = [("severity", "Severity"), ("check", "Check"), ("node", "Node"),
                   ("gpu", "GPU"), ("message", "Message")]
IDLE_COLUMNS = [("slice", "Slice"), ("namespace", "Namespace"), ("pod", "Pod"),
                ("idle_since", "Idle since"), ("idle_until", "Until"),
                ("wasted_gpu_hours", "GPU-hours wasted")]
UNHEALTHY = ("failed", "degraded")
#: the findings of the latest checks and when they ran (None: not checked yet), as the
#: service's ``findings()`` gives them
Checked = tuple[Sequence[Mapping[str, Any]], float | None]
NOT_CHECKED: Checked = ([], None)


def cluster_href(cluster: str) -> str:
    return "/clusters/" + quote(cluster, safe="")


def node_href(cluster: str, node: str) -> str:
    return f"/nodes/{quote(cluster, safe='')}/{quote(node, safe='')}"


def gpu_href(uuid: str) -> str:
    return "/gpus/" + quote(uuid, safe="")


@dataclass
class DetailPage:
    """One detail page as data; ``status`` 404 when what it names is unknown (or not the
    caller's to see)."""

    title: str
    trail: list[tuple[str, str]]
    json: list[str]
    sections: list[Section] = field(default_factory=list)
    notice: str | None = None
    status: int = 200
    #: what is wrong at a glance, under the title: (badge level, text); level "unchecked"
    #: is grey, never green
    badges: list[tuple[str, str]] = field(default_factory=list)
    #: links to the next and the first page of a paged table: (id, label, href)
    pager: list[tuple[str, str, str]] = field(default_factory=list)

    def response(self) -> Response:
        html = html_environment().get_template("detail.html.j2").render(
            title=self.title, trail=self.trail, json=self.json, sections=self.sections,
            notice=self.notice, badges=self.badges, pager=self.pager,
            generated_at=iso(inv.now_utc()))
        return HTMLResponse(html, self.status, headers={"Content-Security-Policy": PAGE_CSP})


def _unknown(what: str, json: list[str]) -> DetailPage:
    return DetailPage(what, [], json, notice=f"Unknown {what} (or not yours to see).",
                      status=404)


def _shown(row: Mapping[str, Any]) -> dict[str, Any]:
    """Times as ISO text, as on the live page."""
    return {k: iso(v) if isinstance(v, dt.datetime) else v for k, v in row.items()}


def _gpu_rows(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**_shown(g), "_href": gpu_href(g["uuid"])} for g in items]


def cluster_page(conn: Connection, cluster: str, scope: Scope,
                 checked: Checked = NOT_CHECKED,
                 after: Sequence[str] | None = None) -> DetailPage:
    """``after``: the key of the last GPU row of the previous page (the API's continue
    token, decoded), so every GPU of the cluster is one "next" away on the page itself."""
    json = ["/api/v1/clusters?" + urlencode({"cluster": cluster}),
            "/api/v1/nodes?" + urlencode({"cluster": cluster}),
            "/api/v1/gpus?" + urlencode({"cluster": cluster}),
            "/api/v1/findings?" + urlencode({"cluster": cluster})]
    found = inv.list_clusters(conn, cluster) if scope.allows_cluster(cluster) else []
    if not found:
        return _unknown(f"cluster {cluster}", json)
    facts = found[0]
    findings = _findings_of(checked, scope, cluster)
    unhealthy = _unhealthy_by_node(conn, cluster)
    nodes = [{**_shown(n), "unhealthy_gpus": _few_words(unhealthy.get(n["node"], {})),
              "findings": sum(1 for f in findings if f.get("node") == n["node"]),
              "_href": node_href(cluster, n["node"])}
             for n in inv.list_nodes(conn, cluster)]
    gpus, last = page_gpus(conn, cluster=cluster, limit=CLUSTER_GPU_ROWS, after=after)
    total = conn.execute(sa.select(sa.func.count()).select_from(inv.gpus).where(
        inv.gpus.c.cluster == cluster)).scalar_one()  # GPUs and MIG slices: the JSON's rows
    pager = []
    if last is not None:
        pager.append(("gpus-next", "Next GPUs →",
                      cluster_href(cluster) + "?" + urlencode({"continue": encode_token(last)})))
    if after is not None:
        pager.append(("gpus-first", "First GPUs", cluster_href(cluster)))
    paged = last is not None or after is not None
    bad = _unhealthy_rows(conn, cluster)
    # only when there is one: the badges say "none" in a word, not in an empty table
    unhealthy_section = [Section("unhealthy-gpus", "Failed and degraded GPUs",
                                 [c for c in DETAIL_GPU_COLUMNS if c[0] != "cluster"],
                                 _gpu_rows(bad), "", json[2], len(bad))] if bad else []
    return DetailPage(f"Cluster {cluster}", [(cluster, cluster_href(cluster))], json, [
        Section("facts", "Cluster", FACT_COLUMNS, _facts(facts), "", json[0]),
        _findings_section(findings, checked, json[3]),
        *unhealthy_section,
        Section("nodes", "Nodes (each node's page lists its GPUs)",
                [("node", "Node"), *NODE_COLUMNS[1:],
                 ("unhealthy_gpus", "Failed / degraded GPUs"), ("findings", "Findings")],
                nodes, "No nodes.", json[1], len(nodes)),
        # the cluster is the page's: no Cluster column; a page of rows at a time (a fleet's
        # cluster was one 3,700-pixel table), the next page one link away
        Section("gpus", "GPUs" + (f" ({CLUSTER_GPU_ROWS} a page)" if paged else ""),
                [c for c in DETAIL_GPU_COLUMNS if c[0] not in ("cluster", "health_reasons")],
                _gpu_rows(gpus),
                "No GPUs.", json[2], total if paged else None)],
        badges=[*_finding_badges(findings, checked), *_health_badges(unhealthy)],
        pager=pager)


def node_page(conn: Connection, cluster: str, node: str, scope: Scope,
              checked: Checked = NOT_CHECKED) -> DetailPage:
    query = urlencode({"cluster": cluster, "node": node})
    json = ["/api/v1/gpus?" + query, "/api/v1/allocations?" + urlencode({"cluster": cluster}),
            "/api/v1/findings?" + urlencode({"cluster": cluster})]
    found = ([n for n in inv.list_nodes(conn, cluster) if n["node"] == node]
             if scope.allows_cluster(cluster) else [])
    if not found:
        return _unknown(f"node {node} of cluster {cluster}", json)
    gpus, _ = page_gpus(conn, cluster=cluster, node=node, limit=PAGE_ROWS)
    allocations = [{**_shown(a), "_href": gpu_href(a["uuid"])}
                   for a in inv.list_allocations(conn, cluster) if a["node"] == node]
    findings = [f for f in _findings_of(checked, scope, cluster) if f.get("node") == node]
    k8s = kubernetes_view(conn, cluster, node)
    facts = {**found[0], **({f"kubernetes_{k}": v for k, v in k8s.items()} if k8s else {})}
    return DetailPage(f"Node {node}", [(cluster, cluster_href(cluster)),
                                       (node, node_href(cluster, node))], json, [
        Section("facts", "Node", FACT_COLUMNS, _facts(facts), ""),
        _findings_section(findings, checked, json[2]),
        Section("gpus", "GPUs and MIG slices",
                [c for c in DETAIL_GPU_COLUMNS if c[0] != "cluster"], _gpu_rows(gpus),
                "No GPUs.", json[0], len(gpus)),
        Section("allocations", "Pods on these GPUs", ALLOCATION_COLUMNS,
                [scope.mask_allocation(a) for a in allocations], "No pods.", json[1],
                len(allocations))],
        badges=[_kubernetes_badge(k8s, found[0]["gpus"]),
                *_finding_badges(findings, checked),
                *_health_badges(_unhealthy_by_node(conn, cluster, node))])


def kubernetes_view(conn: Connection, cluster: str, node: str) -> dict[str, Any] | None:
    """What the latest reconcile that judged the node read from Kubernetes (None: none
    did): the GPUs it advertises, its verdict and why."""
    r = inv.reconcile_results
    row = conn.execute(
        sa.select(r.c.k8s_gpus.label("gpus"), r.c.status, r.c.mode, r.c.reason)
        .where(r.c.cluster == cluster, r.c.node == node)
        .order_by(r.c.run_id.desc()).limit(1)).mappings().first()
    return dict(row) if row is not None else None


def _kubernetes_badge(k8s: Mapping[str, Any] | None, reporting: int) -> tuple[str, str]:
    """"Kubernetes advertises 8, 7 report": the reconcile's count beside the one the
    exporters give now; the reconcile's verdict sets the colour (it knows MIG, time-slicing
    and partitions, where the two numbers differ by design)."""
    if k8s is None or k8s.get("gpus") is None:
        return ("unchecked", f"Kubernetes count unknown (no reconcile has read this node); "
                             f"{reporting} report")
    text = f"Kubernetes advertises {k8s['gpus']}, {reporting} report"
    if k8s.get("status") == "match":
        return ("ok", text)
    return ("warning", f"{text} (reconcile: {k8s.get('status')}"
                       + (f", {k8s['reason']}" if k8s.get("reason") else "") + ")")


def _findings_of(checked: Checked, scope: Scope, cluster: str) -> list[Mapping[str, Any]]:
    return visible_findings(checked[0], scope, cluster=cluster)


def _findings_section(findings: Sequence[Mapping[str, Any]], checked: Checked,
                      api: str) -> Section:
    rows = sorted((dict(f) for f in findings),
                  key=lambda f: (SEVERITY_RANK.get(f.get("severity", ""), 9),
                                 str(f.get("node") or ""), str(f.get("gpu") or "")))
    empty = ("Not checked yet: the service has not run its checks." if checked[1] is None
             else "No findings.")
    return Section("findings", "Findings of the latest checks", FINDING_COLUMNS,
                   [{k: ("" if f.get(k) is None else f.get(k)) for k, _ in FINDING_COLUMNS}
                    for f in rows], empty, api, len(rows))


def _finding_badges(findings: Sequence[Mapping[str, Any]],
                    checked: Checked) -> list[tuple[str, str]]:
    """The findings' counts; grey "not checked yet" before any check ran, never green."""
    if checked[1] is None:
        return [("unchecked", "findings: not checked yet")]
    counts = {s: sum(1 for f in findings if f.get("severity") == s) for s in SEVERITY_RANK}
    level = "error" if counts["error"] else "warning" if counts["warning"] else "ok"
    return [(level, counts_line(counts))]


def _unhealthy_rows(conn: Connection, cluster: str) -> list[dict[str, Any]]:
    g = inv.gpus
    rows = conn.execute(sa.select(g).where(g.c.cluster == cluster, g.c.health.in_(UNHEALTHY))
                        .order_by(g.c.node, g.c.uuid, g.c.slice_key).limit(PAGE_ROWS))
    return [inv.gpu_item(r) for r in rows.mappings()]


def _unhealthy_by_node(conn: Connection, cluster: str,
                       node: str | None = None) -> dict[str, dict[str, int]]:
    """Physical GPUs the exporter reports failed or degraded, per node and level."""
    g = inv.gpus
    stmt = (sa.select(g.c.node, g.c.health, sa.func.count())
            .where(g.c.cluster == cluster, g.c.slice_key == "", g.c.health.in_(UNHEALTHY))
            .group_by(g.c.node, g.c.health))
    if node is not None:
        stmt = stmt.where(g.c.node == node)
    out: dict[str, dict[str, int]] = {}
    for name, level, count in conn.execute(stmt):
        out.setdefault(name, {})[level] = count
    return out


def _few_words(levels: Mapping[str, int]) -> str:
    return ", ".join(f"{levels[k]} {k}" for k in UNHEALTHY if levels.get(k))


def _health_badges(by_node: Mapping[str, Mapping[str, int]]) -> list[tuple[str, str]]:
    out = []
    for level, badge in zip(UNHEALTHY, ("error", "warning"), strict=True):
        n = sum(levels.get(level, 0) for levels in by_node.values())
        if n:
            out.append((badge, f"{n} {level} GPU" + ("s" if n != 1 else "")))
    return out


def gpu_page(conn: Connection, uuid: str, scope: Scope, checked: Checked = NOT_CHECKED,
             rule: Any = None, now: dt.datetime | None = None) -> DetailPage:
    base = "/api/v1/gpus/" + quote(uuid, safe="")
    json = [base, base + "/history"]
    detail = gpu_detail(conn, uuid, clusters=scope.clusters) if uuid else None
    history = usage.gpu_history(conn, uuid) if detail is not None else None
    if detail is None or history is None or detail["gpu"] is None:
        return _unknown(f"GPU {uuid}", json)
    # confined before its events are flattened to text below: the app's own step sees rows,
    # not words (a `moved` event's other end may be another team's cluster)
    history = confine(history, scope)
    gpu = detail["gpu"]
    cluster, node = gpu["cluster"], gpu["node"]
    events = [{**_shown(e), "details": _details(e.get("details"))}
              for e in history["events"]]
    findings = [f for f in _findings_of(checked, scope, cluster) if f.get("gpu") == uuid]
    rule = rule or usage.IdleRule()
    idle = idle_runs_of(conn, gpu, scope, rule, now or inv.now_utc())
    return DetailPage(f"GPU {uuid}", [(cluster, cluster_href(cluster)),
                                      (node, node_href(cluster, node)),
                                      (uuid, gpu_href(uuid))], json, [
        Section("facts", "GPU", FACT_COLUMNS,
                _facts({k: v for k, v in gpu.items() if k not in ("uuid",)}), "", json[0]),
        _findings_section(findings, checked, "/api/v1/findings?"
                          + urlencode({"cluster": cluster})),
        Section("idle", f"Idle allocated (under {rule.threshold:g}% for "
                        f"{human_duration(rule.for_seconds)} or more), last 24 h",
                IDLE_COLUMNS, [_shown(r) for r in idle], "Not idle.",
                "/api/v1/idle?" + urlencode({"since": "24h",
                                             "threshold": f"{rule.threshold:g}",
                                             "for": format_duration(rule.for_seconds)}),
                len(idle)),
        # its life (issue 38): where it sat, and every change of its health, so a repaired
        # GPU keeps its record and the part that replaced it has its own
        Section("placements", "Where it sat", PLACEMENT_COLUMNS,
                [_shown(p) for p in history["placements"]], "No placement recorded.",
                json[1], len(history["placements"])),
        Section("health", "Health history", HEALTH_COLUMNS,
                [_shown(h) for h in history["health"]], "No change of health recorded.",
                json[1], len(history["health"])),
        Section("slices", "MIG slices",
                [c for c in DETAIL_GPU_COLUMNS if c[0] not in ("cluster", "node")],
                _gpu_rows(detail["slices"]), "Not split into MIG slices.", json[0],
                len(detail["slices"])),
        Section("allocations", "Pods on this GPU", ALLOCATION_COLUMNS,
                [_shown(a) for a in history["allocations"]], "No pod seen on it.", json[1],
                len(history["allocations"])),
        Section("usage", "Usage, latest hours first", USAGE_COLUMNS,
                [_shown(u) for u in history["usage"]], "No usage collected.", json[1],
                len(history["usage"])),
        Section("events", "Events", EVENT_COLUMNS, events, "No events.", json[1],
                len(events))],
        badges=[*_gpu_health_badges(gpu), *_idle_badges(idle),
                *_finding_badges(findings, checked)])


def idle_runs_of(conn: Connection, gpu: Mapping[str, Any], scope: Scope, rule: Any,
                 now: dt.datetime) -> list[dict[str, Any]]:
    """The GPU's idle allocated runs of the last 24 h by the usage ledger's idle rule (the
    fleet page's idle section, `gpufleet idle`), limited to what the caller may see."""
    start = now - dt.timedelta(hours=24)
    return [r for r in usage.idle_allocated(conn, start, now, threshold=rule.threshold,
                                            for_seconds=rule.for_seconds,
                                            clusters={gpu["cluster"]},
                                            namespaces=scope.namespaces)
            if r["uuid"] == gpu["uuid"] and r["node"] == gpu["node"]]


def _idle_badges(idle: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    if not idle:
        return []
    since = min(r["idle_since"] for r in idle)
    wasted = sum(r["wasted_gpu_hours"] for r in idle)
    pods = ", ".join(sorted({f"{r['namespace']}/{r['pod']}" for r in idle if r.get("pod")}))
    return [("warning", f"idle since {iso(since)}: {wasted:.2f} allocated GPU-hours wasted"
                        + (f" ({pods})" if pods else ""))]


def _gpu_health_badges(gpu: Mapping[str, Any]) -> list[tuple[str, str]]:
    health = gpu.get("health")
    if health not in UNHEALTHY:
        return []
    why = f" ({gpu['health_reasons']})" if gpu.get("health_reasons") else ""
    return [("error" if health == "failed" else "warning", f"{health}{why}")]


def _facts(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A record (of the caller's own cluster: the pages check that first) as a two-column
    table."""
    return [{"field": k, "value": "" if v is None else v} for k, v in _shown(row).items()]


def _details(details: Any) -> str:
    if not details:
        return ""
    if isinstance(details, Mapping):
        parts = []
        for key, value in sorted(details.items()):
            if isinstance(value, Mapping):
                value = "/".join(str(v) for v in value.values() if v is not None)
            if value is None:
                continue
            parts.append(f"{key} {value}")
        return "; ".join(parts)
    return str(details)
