"""Every metric name, HELP text and label spelling the exporter publishes, in one place.

The hub reads our output with the same profiles it uses for NVIDIA's dcgm-exporter and AMD's
device-metrics-exporter, so the names, units and label spellings here must match theirs
exactly (see shared/FIELD_NOTES.md and the dcgm samples). Nothing else in ``spoke`` knows
that NVIDIA calls a GPU ``UUID`` and AMD calls it ``gpu_uuid``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from hub.common import DCGM_DRIVER_LABELS, DCGM_FB_CAPACITY, DCGM_RENAMES
from spoke._model import GpuReading

NVIDIA = "nvidia"
AMD = "amd"


@dataclass(frozen=True)
class Field:
    """One published metric: its name, HELP text, type and where its value comes from."""

    name: str
    help: str
    value: Callable[[GpuReading], float | None]
    typ: str = "gauge"


def _f(name: str, help: str, attr: str, typ: str = "gauge") -> Field:
    return Field(name, help, lambda r: getattr(r, attr), typ)


# dcgm-exporter's default field set (default-counters.csv), in its order, with its HELP texts
# and types: counters stay counters. NVLINK_BANDWIDTH_TOTAL (no NVML field in nvidia-ml-py;
# "Not Supported" on single-GPU nodes) and VGPU_LICENSE_STATUS (vGPU guests only) are not
# read; everything else is left out only where the device does not answer.
DCGM_FIELDS: tuple[Field, ...] = (
    _f("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz"),
    _f("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "mem_clock_mhz"),
    _f("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", "memory_temp_c"),
    _f("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temp_c"),
    _f("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w"),
    _f("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
       "Total energy consumption since boot (in mJ).", "energy_mj", "counter"),
    _f("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "pcie_replays",
       "counter"),
    _f("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "util_pct"),
    _f("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "mem_copy_util_pct"),
    _f("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", "enc_util_pct"),
    _f("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", "dec_util_pct"),
    _f("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "last_xid"),
    _f("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "mem_free_mib"),
    _f("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "mem_used_mib"),
    _f("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", "mem_reserved_mib"),
    _f("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
       "Number of remapped rows for uncorrectable errors", "remapped_rows_uncorrectable",
       "counter"),
    _f("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
       "Number of remapped rows for correctable errors", "remapped_rows_correctable",
       "counter"),
    _f("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed",
       "row_remap_failure"),
    _f("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.",
       "engine_active_ratio"),
    # Commented out in dcgm-exporter's default CSV, on here: GPM answers them in the same
    # nvmlGpmMetricsGet call as the others, and SM activity is what the hub's efficiency
    # figures mean (without it they fall back to the graphics engine, 99.8 % where the SMs
    # were 96.4 % busy on a real H200).
    _f("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.",
       "sm_active_ratio"),
    _f("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM.",
       "sm_occupancy_ratio"),
    _f("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
       "Ratio of cycles the tensor (HMMA) pipe is active.", "tensor_active_ratio"),
    _f("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active "
       "sending or receiving data.", "dram_active_ratio"),
    _f("DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus - "
       "including both protocol headers and data payloads - in bytes per second.",
       "pcie_tx_bytes_per_s"),
    _f("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus - "
       "including both protocol headers and data payloads - in bytes per second.",
       "pcie_rx_bytes_per_s"),
    # Opt-in upstream, on by default here: the GPU health the hub's inventory reads.
    _f("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.",
       "ecc_dbe_volatile", "counter"),
    _f("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.",
       "ecc_sbe_volatile", "counter"),
    _f("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons.",
       "clocks_event_reasons"),
)

LEGACY = "legacy"
DCGM_47 = "dcgm-4.7"
#: how the NVIDIA series are named: dcgm-exporter up to 4.8 (legacy) or 4.9+ (DCGM 4.7)
NAMINGS = (LEGACY, DCGM_47)
_MIB = 1024 * 1024


#: DCGM 4.7 (dcgm-exporter 4.9) names of the legacy fields, with the unit change: the new
#: value is the legacy one * mul / div (clocks MHz -> Hz, energy mJ -> J, utilisation
#: % -> 0-1, framebuffer MiB -> bytes). From the one table the hub reads too
#: (hub/common/_dcgm_names.py, data only). Fields not listed (ECC, clock events, PCIe
#: bytes) keep their names.
DCGM_47_RENAMES: dict[str, tuple[str, str, float, float]] = {
    r.legacy: (r.dcgm47, r.help, r.mul, r.div) for r in DCGM_RENAMES}
#: collected by default from dcgm-exporter 4.9: total memory without adding used + free
FB_CAPACITY = Field(DCGM_FB_CAPACITY, "Framebuffer memory total (in bytes).",
                    lambda r: None if r.mem_total_mib is None else r.mem_total_mib * _MIB)
#: the driver-version label in each naming
DRIVER_LABEL = dict(zip((LEGACY, DCGM_47), DCGM_DRIVER_LABELS, strict=True))


def _converted(f: Field, new: str, help: str, mul: float, div: float) -> Field:
    def value(r: GpuReading) -> float | None:
        v = f.value(r)
        return None if v is None else v * mul / div
    return Field(new, help, value, f.typ)


def _dcgm_47_fields() -> tuple[Field, ...]:
    out: list[Field] = []
    for f in DCGM_FIELDS:
        rename = DCGM_47_RENAMES.get(f.name)
        out.append(_converted(f, *rename) if rename else f)
        if f.name == "DCGM_FI_DEV_FB_RESERVED":
            out.append(FB_CAPACITY)
    return tuple(out)


DCGM_47_FIELDS = _dcgm_47_fields()

# device-metrics-exporter's names. Its HELP texts vary between releases; the hub never reads
# them, so these only need to be truthful.
AMD_FIELDS: tuple[Field, ...] = (
    Field("gpu_gfx_activity", "Graphics engine activity (in %).", lambda r: r.util_pct),
    Field("gpu_used_vram", "Used VRAM (in MB).", lambda r: r.mem_used_mib),
    Field("gpu_free_vram", "Free VRAM (in MB).", lambda r: r.mem_free_mib),
    Field("gpu_total_vram", "Total VRAM (in MB).", lambda r: r.mem_total_mib),
    Field("gpu_power_usage", "Socket power usage (in W).", lambda r: r.power_w),
    Field("gpu_edge_temperature", "Edge temperature (in C).", lambda r: r.temp_c),
    Field("gpu_junction_temperature", "Junction (hotspot) temperature (in C).",
          lambda r: r.junction_temp_c),
    _f("gpu_umc_activity", "Memory controller (UMC) activity (in %).", "mem_copy_util_pct"),
    _f("gpu_ecc_correct_total", "Correctable ECC errors.", "ecc_sbe_volatile"),
    _f("gpu_ecc_uncorrect_total", "Uncorrectable ECC errors.", "ecc_dbe_volatile"),
)
AMD_NODES_TOTAL = Field("gpu_nodes_total", "Number of GPUs on the node.", lambda r: None)

# The exporter's own health. The hub's checks and the ACM allowlist read these names
# (hub/store/_fields.py EXPORTER_HEALTH_METRICS), so renaming one is a breaking change.
UP = "gpufleet_exporter_up"
COLLECT_ERRORS = "gpufleet_exporter_collect_errors"  # counter; exposed with _total
LAST_COLLECT = "gpufleet_exporter_last_collect_timestamp_seconds"
COLLECT_DURATION = "gpufleet_exporter_collect_duration_seconds"
BUILD_INFO = "gpufleet_exporter_build_info"
#: node label of the health series, so the hub can tell which node's exporter is failing
HEALTH_NODE_LABEL = "hostname"
#: Allocation edges (spoke/_edges.py), per GPU or slice and pod, with the vendor's GPU and pod
#: labels; the hub reads them under the same names (hub/store/_allocation.py EDGE_START/EDGE_END)
EDGE_START = "gpufleet_allocation_start_timestamp_seconds"
EDGE_END = "gpufleet_allocation_end_timestamp_seconds"


#: pod attribution of one device: (namespace, pod, container)
PodRef = tuple[str, str, str]
POD_LABELS = ("container", "namespace", "pod")


def nvidia_labels(r: GpuReading, hostname: str, pod: PodRef | None = None,
                  naming: str = LEGACY) -> dict[str, str]:
    """dcgm-exporter's label set and order; MIG labels only on slices, pod labels only on an
    allocated device, as upstream. ``serial`` is ours (dcgm-exporter has no such label): it
    carries nvmlDeviceGetSerial into the inventory, where the device answers. The driver
    label is spelt as the naming's dcgm-exporter spells it."""
    labels = {
        "gpu": str(r.index),
        "UUID": r.uuid,
        "pci_bus_id": r.pci_bus_id,
        "device": f"nvidia{r.index}",
        "modelName": r.model,
    }
    if r.is_slice:
        labels["GPU_I_PROFILE"] = r.mig_profile or ""
        labels["GPU_I_ID"] = str(r.mig_instance)
    labels["Hostname"] = hostname
    labels[DRIVER_LABEL[naming]] = r.driver_version
    if r.serial:
        labels["serial"] = r.serial
    if pod is not None:
        labels.update(zip(POD_LABELS, (pod[2], pod[0], pod[1]), strict=True))
    return labels


def amd_labels(r: GpuReading, hostname: str, pod: PodRef | None = None) -> dict[str, str]:
    """device-metrics-exporter's labels (client_golang prints them sorted, so do we)."""
    labels = {
        "card_model": r.board_model,
        "card_series": r.model,
        "driver_version": r.driver_version,
        "gpu_id": str(r.index),
        "gpu_uuid": r.uuid,
        "hostname": hostname,
        "serial_number": r.serial,
    }
    if pod is not None:
        labels.update(zip(POD_LABELS, (pod[2], pod[0], pod[1]), strict=True))
    return dict(sorted(labels.items()))


#: Which pods use which device: device id (GPU/MIG UUID, AMD UUID or PCI address) -> pods.
Pods = Mapping[str, Sequence[PodRef]]


def pods_of(r: GpuReading, pods: Pods | None) -> list[PodRef | None]:
    """One label set per pod using the device (time-slicing shares it), or one without."""
    if pods:
        found = sorted({p for dev in r.device_ids for p in pods.get(dev, ())})
        if found:
            return list(found)
    return [None]


def _families(fields: Sequence[Field], readings: Sequence[GpuReading],
              labels: Callable[[GpuReading, str, PodRef | None], dict[str, str]],
              hostname: str, pods: Pods | None) -> list[Metric]:
    label_sets = [(r, labels(r, hostname, pod)) for r in readings for pod in pods_of(r, pods)]
    out: list[Metric] = []
    for f in fields:
        metric = Metric(f.name, f.help, f.typ)
        for r, lbl in label_sets:
            value = f.value(r)
            if value is not None:
                metric.add_sample(f.name, lbl, float(value))
        # An empty family would still print HELP/TYPE; upstream exporters print nothing.
        if metric.samples:
            out.append(metric)
    return out


def check_naming(vendor: str, naming: str) -> None:
    """ValueError unless ``naming`` is one this vendor's exporter has."""
    if naming not in NAMINGS:
        raise ValueError(f"unknown naming {naming!r} (use {' or '.join(NAMINGS)})")
    if vendor != NVIDIA and naming != LEGACY:
        raise ValueError(f"naming {naming!r} exists only for NVIDIA (dcgm-exporter) series")


def fields_of(vendor: str, naming: str = LEGACY) -> tuple[Field, ...]:
    if vendor not in (NVIDIA, AMD):
        raise ValueError(f"unknown vendor {vendor!r}")
    check_naming(vendor, naming)
    if vendor == AMD:
        return AMD_FIELDS
    return DCGM_47_FIELDS if naming == DCGM_47 else DCGM_FIELDS


def select_fields(vendor: str, names: Iterable[str] | None,
                  naming: str = LEGACY) -> tuple[Field, ...]:
    """The ``--fields`` subset (in the default order); ValueError naming an unknown field.

    dcgm names may be given without their ``DCGM_FI_`` prefix (``DEV_GPU_UTIL``), AMD names
    with or without ``amd_``. Under the DCGM 4.7 naming a legacy name selects its renamed
    field, so one ``--fields`` list serves both.
    """
    fields = fields_of(vendor, naming)
    if names is None:
        return fields
    by_name = {f.name: f for f in fields}
    if naming == DCGM_47:
        # (the table is dcgm-exporter's; a renamed field this exporter has no reading of,
        # such as NVLink throughput, is not one to select)
        by_name.update({old: by_name[new[0]] for old, new in DCGM_47_RENAMES.items()
                        if new[0] in by_name})
    wanted: set[str] = set()
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        full = next((c for c in (name, "DCGM_FI_" + name, name.removeprefix("amd_"))
                     if c in by_name), None)
        if full is None:
            raise ValueError(f"unknown {vendor} field {name!r} (known: "
                             f"{', '.join(f.name for f in fields)})")
        wanted.add(by_name[full].name)
    if not wanted:
        raise ValueError("--fields selects no field")
    return tuple(f for f in fields if f.name in wanted)


def gpu_families(vendor: str, readings: Sequence[GpuReading], hostname: str,
                 device_count: int, *, fields: Sequence[Field] | None = None,
                 pods: Pods | None = None, naming: str = LEGACY) -> list[Metric]:
    """Metric families of one collection, named the way the vendor's own exporter names them
    (for NVIDIA: dcgm-exporter's legacy names or DCGM 4.7's, see ``NAMINGS``)."""
    chosen = fields_of(vendor, naming) if fields is None else fields
    if vendor == NVIDIA:
        return _families(chosen, readings, functools.partial(nvidia_labels, naming=naming),
                         hostname, pods)
    if vendor == AMD:
        out = _families(chosen, readings, amd_labels, hostname, pods)
        nodes = Metric(AMD_NODES_TOTAL.name, AMD_NODES_TOTAL.help, "gauge")
        nodes.add_sample(AMD_NODES_TOTAL.name, {"hostname": hostname}, float(device_count))
        out.append(nodes)
        return out
    raise ValueError(f"unknown vendor {vendor!r}")


def health_families(*, up: bool, errors_total: int, last_success: float | None,
                    duration: float | None, version: str, backend: str,
                    hostname: str) -> Iterable[Metric]:
    """The exporter's own series: alive, failing, stale or slow."""
    node = {HEALTH_NODE_LABEL: hostname}
    m = Metric(UP, "1 if the last collection reached the GPU library, 0 if it failed.", "gauge")
    m.add_sample(UP, node, 1.0 if up else 0.0)
    yield m
    m = Metric(COLLECT_ERRORS, "Failed reads of a GPU, or of the whole library, since start.",
               "counter")
    m.add_sample(COLLECT_ERRORS + "_total", node, float(errors_total))
    yield m
    if last_success is not None:
        m = Metric(LAST_COLLECT, "Unix time of the last successful collection.", "gauge")
        m.add_sample(LAST_COLLECT, node, last_success)
        yield m
    if duration is not None:
        m = Metric(COLLECT_DURATION, "Seconds the last collection took.", "gauge")
        m.add_sample(COLLECT_DURATION, node, duration)
        yield m
    m = Metric(BUILD_INFO, "gpufleet exporter build and GPU backend in use.", "gauge")
    m.add_sample(BUILD_INFO, {"version": version, "backend": backend}, 1.0)
    yield m


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def render(families: Iterable[Metric]) -> bytes:
    """Prometheus text format 0.0.4, as dcgm-exporter writes it.

    prometheus_client's writer renames every counter family to ``<name>_total`` in its HELP
    and TYPE lines; dcgm-exporter's counters (TOTAL_ENERGY_CONSUMPTION, PCIE_REPLAY_COUNTER,
    remapped rows, ECC) have no ``_total`` and their TYPE line names the series itself. So a
    family's HELP/TYPE name here is the name its samples carry.
    """
    out: list[str] = []
    # One GPU's label set is the same dict in every family (``_families``): written once per
    # collection, not once per sample (that was half of a collection's CPU at 8 GPUs).
    # Keyed by identity, holding the dict so the key cannot be reused while rendering.
    written: dict[int, tuple[Mapping[str, str], str]] = {}
    for family in families:
        name = family.samples[0].name if family.samples else family.name
        help_text = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {family.type}\n")
        for sample in family.samples:
            cached = written.get(id(sample.labels))
            if cached is None or cached[0] is not sample.labels:
                labels = ",".join(f'{k}="{_escape_label(v)}"'
                                  for k, v in sorted(sample.labels.items()))
                cached = (sample.labels, f"{{{labels}}}" if labels else "")
                written[id(sample.labels)] = cached
            out.append(f"{sample.name}{cached[1]} {floatToGoString(sample.value)}\n")
    return "".join(out).encode()
