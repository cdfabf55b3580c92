"""A simulated node for demos and tests: the real backends over a simulated library.

``SimBackend`` builds a ``FakeNvml`` or ``FakeAmdSmi`` from a seed and a node name, and moves
utilisation, memory and power along smooth, deterministic curves of the clock before each
collection. Going through ``NvmlBackend``/``AmdSmiBackend`` means a demo exercises the same
code (MIG slices, unit conversion, optional fields) as a real GPU host. Several nodes on one
machine stay distinct because every UUID and serial derives from ``seed`` and the node name.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pynvml as _pynvml  # constants only (pure Python until nvmlInit)

from spoke._amdsmi import AmdSmiBackend
from spoke._fakes import (
    HOPPER_BF16_GPM,
    MIB,
    FakeAmdGpu,
    FakeAmdSmi,
    FakeMigSlice,
    FakeNvml,
    FakeNvmlGpu,
)
from spoke._model import EVERY_PASS, Cadence, Collection
from spoke._nvml import NvmlBackend

_PROFILE = re.compile(r"^([1-8])g\.(\d+)gb(\+me)?$")


@dataclass(frozen=True)
class _Model:
    memory_mib: int
    idle_w: float
    max_w: float


_NVIDIA_MODELS = {
    "NVIDIA H100 80GB HBM3": _Model(81559, 70, 700),
    "NVIDIA H200": _Model(143771, 75, 700),
    "NVIDIA A100-SXM4-80GB": _Model(81920, 55, 400),
    "NVIDIA L40S": _Model(46068, 35, 350),
    "Tesla T4": _Model(15360, 10, 70),
}
_AMD_MODELS = {
    "AMD Instinct MI300X": _Model(196592, 140, 750),
    "AMD Instinct MI250X": _Model(65520, 90, 500),
}
DEFAULT_MODEL = {"nvidia": "NVIDIA H100 80GB HBM3", "amd": "AMD Instinct MI300X"}


def parse_mig(spec: str | None) -> list[str]:
    """``"3g.40gb,2g.20gb,1g.10gb"`` → profiles; ValueError naming the bad part."""
    if not spec:
        return []
    profiles = [p.strip() for p in spec.split(",") if p.strip()]
    for p in profiles:
        if not _PROFILE.match(p):
            raise ValueError(f"invalid MIG profile {p!r} (use e.g. 1g.10gb,3g.40gb)")
    slices = sum(int(p.split("g", 1)[0]) for p in profiles)
    if slices > 7:
        raise ValueError(f"MIG profiles {spec!r} use {slices} compute slices; a GPU has 7")
    return profiles


@dataclass(frozen=True)
class Fault:
    """A fault injected into one simulated GPU: ``INDEX:xid=79``, ``INDEX:ecc_dbe=N``,
    ``INDEX:remap_failure``. Lets the demo and the tests show unhealthy GPUs end to end."""

    index: int
    kind: str  # "xid" | "ecc_dbe" | "remap_failure"
    value: int = 1


_FAULT = re.compile(r"^(\d+):(xid|ecc_dbe)=(\d+)$|^(\d+):(remap_failure)$")


def parse_fault(spec: str) -> Fault:
    """``"3:xid=79"`` → Fault(3, "xid", 79); ValueError naming the bad spec."""
    m = _FAULT.match(spec.strip())
    if not m:
        raise ValueError(f"invalid --sim-fault {spec!r} (use INDEX:xid=N, INDEX:ecc_dbe=N or "
                         "INDEX:remap_failure)")
    if m.group(1) is not None:
        return Fault(int(m.group(1)), m.group(2), int(m.group(3)))
    return Fault(int(m.group(4)), m.group(5))


def parse_indices(spec: str | None) -> list[int]:
    """``"0,3"`` → [0, 3] (``--sim-idle``); ValueError naming the bad part."""
    out = []
    for part in (spec or "").split(","):
        if part.strip():
            if not part.strip().isdigit():
                raise ValueError(f"invalid --sim-idle {part.strip()!r} (use GPU indices, "
                                 "e.g. 0,3)")
            out.append(int(part))
    return out


def _profile_gb(profile: str) -> int:
    """Memory of a MIG profile in GB ("3g.40gb" → 40); NVML's slices are a little smaller."""
    return int(profile.split(".", 1)[1].split("gb", 1)[0])


def _digest(seed: int, node: str, index: int) -> str:
    return hashlib.sha256(f"{seed}\0{node}\0{index}".encode()).hexdigest()


def _uuid(hexdigest: str) -> str:
    h = hexdigest
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _wave(t: float, period: float, phase: float) -> float:
    """0..1, smooth: a load that rises and falls over minutes, not a random walk."""
    return 0.5 + 0.5 * math.sin(2 * math.pi * t / period + phase)


#: idle and fully loaded GPU temperature (°C): a real H100 idled at 33 °C and ran a bf16
#: load at 56 °C (shared/samples); air-cooled parts run hotter, so the top is a little higher
IDLE_C, LOADED_C = 32.0, 68.0
#: SM clock (MHz) of an idle H100 (the probe read 345) and under load
IDLE_SM_MHZ, LOADED_SM_MHZ = 345, 1980


def _gpm_answers(util_pct: float) -> dict[int, float]:
    """What a Hopper GPU's GPM answers at this utilisation (NVML's units: percent, MiB/s).

    Scaled from what a real H200 answered under a bf16 matmul (``HOPPER_BF16_GPM``: engine
    99.8 %, SMs 96.4 % active at 14.3 % occupancy, tensor 93.6 %, DRAM 17.3 %), and derived
    from the utilisation itself, so no profiling figure ever exceeds what the utilisation
    allows: SM activity <= engine activity <= utilisation, all 0 on an idle GPU.
    """
    share = util_pct / 100.0
    return {metric: round(value * share, 1) for metric, value in HOPPER_BF16_GPM.items()}


#: the least load of a ``busy`` GPU (0..1)
BUSY_FLOOR = 0.4


class SimBackend:
    """A deterministic simulated node: same seed, node name and clock → same output."""

    name = "sim"

    def __init__(self, *, vendor: str = "nvidia", gpus: int = 8, model: str | None = None,
                 mig: str | None = None, seed: int = 0, node: str = "sim-node",
                 faults: Sequence[Fault] = (), idle: Sequence[int] = (),
                 busy: Sequence[int] = (),
                 cadence: Cadence = EVERY_PASS,
                 clock: Callable[[], float] = time.time) -> None:
        if vendor not in DEFAULT_MODEL:
            raise ValueError(f"unknown simulated vendor {vendor!r} (use nvidia or amd)")
        if gpus < 1:
            raise ValueError("a simulated node needs at least one GPU")
        profiles = parse_mig(mig)
        if profiles and vendor != "nvidia":
            raise ValueError("MIG slices exist only on NVIDIA GPUs")
        self.vendor = vendor
        self.model = model or DEFAULT_MODEL[vendor]
        table = _NVIDIA_MODELS if vendor == "nvidia" else _AMD_MODELS
        self._spec = table.get(self.model, next(iter(table.values())))
        self._clock = clock
        self._digests = [_digest(seed, node, i) for i in range(gpus)]
        self._phases = [int(d[40:48], 16) / 0xFFFFFFFF * 2 * math.pi for d in self._digests]
        for f in faults:
            if not 0 <= f.index < gpus:
                raise ValueError(f"--sim-fault names GPU {f.index}; the node has GPUs 0-{gpus - 1}")
            if vendor == "amd" and f.kind != "ecc_dbe":
                raise ValueError(f"--sim-fault {f.kind} exists only on NVIDIA GPUs "
                                 "(AMD: ecc_dbe)")
        self.faults = tuple(faults)
        for i in idle:
            if not 0 <= i < gpus:
                raise ValueError(f"--sim-idle names GPU {i}; the node has GPUs 0-{gpus - 1}")
        #: GPUs that do nothing (an allocated notebook nobody uses): 0 %, idle power
        self.idle = frozenset(idle)
        for i in busy:
            if not 0 <= i < gpus:
                raise ValueError(f"busy GPU {i}: the node has GPUs 0-{gpus - 1}")
        #: GPUs never left alone (services time-sharing one): their load never falls under
        #: BUSY_FLOOR, so nothing calls their pods idle
        self.busy = frozenset(busy)
        #: the energy counters' clock: the last animated time
        self._animated_at: float | None = None
        self.nvml: FakeNvml | None = None
        self.amdsmi: FakeAmdSmi | None = None
        if vendor == "nvidia":
            self.nvml = FakeNvml([self._nvidia_gpu(i, profiles) for i in range(gpus)],
                                 driver="580.105.08")
            self._inner: NvmlBackend | AmdSmiBackend = NvmlBackend(nvml=self.nvml,
                                                                   cadence=cadence)
        else:
            self.amdsmi = FakeAmdSmi([self._amd_gpu(i) for i in range(gpus)])
            self._inner = AmdSmiBackend(amdsmi=self.amdsmi)

    def _nvidia_gpu(self, i: int, profiles: list[str]) -> FakeNvmlGpu:
        mig = None
        if profiles:
            mig = [
                FakeMigSlice(gi_id=slot + 1, profile=p, slot=slot,
                             memory_total=_profile_gb(p) * 1000 * MIB)
                for slot, p in enumerate(profiles)
            ]
        return FakeNvmlGpu(
            uuid="GPU-" + _uuid(self._digests[i]), name=self.model,
            pci_bus_id=f"{i // 14:08X}:{0x18 + 0x11 * (i % 14):02X}:00.0",
            memory_total=self._spec.memory_mib * MIB, memory_reserved=512 * MIB, mig=mig,
        )

    def _amd_gpu(self, i: int) -> FakeAmdGpu:
        d = self._digests[i]
        return FakeAmdGpu(
            uuid=_uuid(d), market_name=self.model, serial=d[32:44].upper(),
            bdf=f"0000:{0x0C + 0x11 * (i % 14):02x}:00.0", vram_total_mb=self._spec.memory_mib,
        )

    def _load(self, i: int, t: float, period: float, phase: float) -> float:
        if i in self.idle:
            return 0.0
        wave = _wave(t, period, phase)
        return BUSY_FLOOR + (1.0 - BUSY_FLOOR) * wave if i in self.busy else wave

    def _animate(self, t: float) -> None:
        """Move every GPU to time ``t``; what a GPU engineer would check hangs together.

        Utilisation is the one free variable. Power runs from the model's idle to its
        maximum draw with it, temperature from ``IDLE_C`` to ``LOADED_C``, the SM clock
        drops to idle below 5 %, profiling ratios are shares of it (``_gpm_answers``), and
        the energy counter grows by the power drawn since the previous step. A GPU in MIG
        mode draws by its slices' loads, each weighted by its share of the GPU.
        """
        spec = self._spec
        dt = 0.0 if self._animated_at is None else max(0.0, t - self._animated_at)
        self._animated_at = t
        for i, phase in enumerate(self._phases):
            util = round(100 * self._load(i, t, 300.0 + 60.0 * (i % 5), phase))
            if self.nvml is not None:
                gpu = self.nvml.gpus[i]
                busy = util / 100.0
                for s in gpu.mig or []:
                    s_util = round(100 * self._load(i, t, 240.0 + 30.0 * s.slot,
                                                    phase + s.slot), 1)
                    s.graphics_util = s_util
                    s.gpm_metrics = {k: v for k, v in _gpm_answers(s_util).items()
                                     if k != _pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL}
                    s.memory_used = int(s.memory_total * 0.9 * s_util / 100) // MIB * MIB
                if gpu.mig:  # NVML has no utilisation in MIG mode; the slices' loads count
                    busy = sum(s.graphics_util / 100 * int(s.profile.split("g", 1)[0]) / 7
                               for s in gpu.mig)
                power = spec.idle_w + (spec.max_w - spec.idle_w) * busy
                if gpu.energy_mj is not None and gpu.power_mw is not None:
                    gpu.energy_mj += round(gpu.power_mw * dt)  # mW × s = mJ
                gpu.util, gpu.power_mw = util, round(power * 1000)
                gpu.temp = round(IDLE_C + (LOADED_C - IDLE_C) * busy)
                if gpu.memory_temp is not None:  # HBM runs a few degrees above the die
                    gpu.memory_temp = gpu.temp + 5  # (the real H100: 33 °C, memory 37 °C)
                gpu.sm_clock = IDLE_SM_MHZ if busy < 0.05 else LOADED_SM_MHZ
                gpu.memory_used = (sum(s.memory_used for s in gpu.mig) if gpu.mig else
                                   int(gpu.memory_total * 0.9 * util / 100) // MIB * MIB)
                # a MIG-enabled GPU answers GPM per GPU instance only (its slices, above)
                gpu.gpm_metrics = {} if gpu.mig else _gpm_answers(util)
            elif self.amdsmi is not None:
                power = spec.idle_w + (spec.max_w - spec.idle_w) * util / 100
                temp = round(IDLE_C + (LOADED_C - IDLE_C) * util / 100)
                agpu = self.amdsmi.gpus[i]
                agpu.gfx_activity, agpu.power_w = util, round(power)
                agpu.edge_temp, agpu.hotspot_temp = temp, temp + 8
                agpu.vram_used_mb = int(agpu.vram_total_mb * 0.9 * util / 100)

    def open(self) -> None:
        self._inner.open()
        if self.faults:
            self._inject()

    def _inject(self) -> None:
        """Faults as the library would show them: counters and flags set, XIDs queued as
        events (after one pass, so the backend has registered for them)."""
        if self.nvml is not None:
            self._inner.collect()
        for f in self.faults:
            if self.nvml is not None:
                gpu = self.nvml.gpus[f.index]
                if f.kind == "xid":
                    self.nvml.inject_xid(f.index, f.value)
                elif f.kind == "ecc_dbe":
                    gpu.ecc_dbe = f.value
                else:
                    c, u, pending, _ = gpu.remapped_rows or (0, 0, 0, 0)
                    gpu.remapped_rows = (c, u, pending, 1)
            elif self.amdsmi is not None:
                self.amdsmi.gpus[f.index].ecc_uncorrectable = f.value

    def collect(self) -> Collection:
        self._animate(self._clock())
        return self._inner.collect()

    def close(self) -> None:
        self._inner.close()
