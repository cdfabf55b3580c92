"""A reconcile row's cordon: whether Kubernetes marks the node unschedulable.

reconcile_results.unschedulable is the Node's spec.unschedulable (kube and file sources) or
kube-state-metrics' kube_node_spec_unschedulable (hub source) as the run read it; NULL where
the source did not say. `capacity` and the placement scores count a cordoned node's GPUs as
not free: a scheduler places nothing there.

Revision ID: 0023
Revises: 0020
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reconcile_results") as batch:
        batch.add_column(sa.Column("unschedulable", sa.Boolean))


def downgrade() -> None:
    with op.batch_alter_table("reconcile_results") as batch:
        batch.drop_column("unschedulable")
