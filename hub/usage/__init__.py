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
from hub.usage._prices import COST_COLUMNS, Prices, group_costs, load_prices, parse_prices

__all__ = [
    "CAPACITY_FIGURES",
    "CAPACITY_GROUPS",
    "COST_COLUMNS",
    "GROUPS",
    "HISTORY_COLUMNS",
    "IDLE_COLUMNS",
    "IDLE_FOR_S",
    "IDLE_THRESHOLD_PCT",
    "USAGE_FIGURES",
    "Prices",
    "capacity",
    "gpu_history",
    "group_columns",
    "group_costs",
    "idle_allocated",
    "idle_gpu_hours",
    "idle_runs",
    "load_prices",
    "parse_prices",
    "rollup_days",
    "summary_select",
    "usage_frame",
    "usage_summary",
]
