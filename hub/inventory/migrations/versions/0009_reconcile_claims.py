"""DRA ResourceClaims a reconcile run read: which pods hold which GPUs on DRA nodes.

reconcile_claims holds, per run, the GPUs (or MIG/partition devices) that ResourceClaims
reserved by pods hold; reconcile_clusters.claims_read says the run read a cluster's claims, so
the latest such run speaks for the cluster even when no claim holds anything. `capacity` counts
these GPUs as allocated where the exporter gave no pod labels.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reconcile_claims",
        sa.Column("run_id", sa.Integer,
                  sa.ForeignKey("reconcile_runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("cluster", sa.String(253), primary_key=True),
        sa.Column("node", sa.String(253), primary_key=True),
        sa.Column("gpu", sa.String(128), primary_key=True),
        sa.Column("device", sa.String(128), primary_key=True),
        sa.Column("namespace", sa.String(253), primary_key=True),
        sa.Column("pod", sa.String(253), primary_key=True),
        sa.Column("claim", sa.String(253), primary_key=True),
        sa.Column("profile", sa.String(32)),
    )
    with op.batch_alter_table("reconcile_clusters") as batch:
        batch.add_column(sa.Column("claims_read", sa.Boolean))


def downgrade() -> None:
    with op.batch_alter_table("reconcile_clusters") as batch:
        batch.drop_column("claims_read")
    op.drop_table("reconcile_claims")
