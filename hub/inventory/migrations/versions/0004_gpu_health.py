"""GPU health: ok/degraded/failed and its reasons (XID, ECC, row remapping) per GPU.

Revision ID: 0004
Revises: 0002
Create Date: 2026-11-23

Nullable columns added in place: existing rows read NULL ("nothing reported") until the next
sync fills them; SQLite and PostgreSQL both add such columns without rewriting the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("gpus", sa.Column("health", sa.String(16)))
    op.add_column("gpus", sa.Column("health_reasons", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("gpus") as batch:
        batch.drop_column("health_reasons")
        batch.drop_column("health")
