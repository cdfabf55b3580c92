"""refused_inputs: what a spoke sent that the hub left out, per cluster (issue 42).

A series whose labels cannot be stored (a NUL byte, a control character, a value longer than
its column) is turned away at the store's door, and a reading outside its physical range
(utilisation 1e9 %, memory -4,768 MiB, power -1e9 W) is dropped as unknown. Both are counted
here against the cluster that sent them, so `report` names the spoke: the latest sync's
(source ``sync``) and each usage bucket's (source ``usage``, ``at`` its start).

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "refused_inputs",
        sa.Column("source", sa.String(16), primary_key=True),
        sa.Column("at", sa.DateTime, primary_key=True),
        sa.Column("cluster", sa.String(253), primary_key=True),
        sa.Column("kind", sa.String(64), primary_key=True),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("example", sa.String(255), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("refused_inputs")
