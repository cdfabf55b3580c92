"""placements: where each physical GPU sat, from when until when (issue 38).

A GPU's stays in slots (cluster, node, PCI bus id) as a history, so a part pulled under RMA
and the part put in its slot keep two records, and a ``replaced`` event ties them. Every
known physical GPU starts with one open placement where the inventory holds it now, since
it was first seen.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "placements",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("uuid", sa.String(128), nullable=False),
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("slot", sa.String(32)),
        sa.Column("since", sa.DateTime, nullable=False),
        sa.Column("until", sa.DateTime),
    )
    op.create_index("ix_placements_uuid", "placements", ["uuid", "since"])
    op.create_index("ix_placements_slot", "placements", ["cluster", "node", "slot"])
    # the slot as hub.inventory._life.slot_of makes it: the bus id, else "index N"
    op.execute(
        "INSERT INTO placements (uuid, cluster, node, slot, since) "
        "SELECT uuid, cluster, node, CASE WHEN pci_bus_id IS NOT NULL AND pci_bus_id <> '' "
        "THEN substr(pci_bus_id, 1, 32) WHEN gpu_index IS NOT NULL "
        "THEN 'index ' || CAST(gpu_index AS VARCHAR(16)) END, first_seen "
        "FROM gpus WHERE slice_key = ''")


def downgrade() -> None:
    op.drop_index("ix_placements_slot", "placements")
    op.drop_index("ix_placements_uuid", "placements")
    op.drop_table("placements")
