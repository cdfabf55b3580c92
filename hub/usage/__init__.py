"""How GPUs are used: the usage ledger's writer (collect, fold, rollup) and the answers read
from it (GPU-hours, idle allocated GPUs, free capacity, the history of one GPU, and the same
figures over time for charts). The ledger's tables belong to the inventory
(hub/inventory/_usage_tables.py); everything else about the ledger is here, in one place.
"""

from __future__ import annotations

from hub.usage._answers import (
    CAPACITY_FIGURES,
    CAPACITY_GROUPS,
    GROUPS,
    USAGE_FIGURES,
    capacity,
    group_columns,
    models_used,
    summary_select,
    usage_frame,
    usage_summary,
)
from hub.usage._bills import Bill, describe_bill, load_bill, parse_bill
from hub.usage._fold import fold_bucket
from hub.usage._history import gpu_history
from hub.usage._idle import (
    IDLE_COLUMNS,
    IDLE_FOR_S,
    IDLE_THRESHOLD_PCT,
    IdleRule,
    idle_allocated,
    idle_gpu_hours,
    idle_now,
    idle_runs,
)
from hub.usage._ledger import (
    CONFIRM_BUCKETS,
    MAX_BUCKETS,
    CollectResult,
    apply_retention,
    bucket_queries,
    buckets_between,
    check_settings,
    collect_on_new_grid,
    collect_usage,
    describe,
    ledger_bucket,
    pending_buckets,
    rebuild_days,
    replace_grid,
    rollup_days,
    rollup_sums,
    write_bucket,
)
from hub.usage._prices import (
    COST_FIGURES,
    Prices,
    load_prices,
    missing_note,
    parse_prices,
    unused_note,
)
from hub.usage._series import daily_by_namespace, day_starts, utilisation_over_time

__all__ = [
    "CAPACITY_FIGURES",
    "CAPACITY_GROUPS",
    "CONFIRM_BUCKETS",
    "COST_FIGURES",
    "GROUPS",
    "IDLE_COLUMNS",
    "IDLE_FOR_S",
    "IDLE_THRESHOLD_PCT",
    "MAX_BUCKETS",
    "USAGE_FIGURES",
    "Bill",
    "CollectResult",
    "IdleRule",
    "Prices",
    "apply_retention",
    "bucket_queries",
    "buckets_between",
    "capacity",
    "check_settings",
    "collect_on_new_grid",
    "collect_usage",
    "daily_by_namespace",
    "day_starts",
    "describe",
    "describe_bill",
    "fold_bucket",
    "gpu_history",
    "group_columns",
    "idle_allocated",
    "idle_gpu_hours",
    "idle_now",
    "idle_runs",
    "ledger_bucket",
    "load_bill",
    "load_prices",
    "missing_note",
    "models_used",
    "parse_bill",
    "parse_prices",
    "pending_buckets",
    "rebuild_days",
    "replace_grid",
    "rollup_days",
    "rollup_sums",
    "summary_select",
    "unused_note",
    "usage_frame",
    "usage_summary",
    "utilisation_over_time",
    "write_bucket",
]
