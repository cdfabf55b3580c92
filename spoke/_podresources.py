"""Pod attribution: which pod's container holds which GPU, from the kubelet.

The kubelet serves the pod-resources API (gRPC, package ``v1``, service
``PodResourcesLister``) on the unix socket /var/lib/kubelet/pod-resources/kubelet.sock.
``List`` returns pods -> containers -> devices (resource name, device ids) and, for Dynamic
Resource Allocation (on by default from Kubernetes 1.34), ``dynamic_resources``: the claims a
container uses and their devices as (driver, pool, device). dcgm-exporter and AMD's
device-metrics-exporter call it on every collection and label each GPU's series with ``pod``,
``namespace`` and ``container``, and so do we, for device-plugin and DRA GPUs alike:

* device plugins name NVIDIA GPUs by UUID (MIG devices by MIG UUID, time-sliced replicas
  ``<uuid>::<n>``), AMD GPUs by UUID or PCI address;
* NVIDIA's DRA driver names a GPU ``gpu-<minor>`` and a MIG device
  ``gpu-<minor>-mig-<profile id>-<start>-<size>``: the NVML backend lists those names among a
  reading's ids (``spoke._model.dra_gpu_id``), so they match here as ``gpu.nvidia.com/<name>``;
* AMD's DRA driver names a GPU ``gpu-<card>-<render>`` after its DRM nodes: the card's sysfs
  link gives its PCI address, which the amdsmi backend's readings carry.

The protobuf messages are built here at import from a descriptor with the API's own package,
message names and field numbers (those of ``List``, as kubelet's api.proto declares them).
That keeps generated code, whose protobuf-runtime version checks would pin protobuf to
grpcio-tools' release, out of the tree, and needs no build step. grpcio and protobuf are
imported only when pod attribution is on: this module is imported lazily by the CLI.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from spoke._model import AMD_DRA_DRIVER, KUBELET_SOCKET, NVIDIA_DRA_DRIVER, dra_key
from spoke._naming import PodRef

log = logging.getLogger(__name__)

SERVICE = "v1.PodResourcesLister"
LIST_METHOD = f"/{SERVICE}/List"
#: the kubelet answers List in milliseconds; a slower one costs this pass its pod labels
DEFAULT_TIMEOUT = 1.0
#: device plugins whose device ids name GPUs (MIG "mixed" resources are nvidia.com/mig-*)
GPU_RESOURCE_PREFIXES = ("nvidia.com/", "amd.com/")
_MAX_MESSAGE = 16 * 1024 * 1024  # the kubelet's own limit for this API

_F = descriptor_pb2.FieldDescriptorProto


def _file() -> descriptor_pb2.FileDescriptorProto:
    """pkg/apis/podresources/v1/api.proto, the messages of ``List`` (field numbers as upstream)."""
    f = descriptor_pb2.FileDescriptorProto(name="gpufleet/podresources/v1/api.proto",
                                           package="v1", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = f.message_type.add(name=name)
        for fname, number, label, ftype, type_name in fields:
            fd = m.field.add(name=fname, number=number, label=label, type=ftype)
            if type_name:
                fd.type_name = type_name

    opt, rep = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    message("ListPodResourcesRequest")
    message("ListPodResourcesResponse",
            ("pod_resources", 1, rep, _F.TYPE_MESSAGE, ".v1.PodResources"))
    message("PodResources",
            ("name", 1, opt, _F.TYPE_STRING, ""),
            ("namespace", 2, opt, _F.TYPE_STRING, ""),
            ("containers", 3, rep, _F.TYPE_MESSAGE, ".v1.ContainerResources"))
    message("ContainerResources",
            ("name", 1, opt, _F.TYPE_STRING, ""),
            ("devices", 2, rep, _F.TYPE_MESSAGE, ".v1.ContainerDevices"),
            ("cpu_ids", 3, rep, _F.TYPE_INT64, ""),
            ("memory", 4, rep, _F.TYPE_MESSAGE, ".v1.ContainerMemory"),
            ("dynamic_resources", 5, rep, _F.TYPE_MESSAGE, ".v1.DynamicResource"))
    message("ContainerMemory",
            ("memory_type", 1, opt, _F.TYPE_STRING, ""),
            ("size", 2, opt, _F.TYPE_UINT64, ""),
            ("topology", 3, opt, _F.TYPE_MESSAGE, ".v1.TopologyInfo"))
    # field 1 (class_name) was removed upstream; its number stays unused
    message("DynamicResource",
            ("claim_name", 2, opt, _F.TYPE_STRING, ""),
            ("claim_namespace", 3, opt, _F.TYPE_STRING, ""),
            ("claim_resources", 4, rep, _F.TYPE_MESSAGE, ".v1.ClaimResource"))
    message("ClaimResource",
            ("cdi_devices", 1, rep, _F.TYPE_MESSAGE, ".v1.CDIDevice"),
            ("driver_name", 2, opt, _F.TYPE_STRING, ""),
            ("pool_name", 3, opt, _F.TYPE_STRING, ""),
            ("device_name", 4, opt, _F.TYPE_STRING, ""),
            ("share_id", 5, opt, _F.TYPE_STRING, ""))
    message("CDIDevice", ("name", 1, opt, _F.TYPE_STRING, ""))
    message("ContainerDevices",
            ("resource_name", 1, opt, _F.TYPE_STRING, ""),
            ("device_ids", 2, rep, _F.TYPE_STRING, ""),
            ("topology", 3, opt, _F.TYPE_MESSAGE, ".v1.TopologyInfo"))
    message("TopologyInfo", ("nodes", 1, rep, _F.TYPE_MESSAGE, ".v1.NUMANode"))
    message("NUMANode", ("ID", 1, opt, _F.TYPE_INT64, ""))
    svc = f.service.add(name="PodResourcesLister")
    svc.method.add(name="List", input_type=".v1.ListPodResourcesRequest",
                   output_type=".v1.ListPodResourcesResponse")
    return f


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def _cls(name: str) -> Any:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"v1.{name}"))


ListPodResourcesRequest = _cls("ListPodResourcesRequest")
ListPodResourcesResponse = _cls("ListPodResourcesResponse")
PodResources = _cls("PodResources")
ContainerResources = _cls("ContainerResources")
ContainerDevices = _cls("ContainerDevices")
DynamicResource = _cls("DynamicResource")
ClaimResource = _cls("ClaimResource")

_AMD_DRA_NAME = re.compile(r"^gpu-(\d+)-\d+$")
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class DrmPciAddresses:
    """AMD DRA device name (``gpu-<card>-<render>``) -> the GPU's PCI address, from sysfs
    (``/sys/class/drm/card<card>/device`` links to the PCI function). ``sysfs`` is the root
    to read (tests pass a directory of their own)."""

    def __init__(self, sysfs: str = "/sys") -> None:
        self.sysfs = sysfs

    def __call__(self, device_name: str) -> str | None:
        match = _AMD_DRA_NAME.match(device_name)
        if not match:
            return None
        link = os.path.join(self.sysfs, "class", "drm", f"card{match.group(1)}", "device")
        address = os.path.basename(os.path.realpath(link)).lower()
        return address if _PCI_ADDRESS.match(address) else None


def device_map(response: Any,
               amd_pci: Callable[[str], str | None] | None = None) -> dict[str, list[PodRef]]:
    """device id -> [(namespace, pod, container)] for GPU resources of a List response.

    Time-slicing device plugins hand out replicas as ``<uuid>::<n>``; the part before ``::``
    is the GPU, as dcgm-exporter reads it. DRA devices of GPU drivers come from each
    container's ``dynamic_resources`` (see the module's docstring for their names); other
    drivers' devices (IMEX channels, NICs) are not GPUs and are left out. An AMD device whose
    PCI address ``amd_pci`` cannot tell keeps its driver-qualified name, which no reading
    carries: its pod goes unlabelled rather than on the wrong GPU.
    """
    out: dict[str, set[PodRef]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = (pod.namespace, pod.name, container.name)
            for dev in container.devices:
                if not dev.resource_name.startswith(GPU_RESOURCE_PREFIXES):
                    continue
                for device_id in dev.device_ids:
                    gpu = device_id.split("::", 1)[0]
                    out.setdefault(gpu, set()).add(ref)
            for claim in container.dynamic_resources:
                for res in claim.claim_resources:
                    key = _dra_device(res.driver_name, res.device_name, amd_pci)
                    if key:
                        out.setdefault(key, set()).add(ref)
    return {k: sorted(v) for k, v in out.items()}


def _dra_device(driver: str, device: str,
                amd_pci: Callable[[str], str | None] | None) -> str | None:
    if not device:
        return None
    if driver == NVIDIA_DRA_DRIVER:
        return dra_key(driver, device)
    if driver == AMD_DRA_DRIVER:
        address = amd_pci(device) if amd_pci is not None else None
        return address or dra_key(driver, device)
    return None


class KubeletPods:
    """Calls ``List`` on the kubelet's socket; one channel kept open across collections."""

    def __init__(self, socket_path: str = KUBELET_SOCKET, timeout: float = DEFAULT_TIMEOUT,
                 amd_pci: Callable[[str], str | None] | None = None) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        #: AMD DRA device name -> PCI address (sysfs by default)
        self.amd_pci = amd_pci if amd_pci is not None else DrmPciAddresses()
        self._channel = grpc.insecure_channel(
            f"unix://{os.path.abspath(socket_path)}",
            options=[("grpc.max_receive_message_length", _MAX_MESSAGE)])
        self._list = self._channel.unary_unary(
            LIST_METHOD,
            request_serializer=ListPodResourcesRequest.SerializeToString,
            response_deserializer=ListPodResourcesResponse.FromString,
        )

    def devices(self) -> Mapping[str, Sequence[PodRef]]:
        """This moment's allocation; raises (grpc.RpcError) when the kubelet does not answer
        within ``timeout``, so a hung kubelet bounds, never stalls, a collection."""
        try:
            response = self._list(ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            name = code.name if code is not None else "ERROR"
            raise ConnectionError(f"kubelet pod-resources List at {self.socket_path}: "
                                  f"{name} {detail}") from None
        return device_map(response, self.amd_pci)

    def close(self) -> None:
        self._channel.close()
