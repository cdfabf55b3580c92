"""Pod attribution: which pod's container holds which GPU, from the kubelet.

The kubelet serves the pod-resources API (gRPC, package ``v1``, service
``PodResourcesLister``) on the unix socket /var/lib/kubelet/pod-resources/kubelet.sock.
``List`` returns pods -> containers -> devices (resource name, device ids); dcgm-exporter and
AMD's device-metrics-exporter call it on every collection and label each GPU's series with
``pod``, ``namespace`` and ``container``, and so do we.

The protobuf messages are built here at import from a descriptor with the API's own package,
message names and field numbers (the subset ``List`` needs; fields we do not declare, such as
cpu_ids and memory, are kept as unknown fields by protobuf and ignored). That keeps generated
code, whose protobuf-runtime version checks would pin protobuf to grpcio-tools' release, out of
the tree, and needs no build step. grpcio and protobuf are imported only when pod attribution
is on: this module is imported lazily by the CLI.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from spoke._model import KUBELET_SOCKET
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
            ("devices", 2, rep, _F.TYPE_MESSAGE, ".v1.ContainerDevices"))
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


def device_map(response: Any) -> dict[str, list[PodRef]]:
    """device id -> [(namespace, pod, container)] for GPU resources of a List response.

    Time-slicing device plugins hand out replicas as ``<uuid>::<n>``; the part before ``::``
    is the GPU, as dcgm-exporter reads it.
    """
    out: dict[str, set[PodRef]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                if not dev.resource_name.startswith(GPU_RESOURCE_PREFIXES):
                    continue
                for device_id in dev.device_ids:
                    gpu = device_id.split("::", 1)[0]
                    out.setdefault(gpu, set()).add((pod.namespace, pod.name, container.name))
    return {k: sorted(v) for k, v in out.items()}


class KubeletPods:
    """Calls ``List`` on the kubelet's socket; one channel kept open across collections."""

    def __init__(self, socket_path: str = KUBELET_SOCKET,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
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
        return device_map(response)

    def close(self) -> None:
        self._channel.close()
