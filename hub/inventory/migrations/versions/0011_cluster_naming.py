"""Which metric naming each cluster's NVIDIA GPUs send (issue 26: dcgm-exporter 4.9).

clusters.naming is ``legacy``, ``dcgm-4.7`` or ``both`` (NULL: no NVIDIA GPU seen, or not
yet synced by this version); clusters.naming_since is when it last took that value, so the
report can say that a cluster has sent both namings for longer than an upgrade takes.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("naming", sa.String(16)))
        batch.add_column(sa.Column("naming_since", sa.DateTime))


def downgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("naming_since")
        batch.drop_column("naming")
