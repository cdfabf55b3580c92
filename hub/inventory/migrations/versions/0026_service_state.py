"""The service's shared state (hub/inventory/_service_state.py): the leader's latest checks,
which every worker and replica serves, and failed sign-ins counted across all of them.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "service_checks",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("findings", sa.Text),
        sa.Column("checked_at", sa.Float),
        sa.Column("sync_id", sa.Integer),
        sa.Column("failed_at", sa.Float),
        sa.Column("error", sa.Text),
    )
    op.create_table(
        "sign_in_strikes",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("failures", sa.Text, nullable=False),
        sa.Column("locked_until", sa.Float, nullable=False),
        sa.Column("lockouts", sa.Integer, nullable=False),
        sa.Column("seen_at", sa.Float, nullable=False),
    )
    op.create_index("ix_sign_in_strikes_seen", "sign_in_strikes", ["seen_at"])


def downgrade() -> None:
    op.drop_index("ix_sign_in_strikes_seen", "sign_in_strikes")
    op.drop_table("sign_in_strikes")
    op.drop_table("service_checks")
