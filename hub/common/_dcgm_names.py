"""dcgm-exporter's two namings, in one table that the hub and the spoke exporter both read.

dcgm-exporter 4.9 (DCGM 4.7) renamed most fields and changed some units (FIELD_NOTES, fourth
round). The hub reads both spellings everywhere (hub.store) and the spoke exporter can speak
either (spoke._naming, ``--dcgm-names``); both build their tables from this one, so the next
rename is one line here. Data only: nothing to import but the standard library, so the
exporter on a GPU node loads nothing of the hub's for it.
"""

from __future__ import annotations

from typing import NamedTuple

MIB = 2 ** 20


class DcgmRename(NamedTuple):
    """One renamed field. A value under the new name is the legacy value × ``mul`` / ``div``
    (clocks MHz -> Hz, energy mJ -> J, utilisation % -> 0-1, framebuffer MiB -> bytes);
    ``unit`` is gpufleet's own unit of the field; ``help`` is the exporter's HELP text."""

    legacy: str
    dcgm47: str
    legacy_unit: str
    dcgm47_unit: str
    unit: str
    mul: float
    div: float
    help: str

    @property
    def factor(self) -> float:
        """What turns a value under the new name into the legacy name's unit."""
        return self.div / self.mul


DCGM_RENAMES: tuple[DcgmRename, ...] = (
    DcgmRename("DCGM_FI_DEV_GPU_UTIL",
               "DCGM_FI_DEV_GPU_UTIL_RATIO",
               "%", "0-1", "%", 1.0, 100.0,
               "GPU utilization (ratio 0-1)."),
    DcgmRename("DCGM_FI_DEV_MEM_COPY_UTIL",
               "DCGM_FI_DEV_MEMORY_UTIL_RATIO",
               "%", "0-1", "%", 1.0, 100.0,
               "Memory utilization (ratio 0-1)."),
    DcgmRename("DCGM_FI_DEV_ENC_UTIL",
               "DCGM_FI_DEV_ENC_UTIL_RATIO",
               "%", "0-1", "%", 1.0, 100.0,
               "Encoder utilization (ratio 0-1)."),
    DcgmRename("DCGM_FI_DEV_DEC_UTIL",
               "DCGM_FI_DEV_DEC_UTIL_RATIO",
               "%", "0-1", "%", 1.0, 100.0,
               "Decoder utilization (ratio 0-1)."),
    DcgmRename("DCGM_FI_DEV_FB_FREE",
               "DCGM_FI_DEV_FB_FREE_BYTES",
               "MiB", "bytes", "MiB", MIB, 1.0,
               "Framebuffer memory free (in bytes)."),
    DcgmRename("DCGM_FI_DEV_FB_USED",
               "DCGM_FI_DEV_FB_USED_BYTES",
               "MiB", "bytes", "MiB", MIB, 1.0,
               "Framebuffer memory used (in bytes)."),
    DcgmRename("DCGM_FI_DEV_FB_RESERVED",
               "DCGM_FI_DEV_FB_RESERVED_BYTES",
               "MiB", "bytes", "MiB", MIB, 1.0,
               "Framebuffer memory reserved (in bytes)."),
    DcgmRename("DCGM_FI_DEV_SM_CLOCK",
               "DCGM_FI_DEV_SM_CLOCK_HERTZ",
               "MHz", "Hz", "MHz", 1e6, 1.0,
               "SM clock frequency (in Hz)."),
    DcgmRename("DCGM_FI_DEV_MEM_CLOCK",
               "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ",
               "MHz", "Hz", "MHz", 1e6, 1.0,
               "Memory clock frequency (in Hz)."),
    DcgmRename("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
               "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
               "mJ", "J", "J", 1.0, 1000.0,
               "Total energy consumption since boot (in J)."),
    DcgmRename("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
               "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND",
               "MB/s", "B/s", "MB/s", 1e6, 1.0,
               "NVLink throughput (in B/s)."),
    DcgmRename("DCGM_FI_DEV_GPU_TEMP",
               "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
               "°C", "°C", "°C", 1.0, 1.0,
               "GPU temperature (in C)."),
    DcgmRename("DCGM_FI_DEV_MEMORY_TEMP",
               "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
               "°C", "°C", "°C", 1.0, 1.0,
               "Memory temperature (in C)."),
    DcgmRename("DCGM_FI_DEV_POWER_USAGE",
               "DCGM_FI_DEV_BOARD_POWER_WATTS",
               "W", "W", "W", 1.0, 1.0,
               "Board power draw (in W)."),
    DcgmRename("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
               "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
               "count", "count", "count", 1.0, 1.0,
               "Total number of PCIe retries."),
    DcgmRename("DCGM_FI_DEV_XID_ERRORS",
               "DCGM_FI_DEV_XID_ERROR",
               "XID", "XID", "XID", 1.0, 1.0,
               "Value of the last XID error encountered."),
    DcgmRename("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
               "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
               "rows", "rows", "rows", 1.0, 1.0,
               "Number of remapped rows for uncorrectable errors"),
    DcgmRename("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
               "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
               "rows", "rows", "rows", 1.0, 1.0,
               "Number of remapped rows for correctable errors"),
    DcgmRename("DCGM_FI_DEV_ROW_REMAP_FAILURE",
               "DCGM_FI_DEV_ROW_REMAP_FAILED",
               "0/1", "0/1", "0/1", 1.0, 1.0,
               "Whether remapping of rows has failed"),
    DcgmRename("DCGM_FI_PROF_GR_ENGINE_ACTIVE",
               "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
               "0-1", "0-1", "%", 1.0, 1.0,
               "Ratio of time the graphics engine is active."),
    DcgmRename("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
               "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
               "0-1", "0-1", "%", 1.0, 1.0,
               "Ratio of cycles the tensor (HMMA) pipe is active."),
    DcgmRename("DCGM_FI_PROF_DRAM_ACTIVE",
               "DCGM_FI_PROF_DRAM_UTIL_RATIO",
               "0-1", "0-1", "%", 1.0, 1.0,
               "Ratio of cycles the device memory interface is active sending or receiving data."),
    DcgmRename("DCGM_FI_PROF_SM_ACTIVE",
               "DCGM_FI_PROF_SM_UTIL_RATIO",
               "0-1", "0-1", "%", 1.0, 1.0,
               "The ratio of cycles an SM has at least 1 warp assigned."),
    DcgmRename("DCGM_FI_PROF_SM_OCCUPANCY",
               "DCGM_FI_PROF_SM_OCCUPANCY_RATIO",
               "0-1", "0-1", "%", 1.0, 1.0,
               "The ratio of number of warps resident on an SM."),
)
#: the driver-version label, legacy and dcgm-4.7 spellings
DRIVER_LABELS = ("DCGM_FI_DRIVER_VERSION", "DCGM_FI_SYSTEM_DRIVER_VERSION")
#: total framebuffer, collected by default from dcgm-exporter 4.9 (bytes)
FB_CAPACITY = "DCGM_FI_DEV_FB_CAPACITY_BYTES"
