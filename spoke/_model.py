"""The plain data a backend hands to the exporter, and the contract every backend keeps.

Backends turn a vendor library's answers into ``GpuReading`` records in fixed units (MiB, W,
°C, MHz, percent, ratio). Everything vendor-specific about *naming* happens later, in
``spoke._naming``; everything vendor-specific about *asking* happens in the backend. Keeping
the record between them plain lets tests build expected output without any library at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

#: where the kubelet serves its pod-resources API (the exporter's --kubelet-socket default)
KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

#: DRA drivers whose devices are GPUs: pod-resources names a container's DRA devices by
#: (driver, pool, device), and a GPU reading lists the ``driver/device`` keys it answers to
NVIDIA_DRA_DRIVER = "gpu.nvidia.com"
AMD_DRA_DRIVER = "gpu.amd.com"


def dra_key(driver: str, device: str) -> str:
    """How a DRA device appears among a reading's ``device_ids`` (driver-qualified, so a
    device name can never be taken for a UUID)."""
    return f"{driver}/{device}"


def dra_gpu_id(minor: int) -> str:
    """NVIDIA's DRA driver names a whole GPU after its minor number (/dev/nvidia<minor>)."""
    return dra_key(NVIDIA_DRA_DRIVER, f"gpu-{minor}")


def dra_mig_id(minor: int, profile_id: int, start: int, size: int) -> str:
    """…and a MIG device after its GPU, GPU-instance profile ID and placement."""
    return dra_key(NVIDIA_DRA_DRIVER, f"gpu-{minor}-mig-{profile_id}-{start}-{size}")


class LibraryNotFound(Exception):
    """The GPU management library (or its driver) is not on this host.

    Distinct from a failing GPU: it ends the command with exit 3 before anything is served.
    """


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU, or one MIG slice of it, as read in one collection pass.

    ``None`` means the library does not report that value for this device; the series is then
    left out rather than published as 0, which is what the upstream exporters do too.
    Memory is MiB for both vendors: NVML's bytes are divided by 2**20, and AMD SMI's "MB"
    already are MiB (it shifts bytes by 20), which is also what device-metrics-exporter shows.
    """

    index: int
    uuid: str
    model: str
    driver_version: str = ""
    pci_bus_id: str = ""
    serial: str = ""
    board_model: str = ""
    #: MIG slice identity: a slice carries its PARENT's index and UUID plus these two.
    mig_profile: str | None = None
    mig_instance: int | None = None
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_free_mib: float | None = None
    mem_reserved_mib: float | None = None
    mem_total_mib: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    junction_temp_c: float | None = None
    sm_clock_mhz: float | None = None
    last_xid: float | None = None
    engine_active_ratio: float | None = None
    # dcgm-exporter's other default fields (units as DCGM publishes them)
    mem_clock_mhz: float | None = None
    memory_temp_c: float | None = None
    energy_mj: float | None = None  # counter since driver load
    pcie_replays: float | None = None  # counter
    mem_copy_util_pct: float | None = None
    enc_util_pct: float | None = None
    dec_util_pct: float | None = None
    remapped_rows_uncorrectable: float | None = None  # counter
    remapped_rows_correctable: float | None = None  # counter
    row_remap_failure: float | None = None  # 1 when a row could not be remapped
    #: GPM's SM_UTIL and SM_OCCUPANCY as 0-1 ratios (DCGM_FI_PROF_SM_ACTIVE / _SM_OCCUPANCY):
    #: the share of time an SM had a warp, and how full the SMs were with warps
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    # health beyond the default set: volatile ECC counts and the clocks-event bitmask
    ecc_dbe_volatile: float | None = None
    ecc_sbe_volatile: float | None = None
    clocks_event_reasons: float | None = None
    #: ids the kubelet's pod-resources API may name this device by (GPU or MIG UUID, AMD
    #: UUID or PCI address): pod attribution matches on these
    device_ids: tuple[str, ...] = ()

    @property
    def is_slice(self) -> bool:
        return self.mig_instance is not None


@dataclass(frozen=True, slots=True)
class Cadence:
    """How often the expensive readings are taken, in seconds (0: every collection).

    Measured on a real H200 (shared/FIELD_NOTES.md), one NVML call dominates a collection:
    nvmlDeviceGetTotalEnergyConsumption takes 4.1 ms of CPU, nvmlGpmMetricsGet 1.9 ms, every
    other call about 0.01 ms. The energy and PCIe-replay readings are counters, so reading them
    every ``slow`` seconds loses nothing (the counter holds every joule in between); GPM's
    profiling ratios are averages over the window between two samples, so sampling every
    ``prof`` seconds gives the average over that window instead of over one interval. Between
    reads the last value is published again. A cadence at or below the collection interval
    means every collection.
    """

    slow: float = 0.0
    prof: float = 0.0

    def within(self, interval: float) -> Cadence:
        """This cadence on a loop of ``interval``: one not longer than a pass is every pass
        (a pass finishing a hair early must not skip a read for a whole interval)."""
        return Cadence(slow=self.slow if self.slow > interval else 0.0,
                       prof=self.prof if self.prof > interval else 0.0)


#: every reading on every collection (what a backend does unless told otherwise)
EVERY_PASS = Cadence()
#: the exporter's defaults (``--slow-interval`` / ``--prof-interval``)
DEFAULT_CADENCE = Cadence(slow=30.0, prof=10.0)


@dataclass(frozen=True, slots=True)
class Failure:
    """A device the library could not read this pass (lost from the bus, reset, ...)."""

    index: int
    message: str


@dataclass(frozen=True, slots=True)
class Collection:
    """The outcome of one pass: what could be read, and which devices failed."""

    readings: tuple[GpuReading, ...] = ()
    failures: tuple[Failure, ...] = ()
    #: devices the library enumerates, failed ones included (AMD's gpu_nodes_total)
    device_count: int = 0


class Backend(Protocol):
    """What the exporter needs from a GPU library adapter.

    ``collect`` may raise: the exporter then counts one error, reports ``up 0`` and serves no
    GPU series until a later pass succeeds. A single failing device must instead be returned
    as a ``Failure`` so the other devices keep being served.
    """

    name: str  # "nvml" | "amdsmi" | "sim", shown in build_info
    vendor: str  # "nvidia" | "amd": which naming the readings are published under

    def open(self) -> None: ...

    def collect(self) -> Collection: ...

    def close(self) -> None: ...
