"""Node objects as the Kubernetes API returns them, for reconcile tests (unit and end to end).

The time-sliced ones carry the real GPU feature discovery labels of four VMware vGPU nodes
(tests/fixtures/samples/node-gpu-labels-vks-grid-a100-vgpu.json).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from hub.validate import _reconcile as rc
from tests.support.samples import SAMPLES


def vks_label_sets() -> list[dict[str, str]]:
    """The four label sets of node-gpu-labels-vks-grid-a100-vgpu.json (concatenated objects)."""
    text = (SAMPLES / "node-gpu-labels-vks-grid-a100-vgpu.json").read_text()
    decoder, pos, out = json.JSONDecoder(), 0, []
    while pos < len(text):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            break
        obj, pos = decoder.raw_decode(text, pos)
        out.append(obj)
    return out


def node_object(name: str, gpu: dict[str, str] | None = None, labels: dict[str, str] | None = None,
                allocatable: dict[str, str] | None = None, instance: str = "m7i.48xlarge"
                ) -> dict[str, Any]:
    """A Node as the API server returns it: capacity and allocatable with cpu, memory, pods and
    extended resources; labels; conditions; node info."""
    gpu = gpu or {}
    capacity = {"cpu": "96", "ephemeral-storage": "104845292Ki", "hugepages-1Gi": "0",
                "hugepages-2Mi": "0", "memory": "1176414928Ki", "pods": "110", **gpu}
    alloc = {"cpu": "95690m", "ephemeral-storage": "95551679124", "hugepages-1Gi": "0",
             "hugepages-2Mi": "0", "memory": "1175398096Ki", "pods": "110",
             **(gpu if allocatable is None else allocatable)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
                       "kubernetes.io/os": "linux",
                       "node.kubernetes.io/instance-type": instance, **(labels or {})},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {"providerID": f"aws:///us-east-1a/i-{zlib.crc32(name.encode()):012x}"},
        "status": {
            "capacity": capacity, "allocatable": alloc,
            "conditions": [
                {"type": "MemoryPressure", "status": "False",
                 "reason": "KubeletHasSufficientMemory",
                 "lastHeartbeatTime": "2026-11-28T11:59:00Z",
                 "lastTransitionTime": "2026-11-01T08:00:00Z"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "lastHeartbeatTime": "2026-11-28T11:59:00Z",
                 "lastTransitionTime": "2026-11-01T08:00:00Z"},
            ],
            "addresses": [{"type": "InternalIP", "address": "10.0.171.111"},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"architecture": "amd64", "bootID": "5d0c9b6e-0c1e-4f9e-9a57-3c2b8e6a0f11",
                         "machineID": "ec2b5a3c1e0f4a7d9b6e2f8c0d1a3b5e",
                         "systemUUID": "ec2b5a3c-1e0f-4a7d-9b6e-2f8c0d1a3b5e",
                         "containerRuntimeVersion": "containerd://1.7.22",
                         "kernelVersion": "6.1.112-124.190.amzn2023.x86_64",
                         "kubeProxyVersion": "v1.30.4", "kubeletVersion": "v1.30.4",
                         "operatingSystem": "linux", "osImage": "Amazon Linux 2023"},
        },
    }


def nvidia_labels(product: str, count: int, **extra: str) -> dict[str, str]:
    return {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.count": str(count), "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/mig.capable": "false",
            "nvidia.com/mig.strategy": "single", "nvidia.com/gpu.memory": "81559", **extra}


def time_sliced(labels: dict[str, str], replicas: int) -> dict[str, str]:
    """A vks label set as the GPU operator relabels it when time-slicing is configured."""
    out = dict(labels)
    out["nvidia.com/gpu.replicas"] = str(replicas)
    out["nvidia.com/gpu.sharing-strategy"] = "time-slicing"
    out["nvidia.com/gpu.product"] = labels["nvidia.com/gpu.product"] + "-SHARED"
    return out


def ksm_text(capacity: dict[str, dict[str, int]], labels: dict[str, dict[str, str]],
             allocatable: dict[str, dict[str, int]] | None = None,
             providers: dict[str, str] | None = None) -> str:
    """kube-state-metrics output: node capacity, allocatable, (allowlisted) labels and, for
    the nodes of ``providers``, kube_node_info with their spec.providerID."""
    lines = ["# TYPE kube_node_status_capacity gauge"]
    for node, resources in capacity.items():
        for resource, value in {"cpu": 96, **resources}.items():
            unit = "core" if resource == "cpu" else "integer"
            lines.append(f'kube_node_status_capacity{{node="{node}",resource="{resource}",'
                         f'unit="{unit}"}} {value}')
    lines.append("# TYPE kube_node_status_allocatable gauge")
    for node, resources in (allocatable or capacity).items():
        for resource, value in resources.items():
            lines.append(f'kube_node_status_allocatable{{node="{node}",resource="{resource}",'
                         f'unit="integer"}} {value}')
    lines.append("# TYPE kube_node_labels gauge")
    for node, values in labels.items():
        extra = "".join(f',{rc.ksm_label(k)}="{v}"' for k, v in values.items())
        lines.append(f'kube_node_labels{{node="{node}"{extra}}} 1')
    if providers:
        lines.append("# TYPE kube_node_info gauge")
        for node, provider in providers.items():
            lines.append(f'kube_node_info{{node="{node}",kernel_version="6.1.112",'
                         f'provider_id="{provider}",internal_ip="10.0.1.1"}} 1')
    return "\n".join(lines) + "\n"
