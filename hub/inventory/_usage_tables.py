"""The usage ledger's tables. The inventory owns every table (one metadata, one migration
chain, one prune); the ledger's writer and readers live in hub/usage (hub/usage/_ledger.py).

- ``usage``: one row per GPU or MIG slice, allocation and bucket;
- ``usage_buckets``: which buckets are collected (a bucket is written whole or not at all);
- ``usage_daily``: the rollup, per UTC day, of the ledger's rows (rebuilt with every write);
- ``usage_flags``: what the meter corrected in a bucket, naming the pod;
- ``usage_ledger``: properties of the ledger itself, today its bucket size: buckets of two
  sizes must never be summed side by side, so the size is stored once, with the rows.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub.common import json_number
from hub.inventory._db import metadata

usage = sa.Table(
    "usage", metadata,
    sa.Column("bucket_start", sa.DateTime, primary_key=True),
    sa.Column("cluster", sa.String(253), primary_key=True),
    sa.Column("node", sa.String(253), primary_key=True),
    sa.Column("uuid", sa.String(128), primary_key=True),
    sa.Column("slice", sa.String(64), primary_key=True),  # '' = the whole GPU
    sa.Column("namespace", sa.String(253), primary_key=True),  # '' = unallocated
    sa.Column("pod", sa.String(253), primary_key=True),
    sa.Column("bucket_end", sa.DateTime, nullable=False),
    sa.Column("vendor", sa.String(16), nullable=False),
    sa.Column("model", sa.String(128)),
    sa.Column("gpu_share", sa.Float, nullable=False),
    sa.Column("gpu_hours", sa.Float, nullable=False),
    sa.Column("avg_utilisation_pct", sa.Float),
    sa.Column("max_utilisation_pct", sa.Float),
    sa.Column("avg_memory_used_mib", sa.Float),
    sa.Column("max_memory_used_mib", sa.Float),
    sa.Column("avg_power_w", sa.Float),
    sa.Column("energy_wh", sa.Float),
    sa.Column("coverage", sa.Float, nullable=False),
    # profiling counters (DCGM_FI_PROF_*, AMD's equivalents); NULL where not exported
    sa.Column("avg_sm_active_pct", sa.Float),
    sa.Column("avg_tensor_active_pct", sa.Float),
    sa.Column("avg_dram_active_pct", sa.Float),
    # how the allocated time was measured: interval | estimated | sampled (hub/usage/_meter.py)
    sa.Column("allocation_basis", sa.String(16), nullable=False, server_default="sampled"),
    sa.Index("ix_usage_uuid_bucket", "uuid", "bucket_start"),
)

usage_buckets = sa.Table(
    "usage_buckets", metadata,
    sa.Column("bucket_start", sa.DateTime, primary_key=True),
    sa.Column("bucket_end", sa.DateTime, nullable=False),
    sa.Column("collected_at", sa.DateTime, nullable=False),
    sa.Column("rows", sa.Integer, nullable=False),
    sa.Column("requests", sa.Integer, nullable=False),
)

usage_ledger = sa.Table(
    "usage_ledger", metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(255), nullable=False),
)

#: The idle threshold (%) the rollup's idle_allocated_gpu_hours is computed for (the default
#: of `usage --idle-threshold`); another threshold reads the ledger's buckets.
ROLLUP_IDLE_THRESHOLD = 5.0
DAY = dt.timedelta(days=1)

usage_daily = sa.Table(
    "usage_daily", metadata,
    # No primary key: model may be NULL (not known). The rows of a day are only ever
    # replaced together (rebuild_days), never upserted one by one.
    sa.Column("day", sa.DateTime, nullable=False),  # 00:00 UTC; buckets starting that day
    sa.Column("cluster", sa.String(253), nullable=False),
    sa.Column("node", sa.String(253), nullable=False),
    sa.Column("uuid", sa.String(128), nullable=False),
    sa.Column("slice", sa.String(64), nullable=False),
    sa.Column("namespace", sa.String(253), nullable=False),
    sa.Column("model", sa.String(128)),
    sa.Column("gpu_hours", sa.Float, nullable=False),
    sa.Column("allocated_gpu_hours", sa.Float, nullable=False),
    sa.Column("busy_gpu_hours", sa.Float, nullable=False),
    sa.Column("idle_allocated_gpu_hours", sa.Float, nullable=False),
    sa.Column("energy_wh", sa.Float, nullable=False),
    # the GPU-hours whose energy_wh was known (power reported): energy is null where 0
    sa.Column("energy_measured_gpu_hours", sa.Float, nullable=False, server_default="0"),
    # GPU-hours x SM activity, and the GPU-hours that had an SM activity figure: the average
    # is their ratio, over GPUs that export the counter only (never diluted by zeros)
    sa.Column("sm_active_gpu_hours", sa.Float, nullable=False, server_default="0"),
    sa.Column("sm_measured_gpu_hours", sa.Float, nullable=False, server_default="0"),
    # the least exact allocation_basis of the allocated rows (0 interval, 1 estimated,
    # 2 sampled; NULL: none allocated)
    sa.Column("allocation_basis_rank", sa.Integer),
    sa.Index("ix_usage_daily_day", "day"),
)

#: Per day and GPU or slice and pod: its idle allocated buckets at ROLLUP_IDLE_THRESHOLD (a pod
#: held it, it had samples, a utilisation was measured and stayed under the threshold): how
#: many, the first one's start, the last one's end and their sums. When count x bucket size =
#: last_end - first_start they are one unbroken run, so an idle answer over a month reads one
#: row per idle GPU and day instead of every idle bucket (hub/usage/_idle.py).
usage_idle_daily = sa.Table(
    "usage_idle_daily", metadata,
    sa.Column("day", sa.DateTime, nullable=False),
    sa.Column("cluster", sa.String(253), nullable=False),
    sa.Column("node", sa.String(253), nullable=False),
    sa.Column("uuid", sa.String(128), nullable=False),
    sa.Column("slice", sa.String(64), nullable=False),
    sa.Column("namespace", sa.String(253), nullable=False),
    sa.Column("pod", sa.String(253), nullable=False),
    sa.Column("model", sa.String(128)),
    sa.Column("buckets", sa.Integer, nullable=False),
    sa.Column("first_start", sa.DateTime, nullable=False),
    sa.Column("last_end", sa.DateTime, nullable=False),
    sa.Column("gpu_hours", sa.Float, nullable=False),
    sa.Column("busy", sa.Float, nullable=False),  # sum of gpu_hours x utilisation %
    sa.Index("ix_usage_idle_daily_day", "day"),
)

#: What the meter corrected in a bucket, one row per pod and kind (hub/usage/_meter.py): a
#: request beyond its node's GPUs (``capped``), edges that cannot be (``impossible_edges``).
#: Written and deleted with the bucket's rows; `gpufleet report` turns them into findings.
usage_flags = sa.Table(
    "usage_flags", metadata,
    sa.Column("bucket_start", sa.DateTime, primary_key=True),
    sa.Column("cluster", sa.String(253), primary_key=True),
    sa.Column("namespace", sa.String(253), primary_key=True),
    sa.Column("pod", sa.String(253), primary_key=True),
    sa.Column("flag", sa.String(32), primary_key=True),
    sa.Column("node", sa.String(253), nullable=False),
    sa.Column("detail", sa.Text, nullable=False),
)

USAGE_COLUMNS = [
    "cluster", "node", "uuid", "slice", "namespace", "pod", "bucket_start", "bucket_end",
    "vendor", "model", "gpu_share", "gpu_hours", "avg_utilisation_pct", "max_utilisation_pct",
    "avg_memory_used_mib", "max_memory_used_mib", "avg_power_w", "energy_wh", "coverage",
    "avg_sm_active_pct", "avg_tensor_active_pct", "avg_dram_active_pct", "allocation_basis",
]


def day_of(moment: dt.datetime) -> dt.datetime:
    """00:00 UTC of the day a (naive UTC) moment falls in."""
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def recent_usage(conn: Connection, uuid: str, limit: int = 48) -> list[dict[str, Any]]:
    stmt = (sa.select(usage).where(usage.c.uuid == uuid)
            .order_by(usage.c.bucket_start.desc(), usage.c.slice, usage.c.namespace,
                      usage.c.pod).limit(limit))
    # sane JSON precision: a 5-minute bucket is 0.083333 GPU-hours, not 0.08333333333333333
    return [{k: json_number(v) if isinstance(v, float) else v for k, v in r.items()}
            for r in conn.execute(stmt).mappings()]
