"""Initial inventory schema: clusters, nodes, gpus (with MIG slices), allocations, sync_runs.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _seen() -> list[sa.Column]:
    return [
        sa.Column("first_seen", sa.DateTime, nullable=False),
        sa.Column("last_seen", sa.DateTime, nullable=False),
        sa.Column("last_sample_at", sa.DateTime),
    ]


def upgrade() -> None:
    op.create_table(
        "clusters",
        sa.Column("cluster", sa.String(253), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        *_seen(),
    )
    op.create_table(
        "nodes",
        sa.Column("cluster", sa.String(253), primary_key=True),
        sa.Column("node", sa.String(253), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        *_seen(),
    )
    op.create_table(
        "gpus",
        sa.Column("cluster", sa.String(253), primary_key=True),
        sa.Column("node", sa.String(253), primary_key=True),
        sa.Column("uuid", sa.String(128), primary_key=True),
        sa.Column("slice_key", sa.String(64), primary_key=True),
        sa.Column("mig_profile", sa.String(32)),
        sa.Column("mig_instance", sa.String(16)),
        sa.Column("vendor", sa.String(16), nullable=False),
        sa.Column("gpu_index", sa.Integer),
        sa.Column("model", sa.String(128)),
        sa.Column("driver_version", sa.String(64)),
        sa.Column("pci_bus_id", sa.String(32)),
        sa.Column("serial", sa.String(64)),
        sa.Column("memory_total_mib", sa.Float),
        sa.Column("memory_used_mib", sa.Float),
        sa.Column("utilisation_pct", sa.Float),
        sa.Column("power_w", sa.Float),
        sa.Column("temperature_c", sa.Float),
        sa.Column("state", sa.String(16), nullable=False),
        *_seen(),
    )
    op.create_index("ix_gpus_uuid", "gpus", ["uuid"])
    op.create_index("ix_gpus_state", "gpus", ["state"])
    op.create_table(
        "allocations",
        sa.Column("cluster", sa.String(253), primary_key=True),
        sa.Column("node", sa.String(253), primary_key=True),
        sa.Column("uuid", sa.String(128), primary_key=True),
        sa.Column("slice_key", sa.String(64), primary_key=True),
        sa.Column("namespace", sa.String(253), primary_key=True),
        sa.Column("pod", sa.String(253), primary_key=True),
        sa.Column("container", sa.String(253), primary_key=True),
        *_seen(),
    )
    op.create_table(
        "sync_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("finished_at", sa.DateTime),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("requests", sa.Integer, nullable=False),
        sa.Column("clusters", sa.Integer),
        sa.Column("nodes", sa.Integer),
        sa.Column("gpus", sa.Integer),
        sa.Column("error", sa.Text),
    )


def downgrade() -> None:
    for table in ("sync_runs", "allocations", "gpus", "nodes", "clusters"):
        op.drop_table(table)
