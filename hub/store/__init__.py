"""The one door to the hub store (Prometheus / Thanos / ACM Observability): the PromQL HTTP
client with its auth, and the vendor profiles that say which metrics and labels each exporter
uses and which PromQL the sync sends.
"""

from __future__ import annotations

from hub.store._client import (
    HubClient,
    HubSettings,
    PartialResponse,
)
from hub.store._vendors import (
    ENGINE_ACTIVE,
    EXPORTER_COLLECT_ERRORS,
    EXPORTER_NODE_LABEL,
    EXPORTER_POD_REGEX,
    EXPORTER_UP,
    KUBE_NODE_LABELS,
    KUBE_STATE_METRICS,
    MEMORY_FREE,
    MEMORY_RESERVED,
    MEMORY_TOTAL,
    MEMORY_USED,
    NODE_LABELS,
    POWER,
    PROFILES,
    SLICE_LABELS,
    TEMPERATURE,
    UTILISATION,
    Identity,
    Query,
    VendorProfile,
    allocation,
    allowlist_metrics,
    compute_slices,
    is_exporter_pod,
    mig_share,
    profile,
    sync_queries,
)

__all__ = [
    "ENGINE_ACTIVE",
    "EXPORTER_COLLECT_ERRORS",
    "EXPORTER_NODE_LABEL",
    "EXPORTER_POD_REGEX",
    "EXPORTER_UP",
    "KUBE_NODE_LABELS",
    "KUBE_STATE_METRICS",
    "MEMORY_FREE",
    "MEMORY_RESERVED",
    "MEMORY_TOTAL",
    "MEMORY_USED",
    "NODE_LABELS",
    "POWER",
    "PROFILES",
    "SLICE_LABELS",
    "TEMPERATURE",
    "UTILISATION",
    "HubClient",
    "HubSettings",
    "Identity",
    "PartialResponse",
    "Query",
    "VendorProfile",
    "allocation",
    "allowlist_metrics",
    "compute_slices",
    "is_exporter_pod",
    "mig_share",
    "profile",
    "sync_queries",
]
