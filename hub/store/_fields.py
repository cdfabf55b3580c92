"""The neutral names every reader of the store shares: an observation's fields, where a series
belongs (its GPU or slice, its pod), and the names of the non-exporter series the hub reads
(gpufleet's exporter health, kube-state-metrics' node series).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# Neutral value fields of an observation.
UTILISATION = "utilisation_pct"
MEMORY_USED = "memory_used_mib"
MEMORY_FREE = "memory_free_mib"
MEMORY_RESERVED = "memory_reserved_mib"
MEMORY_TOTAL = "memory_total_mib"
POWER = "power_w"
TEMPERATURE = "temperature_c"
ENGINE_ACTIVE = "engine_active_pct"  # profiling counter; the utilisation of MIG slices
# Neutral health fields of an observation (read by the inventory's health assessment).
LAST_XID = "last_xid"  # value of the last XID error (0: none)
ECC_DBE = "ecc_dbe"  # volatile double-bit / uncorrectable ECC errors
ROW_REMAP_FAILURE = "row_remap_failure"  # 1: a row could not be remapped
CLOCKS_EVENT_REASONS = "clocks_event_reasons"  # NVML clocks-event (throttle) bitmask
DEVICE_HEALTH = "device_health"  # exporter's own verdict: 1 healthy, 0 not (AMD gpu_health)


@dataclass(frozen=True)
class Identity:
    """Where a series belongs: one physical GPU, or one MIG slice of it."""

    cluster: str
    node: str
    uuid: str
    mig_profile: str | None = None
    mig_instance: str | None = None


@dataclass(frozen=True)
class Query:
    """One PromQL request of a sync, and which parser reads its result."""

    vendor: str
    kind: str  # "timestamp" | "values" | "presence"
    promql: str
    #: the neutral field a "values" query fills; for "timestamp", the field its newest
    #: samples' values fill too (when the clock family is that field's only metric)
    field: str | None = None



POD_LABELS = [
    "namespace", "pod", "container",
    "exported_namespace", "exported_pod", "exported_container",
]


#: Pod names of the exporters themselves (dcgm-exporter under the GPU Operator or Helm, AMD's
#: device-metrics-exporter, gpufleet's own). Scraped through a ServiceMonitor without
#: honorLabels, an idle GPU's series carry only these *target* labels (the exporter's pod and
#: namespace), while a workload's labels arrive as ``exported_*``.
#: One regex for Python and PromQL (RE2, fully anchored by Prometheus's =~ / !~).
EXPORTER_POD_REGEX = (r"(nvidia-)?dcgm-exporter(-.*)?"
                      r"|(amd-)?(gpu-)?(device-)?metrics-exporter(-.*)?"
                      r"|gpufleet-exporter(-.*)?")
_EXPORTER_POD = re.compile(f"(?:{EXPORTER_POD_REGEX})")


def is_exporter_pod(pod: str) -> bool:
    return bool(_EXPORTER_POD.fullmatch(pod))


def allocation(labels: Mapping[str, str]) -> tuple[str, str, str] | None:
    """(namespace, pod, container) of the workload using a GPU, or None when unallocated.

    The rule, for every vendor: ``exported_pod`` / ``exported_namespace`` /
    ``exported_container`` (Prometheus renamed the exporter's own labels because the target
    carries the same names) win over ``pod`` / ``namespace`` / ``container``. When no
    ``exported_pod`` is present and ``pod`` names the exporter's own pod, those are the
    scrape target's labels, not a user: the GPU is unallocated. The exporter is never a
    GPU's user.
    """
    pod = labels.get("exported_pod") or ""
    if pod:
        ns = labels.get("exported_namespace") or ""
        container = labels.get("exported_container") or ""
        return ns, pod, container
    pod = labels.get("pod") or ""
    if not pod or is_exporter_pod(pod):
        return None
    return labels.get("namespace") or "", pod, labels.get("container") or ""


def gpu_index(text: str | None) -> int | None:
    """A GPU's index label as the integer column holds it; None for anything else (a
    superscript digit, which ``isdigit`` accepts and ``int`` refuses, or 30 digits, which
    PostgreSQL's integer refuses for the whole sync)."""
    if text and text.isascii() and text.isdigit() and len(text) <= 9:
        return int(text)
    return None



#: Metric names the hub's sync and checks read, for both vendors: the single source of the
#: ACM allowlist (``observability-metrics-custom-allowlist``) and of alert rules.
EXPORTER_HEALTH_METRICS = [
    "gpufleet_exporter_up",
    "gpufleet_exporter_collect_errors_total",
    "gpufleet_exporter_last_collect_timestamp_seconds",
]
KUBE_STATE_METRICS = ["kube_node_status_capacity", "kube_node_status_allocatable"]



# -- label roles and extra series, for validation queries and alert rules (issue 5) ----------
#: Which of a profile's ``id_labels`` name the node a series comes from, and which name a MIG
#: slice inside a GPU; the remaining id labels identify the physical GPU. Report queries and
#: alert rules group by these roles, so they stay fixed-size and vendor-neutral.
EXPORTER_UP, EXPORTER_COLLECT_ERRORS, EXPORTER_LAST_COLLECT = EXPORTER_HEALTH_METRICS
#: the node label of gpufleet's exporter health series (spoke/_naming.py HEALTH_NODE_LABEL)
EXPORTER_NODE_LABEL = "hostname"
#: kube-state-metrics' node labels (label_<sanitised name>; only labels on its allowlist)
KUBE_NODE_LABELS = "kube_node_labels"
#: kube-state-metrics' node facts; its ``provider_id`` label is the node's spec.providerID
KUBE_NODE_INFO = "kube_node_info"
KUBE_PROVIDER_ID = "provider_id"
#: kube-state-metrics' cordon: 1 where the Node's spec.unschedulable is true
KUBE_NODE_UNSCHEDULABLE = "kube_node_spec_unschedulable"
