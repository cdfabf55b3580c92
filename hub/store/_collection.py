"""What the hub reads, as each ACM collection path has to carry it, and what a cluster's GPUs
are seen through.

ACM Observability has two collection paths (FIELD_NOTES, fifth round). The legacy
metrics-collector forwards what the ``observability-metrics-custom-allowlist`` ConfigMap
names; the multicluster-observability-addon (MCOA) federates the in-cluster Prometheus'
``/federate`` with the ``match[]`` selectors of ScrapeConfig objects, and its recording rules
run in the spoke's own Prometheus (a PrometheusRule). Both are built here from the same lists
the sync and the ledger read (:func:`allowlist_metrics`, the kube-state-metrics names, the
GPU-pod matches and rules), so a name the hub starts reading reaches both paths at once.

The GPU pods' start, completion and phase are narrowed by recording rules on both paths.
The legacy collector evaluates its rules itself and pushes the result under the record name;
a PrometheusRule records into the same Prometheus the source series live in, where a record
named like its source would collide with it. So under MCOA the rules record under
``gpufleet:<name>:gpu_pods`` and the ScrapeConfig's metricRelabelings give the federated
series back its kube-state-metrics name: the hub reads one set of names on either path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from hub.common import DCGM_DRIVER_LABELS, DCGM_RENAMES
from hub.common import DCGM_FB_CAPACITY as FB_CAPACITY
from hub.store._allocation import (
    EDGE_END,
    EDGE_START,
    allocation_matches,
    allocation_recording_rules,
)
from hub.store._fields import (
    EXPORTER_HEALTH_METRICS,
    EXPORTER_UP,
    KUBE_NODE_INFO,
    KUBE_NODE_LABELS,
    KUBE_NODE_UNSCHEDULABLE,
    KUBE_STATE_METRICS,
)
from hub.store._naming import BOTH, DCGM47, LEGACY, dcgm_names
from hub.store._profiles import PROFILES, cluster_count_query, profile
from hub.store._usage import USAGE_PROFILING_FIELDS

LEGACY_COLLECTION, MCOA_COLLECTION = "legacy", "mcoa"
#: ``--acm-collection``: the two paths, and ``auto`` (read the hub's MultiClusterObservability)
ACM_COLLECTIONS = (LEGACY_COLLECTION, MCOA_COLLECTION)

#: kube-state-metrics' node resources the hub reads: GPU ones (capacity and allocatable), and
#: cpu capacity, so that a node without GPUs is known to exist (``reconcile --source hub``)
KSM_GPU_RESOURCES = "nvidia_com_.+|amd_com_.+"

#: record names of the MCOA recording rules, and the relabelling that takes them back
_RULE_PREFIX, _RULE_SUFFIX = "gpufleet:", ":gpu_pods"
_RULE_NAME = re.compile(f"{re.escape(_RULE_PREFIX)}(.+){re.escape(_RULE_SUFFIX)}")


def mcoa_record(name: str) -> str:
    """The name an MCOA recording rule records ``name`` under (never ``name`` itself)."""
    return f"{_RULE_PREFIX}{name}{_RULE_SUFFIX}"


def mcoa_recording_rules() -> list[dict[str, str]]:
    """The legacy allowlist's recording rules, recorded under names of their own."""
    return [{"record": mcoa_record(rule["record"]), "expr": rule["expr"]}
            for rule in allocation_recording_rules()]


def mcoa_metric_relabelings() -> list[dict[str, object]]:
    """The ScrapeConfig's metricRelabelings (prometheus-operator's camelCase spelling): the
    recorded GPU-pod series get their kube-state-metrics names back."""
    return [{"sourceLabels": ["__name__"], "regex": _RULE_NAME.pattern,
             "targetLabel": "__name__", "replacement": "$1", "action": "replace"}]


def _name(metric: str) -> str:
    return f'{{__name__="{metric}"}}'


def exporter_selectors() -> list[str]:
    """``match[]`` selectors of every GPU exporter series the hub reads: both dcgm namings,
    both AMD spellings, gpufleet's exporter health and allocation edges."""
    kube = {KUBE_NODE_LABELS, KUBE_NODE_INFO, KUBE_NODE_UNSCHEDULABLE}
    return [_name(m) for m in allowlist_metrics() if m not in kube]


def kube_selectors() -> list[str]:
    """``match[]`` selectors of kube-state-metrics' series the hub reads: node capacity
    (GPU resources and cpu) and allocatable, node labels and info, the GPU pods' requests,
    and the recorded start, completion and phase of GPU pods. MCOA's default set lacks the
    capacity, the node labels and the phase, which the legacy default allowlist had."""
    capacity, allocatable = KUBE_STATE_METRICS
    return [
        f'{{__name__="{capacity}",resource=~"{KSM_GPU_RESOURCES}|cpu"}}',
        f'{{__name__="{allocatable}",resource=~"{KSM_GPU_RESOURCES}"}}',
        _name(KUBE_NODE_LABELS),
        _name(KUBE_NODE_INFO),
        _name(KUBE_NODE_UNSCHEDULABLE),
        *(f"{{{match}}}" for match in allocation_matches()),
        *(_name(rule["record"]) for rule in mcoa_recording_rules()),
    ]


def federate_selectors() -> list[str]:
    """Every ``match[]`` selector an MCOA ScrapeConfig carries for gpufleet (one scrape of
    platform monitoring's /federate)."""
    return [*exporter_selectors(), *kube_selectors()]


# -- what a cluster's GPUs are seen through -----------------------------------------------------
#: the extra arms of the sync's planning query, by the value of this label
SOURCE_LABEL = "gpufleet_source"
CARD_INFO = "card-info"  # node_accelerator_card_info (node-exporter; ACM 2.17 forwards it)
ACCELERATOR = "accelerator"  # OpenShift's accelerator_* recording rules (legacy dcgm names)
GPUFLEET_EXPORTER = "gpufleet-exporter"  # gpufleet's own exporter's health series
ACM_MANAGED = "acm-managed"  # acm_managed_cluster_labels: ACM expects the cluster
ACM_MAINTENANCE = "acm-maintenance"  # ... in maintenance_mode: silence is expected
CARD_INFO_METRIC = "node_accelerator_card_info"
ACCELERATOR_METRIC = "accelerator_gpu_utilization"
ACM_CLUSTER_LABELS = "acm_managed_cluster_labels"
#: node_accelerator_card_info's vendor values of the GPUs gpufleet reads (the collector also
#: lists NICs and other accelerators)
CARD_VENDORS = "(?i)nvidia|amd"

#: what a cluster's GPUs are seen through (``inventory clusters``, the report, the API)
SEEN_DCGM = {LEGACY: "dcgm legacy", DCGM47: "dcgm 4.7", BOTH: "both"}
SEEN_AMD = "amd"
SEEN_GPUFLEET = "gpufleet exporter"
SEEN_CARD_INFO = "card info only"
SEEN_NONE = "none"


def source_arms(window: str, cluster_label: str) -> list[str]:
    """Terms the sync's planning query adds (``or``) beside its per-cluster GPU count, each
    carrying ``gpufleet_source``: cards that node-exporter or OpenShift's rules see, whether
    gpufleet's exporter runs, and which clusters ACM manages (and which are in maintenance).
    Node-level or cluster-level series only: a few per node, nothing per GPU series."""
    def tagged(expr: str, source: str) -> str:
        return f'label_replace({expr}, "{SOURCE_LABEL}", "{source}", "", "")'

    def count(selector: str) -> str:
        return f"count by ({cluster_label}) (last_over_time({selector}[{window}]))"

    def managed(maintenance: str) -> str:
        # hub-side series: the cluster is its ``name`` label
        named = (f'label_replace(last_over_time({ACM_CLUSTER_LABELS}'
                 f'{{maintenance_mode{maintenance}"true"}}[{window}]), '
                 f'"{cluster_label}", "$1", "name", "(.+)")')
        return f"count by ({cluster_label}) ({named})"

    return [
        tagged(count(f'{CARD_INFO_METRIC}{{vendor=~"{CARD_VENDORS}"}}'), CARD_INFO),
        tagged(count(ACCELERATOR_METRIC), ACCELERATOR),
        tagged(count(EXPORTER_UP), GPUFLEET_EXPORTER),
        tagged(managed("!="), ACM_MANAGED),
        tagged(managed("="), ACM_MAINTENANCE),
    ]


def seen_through(vendors: Iterable[str], naming: str | None,
                 sources: Mapping[str, int]) -> str:
    """What a cluster's GPUs are seen through, from the vendors of its reporting GPUs, its
    dcgm naming and the planning query's sources. A cluster whose cards are known from
    node-exporter or OpenShift's rules but whose exporter sends nothing is ``card info only``,
    never a cluster of 0 GPUs."""
    reporting = set(vendors)
    parts: list[str] = []
    if reporting and sources.get(GPUFLEET_EXPORTER):
        parts.append(SEEN_GPUFLEET)
    else:
        if "nvidia" in reporting:
            parts.append(SEEN_DCGM.get(naming or LEGACY, SEEN_DCGM[LEGACY]))
        if "amd" in reporting:
            parts.append(SEEN_AMD)
    if parts:
        return " + ".join(parts)
    if sources.get(CARD_INFO) or sources.get(ACCELERATOR):
        return SEEN_CARD_INFO
    return SEEN_NONE


def known_cards(sources: Mapping[str, int]) -> int | None:
    """GPU cards a cluster has by node-exporter's card info (or OpenShift's accelerator
    series), whatever its exporter sends; None when neither reaches the hub."""
    cards = max(sources.get(CARD_INFO, 0), sources.get(ACCELERATOR, 0))
    return cards or None


def planning_query(window: str, cluster_label: str, *, count: bool = True) -> str:
    """The sync's one planning request: GPUs per cluster (rows without ``gpufleet_source``:
    they plan the shards) and each cluster's sources (rows with it). ``count`` False asks
    the sources alone, for a sync that plans from the inventory's sizes: the count reads
    every GPU's sample-time series over the window, as much of the store's work as one
    field's query (1.25 s of store CPU at 100,000 GPUs), while the sources read a few series
    a node."""
    arms = source_arms(window, cluster_label)
    return " or ".join([cluster_count_query(window, cluster_label), *arms] if count else arms)


def acm_view(sources: Mapping[str, int]) -> str | None:
    """How ACM lists the cluster: ``maintenance`` (silence expected), ``managed``, or None
    (not in acm_managed_cluster_labels, or no ACM behind the hub)."""
    if sources.get(ACM_MAINTENANCE):
        return "maintenance"
    return "managed" if sources.get(ACM_MANAGED) else None


# -- what dcgm-exporter collects where a spoke pins its CSV ------------------------------
#: dcgm-exporter's default collectors (etc/default-counters.csv, the 25 uncommented rows, in
#: the legacy naming): what every consumer of a GPU Operator's dcgm-exporter gets unless a
#: custom CSV replaces the list. gpufleet's pinned CSV keeps them all (the OpenShift console's
#: GPU dashboard, other teams' Grafana and alerts read them) and adds what the hub reads.
DCGM_DEFAULT_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
     "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
     "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is "
     "active sending or receiving data."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "counter", "The number of bytes of active pcie tx data "
     "including both header and payload."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "counter", "The number of bytes of active pcie rx data "
     "including both header and payload."),
)


def dcgm_collectors(naming: str) -> list[tuple[str, str, str]]:
    """dcgm-exporter's collectors CSV rows (field, Prometheus type, help): its default set
    (DCGM_DEFAULT_COUNTERS) plus the fields the hub reads, in one naming: what ``spoke render
    --dcgm-names`` pins, so that an operator upgrade (4.9 renames the defaults) cannot change
    the series under the hub, and no consumer of the exporter loses a field it had. DCGM 4.7
    still resolves the legacy names; a 4.6 host engine does not know the new ones."""
    nvidia = profile("nvidia")
    spelled = dcgm_names(naming)
    units = {r.legacy: r.dcgm47_unit if naming == DCGM47 else r.legacy_unit
             for r in DCGM_RENAMES}
    driver = DCGM_DRIVER_LABELS[1] if naming == DCGM47 else DCGM_DRIVER_LABELS[0]
    rows: dict[str, tuple[str, str, str]] = {}
    for legacy, kind, text in DCGM_DEFAULT_COUNTERS:
        name = driver if legacy == DCGM_DRIVER_LABELS[0] else spelled.get(legacy, legacy)
        unit = units.get(legacy)
        if unit and "(in " in text:  # the help says the unit the name now arrives in
            text = f"{text.split(' (in ')[0]} ({'a 0-1 ratio' if unit == '0-1' else 'in ' + unit})."
        if name != legacy and kind == "counter" and not name.endswith("_TOTAL"):
            kind = "gauge"  # 4.7's throughput in bytes per second is a rate, not a count
        rows[name] = (name, kind, text)
    read = [*(m for ms in nvidia.value_fields.values() for m in ms),
            *nvidia.timestamp_metrics,
            # CLOCK_THROTTLE_REASONS is CLOCKS_EVENT_REASONS from DCGM 3.2 on
            *(ms[-1] if naming == DCGM47 else ms[0] for ms in nvidia.health_fields.values()),
            *(m for ms in USAGE_PROFILING_FIELDS["nvidia"].values() for m in ms)]
    for legacy in read:
        if legacy in (FB_CAPACITY, "DCGM_FI_DEV_FB_TOTAL"):
            continue  # the size: 4.7's own field, added below; FB_TOTAL is not needed
        name = spelled.get(legacy, legacy)
        if name in rows:
            continue  # a default field: its own type and help
        kind = "counter" if name.endswith("_TOTAL") and "REMAP" not in name else "gauge"
        unit = units.get(legacy)
        rows[name] = (name, kind, f"read by gpufleet ({unit})" if unit else "read by gpufleet")
    if naming == DCGM47:
        rows[FB_CAPACITY] = (FB_CAPACITY, "gauge", "read by gpufleet (bytes)")
    return list(rows.values())


# -- the one list of names the collection paths and alert rules carry -----------------------
#: Metric names the hub's sync and checks read, for both vendors: the single source of the
#: ACM allowlist (``observability-metrics-custom-allowlist``), MCOA's selectors and alert rules.
def allowlist_metrics() -> list[str]:
    names: set[str] = set()
    for p in PROFILES:
        metrics = [*(m for ms in p.value_fields.values() for m in ms), *p.timestamp_metrics,
                   *(m for ms in p.health_fields.values() for m in ms),
                   *(m for ms in USAGE_PROFILING_FIELDS.get(p.vendor, {}).values() for m in ms)]
        names.update(name for m in metrics for name in p.names(m))
    names.update(EXPORTER_HEALTH_METRICS)
    # gpufleet's exporter's allocation edges: per GPU pod only, bounded by the GPUs
    names.update((EDGE_START, EDGE_END))
    # reconcile --source hub reads node labels (MIG strategy, time-slicing replicas) from
    # kube-state-metrics; ACM's default allowlist forwards the capacity series, not these.
    names.add(KUBE_NODE_LABELS)
    # ... and each node's spec.providerID (kube_node_info's provider_id label), which joins
    # a cloud bill's lines to the node (`usage --bill`)
    names.add(KUBE_NODE_INFO)
    # ... and whether a node is cordoned: its GPUs are not free (`capacity`, placement scores)
    names.add(KUBE_NODE_UNSCHEDULABLE)
    return sorted(names)
