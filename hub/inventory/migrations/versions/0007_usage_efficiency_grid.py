"""The usage ledger's efficiency columns and its bucket grid.

- usage: avg_sm_active_pct, avg_tensor_active_pct, avg_dram_active_pct (profiling counters;
  NULL where the exporter does not send them, so old rows stay "not measured", never 0);
- usage_daily: sm_active_gpu_hours and sm_measured_gpu_hours (0 for the days written before:
  they had no SM activity, and "measured 0 hours" makes their average null);
- usage_ledger: properties of the ledger; the bucket size is stored when the next collect
  runs (read off the collected buckets, hub/usage/_ledger.py ledger_bucket).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

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


def downgrade() -> None:
    op.drop_table("usage_ledger")
    with op.batch_alter_table("usage_daily") as batch:
        batch.drop_column("sm_measured_gpu_hours")
        batch.drop_column("sm_active_gpu_hours")
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("avg_dram_active_pct")
        batch.drop_column("avg_tensor_active_pct")
        batch.drop_column("avg_sm_active_pct")
