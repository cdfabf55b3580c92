"""Monthly range partitions for the usage ledger on PostgreSQL (issue 40): usage_rows by
bucket_start, usage_daily and usage_idle_daily by day (hub/inventory/_partitions.py).

An existing ledger moves over in batches of one day, each batch committed on its own (its
rows inserted into the partitioned table and deleted from the old one in one transaction):
a ledger of years never sits in one transaction, and a migration killed halfway and run
again carries on from the first day not moved yet. Until it has finished the schema stays
at 0026, which this gpufleet refuses to read or write, so no answer sees half a ledger.

1. each table not partitioned yet is renamed ``<table>_0026`` (its indexes too) and a
   partitioned table like it takes its name (the ``usage`` view is recreated over it);
2. a day at a time, oldest first, rows move from ``<table>_0026`` into the partition of
   their month (created as needed);
3. the emptied ``<table>_0026`` tables go.

SQLite has no partitions: nothing changes there.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-01
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from alembic import op
from sqlalchemy.engine import Connection

from hub.inventory._partitions import ensure_partitions

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

#: table: (partition column, its indexes as (name, the CREATE INDEX's tail))
TABLES = {
    "usage_rows": ("bucket_start", [
        ("ix_usage_rows_bucket", "USING brin (bucket_start) WITH (autosummarize = on)"),
        ("ix_usage_rows_place", "(place)")]),
    "usage_daily": ("day", [("ix_usage_daily_day", "(day)")]),
    "usage_idle_daily": ("day", [("ix_usage_idle_daily_day", "(day)")]),
}
OLD = "{}_0026"
VIEW_FIGURES = ["gpu_hours", "avg_utilisation_pct", "max_utilisation_pct",
                "avg_memory_used_mib", "max_memory_used_mib", "avg_power_w", "energy_wh",
                "coverage", "avg_sm_active_pct", "avg_tensor_active_pct",
                "avg_dram_active_pct"]
# the view as 0025 defined it (hub/inventory/_usage_tables.py keeps the current one)
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
DAY = dt.timedelta(days=1)


def _exists(conn: Connection, name: str) -> bool:
    return conn.execute(sa.text("SELECT to_regclass(:n) IS NOT NULL"),
                        {"n": name}).scalar() is True


def _partitioned(conn: Connection, name: str) -> bool:
    return conn.execute(sa.text("SELECT relkind = 'p' FROM pg_class WHERE oid = "
                                "to_regclass(:n)"), {"n": name}).scalar() is True


def swap_in(conn: Connection) -> None:
    """Step 1, for the tables not partitioned yet (a second run finds them done)."""
    todo = [t for t in TABLES if not _partitioned(conn, t)]
    if not todo:
        return
    conn.execute(sa.text("DROP VIEW IF EXISTS usage"))
    for table in todo:
        column, indexes = TABLES[table]
        conn.execute(sa.text(f"ALTER TABLE {table} RENAME TO {OLD.format(table)}"))
        for name, _ in indexes:
            conn.execute(sa.text(f"ALTER INDEX IF EXISTS {name} RENAME TO {OLD.format(name)}"))
        conn.execute(sa.text(
            f"CREATE TABLE {table} (LIKE {OLD.format(table)} INCLUDING DEFAULTS "
            f"INCLUDING CONSTRAINTS) PARTITION BY RANGE ({column})"))
        for name, tail in indexes:
            conn.execute(sa.text(f"CREATE INDEX {name} ON {table} {tail}"))
    conn.execute(sa.text(VIEW))


def move_batches(conn: Connection, relock: sa.Executable | None,
                 batches: int | None = None) -> bool:
    """Step 2: move the rows left in the old tables a day at a time, committing each day
    (and taking ``relock`` again after each commit). ``batches``: stop after that many
    (tests: a migration killed halfway). Returns whether every row has moved."""
    moved = 0
    for table, (column, _) in TABLES.items():
        old = OLD.format(table)
        if not _exists(conn, old):
            continue
        while True:
            first = conn.execute(sa.text(f"SELECT min({column}) FROM {old}")).scalar()
            if first is None:
                break
            if batches is not None and moved >= batches:
                return False
            day = first.replace(hour=0, minute=0, second=0, microsecond=0)
            ensure_partitions(conn, [day])
            bounds = {"a": day, "b": day + DAY}
            where = f"WHERE {column} >= :a AND {column} < :b"
            conn.execute(sa.text(f"INSERT INTO {table} SELECT * FROM {old} {where}"), bounds)
            conn.execute(sa.text(f"DELETE FROM {old} {where}"), bounds)
            conn.commit()
            if relock is not None:
                conn.execute(relock)
            moved += 1
    return True


def drop_old(conn: Connection) -> None:
    """Step 3."""
    for table in TABLES:
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {OLD.format(table)}"))


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    from hub.inventory._db import LOCK_KEY

    relock = sa.select(sa.func.pg_advisory_xact_lock(LOCK_KEY))
    swap_in(conn)
    conn.commit()  # the new tables exist before the first batch moves into them
    conn.execute(relock)
    move_batches(conn, relock)
    drop_old(conn)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    conn.execute(sa.text("DROP VIEW usage"))
    for table, (column, indexes) in TABLES.items():
        old = OLD.format(table)
        conn.execute(sa.text(f"CREATE TABLE {old} (LIKE {table} INCLUDING DEFAULTS "
                             "INCLUDING CONSTRAINTS)"))
        conn.execute(sa.text(f"INSERT INTO {old} SELECT * FROM {table} ORDER BY {column}"))
        conn.execute(sa.text(f"DROP TABLE {table}"))
        conn.execute(sa.text(f"ALTER TABLE {old} RENAME TO {table}"))
        for name, tail in indexes:
            conn.execute(sa.text(f"CREATE INDEX {name} ON {table} {tail}"))
    conn.execute(sa.text(VIEW))
