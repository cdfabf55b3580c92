"""Every metric name, HELP text and label spelling the exporter publishes, in one place.

The hub reads our output with the same profiles it uses for NVIDIA's dcgm-exporter and AMD's
device-metrics-exporter, so the names, units and label spellings here must match theirs
exactly (see shared/FIELD_NOTES.md and the dcgm samples). Nothing else in ``spoke`` knows
that NVIDIA calls a GPU ``UUID`` and AMD calls it ``gpu_uuid``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric

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


# dcgm-exporter's names and HELP texts, in the order its default counters file lists them.
DCGM_FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda r: r.sm_clock_mhz),
    Field("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda r: r.temp_c),
    Field("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda r: r.power_w),
    Field("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda r: r.util_pct),
    Field("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda r: r.mem_free_mib),
    Field("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda r: r.mem_used_mib),
    Field("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).",
          lambda r: r.mem_reserved_mib),
    Field("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.",
          lambda r: r.last_xid),
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.",
          lambda r: r.engine_active_ratio),
)

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
)
AMD_NODES_TOTAL = Field("gpu_nodes_total", "Number of GPUs on the node.", lambda r: None)

# The exporter's own health. The hub's checks and the ACM allowlist read these names
# (hub/vendors.py EXPORTER_HEALTH_METRICS), so renaming one is a breaking change.
UP = "gpufleet_exporter_up"
COLLECT_ERRORS = "gpufleet_exporter_collect_errors"  # counter; exposed with _total
LAST_COLLECT = "gpufleet_exporter_last_collect_timestamp_seconds"
COLLECT_DURATION = "gpufleet_exporter_collect_duration_seconds"
BUILD_INFO = "gpufleet_exporter_build_info"
#: node label of the health series, so the hub can tell which node's exporter is failing
HEALTH_NODE_LABEL = "hostname"


def nvidia_labels(r: GpuReading, hostname: str) -> dict[str, str]:
    """dcgm-exporter's label set and order; MIG labels only on slices, as upstream."""
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
    labels["DCGM_FI_DRIVER_VERSION"] = r.driver_version
    return labels


def amd_labels(r: GpuReading, hostname: str) -> dict[str, str]:
    """device-metrics-exporter's labels (client_golang prints them sorted, so do we)."""
    return {
        "card_model": r.board_model,
        "card_series": r.model,
        "driver_version": r.driver_version,
        "gpu_id": str(r.index),
        "gpu_uuid": r.uuid,
        "hostname": hostname,
        "serial_number": r.serial,
    }


def _families(fields: Sequence[Field], readings: Sequence[GpuReading],
              labels: Callable[[GpuReading, str], dict[str, str]],
              hostname: str) -> list[Metric]:
    label_sets = [labels(r, hostname) for r in readings]
    out: list[Metric] = []
    for f in fields:
        metric = Metric(f.name, f.help, f.typ)
        for r, lbl in zip(readings, label_sets, strict=True):
            value = f.value(r)
            if value is not None:
                metric.add_sample(f.name, lbl, float(value))
        # An empty family would still print HELP/TYPE; upstream exporters print nothing.
        if metric.samples:
            out.append(metric)
    return out


def gpu_families(vendor: str, readings: Sequence[GpuReading], hostname: str,
                 device_count: int) -> list[Metric]:
    """Metric families of one collection, named the way the vendor's own exporter names them."""
    if vendor == NVIDIA:
        return _families(DCGM_FIELDS, readings, nvidia_labels, hostname)
    if vendor == AMD:
        out = _families(AMD_FIELDS, readings, amd_labels, hostname)
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
