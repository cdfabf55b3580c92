"""The usage ledger's daily rollup: `usage` over weeks reads days, not every hourly row.

usage_daily holds, per UTC day (the buckets starting that day) and per cluster, node, GPU or
slice, namespace and model, the sums `usage` reports: gpu_hours, allocated_gpu_hours,
busy_gpu_hours, idle_allocated_gpu_hours (at the default 5 % idle threshold) and energy_wh.
`usage collect` rebuilds a day's rows from the ledger whenever it writes a bucket of that day
(hub/usage/_ledger.py). This migration fills it from the hourly rows already there, with
the same sums, so an upgraded database answers exactly as before.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

IDLE_THRESHOLD = 5.0  # frozen here: the rollup's idle figure is for this threshold
KEYS = ["cluster", "node", "uuid", "slice", "namespace", "model"]


def upgrade() -> None:
    op.create_table(
        "usage_daily",
        sa.Column("day", sa.DateTime, nullable=False),
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
    )
    op.create_index("ix_usage_daily_day", "usage_daily", ["day"])
    _fill()


def _fill() -> None:
    """One INSERT ... SELECT per day that has ledger rows (the day is a bound DateTime, so
    SQLite stores it in the same text form as every other timestamp)."""
    conn = op.get_bind()
    usage = sa.table("usage", *[sa.column(c) for c in (
        *KEYS, "bucket_start", "pod", "gpu_hours", "avg_utilisation_pct", "energy_wh")])
    daily = sa.table("usage_daily", *[sa.column(c) for c in (
        "day", *KEYS, "gpu_hours", "allocated_gpu_hours", "busy_gpu_hours",
        "idle_allocated_gpu_hours", "energy_wh")])
    first, last = conn.execute(sa.select(sa.func.min(usage.c.bucket_start),
                                         sa.func.max(usage.c.bucket_start))).one()
    if first is None:
        return
    first, last = (_as_datetime(v) for v in (first, last))
    allocated = usage.c.pod != ""
    util = sa.func.coalesce(usage.c.avg_utilisation_pct, 0.0)
    zero = sa.literal(0.0)
    day = first.replace(hour=0, minute=0, second=0, microsecond=0)
    while day <= last:
        select = (sa.select(
            sa.literal(day, sa.DateTime), *[usage.c[k] for k in KEYS],
            sa.func.sum(usage.c.gpu_hours),
            sa.func.sum(sa.case((allocated, usage.c.gpu_hours), else_=zero)),
            sa.func.sum(usage.c.gpu_hours * util / 100.0),
            sa.func.sum(sa.case((sa.and_(allocated, util < IDLE_THRESHOLD), usage.c.gpu_hours),
                                else_=zero)),
            sa.func.sum(sa.func.coalesce(usage.c.energy_wh, 0.0)))
            .where(usage.c.bucket_start >= sa.literal(day, sa.DateTime),
                   usage.c.bucket_start < sa.literal(day + dt.timedelta(days=1), sa.DateTime))
            .group_by(*[usage.c[k] for k in KEYS]))
        conn.execute(daily.insert().from_select([c.name for c in daily.c], select))
        day += dt.timedelta(days=1)


def _as_datetime(value: object) -> dt.datetime:
    """SQLite hands min() of a DateTime column back as text."""
    return value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))


def downgrade() -> None:
    op.drop_index("ix_usage_daily_day", table_name="usage_daily")
    op.drop_table("usage_daily")
