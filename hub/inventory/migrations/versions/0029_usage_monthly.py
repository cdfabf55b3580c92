"""Monthly rollups of the usage ledger (issue 40): usage_monthly sums usage_daily, and
usage_idle_monthly sums usage_idle_daily, by calendar month (UTC), for the months before
the latest collected bucket's, so `usage --since 365d` reads some 12 rows per GPU instead of
365 (hub/usage/_ledger.py keeps them from here on: rebuild_months).

The months of an existing ledger are summed here from its daily rollups, one month per
statement. Downgrade drops both tables (the daily rollups they were summed from stay).

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-05
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

ROLLUP_KEYS = ["cluster", "node", "uuid", "slice", "namespace", "model"]
SUMS = ["gpu_hours", "allocated_gpu_hours", "busy_gpu_hours", "idle_allocated_gpu_hours",
        "energy_wh", "energy_measured_gpu_hours", "sm_active_gpu_hours",
        "sm_measured_gpu_hours"]
IDLE_KEYS = ["cluster", "node", "uuid", "slice", "namespace", "pod"]


def _rollup_columns() -> list[sa.Column]:
    return [
        sa.Column("month", sa.DateTime, nullable=False),
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("uuid", sa.String(128), nullable=False),
        sa.Column("slice", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("model", sa.String(128)),
        *[sa.Column(s, sa.Float, nullable=False,
                    server_default=None if s in SUMS[:5] else "0") for s in SUMS],
        sa.Column("allocation_basis_rank", sa.Integer),
    ]


def _idle_columns() -> list[sa.Column]:
    return [
        sa.Column("month", sa.DateTime, nullable=False),
        *[sa.Column(k, sa.String(253 if k not in ("uuid", "slice") else
                                 128 if k == "uuid" else 64), nullable=False)
          for k in IDLE_KEYS],
        sa.Column("model", sa.String(128)),
        sa.Column("buckets", sa.Integer, nullable=False),
        sa.Column("first_start", sa.DateTime, nullable=False),
        sa.Column("last_end", sa.DateTime, nullable=False),
        sa.Column("gpu_hours", sa.Float, nullable=False),
        sa.Column("busy", sa.Float, nullable=False),
    ]


def _month_of(moment: dt.datetime) -> dt.datetime:
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _next_month(month: dt.datetime) -> dt.datetime:
    return (month + dt.timedelta(days=32)).replace(day=1)


def upgrade() -> None:
    monthly = op.create_table("usage_monthly", *_rollup_columns())
    op.create_index("ix_usage_monthly_month", "usage_monthly", ["month"])
    idle_monthly = op.create_table("usage_idle_monthly", *_idle_columns())
    op.create_index("ix_usage_idle_monthly_month", "usage_idle_monthly", ["month"])
    conn = op.get_bind()
    meta = sa.MetaData()
    daily = sa.Table("usage_daily", meta, autoload_with=conn)
    idle_daily = sa.Table("usage_idle_daily", meta, autoload_with=conn)
    latest = conn.execute(sa.text("SELECT max(bucket_start) FROM usage_buckets")).scalar()
    first = conn.execute(sa.select(sa.func.min(daily.c.day))).scalar()
    if latest is None or first is None:
        return
    if isinstance(latest, str):  # SQLite's text, read without the column's type
        latest = dt.datetime.fromisoformat(latest)
    month, built = _month_of(first), _month_of(latest)
    while month < built:  # the months before the latest bucket's, as the writer keeps them
        until = _next_month(month)
        conn.execute(monthly.insert().from_select(
            ["month", *ROLLUP_KEYS, *SUMS, "allocation_basis_rank"],
            sa.select(sa.literal(month, sa.DateTime), *[daily.c[k] for k in ROLLUP_KEYS],
                      *[sa.func.sum(daily.c[s]) for s in SUMS],
                      sa.func.max(daily.c.allocation_basis_rank))
            .where(daily.c.day >= month, daily.c.day < until)
            .group_by(*[daily.c[k] for k in ROLLUP_KEYS])))
        d = idle_daily
        conn.execute(idle_monthly.insert().from_select(
            ["month", *IDLE_KEYS, "model", "buckets", "first_start", "last_end", "gpu_hours",
             "busy"],
            sa.select(sa.literal(month, sa.DateTime), *[d.c[k] for k in IDLE_KEYS],
                      sa.func.min(d.c.model), sa.func.sum(d.c.buckets),
                      sa.func.min(d.c.first_start), sa.func.max(d.c.last_end),
                      sa.func.sum(d.c.gpu_hours), sa.func.sum(d.c.busy))
            .where(d.c.day >= month, d.c.day < until)
            .group_by(*[d.c[k] for k in IDLE_KEYS])))
        month = until


def downgrade() -> None:
    op.drop_index("ix_usage_idle_monthly_month", "usage_idle_monthly")
    op.drop_table("usage_idle_monthly")
    op.drop_index("ix_usage_monthly_month", "usage_monthly")
    op.drop_table("usage_monthly")
