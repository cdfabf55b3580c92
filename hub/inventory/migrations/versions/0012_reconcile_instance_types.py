"""A reconcile row's node facts from the cloud: its instance type and spec.providerID.

reconcile_results.instance_type is the node label node.kubernetes.io/instance-type (or the
beta one) the run read; provider_id the node's spec.providerID (kube and file sources), which
`usage --bill` joins a cloud bill's lines to. expected_gpus (revision 0002) now holds the
instance type's GPU count where the catalog knows the type.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reconcile_results") as batch:
        batch.add_column(sa.Column("instance_type", sa.String(128)))
        batch.add_column(sa.Column("provider_id", sa.String(512)))


def downgrade() -> None:
    with op.batch_alter_table("reconcile_results") as batch:
        batch.drop_column("provider_id")
        batch.drop_column("instance_type")
