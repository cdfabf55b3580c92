"""Reconcile runs: per-node and per-cluster results, and whether the ACM cluster list was read.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _run_id() -> sa.Column:
    return sa.Column("run_id", sa.Integer,
                     sa.ForeignKey("reconcile_runs.id", ondelete="CASCADE"), primary_key=True)


def upgrade() -> None:
    op.create_table(
        "reconcile_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("finished_at", sa.DateTime, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("managed_clusters", sa.Boolean, nullable=False),
        sa.Column("clusters", sa.Integer, nullable=False),
        sa.Column("nodes", sa.Integer, nullable=False),
        sa.Column("problems", sa.Integer, nullable=False),
    )
    op.create_table(
        "reconcile_results",
        _run_id(),
        sa.Column("cluster", sa.String(253), primary_key=True),
        sa.Column("node", sa.String(253), primary_key=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("mode", sa.String(32), nullable=False),
        sa.Column("k8s_gpus", sa.Integer),
        sa.Column("k8s_allocatable", sa.Integer),
        sa.Column("expected_gpus", sa.Integer),
        sa.Column("observed_gpus", sa.Integer),
        sa.Column("k8s_slices", sa.Integer),
        sa.Column("observed_slices", sa.Integer),
        sa.Column("resources", sa.Text),
        sa.Column("metrics_node", sa.String(253)),
        sa.Column("reason", sa.Text, nullable=False),
    )
    op.create_table(
        "reconcile_clusters",
        _run_id(),
        sa.Column("cluster", sa.String(253), primary_key=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("managed", sa.Boolean),
        sa.Column("available", sa.String(16)),
        sa.Column("k8s_gpu_nodes", sa.Integer),
        sa.Column("k8s_gpus", sa.Integer),
        sa.Column("observed_nodes", sa.Integer, nullable=False),
        sa.Column("observed_gpus", sa.Integer, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
    )


def downgrade() -> None:
    for table in ("reconcile_clusters", "reconcile_results", "reconcile_runs"):
        op.drop_table(table)
