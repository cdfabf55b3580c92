"""A Grafana dashboard for ACM Observability (``gpufleet hub render --grafana``).

ACM's Grafana loads custom dashboards from ConfigMaps in the observability namespace that
carry the label ``grafana-custom-dashboard: "true"``, one dashboard JSON per data key, into
the folder the annotation ``observability.open-cluster-management.io/dashboard-folder`` names;
its data source for the hub store is "Observatorium". The dashboard reads the hub store
directly, so it shows the fleet between syncs and without the gpufleet service.

Every expression is built from the vendor profiles (``hub.store``: metric names, prefixes,
device matchers, id and model labels) and the inventory's health rules
(``hub.inventory``: fatal XIDs, hardware slowdown bits), so the dashboard counts what the
inventory counts: a physical GPU once however many MIG slices report, the preferred metric
where an exporter offers several, failed and degraded by the same rules. Nothing here names
a metric.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hub import inventory as inv
from hub import store
from hub.common import SyncSettings
from hub.onboard._render import _labels, _render

OBSERVABILITY_NAMESPACE = "open-cluster-management-observability"
DASHBOARD_LABEL = "grafana-custom-dashboard"
FOLDER_ANNOTATION = "observability.open-cluster-management.io/dashboard-folder"
DASHBOARD_NAME = "gpufleet-gpus"
FOLDER = "GPU fleet"
DATASOURCE = "Observatorium"  # ACM Grafana's data source for the hub store
#: A GPU is current while it has a sample this recent (sync's default --stale-after: ACM
#: pushes every 300 s and its queries look back 10 min).
WINDOW: str = SyncSettings.default("stale_after")
#: How far back a silent cluster is still listed as stale.
LOOKBACK = "24h"


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # "timeseries" | "table"
    expr: str
    legend: str
    unit: str
    description: str


def _physical(p: store.VendorProfile) -> list[str]:
    """The id labels naming a physical GPU (the slice labels left out)."""
    return [label for label in p.id_labels if label not in p.slice_labels]


def _latest(p: store.VendorProfile, metrics: list[str], window: str) -> str:
    """The newest value within ``window`` of the first of ``metrics`` a series has, over
    every spelling (AMD's prefix, dcgm's two namings, each converted into the metric's
    unit by name), device series only; parenthesised for use in larger expressions."""
    return "(" + " or ".join(
        arm for m in metrics
        for arm in p.arms(m, f"last_over_time({{}}{{{{{p.device_matcher}}}}}[{window}])", window)
    ) + ")"


def _by(*labels: str) -> str:
    return ", ".join(dict.fromkeys(labels))


def _per_gpu(p: store.VendorProfile, expr: str, cluster_label: str) -> str:
    """One series per physical GPU of ``expr``, with a ``model`` label from the vendor's
    model labels in their order of preference."""
    models = store.MODEL_LABELS[p.vendor]
    out = f"count by ({_by(cluster_label, *_physical(p), *models)}) ({expr})"
    for label in reversed(models):  # the preferred label is applied last and wins
        out = f'label_replace({out}, "model", "$1", "{label}", "(.+)")'
    return out


def _clock(p: store.VendorProfile, window: str) -> str:
    return _latest(p, [p.clock_metric], window)


def fleet_gpus(cluster_label: str, window: str = WINDOW) -> str:
    """GPUs reporting now, by cluster and model."""
    parts = " or ".join(_per_gpu(p, _clock(p, window), cluster_label) for p in store.PROFILES)
    return f"count by ({cluster_label}, model) ({parts})"


def _by_cluster_avg(field: str, cluster_label: str, window: str) -> str | None:
    """Average of a value field (in the inventory's units) over each cluster's GPUs, one
    value per physical GPU; None when no vendor exports the field."""
    parts = []
    for p in store.PROFILES:
        metrics = p.value_fields.get(field)
        if not metrics:
            continue
        factor = p.convert(field, 1.0)
        per_gpu = f"max by ({_by(cluster_label, *_physical(p))}) ({_latest(p, metrics, window)})"
        parts.append(per_gpu if factor == 1.0 else f"{factor:g} * {per_gpu}")
    if not parts:
        return None
    return f"avg by ({cluster_label}) ({' or '.join(parts)})"


def utilisation_by_cluster(cluster_label: str, window: str = WINDOW) -> str:
    expr = _by_cluster_avg(store.UTILISATION, cluster_label, window)
    assert expr is not None  # every vendor has a utilisation field
    return expr


def activity_by_cluster(cluster_label: str, window: str = WINDOW) -> str | None:
    """SM / engine activity (DCGM's profiling field, %), where exporters send it."""
    return _by_cluster_avg(store.ENGINE_ACTIVE, cluster_label, window)


def stale_clusters(cluster_label: str, window: str = WINDOW, lookback: str = LOOKBACK) -> str:
    """Clusters that reported GPUs within ``lookback`` but none within ``window``, with the
    number of GPUs they had."""
    seen = " or ".join(_per_gpu(p, _clock(p, lookback), cluster_label) for p in store.PROFILES)
    now = " or ".join(f"count by ({cluster_label}) ({_clock(p, window)})"
                      for p in store.PROFILES)
    return (f"count by ({cluster_label}) ({seen}) "
            f"unless on ({cluster_label}) ({now})")


def _failed_conditions(p: store.VendorProfile, window: str) -> list[str]:
    fields = p.health_fields
    out = []
    if store.LAST_XID in fields:
        xid = _latest(p, fields[store.LAST_XID], window)
        out += [f"{xid} == {x}" for x in sorted(inv.FATAL_XIDS)]
    if store.ECC_DBE in fields:
        out.append(f"{_latest(p, fields[store.ECC_DBE], window)} > 0")
    if store.ROW_REMAP_FAILURE in fields:
        out.append(f"{_latest(p, fields[store.ROW_REMAP_FAILURE], window)} > 0")
    if store.DEVICE_HEALTH in fields:
        out.append(f"{_latest(p, fields[store.DEVICE_HEALTH], window)} == 0")
    return out


def _degraded_conditions(p: store.VendorProfile, window: str) -> list[str]:
    fields = p.health_fields
    out = []
    if store.LAST_XID in fields:
        out.append(f"{_latest(p, fields[store.LAST_XID], window)} > 0")
    if store.CLOCKS_EVENT_REASONS in fields:
        reasons = _latest(p, fields[store.CLOCKS_EVENT_REASONS], window)
        out += [f"floor({reasons} / {bit}) % 2 == 1" for bit in sorted(inv.HW_SLOWDOWN)]
    return out


def _gpus_where(p: store.VendorProfile, conditions: list[str], cluster_label: str) -> str:
    return f"count by ({_by(cluster_label, *_physical(p))}) ({' or '.join(conditions)})"


def failed_gpus(cluster_label: str, window: str = WINDOW) -> str:
    """GPUs the inventory's health rules call failed, by cluster."""
    parts = [_gpus_where(p, conds, cluster_label) for p in store.PROFILES
             if (conds := _failed_conditions(p, window))]
    return f"count by ({cluster_label}) ({' or '.join(parts)})"


def degraded_gpus(cluster_label: str, window: str = WINDOW) -> str:
    """GPUs with a non-fatal XID or a hardware slowdown, and not failed, by cluster."""
    parts = []
    for p in store.PROFILES:
        degraded = _degraded_conditions(p, window)
        if not degraded:
            continue
        part = _gpus_where(p, degraded, cluster_label)
        failed = _failed_conditions(p, window)
        if failed:
            part = f"({part} unless {_gpus_where(p, failed, cluster_label)})"
        parts.append(part)
    return f"count by ({cluster_label}) ({' or '.join(parts)})"


def dashboard_panels(cluster_label: str = "cluster", window: str = WINDOW,
                     lookback: str = LOOKBACK) -> list[Panel]:
    c = cluster_label
    panels = [
        Panel("GPUs by cluster and model", "table", fleet_gpus(c, window),
              f"{{{{{c}}}}} {{{{model}}}}", "none",
              f"Physical GPUs with a sample in the last {window} (a MIG GPU counts once)."),
        Panel("Utilisation by cluster", "timeseries", utilisation_by_cluster(c, window),
              f"{{{{{c}}}}}", "percent",
              "Average GPU utilisation of each cluster's GPUs (DCGM GPU_UTIL, AMD gfx "
              "activity)."),
    ]
    activity = activity_by_cluster(c, window)
    if activity is not None:
        panels.append(Panel("SM activity by cluster", "timeseries", activity,
                            f"{{{{{c}}}}}", "percent",
                            "Average engine (SM) activity from DCGM's profiling field; "
                            "clusters whose exporters do not send it are absent."))
    panels += [
        Panel("Stale clusters", "table", stale_clusters(c, window, lookback),
              f"{{{{{c}}}}}", "none",
              f"Clusters with GPUs in the last {lookback} but no sample in the last {window}, "
              "with how many GPUs they had."),
        Panel("Failed GPUs by cluster", "table", failed_gpus(c, window), f"{{{{{c}}}}}",
              "none", "Fatal XID (" + ", ".join(str(x) for x in sorted(inv.FATAL_XIDS))
              + "), uncorrectable ECC, row-remap failure or the exporter's unhealthy verdict."),
        Panel("Degraded GPUs by cluster", "table", degraded_gpus(c, window), f"{{{{{c}}}}}",
              "none", "Another non-zero XID or a hardware clock slowdown, not failed."),
    ]
    return panels


def dashboard(cluster_label: str = "cluster", window: str = WINDOW,
              lookback: str = LOOKBACK) -> dict[str, Any]:
    """The dashboard JSON (Grafana's model): a data source variable defaulting to ACM's
    Observatorium, then one panel per question, two to a row."""
    panels = []
    for i, p in enumerate(dashboard_panels(cluster_label, window, lookback)):
        panel: dict[str, Any] = {
            "id": i + 1, "type": p.kind, "title": p.title, "description": p.description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
            "targets": [{"refId": "A", "expr": p.expr, "legendFormat": p.legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"},
                         **({"instant": True, "format": "table"} if p.kind == "table"
                            else {"range": True})}],
        }
        if p.kind == "table":
            panel["transformations"] = [{"id": "organize", "options": {
                "excludeByName": {"Time": True}, "renameByName": {"Value": "GPUs"}}}]
        panels.append(panel)
    return {
        "uid": DASHBOARD_NAME, "title": "GPU fleet (gpufleet)", "tags": ["gpufleet", "gpu"],
        "timezone": "utc", "editable": False, "refresh": "5m", "schemaVersion": 38,
        "time": {"from": "now-24h", "to": "now"},
        "templating": {"list": [{
            "name": "datasource", "label": "Data source", "type": "datasource",
            "query": "prometheus", "current": {"text": DATASOURCE, "value": DATASOURCE},
            "hide": 0}]},
        "annotations": {"list": []}, "panels": panels,
    }


def render_grafana(cluster_label: str = "cluster", window: str = WINDOW,
                   lookback: str = LOOKBACK) -> dict[str, str]:
    """The dashboard ConfigMap: {file name: YAML}."""
    text = json.dumps(dashboard(cluster_label, window, lookback), indent=2, sort_keys=True)
    return {"grafana-dashboard.yaml": _render(
        "templates/hub/grafana-dashboard.yaml.j2", name=DASHBOARD_NAME,
        namespace=OBSERVABILITY_NAMESPACE,
        labels={**_labels(DASHBOARD_NAME, "dashboard", OBSERVABILITY_NAMESPACE),
                DASHBOARD_LABEL: "true"},
        folder_annotation=FOLDER_ANNOTATION, folder=FOLDER,
        key=f"{DASHBOARD_NAME}.json", lines=text.splitlines())}
