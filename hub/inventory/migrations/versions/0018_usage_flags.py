"""usage_flags: what the meter corrected in a bucket, naming the pod.

A spoke's kube-state-metrics can ask 1e9 GPUs of a 1-GPU node, or send a pod start in the
future: the meter bounds what it bills (a node's GPUs x the bucket; impossible edges billed
from the pod's samples) and says so, one row per bucket, pod and kind, written and deleted
with the bucket's rows, so `gpufleet report` can name the pods whose bill was corrected.
Buckets collected before have no flags (nothing was corrected then).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage_flags",
        sa.Column("bucket_start", sa.DateTime, primary_key=True),
        sa.Column("cluster", sa.String(253), primary_key=True),
        sa.Column("namespace", sa.String(253), primary_key=True),
        sa.Column("pod", sa.String(253), primary_key=True),
        sa.Column("flag", sa.String(32), primary_key=True),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("usage_flags")
