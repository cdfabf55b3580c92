"""Everything gpufleet knows about exporter metric names and label spellings, in one place.

Nothing outside this module knows that NVIDIA calls a GPU ``UUID`` and AMD calls it
``gpu_uuid``, that dcgm-exporter spells the node ``Hostname`` in released images and
``hostname`` on master, or that AMD names may carry an ``amd_`` prefix. Each profile turns the
hub's (already aggregated) PromQL rows into plain dicts of neutral field names; ``normalize``
merges those into observations without knowing which exporter produced them.

The queries are fixed per vendor: their number never depends on the size of the fleet, and
each one lets PromQL aggregate away every label we do not store, so a response carries one
row per GPU and no more.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
    kind: str  # "identity" | "timestamp" | "values"
    promql: str
    field: str | None = None  # the neutral field a "values" query fills


def _by(labels: list[str]) -> str:
    return ", ".join(labels)


class VendorProfile(ABC):
    """Metric names, label spellings and unit conversions of one exporter family."""

    vendor: str = ""
    #: label names that identify a series' GPU or slice (aggregation keeps exactly these)
    id_labels: list[str] = []
    #: the id labels that name the node (in order of preference) and a MIG slice
    node_labels: list[str] = []
    slice_labels: list[str] = []
    #: static attributes of a GPU (model, driver, ...) kept in the identity query
    attr_labels: list[str] = []
    #: device-level series: any metric whose name matches and carries this matcher is a GPU's
    device_names: str = ""
    device_matcher: str = ""
    #: neutral field -> metric names (without prefix), in order of preference
    value_fields: dict[str, list[str]] = {}
    #: metrics whose sample timestamps stand for the GPU's (scraped together)
    timestamp_metrics: list[str] = []
    #: neutral health field -> metric names, in order of preference; fetched like values, one
    #: query each, but kept apart so utilisation checks (stuck, zero usage) do not read them
    health_fields: dict[str, list[str]] = {}
    name_prefixes: tuple[str, ...] = ("",)

    def _names(self, metric: str) -> str:
        return "|".join(prefix + metric for prefix in self.name_prefixes)

    def queries(self, window: str, step: str, cluster_label: str) -> list[Query]:
        ids = _by([cluster_label, *self.id_labels])
        ident = _by([cluster_label, *self.id_labels, *self.attr_labels, *POD_LABELS])
        match = self.device_matcher
        device = f'{{__name__=~"{self.device_names}", {match}}}'
        identity = f"group by ({ident}) (last_over_time({device}[{window}]))"
        # timestamp() of a raw selector is the sample's own time, but it drops __name__, so a
        # regex over several names would collide: chain known names with `or` instead. The
        # instant part sees the newest sample; the subquery finds samples hidden by a
        # staleness marker (a target that went away) anywhere in the window.
        chain = " or ".join(
            f"timestamp({prefix}{name}{{{match}}})"
            for prefix in self.name_prefixes
            for name in self.timestamp_metrics
        )
        per_gpu = f"max by ({ids}) ({chain})"
        timestamps = f"{per_gpu} or max_over_time(({per_gpu})[{window}:{step}])"
        out = [Query(self.vendor, "identity", identity),
               Query(self.vendor, "timestamp", timestamps)]
        # One request per field keeps each response small (one value per GPU) however large
        # the fleet; `or` picks the preferred metric where an exporter offers several.
        for fld, metrics in {**self.value_fields, **self.health_fields}.items():
            promql = " or ".join(
                f'max by ({ids}) (last_over_time({{__name__=~"{self._names(m)}", {match}}}'
                f"[{window}]))"
                for m in metrics
            )
            out.append(Query(self.vendor, "values", promql, fld))
        return out

    # -- parsing of aggregated rows -------------------------------------------------------
    def node(self, labels: Mapping[str, str]) -> str:
        """The node a series comes from: the first node label that is set."""
        return next((labels[n] for n in self.node_labels if labels.get(n)), "")

    @abstractmethod
    def identity(self, labels: Mapping[str, str], cluster_label: str) -> Identity | None:
        """The GPU (or slice) a series belongs to; None for series that are not per-GPU."""

    @abstractmethod
    def attributes(self, labels: Mapping[str, str]) -> dict[str, Any]:
        """Static attributes of the GPU (index, model, driver, ...)."""

    def convert(self, field: str, value: float) -> float:
        """Unit conversion into the neutral units (MiB, W, °C, percent)."""
        return value


POD_LABELS = [
    "namespace", "pod", "container",
    "exported_namespace", "exported_pod", "exported_container",
]


def allocation(labels: Mapping[str, str]) -> tuple[str, str, str] | None:
    """(namespace, pod, container) of a series, honouring Prometheus's ``exported_`` renames."""
    ns = labels.get("exported_namespace") or labels.get("namespace") or ""
    pod = labels.get("exported_pod") or labels.get("pod") or ""
    if not pod:
        return None
    container = labels.get("exported_container") or labels.get("container") or ""
    return ns, pod, container


class Nvidia(VendorProfile):
    """NVIDIA dcgm-exporter (and gpufleet's own exporter, which speaks the same names)."""

    vendor = "nvidia"
    id_labels = ["Hostname", "hostname", "UUID", "GPU_I_PROFILE", "GPU_I_ID"]
    node_labels = ["Hostname", "hostname"]  # released images / master since 2026-05
    slice_labels = ["GPU_I_PROFILE", "GPU_I_ID"]
    # serial: gpufleet's exporter only (nvmlDeviceGetSerial); dcgm-exporter has no such label
    attr_labels = ["gpu", "modelName", "DCGM_FI_DRIVER_VERSION", "pci_bus_id", "serial"]
    device_names = "DCGM_FI_.+"
    device_matcher = 'UUID!=""'
    value_fields = {
        UTILISATION: ["DCGM_FI_DEV_GPU_UTIL"],
        ENGINE_ACTIVE: ["DCGM_FI_PROF_GR_ENGINE_ACTIVE"],
        MEMORY_USED: ["DCGM_FI_DEV_FB_USED"],
        MEMORY_FREE: ["DCGM_FI_DEV_FB_FREE"],
        MEMORY_RESERVED: ["DCGM_FI_DEV_FB_RESERVED"],
        POWER: ["DCGM_FI_DEV_POWER_USAGE"],
        TEMPERATURE: ["DCGM_FI_DEV_GPU_TEMP"],
    }
    timestamp_metrics = [
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_XID_ERRORS",
    ]
    health_fields = {
        LAST_XID: ["DCGM_FI_DEV_XID_ERRORS"],
        ECC_DBE: ["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"],  # opt-in in dcgm-exporter, on in ours
        ROW_REMAP_FAILURE: ["DCGM_FI_DEV_ROW_REMAP_FAILURE"],
        # dcgm-exporter's name; DCGM 3.2+ also calls the field CLOCKS_EVENT_REASONS
        CLOCKS_EVENT_REASONS: ["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                               "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"],
    }

    def identity(self, labels: Mapping[str, str], cluster_label: str) -> Identity | None:
        uuid = labels.get("UUID")
        if not uuid:
            return None
        profile = labels.get("GPU_I_PROFILE") or None
        instance = labels.get("GPU_I_ID") or None
        if profile is None and instance is not None:
            profile = "unknown"
        return Identity(labels.get(cluster_label, ""), self.node(labels), uuid,
                        profile, instance if profile else None)

    def attributes(self, labels: Mapping[str, str]) -> dict[str, Any]:
        index = labels.get("gpu")
        return {
            "index": int(index) if index and index.isdigit() else None,
            "model": labels.get("modelName") or None,
            "driver_version": labels.get("DCGM_FI_DRIVER_VERSION") or None,
            "pci_bus_id": labels.get("pci_bus_id") or None,
            "serial": labels.get("serial") or None,
        }

    def convert(self, field: str, value: float) -> float:
        if field == ENGINE_ACTIVE:
            return value * 100.0  # DCGM profiling counters are ratios 0-1
        return value


class Amd(VendorProfile):
    """AMD device-metrics-exporter, with or without its ``amd_`` name prefix."""

    vendor = "amd"
    id_labels = ["hostname", "gpu_id", "gpu_uuid", "serial_number"]
    node_labels = ["hostname"]
    attr_labels = ["card_series", "card_model", "driver_version", "gpu_partition_id"]
    device_names = "(amd_)?gpu_.+"
    device_matcher = 'gpu_id!=""'
    name_prefixes = ("", "amd_")
    value_fields = {
        UTILISATION: ["gpu_gfx_activity"],
        MEMORY_USED: ["gpu_used_vram"],
        MEMORY_FREE: ["gpu_free_vram"],
        MEMORY_TOTAL: ["gpu_total_vram"],
        POWER: ["gpu_power_usage", "gpu_package_power"],
        TEMPERATURE: ["gpu_edge_temperature", "gpu_junction_temperature"],
    }
    timestamp_metrics = [
        "gpu_gfx_activity", "gpu_used_vram", "gpu_total_vram", "gpu_power_usage",
        "gpu_package_power", "gpu_edge_temperature", "gpu_junction_temperature", "gpu_health",
    ]
    health_fields = {
        DEVICE_HEALTH: ["gpu_health"],
        ECC_DBE: ["gpu_ecc_uncorrect_total"],
    }

    def identity(self, labels: Mapping[str, str], cluster_label: str) -> Identity | None:
        gpu_id = labels.get("gpu_id")
        if not gpu_id:
            return None
        node = self.node(labels)
        uuid = labels.get("gpu_uuid") or ""
        if not uuid:
            serial = labels.get("serial_number") or ""
            uuid = f"serial:{serial}" if serial else f"{node}/{gpu_id}"
        return Identity(labels.get(cluster_label, ""), node, uuid)

    def attributes(self, labels: Mapping[str, str]) -> dict[str, Any]:
        gpu_id = labels.get("gpu_id") or ""
        return {
            "index": int(gpu_id) if gpu_id.isdigit() else None,
            "model": labels.get("card_series") or labels.get("card_model") or None,
            "driver_version": labels.get("driver_version") or None,
            "serial": labels.get("serial_number") or None,
        }

    # VRAM is reported in MB; like the AMD tools we take it as MiB (FIELD_NOTES).


PROFILES: tuple[VendorProfile, ...] = (Nvidia(), Amd())


def sync_queries(window: str, step: str, cluster_label: str) -> list[Query]:
    """The whole, fixed request set of one sync."""
    return [q for profile in PROFILES for q in profile.queries(window, step, cluster_label)]


def profile(vendor: str) -> VendorProfile:
    for p in PROFILES:
        if p.vendor == vendor:
            return p
    raise KeyError(vendor)


#: Metric names the hub's sync and checks read, for both vendors: the single source of the
#: ACM allowlist (``observability-metrics-custom-allowlist``) and of alert rules.
EXPORTER_HEALTH_METRICS = [
    "gpufleet_exporter_up",
    "gpufleet_exporter_collect_errors_total",
    "gpufleet_exporter_last_collect_timestamp_seconds",
]
KUBE_STATE_METRICS = ["kube_node_status_capacity", "kube_node_status_allocatable"]


def allowlist_metrics() -> list[str]:
    names: set[str] = set()
    for p in PROFILES:
        for prefix in p.name_prefixes:
            names.update(prefix + m for ms in p.value_fields.values() for m in ms)
            names.update(prefix + m for m in p.timestamp_metrics)
            names.update(prefix + m for ms in p.health_fields.values() for m in ms)
    names.update(EXPORTER_HEALTH_METRICS)
    # reconcile --source hub reads node labels (MIG strategy, time-slicing replicas) from
    # kube-state-metrics; ACM's default allowlist forwards the capacity series, not these.
    names.add(KUBE_NODE_LABELS)
    return sorted(names)


# -- label roles and extra series, for validation queries and alert rules (issue 5) ----------
#: Which of a profile's ``id_labels`` name the node a series comes from, and which name a MIG
#: slice inside a GPU; the remaining id labels identify the physical GPU. Report queries and
#: alert rules group by these roles, so they stay fixed-size and vendor-neutral.
NODE_LABELS: dict[str, list[str]] = {p.vendor: p.node_labels for p in PROFILES}
SLICE_LABELS: dict[str, list[str]] = {p.vendor: p.slice_labels for p in PROFILES}
EXPORTER_UP, EXPORTER_COLLECT_ERRORS, EXPORTER_LAST_COLLECT = EXPORTER_HEALTH_METRICS
#: the node label of gpufleet's exporter health series (spoke/_naming.py HEALTH_NODE_LABEL)
EXPORTER_NODE_LABEL = "hostname"
#: kube-state-metrics' node labels (label_<sanitised name>; only labels on its allowlist)
KUBE_NODE_LABELS = "kube_node_labels"
