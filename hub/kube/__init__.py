"""The one door to the Kubernetes API (the official client, with paging and one-line errors),
used by reconcile and by ACM policy rollout. Importing it loads the kubernetes client.
"""

from __future__ import annotations

from hub.kube._client import (
    api_client,
    call,
    list_all,
    list_managed_clusters,
    list_nodes,
    translate,
)

__all__ = [
    "api_client",
    "call",
    "list_all",
    "list_managed_clusters",
    "list_nodes",
    "translate",
]
