"""Group rollups of the usage ledger (issue 40): usage_daily_groups sums usage_daily per
day by cluster, namespace and model, and usage_monthly_groups sums those days per month (for
the months usage_monthly has), so `usage --by namespace` (or cluster, or model) reads a row
per group and day instead of one per GPU: at 100,000 GPUs a month of usage_daily is 3
million rows, its groups some 80,000 (hub/usage/_ledger.py keeps them from here on, with
the daily and monthly rollups: rebuild_days, rebuild_months).

The days of an existing ledger are summed here from its daily rollup one month per
statement, then its built months from those days, as the writer sums them. Run in one
transaction: a migration stopped halfway leaves nothing, and runs again from the start.
Downgrade drops both tables (the rollups they were summed from stay).

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-05
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

KEYS = ["cluster", "namespace", "model"]
SUMS = ["gpu_hours", "allocated_gpu_hours", "busy_gpu_hours", "idle_allocated_gpu_hours",
        "energy_wh", "energy_measured_gpu_hours", "sm_active_gpu_hours",
        "sm_measured_gpu_hours"]
RANK = "allocation_basis_rank"


def _columns(period: str) -> list[sa.Column]:
    return [
        sa.Column(period, sa.DateTime, nullable=False),
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("model", sa.String(128)),
        *[sa.Column(s, sa.Float, nullable=False,
                    server_default=None if s in SUMS[:5] else "0") for s in SUMS],
        sa.Column(RANK, sa.Integer),
    ]


def _when(value: str | dt.datetime) -> dt.datetime:
    """A time as read without the column's type (SQLite's text) or with it."""
    return dt.datetime.fromisoformat(value) if isinstance(value, str) else value


def _month_of(moment: dt.datetime) -> dt.datetime:
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _next_month(month: dt.datetime) -> dt.datetime:
    return (month + dt.timedelta(days=32)).replace(day=1)


def _sum(conn: sa.Connection, source: sa.Table, target: sa.Table, period: str,
         per: sa.ColumnElement, start: dt.datetime, end: dt.datetime) -> None:
    """target's rows of source's days in [start, end), summed per group (and day: ``per``
    the day column; or one period: ``per`` its start)."""
    sums = [sa.func.sum(source.c[s]) for s in SUMS] + [sa.func.max(source.c[RANK])]
    keys = [source.c[k] for k in KEYS]
    conn.execute(target.insert().from_select(
        [period, *KEYS, *SUMS, RANK],
        sa.select(per, *keys, *sums)
        .where(source.c.day >= start, source.c.day < end)
        .group_by(*([per] if isinstance(per, sa.Column) else []), *keys)))


def upgrade() -> None:
    daily = op.create_table("usage_daily_groups", *_columns("day"))
    op.create_index("ix_usage_daily_groups_day", "usage_daily_groups", ["day"])
    monthly = op.create_table("usage_monthly_groups", *_columns("month"))
    op.create_index("ix_usage_monthly_groups_month", "usage_monthly_groups", ["month"])
    conn = op.get_bind()
    meta = sa.MetaData()
    days = sa.Table("usage_daily", meta, autoload_with=conn)
    months = sa.Table("usage_monthly", meta, autoload_with=conn)
    first, last = conn.execute(sa.select(sa.func.min(days.c.day),
                                         sa.func.max(days.c.day))).one()
    if first is None:
        return
    month, last = _month_of(_when(first)), _when(last)
    while month <= last:  # a month of days per statement
        _sum(conn, days, daily, "day", days.c.day, month, _next_month(month))
        month = _next_month(month)
    built = sorted(_when(m) for m in conn.execute(
        sa.select(months.c.month).distinct()).scalars())
    for month in built:  # the months usage_monthly has, from their group days
        _sum(conn, daily, monthly, "month", sa.literal(month, sa.DateTime), month,
             _next_month(month))


def downgrade() -> None:
    op.drop_index("ix_usage_monthly_groups_month", "usage_monthly_groups")
    op.drop_table("usage_monthly_groups")
    op.drop_index("ix_usage_daily_groups_day", "usage_daily_groups")
    op.drop_table("usage_daily_groups")
