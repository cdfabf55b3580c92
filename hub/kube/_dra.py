"""GPUs published through Dynamic Resource Allocation (resource.k8s.io), as plain data.

On a DRA node the GPUs are not an extended resource in node allocatable: a GPU driver
(``gpu.nvidia.com``, ``gpu.amd.com``) publishes them as devices in ResourceSlices, and pods hold
them through ResourceClaims. The numbers in a slice are not GPU counts: with dynamic MIG every
possible placement is a device, AMD partition modes add a device per partition, and other
drivers (``compute-domain.nvidia.com`` IMEX channels, NICs) publish devices that are not GPUs
at all. These functions turn the API's objects into what an operator counts, physical GPUs,
and are pure so the rules can be tested with plain dicts:

* only the newest ``spec.pool.generation`` of a pool is current (older slices are being
  replaced); a pool with fewer current slices than ``resourceSliceCount`` is being rewritten, so
  its node's count is unknown, not a number;
* an NVIDIA GPU is its ``uuid`` (``type: gpu``, the UUID dcgm-exporter labels); a MIG device
  names its GPU in ``parentUUID``, which counts once when the GPU itself is not listed;
* an AMD GPU has no UUID in DRA: it is (node, PCI bus id), and its partitions carry the same
  PCI bus id;
* every other device of a GPU driver (MIG placements, partitions, VFIO functions) is not an
  extra GPU.

The same shapes are read from v1, v1beta2 and v1beta1 (v1beta1 nests a device's attributes
and capacity under ``basic``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

NVIDIA_DRIVER = "gpu.nvidia.com"
AMD_DRIVER = "gpu.amd.com"
#: drivers whose devices are GPUs or parts of GPUs; every other driver is ignored
GPU_DRIVERS = (NVIDIA_DRIVER, AMD_DRIVER)
VENDOR_OF = {NVIDIA_DRIVER: "nvidia", AMD_DRIVER: "amd"}

#: the standard attribute DRA drivers publish a device's PCI address under, and older names
PCI_ATTRIBUTES = ("resource.kubernetes.io/pciBusID", "pciBusID", "pcieBusID", "pciAddr")

NVIDIA_GPU_TYPE, NVIDIA_MIG_TYPE = "gpu", "mig"
AMD_GPU_TYPE, AMD_PARTITION_TYPE = "amdgpu", "amdgpu-partition"

#: the annotation the scheduler puts on claims it creates for extended-resource requests
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"


class SliceError(ValueError):
    """An object that is not a ResourceSlice or ResourceClaim as the API writes them."""


# -- attribute and quantity values ------------------------------------------------------------
def attribute(device: Mapping[str, Any], driver: str, name: str) -> Any:
    """A device attribute's value, whichever way the name is qualified.

    Unqualified names are in the driver's own domain, so ``uuid`` and ``gpu.nvidia.com/uuid``
    are the same attribute. Values are typed (``string``, ``int``, ``bool``, ``version``).
    """
    attrs = _basic(device).get("attributes") or {}
    for key in (name, f"{driver}/{name}"):
        value = attrs.get(key)
        if isinstance(value, Mapping):
            for kind in ("string", "int", "bool", "version"):
                if kind in value:
                    return value[kind]
    return None


def _basic(device: Mapping[str, Any]) -> Mapping[str, Any]:
    basic = device.get("basic")
    return basic if isinstance(basic, Mapping) else device


_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)([KMGTPE]i?|[numk]|)$")
_FACTORS: dict[str, int | Decimal] = {
    "": 1, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(text: Any) -> Decimal | None:
    """A Kubernetes resource quantity ("80Gi", "81559Mi", "85899345920") as a number;
    None when it is not one."""
    match = _QUANTITY.match(str(text).strip())
    if not match:
        return None
    try:
        return Decimal(match.group(1)) * _FACTORS[match.group(2)]
    except InvalidOperation:
        return None


def capacity_mib(device: Mapping[str, Any], name: str = "memory") -> float | None:
    """A device capacity in MiB (``{"memory": {"value": "80Gi"}}``), None when absent.

    0 is None too: AMD's DRA driver publishes ``memory: 0`` when it does not know the size
    (FIELD_NOTES, fourth round), and no GPU has no memory: unknown, never 0 MiB."""
    cap = (_basic(device).get("capacity") or {}).get(name)
    raw = cap.get("value") if isinstance(cap, Mapping) else cap
    number = quantity(raw) if raw is not None else None
    return float(number / 2**20) if number else None


def normalise_pci(bus_id: Any) -> str:
    """A PCI address as one spelling: lower case, four-digit domain (``0000:c1:00.0``).

    NVML writes ``00000000:C1:00.0``, amd-smi and the DRA drivers ``0000:c1:00.0``: the same
    function must be the same key wherever it came from.
    """
    text = str(bus_id or "").strip().lower()
    if not text:
        return ""
    parts = text.split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    elif len(parts) == 2:
        parts.insert(0, "0000")
    return ":".join(parts)


# -- slices -> GPUs per node -------------------------------------------------------------------
@dataclass(frozen=True)
class DraGpu:
    """One physical GPU a DRA driver publishes: NVIDIA by UUID, AMD by PCI bus id."""

    vendor: str  # nvidia | amd
    key: str  # NVIDIA: the GPU UUID; AMD: the normalised PCI bus id
    pool: str
    device: str | None  # the whole GPU's device name (gpu-0); None when only its parts are listed
    model: str | None = None  # productName
    memory_mib: float | None = None  # capacity memory of the whole GPU
    pci_bus_id: str = ""


@dataclass(frozen=True)
class PoolState:
    """One pool of a GPU driver on a node, as far as its current generation goes."""

    driver: str
    pool: str
    generation: int
    slices_seen: int
    slices_expected: int
    stale_slices: int = 0  # slices of older generations, ignored

    @property
    def complete(self) -> bool:
        return self.slices_seen >= self.slices_expected


@dataclass(frozen=True)
class DraNode:
    """What DRA publishes for one node: its physical GPUs and everything that is not one."""

    node: str
    gpus: tuple[DraGpu, ...] = ()
    pools: tuple[PoolState, ...] = ()
    #: MIG placements / AMD partitions advertised (never extra GPUs)
    partitions: int = 0
    #: devices of GPU drivers that are neither GPUs nor their parts (VFIO functions, ...)
    other_devices: int = 0
    #: device name -> the GPU it is or belongs to (key), for allocations from claims
    device_gpu: Mapping[tuple[str, str, str], str] = field(default_factory=dict)
    #: (driver, pool, device) of MIG/partition devices -> their profile, for slices
    device_profile: Mapping[tuple[str, str, str], str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return all(p.complete for p in self.pools)

    @property
    def incomplete_pools(self) -> list[PoolState]:
        return [p for p in self.pools if not p.complete]

    @property
    def drivers(self) -> list[str]:
        return sorted({p.driver for p in self.pools})

    @property
    def vendor(self) -> str | None:
        vendors = sorted({VENDOR_OF[d] for d in self.drivers if d in VENDOR_OF})
        return vendors[0] if len(vendors) == 1 else ("mixed" if vendors else None)

    def models(self) -> list[str]:
        return sorted({g.model for g in self.gpus if g.model})

    def memory_mib(self) -> list[float]:
        return sorted({g.memory_mib for g in self.gpus if g.memory_mib})


@dataclass(frozen=True)
class _Slice:
    driver: str
    node: str
    pool: str
    generation: int
    count: int
    devices: tuple[Mapping[str, Any], ...]


def _slice(obj: Mapping[str, Any]) -> _Slice:
    if not isinstance(obj, Mapping):
        raise SliceError("a ResourceSlice that is not an object")
    name = str((obj.get("metadata") or {}).get("name") or "?")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise SliceError(f"ResourceSlice {name} has no spec")
    pool = spec.get("pool")
    if not isinstance(pool, Mapping) or not pool.get("name"):
        raise SliceError(f"ResourceSlice {name} has no spec.pool.name")
    try:
        generation = int(pool.get("generation") or 0)
        count = int(pool.get("resourceSliceCount") or 1)
    except (TypeError, ValueError, OverflowError):  # 1e400 is a float: int() overflows
        raise SliceError(f"ResourceSlice {name}: spec.pool generation and resourceSliceCount "
                         "must be integers") from None
    devices = spec.get("devices") or []
    if not isinstance(devices, list) or not all(isinstance(d, Mapping) for d in devices):
        raise SliceError(f"ResourceSlice {name}: spec.devices is not a list of objects")
    return _Slice(str(spec.get("driver") or ""), str(spec.get("nodeName") or ""),
                  str(pool["name"]), generation, max(count, 1), tuple(devices))


def current_slices(slices: Iterable[Mapping[str, Any]]) -> tuple[list[_Slice], list[PoolState]]:
    """The slices of each pool's newest generation, and every pool's completeness.

    Only node-local pools of GPU drivers are kept: a GPU sits in one node, and other drivers'
    devices (IMEX channels, NICs) are not GPUs.
    """
    pools: dict[tuple[str, str, str], list[_Slice]] = {}
    for obj in slices:
        s = _slice(obj)
        if s.driver not in GPU_DRIVERS or not s.node:
            continue
        pools.setdefault((s.driver, s.node, s.pool), []).append(s)
    current: list[_Slice] = []
    states: list[PoolState] = []
    for (driver, _node, pool), members in sorted(pools.items()):
        newest = max(m.generation for m in members)
        live = [m for m in members if m.generation == newest]
        expected = max(m.count for m in live)
        current += live
        states.append(PoolState(driver, pool, newest, len(live), expected,
                                len(members) - len(live)))
    return current, states


def dra_nodes(slices: Iterable[Mapping[str, Any]]) -> dict[str, DraNode]:
    """Node name -> what the GPU drivers' current slices publish for it.

    A node appears when a GPU driver has a pool on it, even one with no device (its GPUs
    may all be gone); a node no GPU driver publishes for is absent.
    """
    current, states = current_slices(slices)
    node_of_pool = {(s.driver, s.pool): s.node for s in current}
    pools_by_node: dict[str, list[PoolState]] = {}
    for p in states:
        pools_by_node.setdefault(node_of_pool[(p.driver, p.pool)], []).append(p)
    by_node: dict[str, list[_Slice]] = {}
    for s in current:
        by_node.setdefault(s.node, []).append(s)
    return {node: _node(node, by_node.get(node, []), pools_by_node[node])
            for node in sorted(pools_by_node)}


def _node(node: str, slices: list[_Slice], pools: list[PoolState]) -> DraNode:
    whole: dict[str, DraGpu] = {}
    parents: dict[str, DraGpu] = {}
    device_gpu: dict[tuple[str, str, str], str] = {}
    device_profile: dict[tuple[str, str, str], str] = {}
    partitions = other = 0
    for s in slices:
        vendor = VENDOR_OF[s.driver]
        for dev in s.devices:
            name = str(dev.get("name") or "")
            kind = attribute(dev, s.driver, "type")
            pci = normalise_pci(next((v for a in PCI_ATTRIBUTES
                                      if (v := attribute(dev, s.driver, a))), ""))
            model = attribute(dev, s.driver, "productName")
            model = str(model) if model else None
            if s.driver == NVIDIA_DRIVER:
                uuid = str(attribute(dev, s.driver, "uuid") or "")
                parent = str(attribute(dev, s.driver, "parentUUID") or "")
                if kind == NVIDIA_MIG_TYPE or parent:
                    partitions += 1
                    if parent:
                        device_gpu[(s.driver, s.pool, name)] = parent
                        parents.setdefault(parent, DraGpu(vendor, parent, s.pool, None, model))
                        profile = attribute(dev, s.driver, "profile")
                        if profile:
                            device_profile[(s.driver, s.pool, name)] = str(profile)
                elif kind in (NVIDIA_GPU_TYPE, None) and uuid:
                    whole[uuid] = DraGpu(vendor, uuid, s.pool, name, model, capacity_mib(dev),
                                         pci)
                    device_gpu[(s.driver, s.pool, name)] = uuid
                else:
                    other += 1
            else:
                if kind == AMD_PARTITION_TYPE and pci:
                    partitions += 1
                    device_gpu[(s.driver, s.pool, name)] = pci
                    parents.setdefault(pci, DraGpu(vendor, pci, s.pool, None, model,
                                                   pci_bus_id=pci))
                    profile = attribute(dev, s.driver, "partitionProfile")
                    if profile:
                        device_profile[(s.driver, s.pool, name)] = str(profile)
                elif kind in (AMD_GPU_TYPE, None) and pci:
                    whole[pci] = DraGpu(vendor, pci, s.pool, name, model, capacity_mib(dev), pci)
                    device_gpu[(s.driver, s.pool, name)] = pci
                else:
                    other += 1
    gpus = dict(whole)
    for key, gpu in parents.items():
        gpus.setdefault(key, gpu)
    return DraNode(node, tuple(gpus[k] for k in sorted(gpus)), tuple(pools), partitions, other,
                   device_gpu, device_profile)


# -- claims -> which pod holds which GPU -------------------------------------------------------
@dataclass(frozen=True)
class ClaimedDevice:
    """One device a ResourceClaim holds for pods (not admin access)."""

    namespace: str
    claim: str
    driver: str
    pool: str
    device: str
    pods: tuple[str, ...]  # the reserving pods' names (same namespace as the claim)
    extended_resource: bool = False  # created by the scheduler for an nvidia.com/gpu request


def claimed_devices(claims: Iterable[Mapping[str, Any]]) -> list[ClaimedDevice]:
    """Devices of GPU drivers allocated to claims that some pod has reserved.

    A claim allocated but reserved by no pod holds nothing yet (or any more); a result with
    ``adminAccess: true`` is monitoring access beside whoever holds the device, not an
    allocation.
    """
    out: list[ClaimedDevice] = []
    for obj in claims:
        if not isinstance(obj, Mapping):
            raise SliceError("a ResourceClaim that is not an object")
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        pods = tuple(sorted(str(r.get("name")) for r in status.get("reservedFor") or []
                            if isinstance(r, Mapping) and r.get("name")
                            and r.get("resource", "pods") == "pods"))
        if not pods:
            continue
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        extended = EXTENDED_RESOURCE_CLAIM in (meta.get("annotations") or {})
        for r in results:
            if not isinstance(r, Mapping) or r.get("adminAccess") is True:
                continue
            driver = str(r.get("driver") or "")
            if driver not in GPU_DRIVERS:
                continue
            out.append(ClaimedDevice(str(meta.get("namespace") or ""),
                                     str(meta.get("name") or ""), driver,
                                     str(r.get("pool") or ""), str(r.get("device") or ""),
                                     pods, extended))
    return out


@dataclass(frozen=True)
class ClaimAllocation:
    """A pod holding (part of) a physical GPU through a claim."""

    node: str
    gpu: str  # DraGpu.key
    slice: str  # "" for the whole GPU, else the MIG/partition device name
    profile: str | None
    namespace: str
    pod: str
    claim: str


def claim_allocations(nodes: Mapping[str, DraNode],
                      claims: Iterable[ClaimedDevice]) -> list[ClaimAllocation]:
    """Claimed devices joined to the GPUs the slices publish (a device no current slice lists
    is dropped: its pool was rewritten and the claim will be, too)."""
    index: dict[tuple[str, str, str], tuple[str, str, bool]] = {}
    for node in nodes.values():
        whole = {g.device for g in node.gpus if g.device}
        for key, gpu in node.device_gpu.items():
            index[key] = (node.node, gpu, key[2] not in whole)
    out: set[ClaimAllocation] = set()
    for c in claims:
        found = index.get((c.driver, c.pool, c.device))
        if found is None:
            continue
        node_name, gpu, part = found
        profile = nodes[node_name].device_profile.get((c.driver, c.pool, c.device))
        for pod in c.pods:
            out.add(ClaimAllocation(node_name, gpu, c.device if part else "", profile,
                                    c.namespace, pod, c.claim))
    return sorted(out, key=lambda a: (a.node, a.gpu, a.slice, a.namespace, a.pod, a.claim))
