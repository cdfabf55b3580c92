"""The one door to the Kubernetes API (the official client, with paging and one-line errors),
used by reconcile and by ACM policy rollout, and the pure reading of what Dynamic Resource
Allocation publishes (ResourceSlices, ResourceClaims) as GPUs per node.

The DRA rules (``hub.kube._dra``) need no client and are imported at once; the client door is
loaded on first use, so the plain-data users (reconcile from files, the usage answers) do not
pay for importing the kubernetes package.
"""

from __future__ import annotations

from hub.common import lazy_attributes
from hub.kube._catalog import (
    INSTANCE_TYPE_LABELS,
    Catalog,
    InstanceType,
    instance_type_of,
    load_catalog,
    parse_catalog,
    shipped_catalog,
)
from hub.kube._dra import (
    AMD_DRIVER,
    GPU_DRIVERS,
    NVIDIA_DRIVER,
    ClaimAllocation,
    ClaimedDevice,
    DraGpu,
    DraNode,
    PoolState,
    SliceError,
    claim_allocations,
    claimed_devices,
    dra_nodes,
    normalise_pci,
)

_CLIENT = ("api_client", "hub_api_client", "call", "list_all", "list_managed_clusters",
           "list_multicluster_observability", "list_nodes",
           "get_cluster_policy", "get_config_map", "host_of",
           "translate", "dra_version", "list_resource_slices", "list_resource_claims",
           "list_device_classes", "DRA_VERSIONS", "GpuObjects", "read_gpu_objects")

__all__ = [
    "AMD_DRIVER",
    "DRA_VERSIONS",
    "GPU_DRIVERS",
    "INSTANCE_TYPE_LABELS",
    "NVIDIA_DRIVER",
    "Catalog",
    "ClaimAllocation",
    "ClaimedDevice",
    "DraGpu",
    "DraNode",
    "GpuObjects",
    "InstanceType",
    "PoolState",
    "SliceError",
    "api_client",
    "call",
    "claim_allocations",
    "claimed_devices",
    "dra_nodes",
    "dra_version",
    "get_cluster_policy",
    "get_config_map",
    "host_of",
    "hub_api_client",
    "instance_type_of",
    "list_all",
    "list_device_classes",
    "list_managed_clusters",
    "list_multicluster_observability",
    "list_nodes",
    "list_resource_claims",
    "list_resource_slices",
    "load_catalog",
    "normalise_pci",
    "parse_catalog",
    "read_gpu_objects",
    "shipped_catalog",
    "translate",
]


#: the client door, imported on first use
__getattr__ = lazy_attributes(__name__, dict.fromkeys(_CLIENT, "_client"))
