"""The one door to the hub store (Prometheus / Thanos / ACM Observability): the PromQL HTTP
client with its auth, and the vendor profiles that say which metrics and labels each exporter
uses and which PromQL the sync sends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hub.store._client import (
        NO_PARTIAL_RESPONSE,
        HubClient,
        HubSettings,
        PartialResponse,
        QueryResult,
        StreamedRows,
        prometheus_connect,
        range_frame,
    )
from hub.store._vendors import (
    BOTH,
    CLOCKS_EVENT_REASONS,
    DCGM47,
    DCGM_RENAMES,
    DEVICE_HEALTH,
    DRAM_ACTIVE,
    ECC_DBE,
    ENGINE_ACTIVE,
    EXPORTER_COLLECT_ERRORS,
    EXPORTER_NODE_LABEL,
    EXPORTER_POD_REGEX,
    EXPORTER_UP,
    KUBE_NODE_INFO,
    KUBE_NODE_LABELS,
    KUBE_PROVIDER_ID,
    KUBE_STATE_METRICS,
    LAST_XID,
    LEGACY,
    MEMORY_FREE,
    MEMORY_RESERVED,
    MEMORY_TOTAL,
    MEMORY_USED,
    MODEL_LABELS,
    NODE_LABELS,
    POWER,
    PROFILES,
    ROW_REMAP_FAILURE,
    SLICE_LABELS,
    SM_ACTIVE,
    TEMPERATURE,
    TENSOR_ACTIVE,
    UTILISATION,
    Identity,
    Query,
    VendorProfile,
    allocation,
    allowlist_metrics,
    cluster_count_query,
    compute_slices,
    dcgm_collectors,
    dcgm_names,
    is_exporter_pod,
    labelled_matcher,
    labelled_probe,
    mig_share,
    profile,
    shard_matcher,
    sync_queries,
    usage_convert,
    usage_queries,
)

__all__ = [
    "BOTH",
    "CLOCKS_EVENT_REASONS",
    "DCGM47",
    "DCGM_RENAMES",
    "DEVICE_HEALTH",
    "DRAM_ACTIVE",
    "ECC_DBE",
    "ENGINE_ACTIVE",
    "EXPORTER_COLLECT_ERRORS",
    "EXPORTER_NODE_LABEL",
    "EXPORTER_POD_REGEX",
    "EXPORTER_UP",
    "KUBE_NODE_INFO",
    "KUBE_NODE_LABELS",
    "KUBE_PROVIDER_ID",
    "KUBE_STATE_METRICS",
    "LAST_XID",
    "LEGACY",
    "MEMORY_FREE",
    "MEMORY_RESERVED",
    "MEMORY_TOTAL",
    "MEMORY_USED",
    "MODEL_LABELS",
    "NODE_LABELS",
    "NO_PARTIAL_RESPONSE",
    "POWER",
    "PROFILES",
    "ROW_REMAP_FAILURE",
    "SLICE_LABELS",
    "SM_ACTIVE",
    "TEMPERATURE",
    "TENSOR_ACTIVE",
    "UTILISATION",
    "HubClient",
    "HubSettings",
    "Identity",
    "PartialResponse",
    "Query",
    "QueryResult",
    "StreamedRows",
    "VendorProfile",
    "allocation",
    "allowlist_metrics",
    "cluster_count_query",
    "compute_slices",
    "dcgm_collectors",
    "dcgm_names",
    "is_exporter_pod",
    "labelled_matcher",
    "labelled_probe",
    "mig_share",
    "profile",
    "prometheus_connect",
    "range_frame",
    "shard_matcher",
    "sync_queries",
    "usage_convert",
    "usage_queries",
]

#: The HTTP client's names load with it (requests, urllib3) on first use: commands that only
#: read the database (`usage`, `inventory list`) start without them.
_CLIENT = {"NO_PARTIAL_RESPONSE", "HubClient", "HubSettings", "PartialResponse", "QueryResult",
           "StreamedRows", "prometheus_connect", "range_frame"}


def __getattr__(name: str) -> Any:
    if name in _CLIENT:
        from hub.store import _client

        return getattr(_client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
