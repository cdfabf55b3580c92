"""Browser sessions of `gpufleet serve` in the database (shared by replicas, kept across a
restart), keyed by the sha256 of the session id (hub/inventory/_sessions.py).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id_sha256", sa.String(64), primary_key=True),
        sa.Column("owner_sha256", sa.String(64), nullable=False),
        sa.Column("token_sha256", sa.String(64)),
        sa.Column("caller", sa.String(253), nullable=False),
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("token_expires_at", sa.Float),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_index("ix_sessions_owner", "sessions", ["owner_sha256", "created_at"])
    op.create_index("ix_sessions_expires", "sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_sessions_expires", "sessions")
    op.drop_index("ix_sessions_owner", "sessions")
    op.drop_table("sessions")
