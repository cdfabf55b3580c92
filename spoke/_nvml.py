"""NVIDIA backend: reads GPUs and MIG slices through NVML (the ``pynvml`` module).

The module is a constructor argument, never imported here at top level: tests and the
simulation hand in ``spoke._fakes.FakeNvml``, production hands in what ``load_nvml`` returns.
Units are converted once, here: NVML's milliwatts → W, bytes → MiB.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable
from typing import Any, Literal, TypedDict

from spoke._model import (
    EVERY_PASS,
    Cadence,
    Collection,
    Failure,
    GpuReading,
    LibraryNotFound,
    dra_gpu_id,
    dra_mig_id,
)

log = logging.getLogger(__name__)

_MIB = 1024 * 1024
_MAX_EVENTS_PER_PASS = 256  # bounds the drain so a storm of XIDs cannot stall a collection

#: the GpuReading fields GPM fills: spelled out so a reading built with ``**gpm`` is checked
_GpmField = Literal["engine_active_ratio", "sm_active_ratio", "sm_occupancy_ratio",
                    "tensor_active_ratio", "dram_active_ratio", "pcie_tx_bytes_per_s",
                    "pcie_rx_bytes_per_s"]


class _GpmValues(TypedDict, total=False):
    """What one GPM window answered: a metric the device does not answer is absent."""

    engine_active_ratio: float
    sm_active_ratio: float
    sm_occupancy_ratio: float
    tensor_active_ratio: float
    dram_active_ratio: float
    pcie_tx_bytes_per_s: float
    pcie_rx_bytes_per_s: float


#: GPM metric -> GpuReading field and the factor into DCGM's unit (percent -> ratio, MiB/s ->
#: bytes/s), in the order dcgm-exporter's default counters list the PROF fields
_GPM_METRICS: tuple[tuple[str, _GpmField, float], ...] = (
    ("NVML_GPM_METRIC_GRAPHICS_UTIL", "engine_active_ratio", 0.01),
    ("NVML_GPM_METRIC_SM_UTIL", "sm_active_ratio", 0.01),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", "sm_occupancy_ratio", 0.01),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "tensor_active_ratio", 0.01),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "dram_active_ratio", 0.01),
    ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", "pcie_tx_bytes_per_s", float(_MIB)),
    ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", "pcie_rx_bytes_per_s", float(_MIB)),
)
#: nvmlValueType_t -> member of the nvmlValue_t union that holds the number
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}


class _Schedule:
    """When each device's expensive reading is due: every ``every`` seconds, devices in turn.

    Every device is read on its first pass (so its series exist from the start); after that
    device ``slot`` (0 <= slot < 1, its place among the node's devices) is next due
    ``every * (1 - slot)`` later and then every ``every``, so an 8-GPU node reads one or two
    GPUs' energy per pass instead of all eight in one slow pass.
    """

    def __init__(self, every: float, clock: Callable[[], float]) -> None:
        self.every = every
        self._clock = clock
        self._next: dict[Hashable, float] = {}

    def due(self, key: Hashable, slot: float) -> bool:
        if self.every <= 0:
            return True
        now = self._clock()
        next_at = self._next.get(key)
        if next_at is None:
            self._next[key] = now + self.every * (1.0 - slot)
            return True
        if now < next_at:
            return False
        # a pass that came late (a stall) does not make the next ones catch up in a burst
        self._next[key] = next_at + self.every if next_at + self.every > now else now + self.every
        return True

    def forget(self, keep: set[Any]) -> None:
        for key in set(self._next) - keep:
            del self._next[key]


def load_nvml() -> Any:
    """Import pynvml (from nvidia-ml-py). The shared library itself loads in ``nvmlInit``."""
    try:
        import pynvml
    except ImportError:
        raise LibraryNotFound(
            "NVML library not found: the nvidia-ml-py package is not installed"
        ) from None
    return pynvml


class NvmlBackend:
    """Reads every GPU NVML enumerates; a GPU that errors is reported, not fatal."""

    name = "nvml"
    vendor = "nvidia"

    def __init__(self, nvml: Any, *, cadence: Cadence = EVERY_PASS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._nvml = nvml
        #: energy and PCIe replays (counters) on ``cadence.slow``, GPM on ``cadence.prof``
        self._slow = _Schedule(cadence.slow, clock)
        self._prof = _Schedule(cadence.prof, clock)
        self._counters: dict[str, tuple[Any, Any]] = {}  # uuid -> (energy mJ, replays)
        self._gpm_last: dict[tuple[str, int], _GpmValues] = {}
        n = nvml
        # Codes that mean "this device does not report that value": the series is left out.
        self._absent = {
            n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_FUNCTION_NOT_FOUND,
            n.NVML_ERROR_NOT_FOUND, n.NVML_ERROR_NO_PERMISSION,
        }
        self._driver = ""
        self._events: Any = None
        self._xid_state: dict[str, bool] = {}  # uuid -> registered (True) / unsupported
        self._last_xid: dict[str, int] = {}
        self._gpm_support: dict[str, bool] = {}
        self._gpm_samples: dict[tuple[str, int], Any] = {}

    # -- lifecycle ----------------------------------------------------------------------
    def open(self) -> None:
        n = self._nvml
        try:
            n.nvmlInit()
        except n.NVMLError as exc:
            if exc.value == n.NVML_ERROR_LIBRARY_NOT_FOUND:
                raise LibraryNotFound(
                    f"NVML library not found (libnvidia-ml.so.1): {exc}"
                ) from None
            raise LibraryNotFound(f"NVML library not usable: {exc}") from None
        try:
            self._driver = str(n.nvmlSystemGetDriverVersion())
        except n.NVMLError:
            self._driver = ""
        try:
            self._events = n.nvmlEventSetCreate()
        except n.NVMLError:
            self._events = None  # no XID series, everything else still works

    def close(self) -> None:
        n = self._nvml
        for sample in self._gpm_samples.values():
            self._quiet(n.nvmlGpmSampleFree, sample)
        self._gpm_samples.clear()
        if self._events is not None:
            self._quiet(n.nvmlEventSetFree, self._events)
            self._events = None
        self._quiet(n.nvmlShutdown)

    # -- collection ---------------------------------------------------------------------
    def collect(self) -> Collection:
        n = self._nvml
        count = n.nvmlDeviceGetCount()  # an error here fails the whole pass (up 0)
        self._drain_xid_events()
        readings: list[GpuReading] = []
        failures: list[Failure] = []
        seen_slices: set[tuple[str, int]] = set()
        seen_gpus: set[str] = set()
        for index in range(count):
            try:
                readings.extend(self._read_gpu(index, index / count, seen_slices, seen_gpus))
            except n.NVMLError as exc:
                failures.append(Failure(index, f"GPU {index}: {exc}"))
        for key in set(self._gpm_samples) - seen_slices:
            self._quiet(n.nvmlGpmSampleFree, self._gpm_samples.pop(key))
        for key in set(self._gpm_last) - seen_slices:
            del self._gpm_last[key]
        for uuid in set(self._counters) - seen_gpus:
            del self._counters[uuid]
        self._prof.forget(seen_slices)
        self._slow.forget(seen_gpus)
        return Collection(tuple(readings), tuple(failures), count)

    def _read_gpu(self, index: int, slot: float, seen_slices: set[tuple[str, int]],
                  seen_gpus: set[str]) -> list[GpuReading]:
        n = self._nvml
        handle = n.nvmlDeviceGetHandleByIndex(index)
        uuid = str(n.nvmlDeviceGetUUID(handle))
        seen_gpus.add(uuid)
        energy, replays = self._slow_counters(handle, uuid, slot)
        pci = self._opt(n.nvmlDeviceGetPciInfo, handle)
        used, free, reserved, total = self._memory(handle)
        util = self._opt(n.nvmlDeviceGetUtilizationRates, handle)
        power_mw = self._opt(n.nvmlDeviceGetPowerUsage, handle)
        rows = self._opt(n.nvmlDeviceGetRemappedRows, handle)  # (corr, unc, pending, failed)
        serial = self._opt(n.nvmlDeviceGetSerial, handle)
        get_minor = getattr(n, "nvmlDeviceGetMinorNumber", None)
        minor = self._opt(get_minor, handle) if get_minor is not None else None
        gpm = self._gpm(handle, uuid, None, seen_slices, slot)
        gpu = GpuReading(
            index=index,
            uuid=uuid,
            model=str(n.nvmlDeviceGetName(handle)),
            driver_version=self._driver,
            pci_bus_id=str(pci.busId) if pci is not None else "",
            serial=str(serial) if serial else "",
            util_pct=float(util.gpu) if util is not None else None,
            mem_copy_util_pct=float(util.memory) if util is not None else None,
            mem_used_mib=used,
            mem_free_mib=free,
            mem_reserved_mib=reserved,
            mem_total_mib=total,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            temp_c=self._opt(n.nvmlDeviceGetTemperature, handle, n.NVML_TEMPERATURE_GPU),
            sm_clock_mhz=self._opt(n.nvmlDeviceGetClockInfo, handle, n.NVML_CLOCK_SM),
            mem_clock_mhz=self._opt(n.nvmlDeviceGetClockInfo, handle, n.NVML_CLOCK_MEM),
            memory_temp_c=self._field(handle, n.NVML_FI_DEV_MEMORY_TEMP),
            energy_mj=energy,
            pcie_replays=replays,
            enc_util_pct=self._first(n.nvmlDeviceGetEncoderUtilization, handle),
            dec_util_pct=self._first(n.nvmlDeviceGetDecoderUtilization, handle),
            remapped_rows_correctable=rows[0] if rows is not None else None,
            remapped_rows_uncorrectable=rows[1] if rows is not None else None,
            row_remap_failure=rows[3] if rows is not None else None,
            ecc_dbe_volatile=self._opt(n.nvmlDeviceGetTotalEccErrors, handle,
                                       n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                       n.NVML_VOLATILE_ECC),
            ecc_sbe_volatile=self._opt(n.nvmlDeviceGetTotalEccErrors, handle,
                                       n.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                       n.NVML_VOLATILE_ECC),
            clocks_event_reasons=self._clocks_event_reasons(handle),
            last_xid=self._xid(handle, uuid),
            device_ids=(uuid, *((dra_gpu_id(minor),) if minor is not None else ())),
            **gpm,
        )
        mode = self._opt(n.nvmlDeviceGetMigMode, handle)
        if mode is None or mode[0] != n.NVML_DEVICE_MIG_ENABLE:
            return [gpu]
        return [gpu, *self._read_slices(handle, gpu, seen_slices, slot, minor)]

    def _slow_counters(self, handle: Any, uuid: str, slot: float) -> tuple[Any, Any]:
        """Energy (mJ) and PCIe replays: read when due (``Cadence.slow``), else the last read.

        Both are counters since driver load, so a value read 20 s ago is still exact about
        everything up to then; the hub's rate over any window longer than the cadence is
        unchanged. The energy call alone costs 4.1 ms of CPU on an H200.
        """
        n = self._nvml
        if self._slow.due(uuid, slot) or uuid not in self._counters:
            self._counters[uuid] = (
                self._opt(n.nvmlDeviceGetTotalEnergyConsumption, handle),
                self._opt(n.nvmlDeviceGetPcieReplayCounter, handle),
            )
        return self._counters[uuid]

    def _read_slices(self, handle: Any, gpu: GpuReading, seen_slices: set[tuple[str, int]],
                     slot: float = 0.0, minor: int | None = None) -> list[GpuReading]:
        """MIG slices carry the parent's index and UUID, as dcgm-exporter's do.

        A slice also carries its GPU's power draw (NVML answers power for the whole GPU
        only): the hub counts a slice's energy as that power times the slice's share of the
        GPU (hub.store.mig_share), so a MIG node's energy is not lost.
        """
        n = self._nvml
        slices: list[GpuReading] = []
        for slot in range(n.nvmlDeviceGetMaxMigDeviceCount(handle)):
            mig = self._opt(n.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
            if mig is None:
                continue  # empty slot
            gi_id = int(n.nvmlDeviceGetGpuInstanceId(mig))
            used, free, _reserved, total = self._memory(mig)
            mig_uuid = self._opt(n.nvmlDeviceGetUUID, mig)
            slices.append(GpuReading(
                index=gpu.index, uuid=gpu.uuid, model=gpu.model,
                driver_version=gpu.driver_version, pci_bus_id=gpu.pci_bus_id,
                serial=gpu.serial,
                mig_profile=self._profile_name(handle, mig, gi_id), mig_instance=gi_id,
                mem_used_mib=used, mem_free_mib=free, mem_total_mib=total,
                power_w=gpu.power_w,
                device_ids=tuple(d for d in (str(mig_uuid) if mig_uuid else "",
                                             self._dra_mig_id(handle, gi_id, minor)) if d),
                **self._gpm(handle, gpu.uuid, gi_id, seen_slices, slot),
            ))
        return slices

    # -- fields -------------------------------------------------------------------------
    def _opt(self, fn: Any, *args: Any) -> Any:
        """Call NVML; None when the device does not support it, raise when it failed."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            if exc.value in self._absent:
                return None
            raise

    def _quiet(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except self._nvml.NVMLError as exc:
            log.debug("ignored NVML error in cleanup: %s", exc)

    def _memory(self, handle: Any) -> tuple[float | None, ...]:
        """(used, free, reserved, total) in MiB; v2 separates what the driver reserves."""
        n = self._nvml
        v2 = getattr(n, "nvmlMemory_v2", None)
        mem = self._opt(n.nvmlDeviceGetMemoryInfo, handle, v2) if v2 else None
        reserved: float | None = None
        if mem is not None:
            reserved = float(mem.reserved // _MIB)
        else:
            mem = self._opt(n.nvmlDeviceGetMemoryInfo, handle)
            if mem is None:
                return None, None, None, None
        return (float(mem.used // _MIB), float(mem.free // _MIB), reserved,
                float(mem.total // _MIB))

    def _dra_mig_id(self, parent: Any, gi_id: int, minor: int | None) -> str:
        """The name NVIDIA's DRA driver gives this MIG device (pod-resources reports it in
        ``dynamic_resources``): ``gpu-<minor>-mig-<GI profile id>-<start>-<size>``."""
        n = self._nvml
        if minor is None:
            return ""
        try:
            info = n.nvmlGpuInstanceGetInfo(n.nvmlDeviceGetGpuInstanceById(parent, gi_id))
            return dra_mig_id(minor, int(info.profileId), int(info.placement.start),
                              int(info.placement.size))
        except (n.NVMLError, AttributeError):
            return ""  # no placement known: the slice is attributed by its MIG UUID only

    def _profile_name(self, parent: Any, mig: Any, gi_id: int) -> str:
        """dcgm-exporter's GPU_I_PROFILE, e.g. "1g.10gb" (NVML names it "MIG 1g.10gb")."""
        n = self._nvml
        by_id = getattr(n, "nvmlDeviceGetGpuInstanceProfileInfoById", None)
        if by_id is not None:
            try:
                info = n.nvmlGpuInstanceGetInfo(n.nvmlDeviceGetGpuInstanceById(parent, gi_id))
                name = str(by_id(parent, info.profileId).name)
            except n.NVMLError:
                name = ""  # e.g. not permitted in this container: derive it below
            if name:
                return name.removeprefix("MIG ").strip()
        # NVIDIA's names round the slice's memory up to whole GB (A100 "1g.5gb" has 4864 MB,
        # "7g.40gb" 40192 MB), so ceil reproduces them where the name itself is unavailable.
        attrs = n.nvmlDeviceGetAttributes(mig)
        return f"{attrs.gpuInstanceSliceCount}g.{math.ceil(attrs.memorySizeMB / 1024)}gb"

    def _field(self, handle: Any, field_id: int) -> float | None:
        """One NVML field value (nvmlDeviceGetFieldValues), None where it is not supported."""
        values = self._opt(self._nvml.nvmlDeviceGetFieldValues, handle, [field_id])
        if not values or values[0].nvmlReturn != self._nvml.NVML_SUCCESS:
            return None
        v = values[0]
        member = _VALUE_MEMBERS.get(int(v.valueType))
        return float(getattr(v.value, member)) if member else None

    def _first(self, fn: Any, handle: Any) -> float | None:
        """Encoder/decoder utilisation come back as [percent, sampling period in µs]."""
        answer = self._opt(fn, handle)
        return float(answer[0]) if answer is not None else None

    def _clocks_event_reasons(self, handle: Any) -> float | None:
        n = self._nvml
        fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            n, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        value = self._opt(fn, handle) if fn is not None else None
        return float(value) if value is not None else None

    def _gpm_supported(self, handle: Any, uuid: str) -> bool:
        if uuid not in self._gpm_support:
            query = getattr(self._nvml, "nvmlGpmQueryDeviceSupport", None)
            support = self._opt(query, handle) if query is not None else None
            self._gpm_support[uuid] = bool(support is not None and support.isSupportedDevice)
        return self._gpm_support[uuid]

    def _gpm(self, parent: Any, uuid: str, gi_id: int | None,
             seen: set[tuple[str, int]], slot: float = 0.0) -> _GpmValues:
        """DCGM_FI_PROF_* of a GPU or slice from two GPM samples, one ``Cadence.prof`` apart.

        GPM metrics are rates between two samples, so the first pass after start (or after
        a slice appears) has no value yet; the series show up one cadence later. Taking one
        sample when due (never sampling twice with a sleep between) keeps a pass cheap, and
        one nvmlGpmMetricsGet (1.9 ms of CPU on an H200) answers every metric at once;
        between samples the last window's averages are published again. A metric the
        device does not answer is left out.
        """
        n = self._nvml
        if not self._gpm_supported(parent, uuid):
            return {}
        key = (uuid, -1 if gi_id is None else gi_id)
        seen.add(key)
        if not self._prof.due(key, slot):
            return self._gpm_last.get(key, {})
        sample = n.nvmlGpmSampleAlloc()
        try:
            if gi_id is None:
                n.nvmlGpmSampleGet(parent, sample)
            else:
                n.nvmlGpmMigSampleGet(parent, gi_id, sample)
        except n.NVMLError as exc:
            self._quiet(n.nvmlGpmSampleFree, sample)
            if exc.value in self._absent:
                return {}
            raise
        previous = self._gpm_samples.get(key)
        self._gpm_samples[key] = sample
        self._gpm_last[key] = {}
        if previous is None:
            return {}
        try:
            request = n.c_nvmlGpmMetricsGet_t()
            request.version = n.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(_GPM_METRICS)
            request.sample1 = previous
            request.sample2 = sample
            for i, (metric_name, _, _) in enumerate(_GPM_METRICS):
                request.metrics[i].metricId = getattr(n, metric_name)
            self._opt(n.nvmlGpmMetricsGet, request)
            out: _GpmValues = {}
            for i, (_, attr, scale) in enumerate(_GPM_METRICS):
                metric = request.metrics[i]
                if metric.nvmlReturn == n.NVML_SUCCESS:
                    value = float(metric.value) * scale
                    out[attr] = round(min(1.0, max(0.0, value)), 6) if scale < 1 else value
            self._gpm_last[key] = out
            return out
        finally:
            self._quiet(n.nvmlGpmSampleFree, previous)

    # -- XID ----------------------------------------------------------------------------
    def _xid(self, handle: Any, uuid: str) -> float | None:
        """Last XID of the GPU (0 when none since start); None where events are unsupported."""
        n = self._nvml
        if self._events is None:
            return None
        if uuid not in self._xid_state:
            try:
                n.nvmlDeviceRegisterEvents(handle, n.nvmlEventTypeXidCriticalError, self._events)
                self._xid_state[uuid] = True
            except n.NVMLError as exc:
                if exc.value == n.NVML_ERROR_GPU_IS_LOST:
                    raise
                self._xid_state[uuid] = False
        if not self._xid_state[uuid]:
            return None
        return float(self._last_xid.get(uuid, 0))

    def _drain_xid_events(self) -> None:
        n = self._nvml
        if self._events is None:
            return
        for _ in range(_MAX_EVENTS_PER_PASS):
            try:
                data = n.nvmlEventSetWait(self._events, 0)
            except n.NVMLError:
                return  # TIMEOUT: nothing pending (other errors: try again next pass)
            if not data.eventType & n.nvmlEventTypeXidCriticalError:
                continue
            try:
                uuid = str(n.nvmlDeviceGetUUID(data.device))
            except n.NVMLError:
                continue
            self._last_xid[uuid] = int(data.eventData)
            log.warning("XID %d on GPU %s", int(data.eventData), uuid)
