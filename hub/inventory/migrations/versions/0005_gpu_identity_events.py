"""A GPU is its identity (uuid + MIG slice), not its node; inventory events.

Until 0004 the gpus table was keyed by (cluster, node, uuid, slice_key), so a GPU that moved to
another node became a second row beside a stale copy of itself. From 0005 the key is
(uuid, slice_key) and cluster/node are where the GPU reports now. Existing rows are folded in
place: per (uuid, slice_key) the most recently seen row wins, keeping the earliest first_seen.
(Written as 0003 beside issue 9's 0004, which landed first; chained after it as 0005.)

The events table (appeared, stale, returned, moved, changed, pruned) is written by every sync
inside its transaction and is never pruned by retention.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_GPU_COLUMNS = [
    "mig_profile", "mig_instance", "vendor", "gpu_index", "model", "driver_version",
    "pci_bus_id", "serial", "memory_total_mib", "memory_used_mib", "utilisation_pct",
    "power_w", "temperature_c", "health", "health_reasons", "state", "last_seen",
    "last_sample_at",
]


def _gpus_table(name: str) -> None:
    op.create_table(
        name,
        sa.Column("uuid", sa.String(128), primary_key=True),
        sa.Column("slice_key", sa.String(64), primary_key=True),
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
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
        sa.Column("health", sa.String(16)),
        sa.Column("health_reasons", sa.Text),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("also_reporting", sa.Text),
        sa.Column("first_seen", sa.DateTime, nullable=False),
        sa.Column("last_seen", sa.DateTime, nullable=False),
        sa.Column("last_sample_at", sa.DateTime),
    )


def upgrade() -> None:
    _gpus_table("gpus_0003")
    cols = ", ".join(["uuid", "slice_key", "cluster", "node", *_GPU_COLUMNS, "first_seen"])
    picked = ", ".join(f"g.{c}" for c in ["uuid", "slice_key", "cluster", "node",
                                           *_GPU_COLUMNS])
    # The newest row of each identity wins (ties broken by cluster, node so exactly one does).
    op.execute(sa.text(
        f"INSERT INTO gpus_0003 ({cols}) "
        f"SELECT {picked}, (SELECT min(f.first_seen) FROM gpus f "
        "  WHERE f.uuid = g.uuid AND f.slice_key = g.slice_key) "
        "FROM gpus g WHERE NOT EXISTS (SELECT 1 FROM gpus h "
        "  WHERE h.uuid = g.uuid AND h.slice_key = g.slice_key AND ("
        "    h.last_seen > g.last_seen OR (h.last_seen = g.last_seen AND ("
        "      h.cluster > g.cluster OR (h.cluster = g.cluster AND h.node > g.node)))))"
    ))
    op.drop_index("ix_gpus_uuid", table_name="gpus")
    op.drop_index("ix_gpus_state", table_name="gpus")
    op.drop_table("gpus")
    op.rename_table("gpus_0003", "gpus")
    op.create_index("ix_gpus_state", "gpus", ["state"])
    op.create_index("ix_gpus_cluster_node", "gpus", ["cluster", "node"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("cluster", sa.String(253)),
        sa.Column("node", sa.String(253)),
        sa.Column("uuid", sa.String(128)),
        sa.Column("slice", sa.String(64)),
        sa.Column("details", sa.Text),
    )
    op.create_index("ix_events_at", "events", ["at"])
    op.create_index("ix_events_uuid_at", "events", ["uuid", "at"])
    _usage_tables()


def _usage_tables() -> None:
    """The usage ledger (hub/usage/_ledger.py): rows per bucket, and collected buckets."""
    op.create_table(
        "usage",
        sa.Column("bucket_start", sa.DateTime, primary_key=True),
        sa.Column("cluster", sa.String(253), primary_key=True),
        sa.Column("node", sa.String(253), primary_key=True),
        sa.Column("uuid", sa.String(128), primary_key=True),
        sa.Column("slice", sa.String(64), primary_key=True),
        sa.Column("namespace", sa.String(253), primary_key=True),
        sa.Column("pod", sa.String(253), primary_key=True),
        sa.Column("bucket_end", sa.DateTime, nullable=False),
        sa.Column("vendor", sa.String(16), nullable=False),
        sa.Column("model", sa.String(128)),
        sa.Column("gpu_share", sa.Float, nullable=False),
        sa.Column("gpu_hours", sa.Float, nullable=False),
        sa.Column("avg_utilisation_pct", sa.Float),
        sa.Column("max_utilisation_pct", sa.Float),
        sa.Column("avg_memory_used_mib", sa.Float),
        sa.Column("max_memory_used_mib", sa.Float),
        sa.Column("avg_power_w", sa.Float),
        sa.Column("energy_wh", sa.Float),
        sa.Column("coverage", sa.Float, nullable=False),
    )
    op.create_index("ix_usage_uuid_bucket", "usage", ["uuid", "bucket_start"])
    op.create_table(
        "usage_buckets",
        sa.Column("bucket_start", sa.DateTime, primary_key=True),
        sa.Column("bucket_end", sa.DateTime, nullable=False),
        sa.Column("collected_at", sa.DateTime, nullable=False),
        sa.Column("rows", sa.Integer, nullable=False),
        sa.Column("requests", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("usage_buckets")
    op.drop_table("usage")
    op.drop_table("events")
    op.drop_index("ix_gpus_state", table_name="gpus")
    op.drop_index("ix_gpus_cluster_node", table_name="gpus")
    op.rename_table("gpus", "gpus_0003")
    op.create_table(
        "gpus",
        sa.Column("cluster", sa.String(253), primary_key=True),
        sa.Column("node", sa.String(253), primary_key=True),
        sa.Column("uuid", sa.String(128), primary_key=True),
        sa.Column("slice_key", sa.String(64), primary_key=True),
        *[c.copy() for c in sa.Table("gpus_0003", sa.MetaData(),
                                     autoload_with=op.get_bind()).columns
          if c.name not in ("cluster", "node", "uuid", "slice_key", "also_reporting")],
    )
    cols = ", ".join(["cluster", "node", "uuid", "slice_key", *_GPU_COLUMNS, "first_seen"])
    op.execute(sa.text(f"INSERT INTO gpus ({cols}) SELECT {cols} FROM gpus_0003"))
    op.drop_table("gpus_0003")
    op.create_index("ix_gpus_uuid", "gpus", ["uuid"])
    op.create_index("ix_gpus_state", "gpus", ["state"])
