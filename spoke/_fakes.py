"""In-memory stand-ins for ``pynvml`` and ``amdsmi`` with the real function names and shapes.

The backends take their library as a constructor argument, so the simulated backend, the
tests and the benchmark all run the *real* backend code against these objects: same call
names, argument order, return shapes and units (milliwatts and bytes from NVML, MB and W from
AMD SMI), and the same exceptions (pynvml's own ``NVMLError`` classes; an ``AmdSmiException``
hierarchy shaped like amdsmi's, whose import needs ROCm). State is plain mutable data that a
test or the simulation changes between collections.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pynvml as _pynvml  # pure Python until nvmlInit(); supplies real error classes and codes

MIB = 1024 * 1024


# --------------------------------------------------------------------------- NVML ---------
@dataclass
class FakeMigSlice:
    """One MIG GPU instance: what NVML reports through its MIG device handle."""

    gi_id: int
    profile: str = "1g.10gb"
    slot: int = 0
    #: first memory slice of its placement (nvmlGpuInstanceGetInfo's placement.start);
    #: None: the slot number
    start: int | None = None
    memory_total: int = 9856 * MIB
    memory_used: int = 0
    graphics_util: float = 0.0  # percent, what GPM's GRAPHICS_UTIL metric returns
    #: other GPM metrics by pynvml id (percent, or MiB/s for PCIe); absent: NOT_SUPPORTED
    gpm_metrics: dict[int, float] = field(default_factory=dict)

    @property
    def uuid(self) -> str:
        """MIG device UUID, what the device plugin hands the kubelet under MIG."""
        return f"MIG-{self.gi_id:08x}-{self.slot:04x}-5000-8000-000000000000"


@dataclass
class FakeNvmlGpu:
    """One physical GPU. ``None`` in a value field makes NVML answer NOT_SUPPORTED for it."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str = "00000000:18:00.0"
    memory_total: int = 81559 * MIB
    memory_used: int = 0
    memory_reserved: int | None = 0  # None: no nvmlDeviceGetMemoryInfo_v2 for this device
    util: int | None = 0
    power_mw: int | None = 70_000
    temp: int | None = 30
    sm_clock: int | None = 1980
    serial: str | None = "1652823055404"  # None: nvmlDeviceGetSerial NOT_SUPPORTED
    mem_clock: int | None = 2619  # MHz
    memory_temp: int | None = 37  # °C, field value NVML_FI_DEV_MEMORY_TEMP
    energy_mj: int | None = 2_088_017  # nvmlDeviceGetTotalEnergyConsumption, mJ
    pcie_replays: int | None = 0
    mem_util: int = 0  # utilization.memory, percent
    enc_util: int | None = 0
    dec_util: int | None = 0
    #: nvmlDeviceGetRemappedRows: (correctable, uncorrectable, pending, failure); None: Ampere-
    #: less parts answer NOT_SUPPORTED (they retire pages instead)
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    ecc_dbe: int | None = 0  # volatile double-bit ECC errors; None: ECC off/unsupported
    ecc_sbe: int | None = 0
    clocks_event_reasons: int | None = 0  # nvmlClocksEventReason* bitmask
    #: GPM metrics of the whole GPU by pynvml id (percent, MiB/s for PCIe)
    gpm_metrics: dict[int, float] = field(default_factory=dict)
    xid_events: bool = True  # supports XID event registration
    gpm: bool = True  # supports GPU performance monitoring (Hopper and later)
    mig: list[FakeMigSlice] | None = None  # None: MIG not supported; a list: MIG enabled
    mig_slots: int = 7
    lost: bool = False  # fell off the bus: every call about it raises GPU_IS_LOST
    minor: int | None = None  # /dev/nvidia<minor>; None: the same as its index


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass(frozen=True)
class _MigHandle:
    index: int
    slot: int


@dataclass
class _Struct:
    """Attribute bag standing in for pynvml's ctypes structures."""

    values: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class _GpmSample:
    values: dict[int, float] = field(default_factory=dict)
    freed: bool = False


@dataclass
class _Value:
    """pynvml.c_nvmlValue_t: a union; the field value's valueType says which member is set."""

    dVal: float = 0.0
    uiVal: int = 0
    ulVal: int = 0
    ullVal: int = 0
    sllVal: int = 0
    siVal: int = 0


@dataclass
class _FieldValue:
    """pynvml.c_nvmlFieldValue_t."""

    fieldId: int
    nvmlReturn: int = 0
    valueType: int = 0
    value: _Value = field(default_factory=_Value)


@dataclass
class _GpmMetric:
    metricId: int = 0
    nvmlReturn: int = 0
    value: float = 0.0


class _GpmMetrics:
    """The struct's fixed array of NVML_GPM_METRIC_MAX entries, made on first touch: the C
    array costs nothing to allocate, a list of 200 Python objects would dominate what a
    benchmark of the backend measures."""

    def __init__(self) -> None:
        self._made: dict[int, _GpmMetric] = {}

    def __getitem__(self, i: int) -> _GpmMetric:
        if not 0 <= i < _pynvml.NVML_GPM_METRIC_MAX:
            raise IndexError(i)
        return self._made.setdefault(i, _GpmMetric())

    def __iter__(self) -> Iterator[_GpmMetric]:
        return (self[i] for i in range(_pynvml.NVML_GPM_METRIC_MAX))


class _GpmMetricsGet:
    """Shape of pynvml.c_nvmlGpmMetricsGet_t: the backend fills it in and passes it."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: _GpmSample | None = None
        self.sample2: _GpmSample | None = None
        self.metrics = _GpmMetrics()


_PROFILE_IDS = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}
#: GPU instance profile IDs as NVML reports them (`nvidia-smi mig -lgip`'s ID column)
_GI_PROFILE_IDS = {"1g.5gb": 19, "1g.10gb": 19, "1g.12gb": 19, "1g.20gb": 15, "1g.24gb": 15,
                   "2g.10gb": 14, "2g.20gb": 14, "2g.24gb": 14, "3g.20gb": 9, "3g.40gb": 9,
                   "3g.47gb": 9, "4g.20gb": 5, "4g.40gb": 5, "4g.47gb": 5, "7g.40gb": 0,
                   "7g.80gb": 0, "7g.94gb": 0}
#: memory slices a placement of each compute-slice count spans (A100/H100)
_PLACEMENT_SIZE = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}


def _profile_id(s: FakeMigSlice) -> int:
    slices = int(s.profile.split("g", 1)[0])
    return _GI_PROFILE_IDS.get(s.profile, _PROFILE_IDS.get(slices, 0) * 100 + slices)


class FakeNvml:
    """A pynvml look-alike over a list of ``FakeNvmlGpu``."""

    NVMLError = _pynvml.NVMLError
    c_nvmlGpmMetricsGet_t = _GpmMetricsGet

    def __init__(self, gpus: list[FakeNvmlGpu] | None = None, *, driver: str = "580.105.08",
                 init_error: int | None = None) -> None:
        self.gpus: list[FakeNvmlGpu] = list(gpus or [])
        self.driver = driver
        self.init_error = init_error
        self.count_error: int | None = None  # make nvmlDeviceGetCount fail (whole library)
        self.initialised = 0
        self.calls = 0  # device-level calls, for tests that prove who calls the library
        self.gpm_live = 0
        self._event_sets: dict[int, set[int]] = {}
        self._events: list[tuple[int, int]] = []

    # -- test helpers -------------------------------------------------------------------
    def inject_xid(self, index: int, xid: int) -> None:
        """Queue an XID critical-error event for GPU ``index``."""
        self._events.append((index, xid))

    def _raise(self, code: int) -> None:
        raise _pynvml.NVMLError(code)

    def _gpu(self, handle: _Handle | _MigHandle) -> FakeNvmlGpu:
        self.calls += 1
        if not self.initialised:
            self._raise(_pynvml.NVML_ERROR_UNINITIALIZED)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            self._raise(_pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _slice(self, handle: _MigHandle) -> FakeMigSlice:
        gpu = self._gpu(handle)
        for s in gpu.mig or []:
            if s.slot == handle.slot:
                return s
        self._raise(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        raise AssertionError  # unreachable

    def _value(self, value: Any) -> Any:
        if value is None:
            self._raise(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    # -- library ------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            self._raise(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised = max(0, self.initialised - 1)

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error is not None:
            self._raise(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self.gpus):
            self._raise(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetUUID(self, handle: _Handle | _MigHandle) -> str:
        if isinstance(handle, _MigHandle):
            return self._slice(handle).uuid
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> _Struct:
        return _Struct({"busId": self._gpu(handle).pci_bus_id})

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle | _MigHandle,
                                version: int | None = None) -> _Struct:
        if isinstance(handle, _MigHandle):
            s = self._slice(handle)
            total, used, reserved = s.memory_total, s.memory_used, None
        else:
            gpu = self._gpu(handle)
            total, used, reserved = gpu.memory_total, gpu.memory_used, gpu.memory_reserved
        if not version:
            # v1: "used" includes what the driver reserves, as in NVML
            return _Struct({"total": total, "free": total - used - (reserved or 0),
                            "used": used + (reserved or 0)})
        if reserved is None:
            self._raise(_pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return _Struct({"version": version, "total": total, "reserved": reserved,
                        "free": total - used - (reserved or 0), "used": used})

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle | _MigHandle) -> _Struct:
        if isinstance(handle, _MigHandle):
            self._raise(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        gpu = self._gpu(handle)
        if gpu.mig is not None:
            self._raise(_pynvml.NVML_ERROR_NOT_SUPPORTED)  # as NVML does in MIG mode
        return _Struct({"gpu": self._value(gpu.util), "memory": gpu.mem_util})

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._value(self._gpu(handle).power_mw)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        if sensor != _pynvml.NVML_TEMPERATURE_GPU:
            self._raise(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._value(self._gpu(handle).temp)

    def nvmlDeviceGetClockInfo(self, handle: _Handle, type: int) -> int:
        gpu = self._gpu(handle)
        clocks = {_pynvml.NVML_CLOCK_SM: gpu.sm_clock, _pynvml.NVML_CLOCK_MEM: gpu.mem_clock}
        return self._value(clocks.get(type))

    def nvmlDeviceGetSerial(self, handle: _Handle) -> str:
        return self._value(self._gpu(handle).serial)

    def nvmlDeviceGetFieldValues(self, handle: _Handle, fieldIds: list[int]) -> list[_FieldValue]:
        """Like NVML: the call succeeds, each value carries its own nvmlReturn."""
        gpu = self._gpu(handle)
        known = {_pynvml.NVML_FI_DEV_MEMORY_TEMP: gpu.memory_temp}
        out = []
        for fid in fieldIds:
            raw = known.get(fid)
            if raw is None:
                out.append(_FieldValue(fid, nvmlReturn=_pynvml.NVML_ERROR_NOT_SUPPORTED))
            else:
                out.append(_FieldValue(fid, valueType=_pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                                       value=_Value(uiVal=int(raw))))
        return out

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        return self._value(self._gpu(handle).energy_mj)

    def nvmlDeviceGetPcieReplayCounter(self, handle: _Handle) -> int:
        return self._value(self._gpu(handle).pcie_replays)

    def nvmlDeviceGetEncoderUtilization(self, handle: _Handle) -> list[int]:
        return [self._value(self._gpu(handle).enc_util), 100_000]  # [percent, period µs]

    def nvmlDeviceGetDecoderUtilization(self, handle: _Handle) -> list[int]:
        return [self._value(self._gpu(handle).dec_util), 100_000]

    def nvmlDeviceGetRemappedRows(self, device: _Handle) -> tuple[int, int, int, int]:
        return self._value(self._gpu(device).remapped_rows)

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, errorType: int,
                                    counterType: int) -> int:
        gpu = self._gpu(handle)
        if counterType != _pynvml.NVML_VOLATILE_ECC:
            self._raise(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        if errorType == _pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return self._value(gpu.ecc_dbe)
        return self._value(gpu.ecc_sbe)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return self._value(self._gpu(handle).clocks_event_reasons)

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    # -- MIG ----------------------------------------------------------------------------
    def nvmlDeviceGetMinorNumber(self, device: _Handle) -> int:
        gpu = self._gpu(device)
        return device.index if gpu.minor is None else gpu.minor

    def nvmlDeviceGetMigMode(self, device: _Handle) -> list[int]:
        gpu = self._gpu(device)
        if gpu.mig is None:
            self._raise(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [_pynvml.NVML_DEVICE_MIG_ENABLE, _pynvml.NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: _Handle) -> int:
        return self._gpu(device).mig_slots

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: _Handle,
                                            index: int) -> _MigHandle:
        gpu = self._gpu(device)
        if not any(s.slot == index for s in gpu.mig or []):
            self._raise(_pynvml.NVML_ERROR_NOT_FOUND)
        return _MigHandle(device.index, index)

    def nvmlDeviceGetGpuInstanceId(self, device: _MigHandle) -> int:
        return self._slice(device).gi_id

    def nvmlDeviceGetGpuInstanceById(self, device: _Handle,
                                     gpuInstanceId: int) -> tuple[int, int]:
        gpu = self._gpu(device)
        if not any(s.gi_id == gpuInstanceId for s in gpu.mig or []):
            self._raise(_pynvml.NVML_ERROR_NOT_FOUND)
        return (device.index, gpuInstanceId)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: tuple[int, int]) -> _Struct:
        index, gi_id = gpuInstance
        s = next(s for s in self._gpu(_Handle(index)).mig or [] if s.gi_id == gi_id)
        slices = int(s.profile.split("g", 1)[0])
        placement = _Struct({"start": s.slot if s.start is None else s.start,
                             "size": _PLACEMENT_SIZE.get(slices, slices)})
        return _Struct({"id": gi_id, "profileId": _profile_id(s), "device": _Handle(index),
                        "placement": placement})

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, device: _Handle,
                                                profileId: int) -> _Struct:
        gpu = self._gpu(device)
        for s in gpu.mig or []:
            slices = int(s.profile.split("g", 1)[0])
            if _profile_id(s) == profileId:
                return _Struct({"id": profileId, "sliceCount": slices,
                                "memorySizeMB": s.memory_total // MIB,
                                "name": f"MIG {s.profile}"})
        self._raise(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        raise AssertionError  # unreachable

    def nvmlDeviceGetAttributes(self, device: _MigHandle) -> _Struct:
        s = self._slice(device)
        return _Struct({"gpuInstanceSliceCount": int(s.profile.split("g", 1)[0]),
                        "memorySizeMB": s.memory_total // MIB})

    # -- XID events ---------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> int:
        key = len(self._event_sets) + 1
        self._event_sets[key] = set()
        return key

    def nvmlDeviceRegisterEvents(self, handle: _Handle, eventTypes: int,
                                 eventSet: int) -> None:
        gpu = self._gpu(handle)
        if not gpu.xid_events:
            self._raise(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._event_sets[eventSet].add(handle.index)

    def nvmlEventSetWait_v2(self, eventSet: int, timeoutms: int) -> _Struct:
        registered = self._event_sets[eventSet]
        for i, (index, xid) in enumerate(self._events):
            if index in registered:
                del self._events[i]
                return _Struct({"device": _Handle(index),
                                "eventType": _pynvml.nvmlEventTypeXidCriticalError,
                                "eventData": xid, "gpuInstanceId": 0,
                                "computeInstanceId": 0})
        self._raise(_pynvml.NVML_ERROR_TIMEOUT)
        raise AssertionError  # unreachable

    nvmlEventSetWait = nvmlEventSetWait_v2

    def nvmlEventSetFree(self, eventSet: int) -> None:
        self._event_sets.pop(eventSet, None)

    # -- GPM (GR engine activity of MIG slices) -------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, device: _Handle) -> _Struct:
        return _Struct({"version": 1, "isSupportedDevice": int(self._gpu(device).gpm)})

    def nvmlGpmSampleAlloc(self) -> _GpmSample:
        self.gpm_live += 1
        return _GpmSample()

    def nvmlGpmSampleFree(self, gpmSample: _GpmSample) -> None:
        if not gpmSample.freed:
            gpmSample.freed = True
            self.gpm_live -= 1

    def nvmlGpmMigSampleGet(self, device: _Handle, gpuInstanceId: int,
                            gpmSample: _GpmSample) -> _GpmSample:
        gpu = self._gpu(device)
        if not gpu.gpm:
            self._raise(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        for s in gpu.mig or []:
            if s.gi_id == gpuInstanceId:
                gpmSample.values = {_pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: s.graphics_util,
                                    **s.gpm_metrics}
                return gpmSample
        self._raise(_pynvml.NVML_ERROR_NOT_FOUND)
        raise AssertionError  # unreachable

    def nvmlGpmSampleGet(self, device: _Handle, gpmSample: _GpmSample) -> _GpmSample:
        gpu = self._gpu(device)
        if not gpu.gpm:
            self._raise(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        gpmSample.values = dict(gpu.gpm_metrics)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: _GpmMetricsGet) -> _GpmMetricsGet:
        s1, s2 = metricsGet.sample1, metricsGet.sample2
        if s1 is None or s2 is None or s1.freed or s2.freed:
            self._raise(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for m in (metricsGet.metrics[i] for i in range(metricsGet.numMetrics)):
            if s2 is not None and m.metricId in s2.values:
                m.value, m.nvmlReturn = float(s2.values[m.metricId]), _pynvml.NVML_SUCCESS
            else:
                m.nvmlReturn = _pynvml.NVML_ERROR_NOT_SUPPORTED
        return metricsGet


# Constants the backend reads from the module object (error codes, sensor and clock ids, ...).
for _name in dir(_pynvml):
    if _name.startswith(("NVML_", "NVMLError_", "nvmlEventType")) or _name == "nvmlMemory_v2":
        setattr(FakeNvml, _name, getattr(_pynvml, _name))


#: What GPM answered on a real H200 under a bf16 matrix load (shared/FIELD_NOTES.md, "The
#: NVML exporter on a real H200"; PCIe from shared/samples/nvml-h100-probe.txt), in NVML's
#: units: percent, MiB/s. The SMs are busy almost all the time the engine is (96.4 of
#: 99.8 %), yet hold few warps (occupancy 14.3 %): a large-tile matmul.
HOPPER_BF16_GPM: dict[int, float] = {
    _pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 99.8,
    _pynvml.NVML_GPM_METRIC_SM_UTIL: 96.4,
    _pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 14.3,
    _pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 93.6,
    _pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 17.3,
    _pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 1490.0,
    _pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 557.0,
}

#: CPU seconds per NVML call measured on a real H200 (16-core host, driver 580.159.04);
#: every call not named cost at most 0.01 ms there, which is what ``CostedNvml`` charges.
H200_CALL_COSTS: dict[str, float] = {
    "nvmlDeviceGetTotalEnergyConsumption": 4.1e-3,
    "nvmlGpmMetricsGet": 1.9e-3,
    "nvmlDeviceGetPcieReplayCounter": 0.15e-3,
    "nvmlGpmSampleGet": 0.05e-3,
    "nvmlGpmMigSampleGet": 0.05e-3,
}
OTHER_CALL_COST = 0.01e-3


class CostedNvml:
    """A ``FakeNvml`` whose calls cost what the real library's do, so a benchmark of the
    backend shows what the GPU library costs a collection, not only our own Python.

    Every ``nvml*`` function called through it adds its cost to ``charged`` (seconds of
    CPU): accounted, not burnt, so a figure does not depend on a busy machine. With
    ``burn=True`` the cost is also spent in a busy loop (the process's CPU time then
    includes it, as on a GPU host). Constants and error classes pass through unchanged.
    """

    def __init__(self, inner: FakeNvml, costs: Mapping[str, float] = H200_CALL_COSTS, *,
                 other: float = OTHER_CALL_COST, burn: bool = False,
                 cpu: Callable[[], float] = time.process_time) -> None:
        self.inner = inner
        self.costs = dict(costs)
        self.other = other
        self.burn = burn
        self._cpu = cpu
        self.charged = 0.0
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if not (name.startswith("nvml") and callable(value)):
            return value
        cost = self.costs.get(name, self.other)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.charged += cost
            self.calls[name] = self.calls.get(name, 0) + 1
            if self.burn:
                until = self._cpu() + cost
                while self._cpu() < until:
                    pass
            return value(*args, **kwargs)
        return call


# ------------------------------------------------------------------------ AMD SMI --------
class AmdSmiException(Exception):
    """Base of amdsmi's exceptions."""


class AmdSmiLibraryException(AmdSmiException):
    """amdsmi's error for a failed library call; ``err_code`` is an AMDSMI_STATUS_* value."""

    def __init__(self, err_code: int) -> None:
        super().__init__(abs(err_code))
        self.err_code = abs(err_code)

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | AMDSMI status {self.err_code}"


class AmdSmiTemperatureType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0
    MAX = 1


class AmdSmiInitFlags(enum.IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2


# FakeAmdSmi carries the enums under their own names, as the amdsmi module does; inside its
# body those names are its attributes, not types, so its signatures use these
_InitFlags = AmdSmiInitFlags
_TemperatureType = AmdSmiTemperatureType
_TemperatureMetric = AmdSmiTemperatureMetric


AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_NOT_FOUND = 31
AMDSMI_STATUS_FAIL_LOAD_MODULE = 4


@dataclass
class FakeAmdGpu:
    """One AMD GPU. ``None`` in a value field makes AMD SMI answer NOT_SUPPORTED."""

    uuid: str
    market_name: str = "AMD Instinct MI300X"
    model_number: str = "102-G30211-00"
    serial: str = "692251001124"
    bdf: str = "0000:0c:00.0"
    driver: str = "6.10.5"
    vram_total_mb: int = 196592
    vram_used_mb: int = 0
    gfx_activity: int | str | None = 0  # "N/A" is what amdsmi returns for 0xFFFF
    power_w: int | str | None = 140
    edge_temp: int | None = 35
    hotspot_temp: int | None = 40
    temp_scale: int = 1  # 1000: report millidegrees, as some releases did
    umc_activity: int | str = 0
    ecc_correctable: int | None = 0  # None: ECC not supported (NOT_SUPPORTED)
    ecc_uncorrectable: int | None = 0
    lost: bool = False


@dataclass(frozen=True)
class _AmdHandle:
    value: int


@dataclass
class FakeAmdSmi:
    """An amdsmi look-alike over a list of ``FakeAmdGpu``."""

    gpus: list[FakeAmdGpu] = field(default_factory=list)
    init_error: int | None = None
    initialised: bool = False
    calls: int = 0

    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiTemperatureType = AmdSmiTemperatureType
    AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    AmdSmiInitFlags = AmdSmiInitFlags

    def _gpu(self, handle: _AmdHandle) -> FakeAmdGpu:
        self.calls += 1
        if not self.initialised:
            raise AmdSmiLibraryException(32)  # AMDSMI_STATUS_NOT_INIT
        gpu = self.gpus[handle.value]
        if gpu.lost:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_FOUND)
        return gpu

    @staticmethod
    def _value(value: Any) -> Any:
        if value is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return value

    def amdsmi_init(self, flag: _InitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        if self.init_error is not None:
            raise AmdSmiLibraryException(self.init_error)
        self.initialised = True

    def amdsmi_shut_down(self) -> None:
        self.initialised = False

    def amdsmi_get_processor_handles(self) -> list[_AmdHandle]:
        if not self.initialised:
            raise AmdSmiLibraryException(32)
        return [_AmdHandle(i) for i in range(len(self.gpus))]

    def amdsmi_get_gpu_device_uuid(self, processor_handle: _AmdHandle) -> str:
        return self._gpu(processor_handle).uuid

    def amdsmi_get_gpu_device_bdf(self, processor_handle: _AmdHandle) -> str:
        return self._gpu(processor_handle).bdf

    def amdsmi_get_gpu_asic_info(self, processor_handle: _AmdHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle)
        return {"market_name": gpu.market_name, "vendor_id": "0x1002",
                "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]", "subvendor_id": "0x1002",
                "device_id": "0x74a1", "rev_id": "0x00", "asic_serial": "0xD9A85F1A2B3C4D5E",
                "oam_id": 0, "num_compute_units": 304, "target_graphics_version": "gfx942",
                "subsystem_id": "0x74a1"}

    def amdsmi_get_gpu_board_info(self, processor_handle: _AmdHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle)
        return {"model_number": gpu.model_number or "N/A",
                "product_serial": gpu.serial or "N/A", "fru_id": "N/A",
                "product_name": gpu.market_name, "manufacturer_name": "AMD"}

    def amdsmi_get_gpu_driver_info(self, processor_handle: _AmdHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle)
        return {"driver_name": "amdgpu", "driver_version": gpu.driver,
                "driver_date": "2015/01/01 00:00"}

    def amdsmi_get_gpu_activity(self, processor_handle: _AmdHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle)
        gfx = "N/A" if gpu.gfx_activity is None else gpu.gfx_activity
        return {"gfx_activity": gfx, "umc_activity": gpu.umc_activity, "mm_activity": "N/A"}

    def amdsmi_get_gpu_total_ecc_count(self, processor_handle: _AmdHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle)
        self._value(gpu.ecc_uncorrectable)
        return {"correctable_count": gpu.ecc_correctable,
                "uncorrectable_count": gpu.ecc_uncorrectable, "deferred_count": 0}

    def amdsmi_get_gpu_vram_usage(self, processor_handle: _AmdHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle)
        return {"vram_total": gpu.vram_total_mb, "vram_used": gpu.vram_used_mb}

    def amdsmi_get_power_info(self, processor_handle: _AmdHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle)
        power = "N/A" if gpu.power_w is None else gpu.power_w
        return {"socket_power": power, "current_socket_power": power,
                "average_socket_power": "N/A", "gfx_voltage": "N/A", "soc_voltage": "N/A",
                "mem_voltage": "N/A", "power_limit": 750}

    def amdsmi_get_temp_metric(self, processor_handle: _AmdHandle,
                               sensor_type: _TemperatureType,
                               metric: _TemperatureMetric) -> int:
        gpu = self._gpu(processor_handle)
        if metric != AmdSmiTemperatureMetric.CURRENT:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        raw = {AmdSmiTemperatureType.EDGE: gpu.edge_temp,
               AmdSmiTemperatureType.HOTSPOT: gpu.hotspot_temp}.get(sensor_type)
        return self._value(raw) * gpu.temp_scale
