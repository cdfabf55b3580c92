"""The usage ledger's efficiency columns and its bucket grid.

- usage: avg_sm_active_pct, avg_tensor_active_pct, avg_dram_active_pct (profiling counters;
  NULL where the exporter does not send them, so old rows stay "not measured", never 0);
- usage_daily: sm_active_gpu_hours and sm_measured_gpu_hours (0 for the days written before:
  they had no SM activity, and "measured 0 hours" makes their average null);
- usage_ledger: properties of the ledger; the bucket size is stored when the next collect
  runs (read off the collected buckets, hub/usage/_ledger.py ledger_bucket);
- usage_idle_daily: per day, GPU or slice and pod, its idle allocated buckets (count, first
  start, last end, sums), filled here from the rows already there, so the one idle answer
  reads a month by days (hub/usage/_idle.py).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage") as batch:
        batch.add_column(sa.Column("avg_sm_active_pct", sa.Float))
        batch.add_column(sa.Column("avg_tensor_active_pct", sa.Float))
        batch.add_column(sa.Column("avg_dram_active_pct", sa.Float))
    with op.batch_alter_table("usage_daily") as batch:
        batch.add_column(sa.Column("sm_active_gpu_hours", sa.Float, nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("sm_measured_gpu_hours", sa.Float, nullable=False,
                                   server_default="0"))
    op.create_table(
        "usage_ledger",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(255), nullable=False),
    )
    op.create_table(
        "usage_idle_daily",
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
        sa.Column("busy", sa.Float, nullable=False),
    )
    op.create_index("ix_usage_idle_daily_day", "usage_idle_daily", ["day"])
    _fill_idle()


IDLE_THRESHOLD = 5.0  # frozen here, as in 0006: the rollup's idle threshold
KEYS = ["cluster", "node", "uuid", "slice", "namespace", "pod"]


def _fill_idle() -> None:
    """One INSERT ... SELECT per day that has ledger rows, as the writer rebuilds a day."""
    conn = op.get_bind()
    usage = sa.table("usage", *[sa.column(c) for c in (
        *KEYS, "model", "bucket_start", "bucket_end", "gpu_hours", "avg_utilisation_pct")])
    idle = sa.table("usage_idle_daily", *[sa.column(c) for c in (
        "day", *KEYS, "model", "buckets", "first_start", "last_end", "gpu_hours", "busy")])
    first, last = conn.execute(sa.select(sa.func.min(usage.c.bucket_start),
                                         sa.func.max(usage.c.bucket_start))).one()
    if first is None:
        return
    first, last = (v if isinstance(v, dt.datetime) else dt.datetime.fromisoformat(str(v))
                   for v in (first, last))
    day = first.replace(hour=0, minute=0, second=0, microsecond=0)
    while day <= last:
        nxt = day + dt.timedelta(days=1)
        select = (sa.select(
            sa.literal(day, sa.DateTime), *[usage.c[k] for k in KEYS],
            sa.func.min(usage.c.model), sa.func.count(), sa.func.min(usage.c.bucket_start),
            sa.func.max(usage.c.bucket_end), sa.func.sum(usage.c.gpu_hours),
            sa.func.sum(usage.c.gpu_hours * usage.c.avg_utilisation_pct))
            .where(usage.c.bucket_start >= sa.literal(day, sa.DateTime),
                   usage.c.bucket_start < sa.literal(nxt, sa.DateTime),
                   usage.c.pod != "", usage.c.gpu_hours > 0,
                   usage.c.avg_utilisation_pct.is_not(None),
                   usage.c.avg_utilisation_pct < IDLE_THRESHOLD)
            .group_by(*[usage.c[k] for k in KEYS]))
        conn.execute(idle.insert().from_select([c.name for c in idle.c], select))
        day = nxt


def downgrade() -> None:
    op.drop_table("usage_idle_daily")
    op.drop_table("usage_ledger")
    with op.batch_alter_table("usage_daily") as batch:
        batch.drop_column("sm_measured_gpu_hours")
        batch.drop_column("sm_active_gpu_hours")
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("avg_dram_active_pct")
        batch.drop_column("avg_tensor_active_pct")
        batch.drop_column("avg_sm_active_pct")
