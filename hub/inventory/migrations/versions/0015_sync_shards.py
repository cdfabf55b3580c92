"""How many shards of clusters a sync asked its queries for (sync_runs.shards).

A sharded sync asks its fixed query set once per shard (plus one count that plans them):
the request count of a run is 1 + shards x the set, and sync-runs shows both.

Revision ID: 0015
Revises: 0012
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sync_runs") as batch:
        batch.add_column(sa.Column("shards", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("sync_runs") as batch:
        batch.drop_column("shards")
