"""A compact usage ledger (issue 40): the hourly rows refer to their GPU or slice and to their
pod by small integer keys, and ``usage`` becomes a view with the columns it always had.

- usage_places (cluster, node, uuid, slice, vendor, model, gpu_share) and usage_pods
  (namespace, pod): the strings every row repeated, once each;
- usage_rows: bucket_start, the two keys, the figures, allocation_basis as a 2-byte code
  (the bucket's end is its usage_buckets mark's); a BRIN index on bucket_start on
  PostgreSQL (a B-tree on SQLite) and one on place, instead of a primary key over seven
  strings and a second index;
- the old table's rows move over (a bucket written before marks were kept gets its mark,
  so the view shows every row it held), then it goes.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

FIGURES = ["gpu_hours", "coverage", "avg_utilisation_pct", "max_utilisation_pct",
           "avg_memory_used_mib", "max_memory_used_mib", "avg_power_w", "energy_wh",
           "avg_sm_active_pct", "avg_tensor_active_pct", "avg_dram_active_pct"]
# the figures in the order the ledger's table had them (a row read whole is the same tuple)
VIEW_FIGURES = ["gpu_hours", "avg_utilisation_pct", "max_utilisation_pct",
                "avg_memory_used_mib", "max_memory_used_mib", "avg_power_w", "energy_wh",
                "coverage", "avg_sm_active_pct", "avg_tensor_active_pct",
                "avg_dram_active_pct"]
PLACE = ["cluster", "node", "uuid", "slice", "vendor", "model", "gpu_share"]
# the view as this revision defines it (hub/inventory/_usage_tables.py keeps the current one)
VIEW = """CREATE VIEW usage AS
SELECT r.bucket_start, p.cluster, p.node, p.uuid, p.slice, d.namespace, d.pod, b.bucket_end,
  p.vendor, p.model, p.gpu_share, {figures},
  CASE r.basis WHEN 0 THEN 'interval' WHEN 1 THEN 'estimated' ELSE 'sampled' END
    AS allocation_basis
FROM usage_rows r
  JOIN usage_places p ON p.id = r.place
  JOIN usage_pods d ON d.id = r.pod
  JOIN usage_buckets b ON b.bucket_start = r.bucket_start""".format(
    figures=", ".join(f"r.{f}" for f in VIEW_FIGURES))
BASIS = ("CASE u.allocation_basis WHEN 'interval' THEN 0 WHEN 'estimated' THEN 1 ELSE 2 END")
# model may be NULL: equal when both are NULL or both the same string (hashable, unlike
# IS NOT DISTINCT FROM)
SAME_PLACE = " AND ".join(
    [f"p.{k} = u.{k}" for k in PLACE if k != "model"]
    + ["coalesce(p.model, '') = coalesce(u.model, '')",
       "(p.model IS NULL) = (u.model IS NULL)"])


def create_compact() -> None:
    op.create_table(
        "usage_places",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("uuid", sa.String(128), nullable=False),
        sa.Column("slice", sa.String(64), nullable=False),
        sa.Column("vendor", sa.String(16), nullable=False),
        sa.Column("model", sa.String(128)),
        sa.Column("gpu_share", sa.Float, nullable=False),
    )
    op.create_index("ix_usage_places_uuid", "usage_places", ["uuid"])
    op.create_table(
        "usage_pods",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("pod", sa.String(253), nullable=False),
        sa.UniqueConstraint("namespace", "pod", name="uq_usage_pods"),
    )
    op.create_table(
        "usage_rows",
        sa.Column("bucket_start", sa.DateTime, nullable=False),
        sa.Column("place", sa.Integer, nullable=False),
        sa.Column("pod", sa.Integer, nullable=False),
        *[sa.Column(f, sa.Float, nullable=f not in ("gpu_hours", "coverage"))
          for f in FIGURES],
        sa.Column("basis", sa.SmallInteger, nullable=False),
    )
    op.create_index("ix_usage_rows_bucket", "usage_rows", ["bucket_start"],
                    postgresql_using="brin", postgresql_with={"autosummarize": "on"})
    op.create_index("ix_usage_rows_place", "usage_rows", ["place"])


def upgrade() -> None:
    create_compact()
    op.execute("INSERT INTO usage_buckets (bucket_start, bucket_end, collected_at, rows, "
               "requests) SELECT bucket_start, max(bucket_end), max(bucket_end), count(*), 0 "
               "FROM usage WHERE bucket_start NOT IN (SELECT bucket_start FROM usage_buckets) "
               "GROUP BY bucket_start")
    keys = ", ".join(PLACE)
    op.execute(f"INSERT INTO usage_places ({keys}) SELECT {keys} FROM (SELECT DISTINCT "
               f"{keys} FROM usage) x ORDER BY cluster, node, uuid, slice")
    op.execute("INSERT INTO usage_pods (namespace, pod) SELECT namespace, pod FROM (SELECT "
               "DISTINCT namespace, pod FROM usage) x ORDER BY namespace, pod")
    figures = ", ".join(FIGURES)
    op.execute(
        f"INSERT INTO usage_rows (bucket_start, place, pod, {figures}, basis) "
        f"SELECT u.bucket_start, p.id, d.id, {', '.join('u.' + f for f in FIGURES)}, {BASIS} "
        f"FROM usage u JOIN usage_places p ON {SAME_PLACE} "
        "JOIN usage_pods d ON d.namespace = u.namespace AND d.pod = u.pod "
        "ORDER BY u.bucket_start")
    op.drop_index("ix_usage_uuid_bucket", "usage")
    op.drop_table("usage")
    op.execute(VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW usage")
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
        *[sa.Column(f, sa.Float, nullable=f not in ("gpu_hours", "coverage"))
          for f in FIGURES],
        sa.Column("allocation_basis", sa.String(16), nullable=False,
                  server_default="sampled"),
    )
    op.create_index("ix_usage_uuid_bucket", "usage", ["uuid", "bucket_start"])
    columns = ("bucket_start, bucket_end, cluster, node, uuid, slice, namespace, pod, vendor, "
               "model, gpu_share, " + ", ".join(FIGURES))
    op.execute(
        f"INSERT INTO usage ({columns}, allocation_basis) SELECT r.bucket_start, b.bucket_end, "
        "p.cluster, p.node, p.uuid, p.slice, d.namespace, d.pod, p.vendor, p.model, "
        f"p.gpu_share, {', '.join('r.' + f for f in FIGURES)}, CASE r.basis WHEN 0 THEN "
        "'interval' WHEN 1 THEN 'estimated' ELSE 'sampled' END FROM usage_rows r "
        "JOIN usage_places p ON p.id = r.place JOIN usage_pods d ON d.id = r.pod "
        "JOIN usage_buckets b ON b.bucket_start = r.bucket_start")
    op.drop_table("usage_rows")
    op.drop_table("usage_pods")
    op.drop_table("usage_places")
