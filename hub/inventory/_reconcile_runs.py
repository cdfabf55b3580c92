"""The tables of reconcile runs (Alembic revision 0002), beside the rest of the schema.

They are written by hub.validate (reconcile) but belong to the inventory database, so the
migration environment sees the whole schema without importing the validation layer.
"""

from __future__ import annotations

import sqlalchemy as sa

from hub.inventory._db import metadata

reconcile_runs = sa.Table(
    "reconcile_runs", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("started_at", sa.DateTime, nullable=False),
    sa.Column("finished_at", sa.DateTime, nullable=False),
    sa.Column("source", sa.String(16), nullable=False),  # hub | kube | file
    # whether the ACM ManagedCluster list was read: only then is the expected set known
    sa.Column("managed_clusters", sa.Boolean, nullable=False),
    sa.Column("clusters", sa.Integer, nullable=False),
    sa.Column("nodes", sa.Integer, nullable=False),
    sa.Column("problems", sa.Integer, nullable=False),
)

reconcile_results = sa.Table(
    "reconcile_results", metadata,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("reconcile_runs.id", ondelete="CASCADE"),
              primary_key=True),
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
    sa.Column("resources", sa.Text),  # JSON object: resource -> capacity
    sa.Column("metrics_node", sa.String(253)),
    sa.Column("reason", sa.Text, nullable=False),
    # the node's instance type and spec.providerID as the run read them (revision 0012):
    # `usage` prices a node by its type, and joins a cloud bill's lines by the provider id
    sa.Column("instance_type", sa.String(128)),
    sa.Column("provider_id", sa.String(512)),
    # spec.unschedulable (a cordon) as the run read it; NULL: the source did not say (0023)
    sa.Column("unschedulable", sa.Boolean),
)

reconcile_clusters = sa.Table(
    "reconcile_clusters", metadata,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("reconcile_runs.id", ondelete="CASCADE"),
              primary_key=True),
    sa.Column("cluster", sa.String(253), primary_key=True),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("managed", sa.Boolean),  # NULL: no ManagedCluster list was read
    sa.Column("available", sa.String(16)),
    sa.Column("k8s_gpu_nodes", sa.Integer),
    sa.Column("k8s_gpus", sa.Integer),
    sa.Column("observed_nodes", sa.Integer, nullable=False),
    sa.Column("observed_gpus", sa.Integer, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    # whether this run read the cluster's DRA ResourceClaims (revision 0009): the latest run
    # that did holds the cluster's claims, none of them included
    sa.Column("claims_read", sa.Boolean),
)

#: GPUs (or MIG/partition devices of them) pods hold through DRA ResourceClaims, as a
#: reconcile run read them (revision 0009): `capacity` counts them as allocated where the
#: exporter gave no pod labels. ``gpu`` is the NVIDIA UUID, or an AMD GPU's PCI bus id.
reconcile_claims = sa.Table(
    "reconcile_claims", metadata,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("reconcile_runs.id", ondelete="CASCADE"),
              primary_key=True),
    sa.Column("cluster", sa.String(253), primary_key=True),
    sa.Column("node", sa.String(253), primary_key=True),
    sa.Column("gpu", sa.String(128), primary_key=True),
    sa.Column("device", sa.String(128), primary_key=True),  # "" for the whole GPU
    sa.Column("namespace", sa.String(253), primary_key=True),
    sa.Column("pod", sa.String(253), primary_key=True),
    sa.Column("claim", sa.String(253), primary_key=True),
    sa.Column("profile", sa.String(32)),  # the MIG profile / partition profile of ``device``
)
