"""Everything gpufleet knows about exporter metric names and label spellings: one profile per
exporter family, and the fixed query set of a sync built from them.

Nothing outside hub.store knows that NVIDIA calls a GPU ``UUID`` and AMD calls it
``gpu_uuid``, that dcgm-exporter spells the node ``Hostname`` in released images and
``hostname`` on master, or that AMD names may carry an ``amd_`` prefix. Each profile turns the
hub's PromQL rows into plain dicts of neutral field names; ``normalize`` merges those into
observations without knowing which exporter produced them.

The queries are fixed per vendor: their number never depends on the size of the fleet. Each
names its metrics exactly (no ``__name__`` regex, which the store matches against every name
in its index and which keeps Thanos from pruning its store fan-out).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Container, Mapping
from typing import Any

from hub.common import DCGM_DRIVER_LABELS, DCGM_RENAMES, format_duration, parse_duration
from hub.common import DCGM_FB_CAPACITY as FB_CAPACITY
from hub.store._fields import (
    CLOCKS_EVENT_REASONS,
    DEVICE_HEALTH,
    ECC_DBE,
    ENGINE_ACTIVE,
    LAST_XID,
    MEMORY_FREE,
    MEMORY_RESERVED,
    MEMORY_TOTAL,
    MEMORY_USED,
    POD_LABELS,
    POWER,
    ROW_REMAP_FAILURE,
    TEMPERATURE,
    UTILISATION,
    Identity,
    Query,
    gpu_index,
)
from hub.store._naming import DCGM47, LEGACY, MIB, braced, convert_arm


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

    def spellings(self, metric: str, held: Container[str] | None = None
                  ) -> list[tuple[str, float]]:
        """Every exact name ``metric`` arrives under, in order of preference (the exporter's
        own spelling first), with the factor that turns its value into ``metric``'s unit.
        ``held``: the names the store holds (HubClient.metric_names; None: any), the only
        ones a query then reads: a selector of a name the store lacks answers nothing and
        still costs it the postings of its other matchers."""
        out = [(prefix + metric, self.units.get(metric, 1.0)) for prefix in self.name_prefixes]
        other = self.renames.get(metric)
        if other is not None:
            out += [(prefix + other[0], other[1]) for prefix in self.name_prefixes]
        return out if held is None else [(n, f) for n, f in out if n in held]

    def names(self, metric: str, held: Container[str] | None = None) -> list[str]:
        return [name for name, _ in self.spellings(metric, held)]

    def _any_name(self, metric: str, selector: str, held: Container[str] | None = None) -> str:
        """``selector`` (with ``{}`` for the metric name) over each spelling, chained with
        ``or``: exact names only, so Thanos can prune its store fan-out. No conversion: for
        selectors whose value is not the metric's (``timestamp``, ``count``). ``held`` (the
        names the store holds) leaves the others out: "" when it holds none."""
        return " or ".join(selector.format(name) for name in self.names(metric, held))

    def arms(self, metric: str, selector: str, window: str,
             matcher: str | None = None, held: Container[str] | None = None) -> list[str]:
        """``selector`` (``{}`` for the name) over each spelling, each arm converted into
        the metric's unit by name: the terms a caller joins with ``or`` (first wins per
        label set, so a GPU sending two spellings at once counts once). ``window`` is what
        a name of two possible units (PERCENT_OR_RATIO) is judged over, with ``matcher``
        (the selector's own: a sync shard's too; None: the device matcher). ``held``: the
        names the store holds (HubClient.metric_names); the others have no arm."""
        return [convert_arm(name, factor, selector.format(name),
                            self.device_matcher if matcher is None else matcher, window)
                for name, factor in self.spellings(metric, held)]

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
                shard: str = "", at: float | None = None,
                held: Container[str] | None = None) -> list[Query]:
        """One request per neutral field plus one for sample times, all series unaggregated.

        Every query keeps each series' full label set: aggregating (``max by``) would mix a
        GPU's old series (a previous pod, exporter or driver, lingering in the window) with
        its new one. The client joins a field's series to their sample times on the label
        set and keeps, per GPU, the value of the newest series (FleetBuilder). Identity,
        attributes and allocations come from the same rows, so no ``__name__`` regex is
        needed. ``or`` picks the preferred metric where an exporter offers several.
        ``shard`` (a cluster matcher) is added to every selector, each ``or`` arm included;
        no selector carries the device matcher (see sync_matcher). ``held``: the names the
        store holds (HubClient.metric_names; None: any): an arm reads only those, and a
        query none of whose names the store holds is not asked.
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
                for arm in self.arms(m, f"last_over_time({{}}{sel}[{window}])", window, match,
                                     held))
            if promql:
                out.append(Query(self.vendor, "values", promql, fld))
        # Sample times: the raw samples of one family over the window (a range selector
        # returns each sample with its own time, skips staleness markers, and sees series older
        # than the store's look-back, as ACM's 300 s pushes need); the client keeps only each
        # series' newest (HubClient.query_newest). Prometheus 2.42 answers
        # `max_over_time(timestamp(x)[w:s])` with nothing, so no subquery can do this. One
        # family stands for the whole scrape: a GPU's series all carry the same labels.
        # Both spellings in one range selector: an exact ``a|b`` list (its values are the
        # clock field's, whose spellings share a unit: CLOCK_UNITS_AGREE below).
        clocks = self.names(self.clock_metric, held)
        if clocks:
            stamps = (f"{clocks[0]}{braced(match)}[{window}]" if len(clocks) == 1
                      else f'{{__name__=~"{"|".join(clocks)}"{", " if match else ""}{match}}}'
                           f'[{window}]')
            out.append(Query(self.vendor, "timestamp", stamps, clock_field))
        presence = self.presence_query(window, step, cluster_label, shard, at, held)
        if presence is not None:
            out.append(presence)
        return out

    @property
    def naming_label(self) -> str | None:
        """The device label whose series say which naming a cluster's GPUs send (issue 26:
        see the move); None for an exporter with one naming. The sample-time answer reads
        both spellings of the clock family, so the sync takes each cluster's namings off
        its rows (their metric names) rather than asking again (the former naming query:
        a request per shard that read the same series)."""
        if self.clock_metric not in self.renames:
            return None
        return self.device_matcher.partition("!=")[0]

    def naming(self, name: str) -> str | None:
        """The dcgm naming a clock-family metric name is spelt in (None: neither)."""
        other = self.renames.get(self.clock_metric)
        if other is None:
            return None
        return LEGACY if name == self.clock_metric else DCGM47 if name == other[0] else None

    def presence_query(self, window: str, step: str, cluster_label: str,
                       shard: str = "", at: float | None = None,
                       held: Container[str] | None = None) -> Query | None:
        """GPUs sending none of the metrics the other queries read, with their newest sample's
        time: one request over exact names, ``max``-ed per GPU, attributes and allocation.
        ``timestamp()`` of a selector is its sample's own time. The subquery's steps are
        aligned to multiples of ``step``: pinned ``@`` the first one at or after ``at`` (the
        sync's time), reaching a step further back, its last step sees what an instant form
        at ``at`` (no longer beside it, reading every name again) would. ``> time() -
        window`` drops what is older. GPUs sending the clock family in the window are left
        out (``unless``): the sync has them (one whose first samples came after ``at`` is
        found here a sync before its fields). No selector carries the device matcher (see
        sync_matcher): the client drops a series without the id label. ``held`` (the names
        the store holds) leaves the others' arms out: None when it holds no presence name,
        and no ``unless`` when it holds no clock name.
        """
        sel = braced(self.sync_matcher(shard), template=True)
        group = _by([cluster_label, *self.id_labels, *self.attribute_labels, *POD_LABELS])
        ids = _by([cluster_label, *self.id_labels])
        arms = " or ".join(filter(None, (self._any_name(m, f"timestamp({{}}{sel})", held)
                                         for m in self.presence_metrics)))
        if not arms:
            return None
        newest = f"max by ({group}) ({arms})"
        every = parse_duration(step)
        span = format_duration(parse_duration(window) + every)
        pinned = "" if at is None else f" @ {math.ceil(at / every) * every:.3f}"
        clock = self._any_name(self.clock_metric, f"last_over_time({{}}{sel}[{window}])", held)
        unless = f" unless on ({ids}) ({clock})" if clock else ""
        return Query(self.vendor, "presence", f"max_over_time(({newest})[{span}:{step}]{pinned})"
                     f" > time() - {parse_duration(window):g}{unless}")

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


def sync_queries(window: str, step: str, cluster_label: str, shard: str = "",
                 at: float | None = None, held: Container[str] | None = None) -> list[Query]:
    """The whole, fixed request set of one sync (of one shard of clusters: ``shard`` is a
    shard_matcher, added to every selector), to be asked at ``at``; with ``held`` (the
    names the store holds), less the queries of names it does not hold."""
    return [q for profile in PROFILES
            for q in profile.queries(window, step, cluster_label, shard, at, held)]


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



# -- label roles and extra series, for validation queries and alert rules (issue 5) ----------
#: Which of a profile's ``id_labels`` name the node a series comes from, and which name a MIG
#: slice inside a GPU; the remaining id labels identify the physical GPU. Report queries and
#: alert rules group by these roles, so they stay fixed-size and vendor-neutral.
NODE_LABELS: dict[str, list[str]] = {p.vendor: p.node_labels for p in PROFILES}
SLICE_LABELS: dict[str, list[str]] = {p.vendor: p.slice_labels for p in PROFILES}

def _by(labels: list[str]) -> str:
    return ", ".join(labels)
