"""The schedule's lease (hub/inventory/_lease.py): a hung leader of `gpufleet serve` stops
renewing it and another process takes the schedule over; its epoch fences the sync's write.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedule_lease",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("renewed_at", sa.Float, nullable=False),
        sa.Column("locked", sa.Boolean, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("schedule_lease")
