"""The GPU inventory: normalising the hub's answers into GPUs, nodes and clusters, the
database tables and their Alembic migrations, and the sync that fills them in one transaction.
"""

from __future__ import annotations

from hub.inventory._db import (
    ACTIVE,
    ALLOCATION_COLUMNS,
    CLUSTER_COLUMNS,
    GPU_COLUMNS,
    GPU_TABLE_COLUMNS,
    NODE_COLUMNS,
    STALE,
    LockHeld,
    gpu_item,
    gpus,
    list_allocations,
    list_clusters,
    list_gpus,
    list_nodes,
    list_sync_runs,
    make_engine,
    metadata,
    nodes,
    now_utc,
    safe_url,
    sync_runs,
)
from hub.inventory._health import FATAL_XIDS
from hub.inventory._health import LEVELS as HEALTH_LEVELS
from hub.inventory._migrate import (
    current,
    ensure_schema,
    upgrade,
)
from hub.inventory._reconcile_runs import reconcile_clusters, reconcile_results, reconcile_runs
from hub.inventory._sync import (
    NO_GPU_SERIES,
    SyncResult,
    missing_label_error,
    run_sync,
    subquery_step,
    unlabelled,
)

__all__ = [
    "ACTIVE",
    "ALLOCATION_COLUMNS",
    "CLUSTER_COLUMNS",
    "FATAL_XIDS",
    "GPU_COLUMNS",
    "GPU_TABLE_COLUMNS",
    "HEALTH_LEVELS",
    "NODE_COLUMNS",
    "NO_GPU_SERIES",
    "STALE",
    "LockHeld",
    "SyncResult",
    "current",
    "ensure_schema",
    "gpu_item",
    "gpus",
    "list_allocations",
    "list_clusters",
    "list_gpus",
    "list_nodes",
    "list_sync_runs",
    "make_engine",
    "metadata",
    "missing_label_error",
    "nodes",
    "now_utc",
    "reconcile_clusters",
    "reconcile_results",
    "reconcile_runs",
    "run_sync",
    "safe_url",
    "subquery_step",
    "sync_runs",
    "unlabelled",
    "upgrade",
]
