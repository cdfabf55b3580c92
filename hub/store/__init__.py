"""The one door to the hub store (Prometheus / Thanos / ACM Observability): the PromQL HTTP
client with its auth, and the vendor profiles that say which metrics and labels each exporter
uses and which PromQL the sync sends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
from hub.common import lazy_attributes
from hub.store._vendors import (
    CLOCKS_EVENT_REASONS,
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
    compute_slices,
    is_exporter_pod,
    labelled_matcher,
    labelled_probe,
    mig_share,
    profile,
    sync_queries,
    usage_convert,
    usage_queries,
)

__all__ = [
    "CLOCKS_EVENT_REASONS",
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
    "compute_slices",
    "is_exporter_pod",
    "labelled_matcher",
    "labelled_probe",
    "mig_share",
    "profile",
    "prometheus_connect",
    "range_frame",
    "sync_queries",
    "usage_convert",
    "usage_queries",
]

#: The HTTP client's names load with it (requests, urllib3) on first use: commands that only
#: read the database (`usage`, `inventory list`) start without them.
_CLIENT = {"NO_PARTIAL_RESPONSE", "HubClient", "HubSettings", "PartialResponse", "QueryResult",
           "StreamedRows", "prometheus_connect", "range_frame"}


__getattr__ = lazy_attributes(__name__, dict.fromkeys(_CLIENT, "_client"))
