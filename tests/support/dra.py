"""Dynamic Resource Allocation objects as the API server returns them, for tests.

ResourceSlices carry the attribute names and value types NVIDIA's DRA driver publishes
(k8s-dra-driver-gpu: ``gpu-<minor>`` devices with ``type``, ``uuid``, ``productName``, ``brand``,
``architecture``, versions as ``version`` values, the standard PCI bus id attribute, capacity
``memory``; MIG devices ``gpu-<minor>-mig-<profileId>-<start>-<size>`` with ``parentUUID`` and
``profile``), AMD's (``gpu-<card>-<render>`` devices of ``type`` amdgpu / amdgpu-partition
with ``partitionProfile``, no UUID) and NVIDIA's IMEX channels (``compute-domain.nvidia.com``,
not GPUs). ``v1beta1`` nests a device's attributes and capacity under ``basic``, as that
version does.

``dra_fleet`` is one mixed cluster: the node kinds the reconcile must tell apart.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

API = "resource.k8s.io"
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
MI300X = "AMD Instinct MI300X"

#: dynamic MIG placements of an A100-80GB: (profile, GI profile id, [(start, size)])
A100_PLACEMENTS = [
    ("1g.10gb", 19, [(i, 1) for i in range(7)]),
    ("2g.20gb", 14, [(0, 2), (2, 2), (4, 2)]),
    ("3g.40gb", 9, [(0, 4), (4, 4)]),
    ("7g.80gb", 0, [(0, 8)]),
]


def gpu_uuid(node: str, index: int) -> str:
    """A stable NVIDIA-looking UUID for GPU ``index`` of ``node``."""
    return "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}/{index}"))


def pci(index: int, base: int = 0x18) -> str:
    return f"0000:{base + index:02x}:00.0"


def _attrs(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Typed attribute values: str -> string, bool -> bool, int -> int, ('v', x) -> version."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        if isinstance(value, tuple):
            out[key] = {"version": value[1]}
        elif isinstance(value, bool):
            out[key] = {"bool": value}
        elif isinstance(value, int):
            out[key] = {"int": value}
        else:
            out[key] = {"string": value}
    return out


def device(name: str, attributes: dict[str, Any], capacity: dict[str, str] | None = None,
           version: str = "v1") -> dict[str, Any]:
    body: dict[str, Any] = {"attributes": _attrs(attributes)}
    if capacity:
        body["capacity"] = {k: {"value": v} for k, v in capacity.items()}
    return {"name": name, "basic": body} if version == "v1beta1" else {"name": name, **body}


def nvidia_gpu(node: str, minor: int, model: str = H100, memory: str = "80Gi",
               version: str = "v1") -> dict[str, Any]:
    arch = "Hopper" if "H100" in model else "Ampere"
    return device(f"gpu-{minor}", {
        "type": "gpu", "uuid": gpu_uuid(node, minor), "productName": model, "brand": "Nvidia",
        "architecture": arch, "cudaComputeCapability": ("v", "9.0.0" if arch == "Hopper"
                                                        else "8.0.0"),
        "driverVersion": ("v", "550.54.15"), "cudaDriverVersion": ("v", "12.4.0"),
        "resource.kubernetes.io/pciBusID": pci(minor),
        "resource.kubernetes.io/pcieRoot": "pci0000:15", "addressingMode": "None",
    }, {"memory": memory}, version)


def nvidia_mig_placements(node: str, minor: int, model: str = A100,
                          version: str = "v1") -> list[dict[str, Any]]:
    """Every placement dynamic MIG advertises on one GPU (never the number of GPUs)."""
    out = []
    for profile, gi_profile, spots in A100_PLACEMENTS:
        memory = f"{int(profile.split('.')[1][:-2]) * 1024 - 256}Mi"
        for start, size in spots:
            out.append(device(f"gpu-{minor}-mig-{gi_profile}-{start}-{size}", {
                "type": "mig", "parentUUID": gpu_uuid(node, minor), "profile": profile,
                "productName": model, "brand": "Nvidia", "architecture": "Ampere",
                "cudaComputeCapability": ("v", "8.0.0"), "driverVersion": ("v", "550.54.15"),
                "cudaDriverVersion": ("v", "12.4.0"),
                "resource.kubernetes.io/pciBusID": pci(minor),
            }, {"multiprocessors": str(14 * size), "memory": memory,
                **{f"memorySlice{i}": "1" for i in range(start, start + size)}}, version))
    return out


def amd_gpu(card: int, render: int, bus: str, model: str = MI300X,
            version: str = "v1") -> dict[str, Any]:
    return device(f"gpu-{card}-{render}", {
        "type": "amdgpu", "productName": model, "numaNode": 0,
        "driverVersion": ("v", "6.10.5"), "driverVersionFull": "6.10.5",
        "deviceID": "0x74a1", "partitionProfile": "spx_nps1",
        "resource.kubernetes.io/pciBusID": bus,
    }, {"memory": "192Gi", "computeUnits": "304", "simdUnits": "1216"}, version)


def amd_partitions(first_card: int, bus: str, count: int = 8, model: str = MI300X,
                   version: str = "v1") -> list[dict[str, Any]]:
    """CPX partitions of one MI300X: one device each, all with the parent's PCI bus id."""
    return [device(f"gpu-{first_card + i}-{128 + first_card + i}", {
        "type": "amdgpu-partition", "productName": model, "partitionProfile": "cpx_nps1",
        "numaNode": 0, "driverVersion": ("v", "6.10.5"), "deviceID": "0x74a1",
        "resource.kubernetes.io/pciBusID": bus,
    }, {"memory": f"{192 // count}Gi", "computeUnits": str(304 // count)}, version)
        for i in range(count)]


def resource_slice(name: str, driver: str, node: str | None, devices: list[dict[str, Any]],
                   pool: str | None = None, generation: int = 1, count: int = 1,
                   version: str = "v1", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"driver": driver, "pool": {
        "name": pool or node or name, "generation": generation, "resourceSliceCount": count},
        "devices": devices, **spec}
    if node:
        body["nodeName"] = node
    return {"apiVersion": f"{API}/{version}", "kind": "ResourceSlice",
            "metadata": {"name": name,
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                                              "name": node or "", "uid": str(uuidlib.uuid5(
                                                  uuidlib.NAMESPACE_DNS, node or name))}]},
            "spec": body}


def imex_slice(node: str, channels: int = 128, version: str = "v1") -> dict[str, Any]:
    """compute-domain.nvidia.com's IMEX channels: devices of a node, but not GPUs."""
    return resource_slice(f"{node}-compute-domain.nvidia.com-imex", "compute-domain.nvidia.com",
                          node, [device(f"channel-{i}", {"type": "channel", "id": i},
                                        version=version) for i in range(channels)],
                          version=version)


def resource_claim(namespace: str, name: str, results: list[tuple[str, str, str]],
                   pods: list[str] = (), admin: bool = False, extended: bool = False,
                   version: str = "v1") -> dict[str, Any]:
    """A ResourceClaim allocated to (driver, pool, device) results and reserved by ``pods``."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if extended:
        meta["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    status: dict[str, Any] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": d, "pool": p, "device": dev,
         **({"adminAccess": True} if admin else {})} for d, p, dev in results]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [results[0][1]]}]}]}}}
    if pods:
        status["reservedFor"] = [{"resource": "pods", "name": p,
                                  "uid": str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, p))}
                                 for p in pods]
    return {"apiVersion": f"{API}/{version}", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
                "count": len(results), **({"adminAccess": True} if admin else {})}}]}},
            "status": status}


def device_class(name: str, driver: str, version: str = "v1") -> dict[str, Any]:
    return {"apiVersion": f"{API}/{version}", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]}}


# -- one mixed cluster ---------------------------------------------------------------------------
DRA_H100 = "dra-h100-0"  # 8 H100 through DRA; a stale generation and IMEX channels beside
DRA_MIG = "dra-a100-mig"  # 2 A100, dynamic MIG: GPU 0 listed whole, GPU 1 only by placements
DRA_SILENT = "dra-silent"  # 4 H100 through DRA, no metrics from them
DRA_PARTIAL = "dra-partial"  # a pool being rewritten: 1 of its 2 slices seen
DRA_AMD = "dra-mi300x"  # 2 MI300X: one SPX, one CPX (8 partitions)
BOTH = "both-node"  # device plugin allocatable and DRA slices at once
PLUGIN = "plugin-node"  # device plugin only
AMD_BUS = [pci(0, 0x0c), pci(0, 0x8c)]


def dra_slices(version: str = "v1") -> list[dict[str, Any]]:
    nv, amd = "gpu.nvidia.com", "gpu.amd.com"
    return [
        resource_slice(f"{DRA_H100}-gpu.nvidia.com-old", nv, DRA_H100,
                       [nvidia_gpu("replaced", i, version=version) for i in range(7)],
                       generation=1, version=version),
        resource_slice(f"{DRA_H100}-gpu.nvidia.com-x7k2p", nv, DRA_H100,
                       [nvidia_gpu(DRA_H100, i, version=version) for i in range(8)],
                       generation=2, version=version),
        imex_slice(DRA_H100, version=version),
        resource_slice(f"{DRA_MIG}-gpu.nvidia.com-a1", nv, DRA_MIG,
                       [nvidia_gpu(DRA_MIG, 0, A100, version=version),
                        *nvidia_mig_placements(DRA_MIG, 0, version=version)],
                       pool=DRA_MIG, count=2, version=version),
        resource_slice(f"{DRA_MIG}-gpu.nvidia.com-b2", nv, DRA_MIG,
                       nvidia_mig_placements(DRA_MIG, 1, version=version), pool=DRA_MIG,
                       count=2, version=version),
        resource_slice(f"{DRA_SILENT}-gpu.nvidia.com-q9", nv, DRA_SILENT,
                       [nvidia_gpu(DRA_SILENT, i, version=version) for i in range(4)],
                       version=version),
        resource_slice(f"{DRA_PARTIAL}-gpu.nvidia.com-0", nv, DRA_PARTIAL,
                       [nvidia_gpu(DRA_PARTIAL, i, version=version) for i in range(4)],
                       generation=5, count=2, version=version),
        resource_slice(f"{DRA_AMD}-gpu.amd.com-0", amd, DRA_AMD,
                       [amd_gpu(1, 128, AMD_BUS[0], version=version),
                        *amd_partitions(2, AMD_BUS[1], version=version)],
                       version=version),
        resource_slice(f"{BOTH}-gpu.nvidia.com-0", nv, BOTH,
                       [nvidia_gpu(BOTH, i, version=version) for i in range(8)],
                       version=version),
    ]


def dra_claims(version: str = "v1") -> list[dict[str, Any]]:
    nv = "gpu.nvidia.com"
    return [
        resource_claim("team-a", "trainer-0-gpu-abc12",
                       [(nv, DRA_H100, "gpu-0"), (nv, DRA_H100, "gpu-1")],
                       pods=["trainer-0"], version=version),
        resource_claim("team-b", "notebook-gpu-x", [(nv, DRA_MIG, "gpu-1-mig-19-3-1")],
                       pods=["notebook"], version=version),
        resource_claim("monitoring", "dcgm-admin", [(nv, DRA_H100, "gpu-2")],
                       pods=["dcgm-exporter-abcde"], admin=True, version=version),
        resource_claim("team-c", "pending-gpu", [(nv, DRA_H100, "gpu-3")], pods=[],
                       version=version),
        resource_claim("team-d", "legacy-0-gpu", [(nv, DRA_H100, "gpu-4")], pods=["legacy-0"],
                       extended=True, version=version),
        resource_claim("team-e", "cd-channel", [("compute-domain.nvidia.com", DRA_H100,
                                                 "channel-0")], pods=["mpi-0"],
                       version=version),
    ]
