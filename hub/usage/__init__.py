"""Answers about how GPUs are used: GPU-hours, idle allocated GPUs, free capacity, the
history of one GPU, and the same figures over time for charts. Reads the inventory (tables,
events, usage ledger); writes nothing.
"""

from __future__ import annotations

from hub.usage._answers import (
    CAPACITY_FIGURES,
    CAPACITY_GROUPS,
    GROUPS,
    IDLE_COLUMNS,
    USAGE_FIGURES,
    capacity,
    group_columns,
    idle_allocated,
    rollup_days,
    summary_select,
    usage_frame,
    usage_summary,
)
from hub.usage._history import HISTORY_COLUMNS, gpu_history
from hub.usage._series import daily_by_namespace, day_starts, utilisation_over_time

__all__ = [
    "CAPACITY_FIGURES",
    "CAPACITY_GROUPS",
    "GROUPS",
    "HISTORY_COLUMNS",
    "IDLE_COLUMNS",
    "USAGE_FIGURES",
    "capacity",
    "daily_by_namespace",
    "day_starts",
    "gpu_history",
    "group_columns",
    "idle_allocated",
    "rollup_days",
    "summary_select",
    "usage_frame",
    "usage_summary",
    "utilisation_over_time",
]
