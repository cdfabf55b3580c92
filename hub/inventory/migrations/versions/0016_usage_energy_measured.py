"""usage_daily.energy_measured_gpu_hours: the GPU-hours of a day whose power was reported.

A ledger row's energy_wh is NULL when its GPU sent no power (an exporter without the series,
an AMD GPU whose power series is suppressed after a zero first poll), but the rollup summed
energy with NULL as 0, so a namespace whose GPUs never reported power showed 0 kWh. With this
column the answers say null there, as avg_sm_active_pct already does (sm_measured_gpu_hours).

The days rolled up before kept only the sum, not which of their rows had power. A day row
with energy_wh > 0 had power reported, so its gpu_hours count as measured (a powerless row
inside it can no longer be told apart, but energy is a sum, not an average: the kWh shown are
still the ones measured). A day row with energy_wh = 0 summed rows without power (a GPU that
reports power draws more than 0 W), so "measured 0 hours" is the honest reading: its energy
becomes null, unknown, instead of a claimed 0 kWh. The hourly rows keep the truth, and a
re-collect of a day rebuilds its rollup from them exactly.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage_daily") as batch:
        batch.add_column(sa.Column("energy_measured_gpu_hours", sa.Float, nullable=False,
                                   server_default="0"))
    daily = sa.table("usage_daily", *[sa.column(c) for c in (
        "gpu_hours", "energy_wh", "energy_measured_gpu_hours")])
    op.get_bind().execute(daily.update().where(daily.c.energy_wh > 0)
                          .values(energy_measured_gpu_hours=daily.c.gpu_hours))


def downgrade() -> None:
    with op.batch_alter_table("usage_daily") as batch:
        batch.drop_column("energy_measured_gpu_hours")
