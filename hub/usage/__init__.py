"""Answers about how GPUs are used: GPU-hours, idle allocated GPUs, free capacity, and the
history of one GPU. Reads the inventory (tables, events, usage ledger); writes nothing.
"""

from __future__ import annotations

from hub.usage._answers import (
    CAPACITY_FIGURES,
    CAPACITY_GROUPS,
    GROUPS,
    USAGE_FIGURES,
    capacity,
    group_columns,
    rollup_days,
    summary_select,
    usage_frame,
    usage_summary,
)
from hub.usage._history import HISTORY_COLUMNS, gpu_history
from hub.usage._idle import (
    IDLE_COLUMNS,
    IDLE_FOR_S,
    IDLE_THRESHOLD_PCT,
    idle_allocated,
    idle_gpu_hours,
    idle_runs,
)

__all__ = [
    "CAPACITY_FIGURES",
    "CAPACITY_GROUPS",
    "GROUPS",
    "HISTORY_COLUMNS",
    "IDLE_COLUMNS",
    "IDLE_FOR_S",
    "IDLE_THRESHOLD_PCT",
    "USAGE_FIGURES",
    "capacity",
    "gpu_history",
    "group_columns",
    "idle_allocated",
    "idle_gpu_hours",
    "idle_runs",
    "rollup_days",
    "summary_select",
    "usage_frame",
    "usage_summary",
]
