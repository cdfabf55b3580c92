"""Pages of one cluster, one node and one GPU: where the live page's links lead.

Each is a few tables drawn from the same reads as the JSON API, with that JSON one click
away (the links at the top and under each table). They are plain data (:class:`DetailPage`)
until the app has confined them to the caller's scope (``hub.service._confine``), then
rendered with the report's layout and tables: no script, nothing from elsewhere. A cluster,
node or GPU outside the caller's scope reads as unknown (404), as in the API.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from starlette.responses import HTMLResponse, Response

from hub import inventory as inv
from hub import usage
from hub.common import html_environment, iso
from hub.inventory import gpu_detail, page_gpus
from hub.service._auth import Scope
from hub.service._confine import confine
from hub.service._page import GPU_COLUMNS, PAGE_CSP, PAGE_ROWS, Section

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
#: GPU rows on a cluster's page; its nodes' pages list the rest
CLUSTER_GPU_ROWS = 32


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

    def response(self) -> Response:
        html = html_environment().get_template("detail.html.j2").render(
            title=self.title, trail=self.trail, json=self.json, sections=self.sections,
            notice=self.notice, generated_at=iso(inv.now_utc()))
        return HTMLResponse(html, self.status, headers={"Content-Security-Policy": PAGE_CSP})


def _unknown(what: str, json: list[str]) -> DetailPage:
    return DetailPage(what, [], json, notice=f"Unknown {what} (or not yours to see).",
                      status=404)


def _shown(row: Mapping[str, Any]) -> dict[str, Any]:
    """Times as ISO text, as on the live page."""
    return {k: iso(v) if isinstance(v, dt.datetime) else v for k, v in row.items()}


def _gpu_rows(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**_shown(g), "_href": gpu_href(g["uuid"])} for g in items]


def cluster_page(conn: Connection, cluster: str, scope: Scope) -> DetailPage:
    json = ["/api/v1/clusters?" + urlencode({"cluster": cluster}),
            "/api/v1/nodes?" + urlencode({"cluster": cluster}),
            "/api/v1/gpus?" + urlencode({"cluster": cluster})]
    found = inv.list_clusters(conn, cluster) if scope.allows_cluster(cluster) else []
    if not found:
        return _unknown(f"cluster {cluster}", json)
    facts = found[0]
    nodes = [{**_shown(n), "_href": node_href(cluster, n["node"])}
             for n in inv.list_nodes(conn, cluster)]
    gpus, more = page_gpus(conn, cluster=cluster, limit=CLUSTER_GPU_ROWS)
    total = conn.execute(sa.select(sa.func.count()).select_from(inv.gpus).where(
        inv.gpus.c.cluster == cluster)).scalar_one()  # GPUs and MIG slices: the JSON's rows
    return DetailPage(f"Cluster {cluster}", [(cluster, cluster_href(cluster))], json, [
        Section("facts", "Cluster", FACT_COLUMNS, _facts(facts), "", json[0]),
        Section("nodes", "Nodes (each node's page lists its GPUs)",
                [("node", "Node"), *NODE_COLUMNS[1:]], nodes, "No nodes.", json[1],
                len(nodes)),
        # the cluster is the page's: no Cluster column; the first rows only, the rest on
        # the nodes' pages and in the JSON (a fleet's cluster was one 3,700-pixel table)
        Section("gpus", "GPUs" + (f" (first {CLUSTER_GPU_ROWS})" if more else ""),
                [c for c in GPU_COLUMNS if c[0] != "cluster"], _gpu_rows(gpus), "No GPUs.",
                json[2], total if more else None)])


def node_page(conn: Connection, cluster: str, node: str, scope: Scope) -> DetailPage:
    query = urlencode({"cluster": cluster, "node": node})
    json = ["/api/v1/gpus?" + query, "/api/v1/allocations?" + urlencode({"cluster": cluster})]
    found = ([n for n in inv.list_nodes(conn, cluster) if n["node"] == node]
             if scope.allows_cluster(cluster) else [])
    if not found:
        return _unknown(f"node {node} of cluster {cluster}", json)
    gpus, _ = page_gpus(conn, cluster=cluster, node=node, limit=PAGE_ROWS)
    allocations = [{**_shown(a), "_href": gpu_href(a["uuid"])}
                   for a in inv.list_allocations(conn, cluster) if a["node"] == node]
    return DetailPage(f"Node {node}", [(cluster, cluster_href(cluster)),
                                       (node, node_href(cluster, node))], json, [
        Section("facts", "Node", FACT_COLUMNS, _facts(found[0]), ""),
        Section("gpus", "GPUs and MIG slices", GPU_COLUMNS, _gpu_rows(gpus), "No GPUs.",
                json[0], len(gpus)),
        Section("allocations", "Pods on these GPUs", ALLOCATION_COLUMNS,
                [scope.mask_allocation(a) for a in allocations], "No pods.", json[1],
                len(allocations))])


def gpu_page(conn: Connection, uuid: str, scope: Scope) -> DetailPage:
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
    return DetailPage(f"GPU {uuid}", [(cluster, cluster_href(cluster)),
                                      (node, node_href(cluster, node)),
                                      (uuid, gpu_href(uuid))], json, [
        Section("facts", "GPU", FACT_COLUMNS,
                _facts({k: v for k, v in gpu.items() if k not in ("uuid",)}), "", json[0]),
        # its life (issue 38): where it sat, and every change of its health, so a repaired
        # GPU keeps its record and the part that replaced it has its own
        Section("placements", "Where it sat", PLACEMENT_COLUMNS,
                [_shown(p) for p in history["placements"]], "No placement recorded.",
                json[1], len(history["placements"])),
        Section("health", "Health history", HEALTH_COLUMNS,
                [_shown(h) for h in history["health"]], "No change of health recorded.",
                json[1], len(history["health"])),
        Section("slices", "MIG slices", GPU_COLUMNS, _gpu_rows(detail["slices"]),
                "Not split into MIG slices.", json[0], len(detail["slices"])),
        Section("allocations", "Pods on this GPU", ALLOCATION_COLUMNS,
                [_shown(a) for a in history["allocations"]], "No pod seen on it.", json[1],
                len(history["allocations"])),
        Section("usage", "Usage, latest hours first", USAGE_COLUMNS,
                [_shown(u) for u in history["usage"]], "No usage collected.", json[1],
                len(history["usage"])),
        Section("events", "Events", EVENT_COLUMNS, events, "No events.", json[1],
                len(events))])


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
