"""Everything gpufleet knows about exporter metric names and label spellings, in one place.

Nothing outside this module knows that NVIDIA calls a GPU ``UUID`` and AMD calls it
``gpu_uuid``, that dcgm-exporter spells the node ``Hostname`` in released images and
``hostname`` on master, or that AMD names may carry an ``amd_`` prefix. Each profile turns the
hub's PromQL rows into plain dicts of neutral field names; ``normalize``
merges those into observations without knowing which exporter produced them.

The queries are fixed per vendor: their number never depends on the size of the fleet. Each
names its metrics exactly (no ``__name__`` regex, which the store matches against every name
in its index and which keeps Thanos from pruning its store fan-out).
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hub.common import DCGM_DRIVER_LABELS, DCGM_RENAMES, parse_duration
from hub.common import DCGM_FB_CAPACITY as FB_CAPACITY

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
    kind: str  # "timestamp" | "values" | "presence" | "naming"
    promql: str
    #: the neutral field a "values" query fills; for "timestamp", the field its newest
    #: samples' values fill too (when the clock family is that field's only metric)
    field: str | None = None


class VendorProfile(ABC):
    """Metric names, label spellings and unit conversions of one exporter family."""

    vendor: str = ""
    #: label names that identify a series' GPU or slice (aggregation keeps exactly these)
    id_labels: list[str] = []
    #: the id labels that name the node (in order of preference) and a MIG slice
    node_labels: list[str] = []
    slice_labels: list[str] = []
    #: device-level series carry this matcher (node-level ones such as gpu_nodes_total do not)
    device_matcher: str = ""
    #: neutral field -> metric names (without prefix), in order of preference
    value_fields: dict[str, list[str]] = {}
    #: metrics whose sample timestamps stand for the GPU's (scraped together): alert rules
    timestamp_metrics: list[str] = []
    #: the one family whose sample times the sync reads for every series (see queries())
    clock_metric: str = ""
    #: neutral health field -> metric names, in order of preference; fetched like values, one
    #: query each, but kept apart so utilisation checks (stuck, zero usage) do not read them
    health_fields: dict[str, list[str]] = {}
    name_prefixes: tuple[str, ...] = ("",)
    #: device-level metric names of the exporter's whole field list that no value or health
    #: query reads: a GPU whose exporter sends only these (a trimmed counter set) is found by
    #: the presence query, with its fields left null (adoption contract N3, N4)
    presence_metrics: list[str] = []
    #: labels that carry a GPU's attributes (index, model, driver, ...), kept by the presence
    #: query beside the id labels so a GPU found only there still has them
    attribute_labels: list[str] = []

    #: metric -> (its other exact name, factor into the metric's own unit): NVIDIA's
    #: dcgm-4.7 names (DCGM_RENAMES); a name that arrives in another unit than its field's
    #: (``units``) is converted in the PromQL of every query that reads its value
    renames: dict[str, tuple[str, float]] = {}
    units: dict[str, float] = {}

    def spellings(self, metric: str) -> list[tuple[str, float]]:
        """Every exact name ``metric`` arrives under, in order of preference (the exporter's
        own spelling first), with the factor that turns its value into ``metric``'s unit."""
        out = [(prefix + metric, self.units.get(metric, 1.0)) for prefix in self.name_prefixes]
        other = self.renames.get(metric)
        if other is not None:
            out += [(prefix + other[0], other[1]) for prefix in self.name_prefixes]
        return out

    def names(self, metric: str) -> list[str]:
        return [name for name, _ in self.spellings(metric)]

    def _any_name(self, metric: str, selector: str) -> str:
        """``selector`` (with ``{}`` for the metric name) over each spelling, chained with
        ``or``: exact names only, so Thanos can prune its store fan-out. No conversion: for
        selectors whose value is not the metric's (``timestamp``, ``count``)."""
        return " or ".join(selector.format(name) for name in self.names(metric))

    def arms(self, metric: str, selector: str, window: str,
             matcher: str | None = None) -> list[str]:
        """``selector`` (``{}`` for the name) over each spelling, each arm converted into
        the metric's unit by name: the terms a caller joins with ``or`` (first wins per
        label set, so a GPU sending two spellings at once counts once). ``window`` is what
        a name of two possible units (PERCENT_OR_RATIO) is judged over, with ``matcher``
        (the selector's own: a sync shard's too; None: the device matcher)."""
        return [convert_arm(name, factor, selector.format(name),
                            self.device_matcher if matcher is None else matcher, window)
                for name, factor in self.spellings(metric)]

    def matcher(self, shard: str = "") -> str:
        """The label matchers every device-level selector of a query carries: the device
        matcher, and a sync shard's cluster matcher (see shard_matcher) when given."""
        return f"{self.device_matcher}, {shard}" if shard else self.device_matcher

    def sync_matcher(self, shard: str = "") -> str:
        """The label matchers of the sync's per-series selectors: only the shard's (maybe
        none). The device matcher is left to the client, where :meth:`identity` drops a
        series without the id label just as the matcher would: in Prometheus 2.42 a
        ``UUID!=""`` matcher merges the postings of every UUID in the store, whatever the
        shard, so with one per selector (about 200 a shard, the presence query's arms most)
        the store's work grew as the fleet times the shards, past that of the answers. A
        selector without it reads the same device series, and the other series it adds
        (none in an exporter's value families) fold into nothing: ``or``, ``and`` and
        ``unless`` match on the whole label set, so they meet only each other."""
        return shard

    def queries(self, window: str, step: str, cluster_label: str,
                shard: str = "") -> list[Query]:
        """One request per neutral field plus one for sample times, all series unaggregated.

        Every query keeps each series' full label set: aggregating (``max by``) would mix a
        GPU's old series (a previous pod, exporter or driver, lingering in the window) with
        its new one. The client joins a field's series to their sample times on the label
        set and keeps, per GPU, the value of the newest series (FleetBuilder). Identity,
        attributes and allocations come from the same rows, so no ``__name__`` regex is
        needed. ``or`` picks the preferred metric where an exporter offers several.
        ``shard`` (a cluster matcher) is added to every selector, each ``or`` arm included;
        no selector carries the device matcher (see sync_matcher).
        """
        match = self.sync_matcher(shard)
        sel = braced(match, template=True)
        out = []
        # the field read from the clock family itself comes with the sample times (below)
        clock_field = next((f for f, ms in self.value_fields.items()
                            if ms == [self.clock_metric]), None)
        for fld, metrics in {**self.value_fields, **self.health_fields}.items():
            if fld == clock_field:
                continue
            promql = " or ".join(
                arm for m in metrics
                for arm in self.arms(m, f"last_over_time({{}}{sel}[{window}])", window, match))
            out.append(Query(self.vendor, "values", promql, fld))
        # Sample times: the raw samples of one family over the window (a range selector
        # returns each sample with its own time, skips staleness markers, and sees series older
        # than the store's look-back, as ACM's 300 s pushes need); the client keeps only each
        # series' newest (HubClient.query_newest). Prometheus 2.42 answers
        # `max_over_time(timestamp(x)[w:s])` with nothing, so no subquery can do this. One
        # family stands for the whole scrape: a GPU's series all carry the same labels.
        # Both spellings in one range selector: an exact ``a|b`` list (its values are the
        # clock field's, whose spellings share a unit: CLOCK_UNITS_AGREE below).
        clocks = self.names(self.clock_metric)
        stamps = (f"{self.clock_metric}{braced(match)}[{window}]" if len(clocks) == 1
                  else f'{{__name__=~"{"|".join(clocks)}"{", " if match else ""}{match}}}'
                       f'[{window}]')
        out.append(Query(self.vendor, "timestamp", stamps, clock_field))
        out.append(self.presence_query(window, step, cluster_label, shard))
        naming = self.naming_query(window, cluster_label, shard)
        if naming is not None:
            out.append(naming)
        return out

    def naming_query(self, window: str, cluster_label: str, shard: str = "") -> Query | None:
        """Which naming each cluster's GPUs send (issue 26: see the move): GPU series per
        cluster under each spelling of the clock family, tagged ``naming``. One request,
        one row per cluster and naming; None for an exporter with one naming."""
        other = self.renames.get(self.clock_metric)
        if other is None:
            return None
        match = self.matcher(shard)
        arms = [f'label_replace(count by ({cluster_label}) (last_over_time({name}{{{match}}}'
                f'[{window}])), "naming", "{naming}", "", "")'
                for name, naming in ((self.clock_metric, LEGACY), (other[0], DCGM47))]
        return Query(self.vendor, "naming", " or ".join(arms))

    def presence_query(self, window: str, step: str, cluster_label: str,
                       shard: str = "") -> Query:
        """GPUs that send none of the metrics the other queries read, with their newest
        sample's time: one request over an explicit list of exact names (no ``__name__``
        regex), ``max``-ed per GPU, attributes and allocation (the names' extra labels such
        as ``clock_index`` fold away).

        ``timestamp()`` of a plain selector is its sample's own time. Its instant form sees
        the store's look-back; the subquery form the whole window (its steps are aligned to
        multiples of ``step``, so it misses a GPU that first reported after the last step:
        the instant form has that one). ``> time() - window`` drops what a look-back carried
        in from before the window. GPUs that send the clock family are left out on the hub
        (``unless``): they are in the sync already, so at any fleet size the answer holds
        only the GPUs with a trimmed field set. The value is a time, never a field. No
        selector carries the device matcher (see sync_matcher): a series without the id
        label groups apart, under an empty id, and the client drops it.
        """
        sel = braced(self.sync_matcher(shard), template=True)
        group = _by([cluster_label, *self.id_labels, *self.attribute_labels, *POD_LABELS])
        ids = _by([cluster_label, *self.id_labels])
        arms = " or ".join(self._any_name(m, f"timestamp({{}}{sel})")
                           for m in self.presence_metrics)
        newest = f"max by ({group}) ({arms})"
        clock = self._any_name(self.clock_metric, f"{{}}{sel}")
        seconds = f"{parse_duration(window):g}"
        promql = (f"({newest} or max_over_time(({newest})[{window}:{step}]))"
                  f" > time() - {seconds} unless on ({ids}) ({clock})")
        return Query(self.vendor, "presence", promql)

    # -- parsing of rows -------------------------------------------------------
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


# -- dcgm-exporter's two namings (issue 26) --------------------------------------------------
MIB = 2.0 ** 20

#: Old name -> new name with units: the one table hub and spoke share
#: (hub/common/_dcgm_names.py). Legacy names stay resolvable in DCGM 4.7, so a spoke pinning
#: a collectors CSV (``spoke render --dcgm-names``) keeps either naming across an upgrade;
#: the hub reads both everywhere. ``factor`` turns a value under the new name into the legacy
#: name's unit (the one the rest of the hub was written for).

#: One name, two units: DCGM 4.6 maps ``DCGM_FI_DEV_GPU_UTIL_RATIO`` to the old integer
#: field (0-100), so a custom CSV sends percent under it; DCGM 4.7's own field is 0-1. The
#: rule, per series and per query window: a value above 1 in the window proves percent (read
#: as it is); otherwise it is read as a ratio (x 100). What it cannot tell: a percent series
#: that stayed at 0 or 1 % for the whole window reads as 0 or 100 % (an idle GPU at 1 % would
#: look busy until it sends a value above 1). docs/adoption-contract.md says so.
PERCENT_OR_RATIO = frozenset({"DCGM_FI_DEV_GPU_UTIL_RATIO"})


def braced(matcher: str, template: bool = False) -> str:
    """``matcher`` as a selector's braces (``{...}``, to follow a metric name); nothing for
    no matcher. ``template``: as a str.format template spells them (``{{...}}``; a matcher
    holds no brace of its own, see shard_matcher)."""
    if not matcher:
        return ""
    return f"{{{{{matcher}}}}}" if template else f"{{{matcher}}}"


def convert_arm(name: str, factor: float, expr: str, matcher: str, window: str) -> str:
    """``expr`` (a per-series PromQL term reading ``name``) in the unit of its field.

    A name of two possible units (PERCENT_OR_RATIO) is decided per series over ``window``:
    ``max_over_time`` above 1 proves percent; ``and`` keeps those series as they are,
    ``or`` scales the rest. The decision needs no subquery and no second request.
    """
    if name in PERCENT_OR_RATIO:
        proof = f"max_over_time({name}{braced(matcher)}[{window}]) > 1"
        return f"({expr} and {proof}) or ({expr}) * {factor:g}"
    if factor == 1.0:
        return expr
    if factor < 1.0:  # bytes -> MiB, Hz -> MHz: dividing by the exact integer loses nothing
        return f"({expr}) / {round(1 / factor)}"
    return f"({expr}) * {factor:g}"


#: the namings a cluster's NVIDIA GPUs may send (the sync and the report say which)
LEGACY, DCGM47, BOTH = "legacy", "dcgm-4.7", "both"



def dcgm_names(naming: str) -> dict[str, str]:
    """legacy name -> its spelling in ``naming`` (legacy or dcgm-4.7)."""
    if naming not in (LEGACY, DCGM47):
        raise ValueError(f"unknown dcgm naming {naming!r} (legacy or {DCGM47})")
    return {r.legacy: r.legacy if naming == LEGACY else r.dcgm47 for r in DCGM_RENAMES}


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


class Nvidia(VendorProfile):
    """NVIDIA dcgm-exporter (and gpufleet's own exporter, which speaks the same names)."""

    vendor = "nvidia"
    id_labels = ["Hostname", "hostname", "UUID", "GPU_I_PROFILE", "GPU_I_ID"]
    node_labels = ["Hostname", "hostname"]  # released images / master since 2026-05
    slice_labels = ["GPU_I_PROFILE", "GPU_I_ID"]
    device_matcher = 'UUID!=""'
    renames = {r.legacy: (r.dcgm47, r.factor) for r in DCGM_RENAMES}
    units = {FB_CAPACITY: 1 / MIB}
    value_fields = {
        UTILISATION: ["DCGM_FI_DEV_GPU_UTIL"],
        ENGINE_ACTIVE: ["DCGM_FI_PROF_GR_ENGINE_ACTIVE"],
        MEMORY_USED: ["DCGM_FI_DEV_FB_USED"],
        MEMORY_FREE: ["DCGM_FI_DEV_FB_FREE"],
        MEMORY_RESERVED: ["DCGM_FI_DEV_FB_RESERVED"],
        # the GPU's size from one source where the exporter says it (4.9 by default, or
        # FB_TOTAL where a CSV asks): a property, not used + free of two samples
        MEMORY_TOTAL: [FB_CAPACITY, "DCGM_FI_DEV_FB_TOTAL"],
        POWER: ["DCGM_FI_DEV_POWER_USAGE"],
        TEMPERATURE: ["DCGM_FI_DEV_GPU_TEMP"],
    }
    clock_metric = "DCGM_FI_DEV_GPU_TEMP"  # on every GPU and MIG slice, in every field set
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

    attribute_labels = ["gpu", "modelName", *DCGM_DRIVER_LABELS, "pci_bus_id", "serial"]
    #: dcgm-exporter's default field set (default-counters.csv, 25 fields), its opt-in health
    #: and profiling fields, less those the value and health queries read
    presence_metrics = [
        "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION", "DCGM_FI_DEV_RELIABILITY_VIOLATION",
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    ]

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
        return {
            "index": gpu_index(labels.get("gpu")),
            "model": labels.get("modelName") or None,
            "driver_version": next((labels[n] for n in DCGM_DRIVER_LABELS if labels.get(n)),
                                   None),
            "pci_bus_id": labels.get("pci_bus_id") or None,
            # gpufleet's exporter only (nvmlDeviceGetSerial); dcgm-exporter has no such label
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
    clock_metric = "gpu_edge_temperature"  # also on trimmed virtual functions
    timestamp_metrics = [
        "gpu_gfx_activity", "gpu_used_vram", "gpu_total_vram", "gpu_power_usage",
        "gpu_package_power", "gpu_edge_temperature", "gpu_junction_temperature", "gpu_health",
    ]
    health_fields = {
        DEVICE_HEALTH: ["gpu_health"],
        ECC_DBE: ["gpu_ecc_uncorrect_total"],
    }

    attribute_labels = ["card_series", "card_model", "driver_version"]
    #: device-metrics-exporter's whole field list (every field is on by default), less
    #: those the value and health queries read and the node-level gpu_nodes_total
    presence_metrics = [
        "gpu_average_package_power", "gpu_memory_temperature", "gpu_hbm_temperature",
        "gpu_umc_activity", "gpu_mma_activity", "gpu_vcn_activity", "gpu_jpeg_activity",
        "gpu_voltage", "gpu_gfx_voltage", "gpu_memory_voltage", "pcie_speed",
        "pcie_max_speed", "pcie_bandwidth", "gpu_energy_consumed", "pcie_replay_count",
        "pcie_recovery_count", "pcie_replay_rollover_count", "pcie_nack_sent_count",
        "pcie_nack_received_count", "gpu_clock", "gpu_total_visible_vram",
        "gpu_used_visible_vram", "gpu_free_visible_vram", "gpu_total_gtt", "gpu_used_gtt",
        "gpu_free_gtt", "gpu_ecc_correct_total",
        *(f"gpu_ecc_{kind}_{block}" for block in (
            "sdma", "gfx", "mmhub", "athub", "bif", "hdp", "xgmi_wafl", "df", "smn", "sem",
            "mp0", "mp1", "fuse", "umc", "mca", "vcn", "jpeg", "ih", "mpio")
          for kind in ("correct", "uncorrect")),
        "gpu_xgmi_link_rx", "gpu_xgmi_link_tx",
        *(f"xgmi_neighbor_{n}_{what}" for n in (0, 1)
          for what in ("nop_tx", "request_tx", "response_tx", "beats_tx")),
        *(f"xgmi_neighbor_{n}_tx_throughput" for n in range(6)),
    ]

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
        return {
            "index": gpu_index(labels.get("gpu_id")),
            "model": labels.get("card_series") or labels.get("card_model") or None,
            "driver_version": labels.get("driver_version") or None,
            "serial": labels.get("serial_number") or None,
        }

    # VRAM is reported in MB; like the AMD tools we take it as MiB (FIELD_NOTES).


PROFILES: tuple[VendorProfile, ...] = (Nvidia(), Amd())


def labelled_matcher(cluster_label: str) -> str:
    """The label matcher that keeps only series carrying the cluster label (``cluster!=""``).

    A series pushed without it (one spoke's agent missing its external label) belongs to no
    cluster: the sync leaves it out and names it (finding ``unlabelled_series``), and any
    query that groups by the cluster label (the usage ledger's) adds this matcher to its
    selectors so such series never land under a cluster named ''. ``cluster_label`` must be
    a checked label name (``--cluster-label`` is, by its option).
    """
    return f'{cluster_label}!=""'


def sync_queries(window: str, step: str, cluster_label: str, shard: str = "") -> list[Query]:
    """The whole, fixed request set of one sync (of one shard of clusters: ``shard`` is a
    shard_matcher, added to every selector)."""
    return [q for profile in PROFILES
            for q in profile.queries(window, step, cluster_label, shard)]


#: characters RE2 reads as syntax; every other character of a cluster name is itself
_RE2_SYNTAX = re.compile(r"[\\.+*?()|\[\]{}^$]")


def _re2_literal(match: re.Match[str]) -> str:
    # braces as hex escapes: no brace reaches the query text, where the selector templates
    # (str.format) would read it
    char = match.group()
    return f"\\x{ord(char):02X}" if char in "{}" else "\\" + char


def promql_string(text: str) -> str:
    """``text`` as a PromQL double-quoted string literal (Go's escapes: JSON's are a subset)."""
    return json.dumps(text, ensure_ascii=False)


def shard_matcher(cluster_label: str, clusters: Iterable[str], *, exclude: bool = False
                  ) -> str:
    """The exact matcher of a shard of clusters: ``cluster=~"a|b\\.c"``, each name a literal
    (RE2 syntax escaped; Prometheus anchors the regex whole). ``exclude`` gives the
    complement, ``cluster!~"..."``: every other cluster, clusters that appeared since the
    shard plan and series without the label included (the empty value matches no name)."""
    names = "|".join(_RE2_SYNTAX.sub(_re2_literal, c) for c in clusters)
    return f"{cluster_label}{'!~' if exclude else '=~'}{promql_string(names)}"


def cluster_count_query(window: str, cluster_label: str) -> str:
    """GPUs (and MIG slices) per cluster over the window, by the sample-time family of each
    vendor: one cheap request that plans a sharded sync. Series without the cluster label
    count under ``""``."""
    arms = " or ".join(p._any_name(p.clock_metric,
                                   f"last_over_time({{}}{{{{{p.device_matcher}}}}}[{window}])")
                       for p in PROFILES)
    return f"count by ({cluster_label}) ({arms})"


#: `gpufleet query --preset NAME`: questions people ask of the store in every naming
PRESETS = ("gpus-per-cluster",)


def gpus_per_cluster_query(window: str, cluster_label: str) -> str:
    """How many GPUs report per cluster, whatever their exporter calls its series: both dcgm
    namings, both AMD spellings, gpufleet's own. A GPU counts when any of the series the
    sync dates it by has a sample within ``window`` (``last_over_time``: a cluster silent
    for longer drops out, where a plain selector would still count it for Prometheus' 5
    minutes of look-back); each physical GPU counts once (``max by`` its identity folds its
    MIG slices and its names, and the arms are joined with ``or``)."""
    arms = []
    for p in PROFILES:
        ident = ", ".join([cluster_label, *(x for x in p.id_labels if x not in p.slice_labels)])
        match = f"{p.device_matcher}, {labelled_matcher(cluster_label)}"
        arms += [f"max by ({ident}) (last_over_time({name}{{{match}}}[{window}]))"
                 for m in p.timestamp_metrics for name in p.names(m)]
    return f"count by ({cluster_label}) ({' or '.join(arms)})"


def preset_query(name: str, window: str, cluster_label: str) -> str:
    """The PromQL of a `gpufleet query --preset` (PRESETS)."""
    if name == "gpus-per-cluster":
        return gpus_per_cluster_query(window, cluster_label)
    raise KeyError(name)


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
#: kube-state-metrics' node facts; its ``provider_id`` label is the node's spec.providerID
KUBE_NODE_INFO = "kube_node_info"
KUBE_PROVIDER_ID = "provider_id"
#: kube-state-metrics' cordon: 1 where the Node's spec.unschedulable is true
KUBE_NODE_UNSCHEDULABLE = "kube_node_spec_unschedulable"


# -- MIG: how much of a GPU a slice is (issue 12) --------------------------------------------
#: Compute slices of a whole GPU per model family (NVIDIA MIG user guide: A100, H100, H200,
#: B200 and GH200 have 7 GPU instances' worth of compute slices, A30 has 4). Matched as a
#: case-insensitive substring of the model name, first match wins.
MIG_COMPUTE_SLICES: tuple[tuple[str, int], ...] = (
    ("A30", 4),
    ("A100", 7), ("H100", 7), ("H200", 7), ("H800", 7), ("A800", 7), ("GH200", 7),
    ("B200", 7), ("GB200", 7), ("B100", 7), ("RTX PRO 6000", 4),
)
#: ``3g.40gb`` (a GPU instance) or ``1c.3g.40gb`` (a compute instance of 1 slice inside it)
_PROFILE = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.")


def compute_slices(model: str | None) -> int | None:
    """How many compute slices a whole GPU of this model has; None when we do not know."""
    upper = (model or "").upper()
    return next((n for name, n in MIG_COMPUTE_SLICES if name.upper() in upper), None)


def mig_share(model: str | None, profile: str | None, slice_memory_mib: float | None = None,
              gpu_memory_mib: float | None = None) -> float:
    """The fraction of its GPU a MIG slice counts as (a whole GPU is 1.0).

    ``3g.40gb`` on a 7-slice GPU is 3/7. A profile we cannot read, or a model whose slice
    count we do not know, counts as its share of the GPU's memory; with no memory figures
    either it counts as one slice of seven (the common case), never as a whole GPU.
    """
    if profile is None:
        return 1.0
    match = _PROFILE.match(profile)
    total = compute_slices(model)
    if match and total:
        return min(1.0, int(match.group(1) or match.group(2)) / total)
    if slice_memory_mib and gpu_memory_mib and gpu_memory_mib > 0:
        return min(1.0, slice_memory_mib / gpu_memory_mib)
    return 1.0 / 7.0


# -- usage ledger queries (issue 12, 19) -----------------------------------------------------
#: Neutral profiling fields the ledger averages for efficiency (percent). SM activity falls
#: back to the graphics-engine activity where DCGM_FI_PROF_SM_ACTIVE is not exported.
SM_ACTIVE = "sm_active_pct"
TENSOR_ACTIVE = "tensor_active_pct"
DRAM_ACTIVE = "dram_active_pct"
#: Neutral fields of the usage ledger, and the aggregation each query applies over a bucket.
USAGE_FIELDS: tuple[tuple[str, str], ...] = (
    (UTILISATION, "avg"), (UTILISATION, "max"), (ENGINE_ACTIVE, "avg"), (ENGINE_ACTIVE, "max"),
    (MEMORY_USED, "avg"), (MEMORY_USED, "max"), (POWER, "avg"),
    (SM_ACTIVE, "avg"), (TENSOR_ACTIVE, "avg"), (DRAM_ACTIVE, "avg"),
)
#: Profiling metrics per vendor (not read by the sync). dcgm-exporter's are ratios 0-1;
#: device-metrics-exporter's GPU_PROF_SM_ACTIVE (VALUBusy) and GPU_PROF_TENSOR_ACTIVE_PERCENT
#: (MfmaUtil) are percent; it has no DRAM-active counter.
USAGE_PROFILING_FIELDS: dict[str, dict[str, list[str]]] = {
    "nvidia": {SM_ACTIVE: ["DCGM_FI_PROF_SM_ACTIVE"],
               TENSOR_ACTIVE: ["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"],
               DRAM_ACTIVE: ["DCGM_FI_PROF_DRAM_ACTIVE"]},
    "amd": {SM_ACTIVE: ["gpu_prof_sm_active"],
            TENSOR_ACTIVE: ["gpu_prof_tensor_active_percent"]},
}
_RATIO_FIELDS = {"nvidia": {ENGINE_ACTIVE, SM_ACTIVE, TENSOR_ACTIVE, DRAM_ACTIVE}}
#: the model label(s) of each vendor, kept in usage queries (a MIG slice's share needs it)
MODEL_LABELS = {"nvidia": ["modelName"], "amd": ["card_series", "card_model"]}
USAGE_POD_LABELS = ["namespace", "pod", "exported_namespace", "exported_pod"]


def _by(labels: list[str]) -> str:
    return ", ".join(labels)


def usage_group(p: VendorProfile, cluster_label: str) -> str:
    return _by([cluster_label, *p.id_labels, *MODEL_LABELS[p.vendor], *USAGE_POD_LABELS])



def _usage_fields(p: VendorProfile, fld: str) -> list[str]:
    return p.value_fields.get(fld) or USAGE_PROFILING_FIELDS.get(p.vendor, {}).get(fld, [])


def usage_convert(vendor: str, fld: str, value: float) -> float:
    """Into the ledger's units: percent for every activity field."""
    if fld in _RATIO_FIELDS.get(vendor, ()):
        return value * 100.0
    return profile(vendor).convert(fld, value)


def usage_queries(bucket: str, resolution: str, cluster_label: str,
                  shard: str = "") -> list[Query]:
    """The fixed request set of one usage bucket, whatever the fleet size.

    Per vendor and field: ``avg by (identity, allocation) (avg_over_time(name[bucket]))``
    (``max`` likewise) evaluated at the bucket's end, one term per exact name joined with
    ``or``: a GPU sending a field under two names (both AMD spellings) is read once, from
    the preferred name, where a ``__name__`` regex inside the range function would make
    Prometheus refuse the whole query ("vector cannot contain metrics with the same
    labelset").

    Coverage counts the push-interval-long slots (``resolution``) of the bucket that hold
    a sample: ``count_over_time((presence)[bucket:resolution])`` where presence is
    ``max by (...) (last_over_time(name[resolution] offset 1ms))`` over each clock name,
    evaluated one slot after the bucket's end so its points are the ends of the slots. The
    look-back is exactly one slot: the slots partition time, so a GPU whose pod or node
    changes mid-bucket never has one slot counted twice (a wider look-back would give the
    old series the new one's first slot). Prometheus stamps scrapes on their schedule, so a
    steady push stays in its slot. A Query's ``kind`` is ``usage:<agg>`` or ``coverage``.

    Series without the cluster label never reach the ledger (``{cluster}!=""``). ``shard``
    (a shard_matcher) is added to every selector: the set of one shard of clusters.
    """
    out: list[Query] = []
    labelled = labelled_matcher(cluster_label)
    for p in PROFILES:
        group = usage_group(p, cluster_label)
        match = f"{p.matcher(shard)}, {labelled}"
        for fld, agg in USAGE_FIELDS:
            arms = [arm for m in _usage_fields(p, fld)
                     for arm in p.arms(m, f"{agg}_over_time({{}}{{{{{match}}}}}[{bucket}])",
                                       bucket, match)]
            if not arms:
                continue
            promql = " or ".join(f"{agg} by ({group}) ({arm})" for arm in arms)
            out.append(Query(p.vendor, f"usage:{agg}", promql, fld))
        presence = " or ".join(
            f"max by ({group}) (last_over_time({name}{{{match}}}[{resolution}] offset 1ms))"
            for m in p.timestamp_metrics for name in p.names(m))
        out.append(Query(p.vendor, "coverage",
                         f"count_over_time(({presence})[{bucket}:{resolution}])"))
    return out


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


def labelled_probe(window: str, cluster_label: str | None = None) -> str:
    """How many GPU series of any vendor the store holds in the window (only those carrying
    ``cluster_label`` when given): asked only when a bucket came back empty, to tell a typo'd
    --cluster-label (GPU series exist, none carries it) from a quiet fleet."""
    extra = f", {labelled_matcher(cluster_label)}" if cluster_label else ""
    return " or ".join(
        f"count(last_over_time({name}{{{p.device_matcher}{extra}}}[{window}]))"
        for p in PROFILES for m in p.timestamp_metrics for name in p.names(m))


# -- metered allocation: intervals from the allocations' own edges (issue 27) ----------------
#: kube-state-metrics' pod series (STABLE): start and completion in unix seconds, the
#: container requests (the series lives as long as the pod object, also after it completed:
#: never an end), and the phase (where OpenShift deny-lists the completion time, the last
#: Running sample bounds the end to one push interval).
KSM_POD_START = "kube_pod_start_time"
KSM_POD_COMPLETION = "kube_pod_completion_time"
KSM_POD_REQUESTS = "kube_pod_container_resource_requests"
KSM_POD_PHASE = "kube_pod_status_phase"
#: kube-state-metrics' spelling of the time-slicing replicas node label (nvidia.com/gpu.replicas)
KSM_REPLICAS_LABEL = "label_nvidia_com_gpu_replicas"
#: gpufleet's exporter: the edges it saw in the kubelet's pod-resources (spoke/_naming.py
#: publishes the same names): start while held, end for at least two push intervals after.
EDGE_START = "gpufleet_allocation_start_timestamp_seconds"
EDGE_END = "gpufleet_allocation_end_timestamp_seconds"
ALLOCATION_METRICS = [KSM_POD_START, KSM_POD_COMPLETION, KSM_POD_REQUESTS, KSM_POD_PHASE,
                      EDGE_START, EDGE_END]
#: GPU resources as kube-state-metrics sanitises them (non-alphanumerics -> ``_``): whole
#: GPUs, time-sliced replicas (renamed), MIG devices (mixed strategy), HAMi's cores share,
#: AMD partitions. A label regex (never a ``__name__`` one).
GPU_RESOURCE_REGEX = ("nvidia_com_gpu|nvidia_com_gpu_shared|nvidia_com_gpucores"
                      "|nvidia_com_mig_.+|amd_com_gpu|amd_com_.+_nps.+")
#: the per-pod labels of kube-state-metrics' pod series and the pod labels of the edges
KSM_POD_KEY = ["namespace", "pod", "uid"]
EDGE_POD_LABELS = ["namespace", "pod", "exported_namespace", "exported_pod"]


@dataclass(frozen=True)
class GpuRequest:
    """What one sanitised resource request means for a GPU's time."""

    vendor: str
    kind: str  # "whole" | "shared" | "mig" | "cores"
    profile: str | None = None  # MIG profile (``1g.10gb``)


def gpu_request(resource: str) -> GpuRequest | None:
    """kube-state-metrics' resource label -> its meaning; None for a resource that is no
    count of GPUs (HAMi's gpumem, anything else)."""
    if resource in ("nvidia_com_gpu", "amd_com_gpu"):
        return GpuRequest(resource.split("_", 1)[0], "whole")
    if resource == "nvidia_com_gpu_shared":
        return GpuRequest("nvidia", "shared")
    if resource == "nvidia_com_gpucores":
        return GpuRequest("nvidia", "cores")
    if resource.startswith("nvidia_com_mig_"):
        return GpuRequest("nvidia", "mig", resource.removeprefix("nvidia_com_mig_")
                          .replace("_", "."))
    if resource.startswith("amd_com_") and "_nps" in resource:
        return GpuRequest("amd", "whole")  # a partition holds its GPU (see hub/usage/_dra.py)
    return None


def allocation_queries(window: str, step: str, cluster_label: str,
                       shard: str = "") -> list[Query]:
    """The fixed request set of a bucket's allocation intervals, whatever the fleet size.

    Evaluated a push interval and one ``step`` after the bucket's end over ``window`` (the
    bucket, a push interval each side and the step): a pod that lived in the bucket has
    samples there, also one shorter than a push (the push after it carries its edges), and
    one held past the bucket's end has a sample after it. Intervals are read from the
    values (the edges' own times), so a wider window never lengthens one.

    Kinds: ``alloc:start`` / ``alloc:end`` (kube-state-metrics' start and completion),
    ``alloc:requests`` (GPU requests per pod, resource and node), ``alloc:running`` (the time
    of the pod's last Running sample: ``timestamp`` inside a subquery whose ``step`` is at
    most the push interval and the store's look-back), ``alloc:replicas`` (time-slicing
    replicas per node), ``edge:start`` / ``edge:end`` / ``edge:seen`` (gpufleet's exporter:
    per GPU and pod; seen = its start gauge's last sample, the end where the end gauge was
    not pushed). ``shard`` (a shard_matcher) is added to every selector, as in
    usage_queries.
    """
    labelled = labelled_matcher(cluster_label) + (f", {shard}" if shard else "")
    pod = _by([cluster_label, *KSM_POD_KEY])
    edge_ids = list(dict.fromkeys(label for p in PROFILES for label in p.id_labels))
    edge = _by([cluster_label, *edge_ids, *EDGE_POD_LABELS])

    def last(agg: str, by: str, name: str, match: str = "") -> str:
        return f"{agg} by ({by}) (last_over_time({name}{{{labelled}{match}}}[{window}]))"

    def seen(by: str, selector: str, only: str = "") -> str:
        # timestamp() gives a sample's own time only around a plain selector; ``and`` keeps
        # those where the condition holds (around ``== 1`` it would give the step's time)
        stamps = f"timestamp({selector})" + (f" and {only}" if only else "")
        return f"max by ({by}) (max_over_time(({stamps})[{window}:{step}]))"

    gpu = f', resource=~"{GPU_RESOURCE_REGEX}"'
    # only pods that request GPUs: a hub that holds every pod's series answers with these
    gpu_pods = f" and on ({pod}) {last('sum', pod, KSM_POD_REQUESTS, gpu)}"
    return [
        Query("kube", "alloc:start", last("max", pod, KSM_POD_START) + gpu_pods),
        Query("kube", "alloc:end", last("max", pod, KSM_POD_COMPLETION) + gpu_pods),
        Query("kube", "alloc:requests", last(
            "sum", _by([cluster_label, *KSM_POD_KEY, "node", "resource"]), KSM_POD_REQUESTS,
            gpu)),
        Query("kube", "alloc:running", seen(
            pod, running := f'{KSM_POD_PHASE}{{{labelled}, phase="Running"}}',
            f"{running} == 1") + gpu_pods),
        Query("kube", "alloc:replicas", last(
            "max", _by([cluster_label, "node", KSM_REPLICAS_LABEL]), KUBE_NODE_LABELS,
            f', {KSM_REPLICAS_LABEL}!=""')),
        Query("gpufleet", "edge:start", last("max", edge, EDGE_START)),
        Query("gpufleet", "edge:end", last("max", edge, EDGE_END)),
        Query("gpufleet", "edge:seen", seen(edge, f"{EDGE_START}{{{labelled}}}")),
    ]


def allocation_probe(window: str, cluster_label: str) -> str:
    """How many allocation series (GPU requests of kube-state-metrics, the exporter's start
    edges) the store holds in the window: asked once per collect, so a hub without any
    (a new one, one whose spokes forward neither) is not asked the interval queries for
    every bucket of a backfill."""
    labelled = labelled_matcher(cluster_label)
    return (f'count(last_over_time({KSM_POD_REQUESTS}{{{labelled}, '
            f'resource=~"{GPU_RESOURCE_REGEX}"}}[{window}])) or '
            f"count(last_over_time({EDGE_START}{{{labelled}}}[{window}]))")


# -- forwarding kube-state-metrics' allocation series (spoke render, issue 27) ----------------
#: kube-state-metrics' pod series the ledger's intervals read; forwarded only for pods that
#: request GPUs (their requests series by its resource label, the others joined to it where
#: the forwarder can join: ACM's recording rules)
_GPU_REQUESTS = f'{KSM_POD_REQUESTS}{{resource=~"{GPU_RESOURCE_REGEX}"}}'


def allocation_matches() -> list[str]:
    """ACM allowlist ``matches``: the requests series of GPU resources only."""
    return [f'__name__="{KSM_POD_REQUESTS}",resource=~"{GPU_RESOURCE_REGEX}"']


def allocation_recording_rules() -> list[dict[str, str]]:
    """ACM allowlist ``recording_rules`` (platform monitoring only): the start, completion
    and Running phase of pods that request GPUs, under their own names (the metrics-
    collector pushes the rule's result, so the hub reads them as kube-state-metrics'), so a
    cluster's thousands of other pods are never forwarded."""
    gpu_pods = f"on ({', '.join(KSM_POD_KEY)}) ({_GPU_REQUESTS} > 0)"
    return [{"record": name, "expr": f"{name}{match} and {gpu_pods}"}
            for name, match in ((KSM_POD_START, ""), (KSM_POD_COMPLETION, ""),
                                (KSM_POD_PHASE, '{phase="Running"}'))]


def allocation_agent_keep() -> tuple[list[str], str]:
    """(source_labels, regex) of the Prometheus agent's keep rule on kube-state-metrics:
    GPU requests by their resource label, the pods' start and completion, the Running phase
    only, and the node labels (time-slicing replicas). An agent cannot join series, so the
    pod series are one to three per pod of the cluster, not per GPU pod."""
    pods = "|".join((KSM_POD_START, KSM_POD_COMPLETION, KUBE_NODE_LABELS))
    return (["__name__", "resource", "phase"],
            f"{KSM_POD_REQUESTS};(?:{GPU_RESOURCE_REGEX});.*|(?:{pods});.*|"
            f"{KSM_POD_PHASE};.*;Running")
