"""How each usage row's allocated time was measured (metered allocation, issue 27).

- usage.allocation_basis: ``interval`` (both edges of the allocation exported), ``estimated``
  (an edge known to the push interval only), ``sampled`` (no interval source: the pod's
  samples' coverage). Rows written before were sampled.
- usage_daily.allocation_basis_rank: the least exact basis of the day's allocated rows of
  each group (0 interval, 1 estimated, 2 sampled; NULL without allocated rows), so a
  summary read from the rollup says how exact it is as one read from the ledger does.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage") as batch:
        batch.add_column(sa.Column("allocation_basis", sa.String(16), nullable=False,
                                   server_default="sampled"))
    with op.batch_alter_table("usage_daily") as batch:
        batch.add_column(sa.Column("allocation_basis_rank", sa.Integer))
    op.execute("UPDATE usage_daily SET allocation_basis_rank = 2 "
               "WHERE allocated_gpu_hours > 0")


def downgrade() -> None:
    with op.batch_alter_table("usage_daily") as batch:
        batch.drop_column("allocation_basis_rank")
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("allocation_basis")
