"""The fleet's failure modes as PromQL: alerting rules for the hub, and the report's history.

One builder per failure mode writes the expression from the vendor profiles (metric names,
label roles, name prefixes), so the rules cover both vendors and both AMD prefixes without
naming either here. ``gpufleet alerts render`` wraps them in rule files for Prometheus,
Thanos Ruler or ACM; ``gpufleet report`` asks the same expressions once, as instant queries,
to find zero-usage GPUs, stuck collectors, unhealthy exporters and clusters the hub's token
cannot see. Either way the number of expressions is fixed: each groups by the cluster label
and node/GPU labels, never one query per cluster.

Functions that drop the metric name (``changes``, ``*_over_time`` except ``last_over_time``)
would collide across names in one selector, so such parts are chained per metric name with
``or``, as the sync's timestamp query does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from hub import inventory, store
from hub.common import CHECKS, LEDGER, format_duration, parse_duration
from hub.kube import INSTANCE_TYPE_LABELS, Catalog, shipped_catalog
from hub.store import HubClient, PartialResponse, VendorProfile
from hub.validate._checks import GpuRef, HubHistory, NodeRef
from hub.validate._reconcile import ksm_label

RULES_FILE = "gpufleet-alerts.rules.yaml"
PROMETHEUS_RULE_FILE = "gpufleet-alerts.prometheusrule.yaml"
GROUP = "gpufleet"
#: a series needs this many samples in the window before "never changed" / "always 0" counts
MIN_SAMPLES = 3


# -- label roles ---------------------------------------------------------------------------------
def node_labels(p: VendorProfile) -> list[str]:
    return store.NODE_LABELS[p.vendor]


def gpu_labels(p: VendorProfile) -> list[str]:
    """Labels of the physical GPU (no node, no MIG slice)."""
    skip = set(node_labels(p)) | set(store.SLICE_LABELS[p.vendor])
    return [label for label in p.id_labels if label not in skip]


def _names(p: VendorProfile, metrics: list[str]) -> list[str]:
    """Every exact name of ``metrics`` (each spelling: AMD's prefix, dcgm's two namings)."""
    return [name for m in metrics for name in p.names(m)]


def _seen(p: VendorProfile, window: str, off: str = "") -> str:
    """Device series with a sample in the window under any clock name, one ``or`` term per
    exact name: a ``__name__`` regex inside the range function would make Prometheus refuse
    the query for a GPU sending two spellings at once (two series, one label set)."""
    return " or ".join(f"last_over_time({n}{{{p.device_matcher}}}[{window}]{off})"
                       for n in _names(p, p.timestamp_metrics))


def _field_names(p: VendorProfile, fld: str) -> list[str]:
    return _names(p, p.value_fields.get(fld, []))


def _all_value_names(p: VendorProfile) -> list[str]:
    return _names(p, [m for ms in p.value_fields.values() for m in ms])


def _by(*groups: list[str] | str) -> str:
    labels: list[str] = []
    for g in groups:
        labels += [g] if isinstance(g, str) else g
    return ", ".join(labels)


def _or(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else " or ".join(f"({p})" for p in parts)


# -- failure modes, per vendor ---------------------------------------------------------------------
def presence(p: VendorProfile, window: str, cl: str) -> str:
    """Clusters with any GPU sample of this vendor in the window."""
    return f"group by ({cl}) ({_seen(p, window)})"


def gpu_count(p: VendorProfile, window: str, cl: str, offset: str = "") -> str:
    """Physical GPUs per node seen in the window (MIG slices count as their GPU)."""
    off = f" offset {offset}" if offset else ""
    node = _by(cl, node_labels(p))
    return (f"count by ({node}) (group by ({_by(node, gpu_labels(p))}) "
            f"({_seen(p, window, off)}))")


def gpu_count_dropped(p: VendorProfile, window: str, offset: str, cl: str) -> str:
    """Nodes with fewer GPUs now than ``offset`` ago (a vanished node counts as 0); the value
    is the number of GPUs lost."""
    before = gpu_count(p, window, cl, offset)
    now = gpu_count(p, window, cl)
    return f"({before}) - (({now}) or ({before}) * 0) > 0"


def zero_usage(p: VendorProfile, window: str, cl: str) -> str:
    """GPUs (or MIG slices) with a pod allocated whose utilisation was exactly 0 in every
    sample of the window (and at least MIN_SAMPLES samples). The value is the seconds from
    the first of those samples until now (at the subquery's resolution), so a finding names
    the span it saw: a GPU that appeared 3 minutes ago was not idle "for the whole hour".

    Utilisation means what the inventory stores: the utilisation field of a physical GPU, the
    profiling counter of a MIG slice (DCGM reports GPU_UTIL 0 on slices), so a slice whose
    profiling counter shows work is not idle, while a whole GPU whose utilisation rounds to 0
    is, however busy its profiling counter says it is by a fraction of a percent.
    """
    ids = _by(cl, p.id_labels)
    keep = _by(ids, "namespace", "pod", "exported_namespace", "exported_pod")
    slice_labels = store.SLICE_LABELS[p.vendor]
    on_slices = f', {slice_labels[0]}!=""' if slice_labels else ""
    engine = _field_names(p, store.ENGINE_ACTIVE) if slice_labels else []
    # the span's resolution: a thirtieth of the window (the default, the evaluation
    # interval, can be longer than a short window and find nothing)
    step = format_duration(max(1.0, parse_duration(window) / 30))

    def idle(name: str, extra: str) -> list[str]:
        out = []
        # the exporter's own pod (target labels, store.allocation) is never a GPU's user
        not_exporter = f', pod!~"{store.EXPORTER_POD_REGEX}", exported_pod=""'
        for pod, rule in (("pod", not_exporter), ("exported_pod", "")):
            series = f'{name}{{{p.device_matcher}{extra}, {pod}!=""{rule}}}'
            sel = f"{series}[{window}]"
            out.append(f"max by ({keep}) ((time() - min_over_time(timestamp({series})"
                       f"[{window}:{step}])) and (max_over_time({sel}) == 0) and "
                       f"(count_over_time({sel}) >= {MIN_SAMPLES}))")
        return out

    parts = [q for name in _field_names(p, store.UTILISATION) for q in idle(name, "")]
    parts += [q for name in engine for q in idle(name, on_slices)]
    busy = [f"max by ({ids}) (max_over_time({name}{{{p.device_matcher}{on_slices}}}"
            f"[{window}])) > 0" for name in engine]
    if busy:
        return f"({_or(parts)}) unless on ({ids}) ({_or(busy)})"
    return _or(parts)


def stuck_exporter(p: VendorProfile, window: str, cl: str) -> str:
    """Nodes whose exporter keeps sending (a fresh sample now, enough samples in the window)
    but none of whose GPU values changed in the window."""
    node = _by(cl, node_labels(p))
    names = _all_value_names(p)
    changed = _or([f"group by ({node}) (changes({n}{{{p.device_matcher}}}[{window}]) > 0)"
                   for n in names])
    sampled = _or([f"group by ({node}) (count_over_time({n}{{{p.device_matcher}}}[{window}]) "
                   f">= {MIN_SAMPLES})" for n in names])
    regex = "|".join(names)
    fresh = f'group by ({node}) ({{__name__=~"{regex}", {p.device_matcher}}})'
    return f"(({sampled}) and on ({node}) ({fresh})) unless on ({node}) ({changed})"


def visible_gpus(p: VendorProfile, window: str, cl: str) -> str:
    """GPUs per cluster the hub returns to this token (tagged with the vendor)."""
    count = (f"count by ({cl}) (group by ({_by(cl, node_labels(p), gpu_labels(p))}) "
             f"({_seen(p, window)}))")
    return f'label_replace({count}, "vendor", "{p.vendor}", "", "")'


def gpu_failed(p: VendorProfile, window: str, cl: str) -> str:
    """GPUs whose newest health fields say "failed" (hub.inventory._health): a fatal XID,
    double-bit ECC errors, a row-remap failure, or the exporter's own unhealthy verdict."""
    ids = _by(cl, p.id_labels)
    parts: list[str] = []
    for fld, metrics in p.health_fields.items():
        for name in _names(p, metrics):
            agg = "min" if fld == store.DEVICE_HEALTH else "max"
            sel = f"{agg} by ({ids}) (last_over_time({name}{{{p.device_matcher}}}[{window}]))"
            if fld == store.LAST_XID:
                parts += [f"{sel} == {xid}" for xid in sorted(inventory.FATAL_XIDS)]
            elif fld in (store.ECC_DBE, store.ROW_REMAP_FAILURE):
                parts.append(f"{sel} > 0")
            elif fld == store.DEVICE_HEALTH:
                parts.append(f"{sel} == 0")
    return _or(parts)


def _regex_alternatives(names: list[str]) -> str:
    """A case-insensitive alternation of names inside a PromQL string (a regex escape's
    backslash is itself escaped there)."""
    return "(?i)(" + "|".join(re.escape(n).replace("\\", "\\\\") for n in names) + ")"


def expected_by_instance_type(catalog: Catalog, window: str, cl: str) -> str | None:
    """GPUs per node its instance type (node label, through kube-state-metrics) or a catalog
    selector says it has: one ``or`` term per distinct count, so the expression stays the
    size of the catalog's few counts, not its entries. None for a catalog without GPUs."""
    by_count: dict[int, list[str]] = {}
    for entry in catalog.types.values():
        if entry.gpus > 0:
            by_count.setdefault(entry.gpus, []).append(entry.name)
    terms = []
    for count, names in sorted(by_count.items()):
        regex = _regex_alternatives(sorted(names))
        sel = " or ".join(
            f'last_over_time({store.KUBE_NODE_LABELS}{{{ksm_label(label)}=~"{regex}"}}'
            f"[{window}])" for label in INSTANCE_TYPE_LABELS)
        terms.append(f"max by ({cl}, node) ({sel}) * {count}")
    for selector in catalog.selectors:
        if selector.entry.gpus > 0:
            matchers = ", ".join(f'{ksm_label(k)}="{v}"' for k, v in
                                 sorted(selector.labels.items()))
            terms.append(f"max by ({cl}, node) (last_over_time({store.KUBE_NODE_LABELS}"
                         f"{{{matchers}}}[{window}])) * {selector.entry.gpus}")
    return _or(terms) if terms else None


def gpus_missing_by_instance_type(catalog: Catalog, window: str, cl: str) -> str | None:
    """Nodes whose instance type has more GPUs than both Kubernetes' GPU capacity and the
    exporter's GPU count show; the value is the number lost. The exporter's node label
    (Hostname/hostname) is taken as the node name, as kube-state-metrics spells it."""
    expected = expected_by_instance_type(catalog, window, cl)
    if expected is None:
        return None
    capacity = store.KUBE_STATE_METRICS[0]
    k8s = (f"sum by ({cl}, node) (last_over_time({capacity}"
           f'{{resource=~"nvidia_com_gpu|nvidia_com_gpu_shared|amd_com_gpu"}}[{window}]))')
    shown = [f'label_replace({k8s}, "source", "kubernetes", "", "")']
    for p in store.PROFILES:
        count = gpu_count(p, window, cl)
        for label in node_labels(p):
            count = f'label_replace({count}, "node", "$1", "{label}", "(.+)")'
        shown.append(f'label_replace(max by ({cl}, node) ({count}), "source", "{p.vendor}", '
                     '"", "")')
    visible = f"max by ({cl}, node) ({' or '.join(f'({x})' for x in shown)})"
    return f"({expected}) - (({visible}) or ({expected}) * 0) > 0"


# -- failure modes of gpufleet's own exporter ------------------------------------------------------
def exporter_down(window: str, cl: str) -> str:
    return (f"max by ({cl}, {store.EXPORTER_NODE_LABEL}) "
            f"(last_over_time({store.EXPORTER_UP}[{window}])) == 0")


def collect_errors(window: str, cl: str) -> str:
    return (f"sum by ({cl}, {store.EXPORTER_NODE_LABEL}) "
            f"(increase({store.EXPORTER_COLLECT_ERRORS}[{window}])) > 0")


# -- the report's history: one fixed set of instant queries -------------------------------------
def _rows(client: HubClient, promql: str, at: float | None) -> list[dict[str, Any]]:
    res = client.query(promql, time=at)
    if res.warnings:
        raise PartialResponse(f"hub {client.safe_url} returned a partial response "
                              f"({res.warnings[0]}): report not trusted")
    return list(res.result or [])


def _node(p: VendorProfile, labels: Mapping[str, str]) -> str:
    return p.node(labels)


def read_history(client: HubClient, *, window: float, max_age: float, push_interval: float,
                 cluster_label: str = "cluster", at: float | None = None) -> HubHistory:
    """Ask the hub the report's history questions: 2 per vendor and 3 for the fleet."""
    w = format_duration(window)
    cl = cluster_label
    history = HubHistory(window=window)
    for p in store.PROFILES:
        for row in _rows(client, zero_usage(p, w, cl), at):
            labels = row.get("metric") or {}
            ident = p.identity(labels, cl)
            alloc = store.allocation(labels)
            if ident is None or alloc is None:
                continue
            gpu = ident.uuid + (f" {ident.mig_profile}/{ident.mig_instance or ''}"
                                if ident.mig_profile else "")
            seen = float(row["value"][1]) if row.get("value") else None
            history.zero_usage.append(GpuRef(ident.cluster, ident.node, gpu,
                                             f"{alloc[0]}/{alloc[1]}",
                                             None if seen is None else min(seen, window)))
        for row in _rows(client, stuck_exporter(p, w, cl), at):
            labels = row.get("metric") or {}
            history.stuck.append(NodeRef(labels.get(cl, ""), _node(p, labels)))
    push = format_duration(2 * push_interval)
    for row in _rows(client, exporter_down(push, cl), at):
        labels = row.get("metric") or {}
        history.exporter_down.append(NodeRef(labels.get(cl, ""),
                                             labels.get(store.EXPORTER_NODE_LABEL, "")))
    for row in _rows(client, collect_errors(w, cl), at):
        labels = row.get("metric") or {}
        history.collect_errors.append((NodeRef(labels.get(cl, ""),
                                               labels.get(store.EXPORTER_NODE_LABEL, "")),
                                       float(row["value"][1])))
    visible = _or([visible_gpus(p, format_duration(max_age), cl) for p in store.PROFILES])
    for row in _rows(client, visible, at):
        cluster = (row.get("metric") or {}).get(cl, "")
        history.visible[cluster] = history.visible.get(cluster, 0) + int(float(row["value"][1]))
    history.zero_usage.sort(key=lambda g: (g.cluster, g.node, g.gpu))
    history.stuck.sort(key=lambda n: (n.cluster, n.node))
    return history


# -- alerting rules --------------------------------------------------------------------------------
@dataclass(frozen=True)
class AlertSettings:
    max_age: float = CHECKS.max_age  # the adoption contract's freshness guarantee
    push_interval: float = LEDGER.push_interval  # ACM's default push interval
    window: float = CHECKS.window  # zero-usage and stuck-collector window
    lookback: float = 86400.0  # how long a silent cluster stays in the stale alert
    drop_offset: float = 3600.0  # GPU counts are compared with this long ago
    cluster_label: str = "cluster"
    namespace: str = "gpufleet"
    #: GPUs per instance type (hub.kube's catalog; None: the one shipped in gpufleet)
    catalog: Catalog | None = None


def _node_ref(cl: str) -> str:
    return f"{{{{ $labels.{cl} }}}}/{{{{ or $labels.Hostname $labels.hostname $labels.node }}}}"


def rules(s: AlertSettings) -> list[dict[str, Any]]:
    """The rules of group ``gpufleet``: both vendors in every expression."""
    cl = s.cluster_label
    age, push2 = format_duration(s.max_age), format_duration(2 * s.push_interval)
    window, lookback = format_duration(s.window), format_duration(s.lookback)
    offset = format_duration(s.drop_offset)
    profiles = store.PROFILES

    def seen(w: str) -> str:
        return _or([presence(p, w, cl) for p in profiles])

    where = f"{{{{ $labels.{cl} }}}}"
    node = _node_ref(cl)
    lost = gpus_missing_by_instance_type(s.catalog or shipped_catalog(), push2, cl)
    by_type = [{
        "alert": "GpuFleetGpusMissingByInstanceType",
        "expr": lost,
        "for": push2,
        "labels": {"severity": "critical"},
        "annotations": {
            "summary": f"{{{{ $value }}}} GPUs of {where}/{{{{ $labels.node }}}} are missing",
            "description": "The node's instance type has more GPUs than Kubernetes "
                           "advertises and the exporter reports: the device plugin or driver "
                           "is not running, or GPUs fell off the bus. `gpufleet reconcile` "
                           "says which (gpus_missing_by_instance_type).",
        },
    }] if lost else []
    return [
        {
            "alert": "GpuFleetClusterDataDelayed",
            "expr": f"({seen(age)}) unless ({seen(push2)})",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"GPU metrics of cluster {where} are late",
                "description": f"No GPU sample from cluster {where} for more than {push2} "
                               "(twice the push interval): at least one push was missed.",
            },
        },
        {
            "alert": "GpuFleetClusterDataStale",
            "expr": f"({seen(lookback)}) unless ({seen(age)})",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": f"GPU metrics of cluster {where} are stale",
                "description": f"No GPU sample from cluster {where} for more than {age}, the "
                               "freshness guarantee of the adoption contract.",
            },
        },
        {
            "alert": "GpuFleetExporterDown",
            "expr": exporter_down(push2, cl),
            "for": push2,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": f"gpufleet exporter on {where}/{{{{ $labels."
                           f"{store.EXPORTER_NODE_LABEL} }}}} cannot read its GPUs",
                "description": "gpufleet_exporter_up is 0: the GPU library failed; the node's "
                               "GPU metrics are missing or old.",
            },
        },
        {
            "alert": "GpuFleetExporterCollectErrors",
            "expr": collect_errors(window, cl),
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"gpufleet exporter on {where}/{{{{ $labels."
                           f"{store.EXPORTER_NODE_LABEL} }}}} fails to collect",
                "description": f"Collection errors in the last {window}.",
            },
        },
        {
            "alert": "GpuFleetGpuCountDropped",
            "expr": _or([gpu_count_dropped(p, push2, offset, cl) for p in profiles]),
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"GPUs disappeared on {node}",
                "description": f"The node reports fewer GPUs than {offset} ago (a node that "
                               "stopped reporting counts as 0).",
            },
        },
        {
            "alert": "GpuFleetGpuZeroUsage",
            "expr": _or([zero_usage(p, window, cl) for p in profiles]),
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"Allocated GPU idle on {node}",
                "description": f"Utilisation was exactly 0 for {window} while a pod is "
                               "allocated to the GPU.",
            },
        },
        {
            "alert": "GpuFleetGpuFailed",
            "expr": _or([gpu_failed(p, push2, cl) for p in profiles]),
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": f"GPU {{{{ or $labels.UUID $labels.gpu_uuid $labels.gpu_id }}}} "
                           f"failed on {node}",
                "description": "A fatal XID (48, 79, 95, 119, 120), double-bit ECC errors, a "
                               "row-remap failure or the exporter's unhealthy verdict: drain "
                               "the node and reset or replace the GPU.",
            },
        },
        {
            "alert": "GpuFleetExporterStuck",
            "expr": _or([stuck_exporter(p, window, cl) for p in profiles]),
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"GPU collector stuck on {node}",
                "description": f"Samples keep arriving but no GPU value changed in {window}.",
            },
        },
        *by_type,
    ]


def rule_groups(s: AlertSettings) -> dict[str, Any]:
    return {"groups": [{"name": GROUP, "rules": rules(s)}]}


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=1 << 16, allow_unicode=True)


def render_files(s: AlertSettings) -> dict[str, str]:
    """{file name: text}: a plain rules file and the same groups as a PrometheusRule."""
    groups = rule_groups(s)
    prometheus_rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "gpufleet-alerts",
            "namespace": s.namespace,
            "labels": {"app.kubernetes.io/name": "gpufleet",
                       "app.kubernetes.io/component": "alerts"},
        },
        "spec": groups,
    }
    header = "# Rendered by gpufleet alerts render: GPU fleet failure modes.\n"
    return {RULES_FILE: header + _dump(groups),
            PROMETHEUS_RULE_FILE: header + _dump(prometheus_rule)}
