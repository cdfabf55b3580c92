"""What each cluster's GPUs are seen through besides their exporter series (cluster_sources).

The sync's planning query also counts, per cluster, node-exporter's GPU cards
(node_accelerator_card_info), OpenShift's accelerator series, gpufleet's exporter and the
clusters ACM manages (acm_managed_cluster_labels, in maintenance or not). A cluster whose cards
are known but whose exporter series never reach the hub (ACM's new collection path forwards
no GPU exporter series by default) is then shown and reported as such, never as 0 GPUs.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cluster_sources",
        sa.Column("cluster", sa.String(253), primary_key=True),
        sa.Column("source", sa.String(32), primary_key=True),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("cluster_sources")
