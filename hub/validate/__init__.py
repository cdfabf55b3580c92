"""Whether the fleet view can be trusted: pure checks over inventory facts, reconcile against
Kubernetes, the report (table, JSON, Markdown, HTML) and the alert rules that watch the same.
"""

from __future__ import annotations

from hub.validate._alerts import (
    AlertSettings,
)
from hub.validate._alerts import render_files as render_alert_files
from hub.validate._assess import (
    assess,
    nodes_from_hub,
    reconcile_run,
)
from hub.validate._checks import (
    summarize,
)
from hub.validate._reconcile import (
    MATCH,
    NOTHING_TO_COMPARE,
    ManagedCluster,
    NodeView,
    claim_allocations_of,
    managed_cluster,
    node_from_object,
    nodes_from_document,
    nothing_to_compare,
    slices_from_document,
    with_dra,
)
from hub.validate._report import (
    Report,
    write_atomic,
)
from hub.validate._report import render as render_report

__all__ = [
    "MATCH",
    "NOTHING_TO_COMPARE",
    "AlertSettings",
    "ManagedCluster",
    "NodeView",
    "Report",
    "assess",
    "claim_allocations_of",
    "managed_cluster",
    "node_from_object",
    "nodes_from_document",
    "nodes_from_hub",
    "nothing_to_compare",
    "reconcile_run",
    "render_alert_files",
    "render_report",
    "slices_from_document",
    "summarize",
    "with_dra",
    "write_atomic",
]
