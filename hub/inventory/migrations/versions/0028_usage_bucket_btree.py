"""The ledger's hourly rows are found by a B-tree on bucket_start on PostgreSQL, not a BRIN
(issue 40; docs/architecture.md, "The usage ledger at 100,000 GPUs, measured").

Measured at 100,000 GPUs: autovacuum's summarization of the BRIN was cancelled under the
writer's bulk inserts and left placeholder range summaries, and PostgreSQL 15 reads every
page of the month's partition for a period read that meets one (a one-hour read 4.5-6.8 s
instead of 0.27 s; each write's rollup rebuild reads its day through the same index).
Nothing re-summarizes such a range. A B-tree has no summaries to lose; PostgreSQL (13 and
later) deduplicates its equal keys, and the ~100,000 rows of a bucket share one key, so it
costs some 6-7 bytes a row. SQLite has had a B-tree all along: nothing changes there.

The B-tree is built one monthly partition at a time, each committed on its own, beside the
BRIN, which goes only once every partition has its B-tree: a migration killed halfway
leaves the ledger with its BRIN (and the schema at 0027, which this gpufleet refuses), and
run again it carries on from the partitions without one. A partition created meanwhile
(the writer makes its month and the next ahead) gets the new index from its parent.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.engine import Connection

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

INDEX = "ix_usage_rows_bucket"
#: the B-tree's name while it is built beside the BRIN
NEW = "ix_usage_rows_bucket_btree"
BRIN = "USING brin (bucket_start) WITH (autosummarize = on)"


def _exists(conn: Connection, name: str) -> bool:
    return conn.execute(sa.text("SELECT to_regclass(:n) IS NOT NULL"),
                        {"n": name}).scalar() is True


def _method(conn: Connection, index: str) -> str | None:
    """The access method of an index (btree, brin), None if there is none by that name."""
    return conn.execute(sa.text(
        "SELECT a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam "
        "WHERE c.oid = to_regclass(:n)"), {"n": index}).scalar()


def _partitions_without(conn: Connection, parent_index: str) -> list[str]:
    """The partitions of usage_rows with no index attached to ``parent_index`` yet."""
    return list(conn.execute(sa.text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'usage_rows'::regclass AND NOT EXISTS ("
        " SELECT 1 FROM pg_inherits j JOIN pg_index x ON x.indexrelid = j.inhrelid"
        " WHERE j.inhparent = to_regclass(:p) AND x.indrelid = c.oid) "
        "ORDER BY c.relname"), {"p": parent_index}).scalars())


def build(conn: Connection, relock: sa.Executable | None, partitions: int | None = None
          ) -> bool:
    """Build the B-tree beside the BRIN, a partition at a time, committing each (and taking
    ``relock`` again after each commit). ``partitions``: stop after that many (tests: a
    migration killed halfway). Returns whether every partition has it."""
    if _method(conn, INDEX) == "btree":
        return True  # swapped already
    # ON ONLY: the parent's index alone, not valid until each partition's is attached
    conn.execute(sa.text(f"CREATE INDEX IF NOT EXISTS {NEW} ON ONLY usage_rows "
                         "(bucket_start)"))
    conn.commit()
    if relock is not None:
        conn.execute(relock)
    for done, partition in enumerate(_partitions_without(conn, NEW)):
        if partitions is not None and done >= partitions:
            return False
        child = f"{partition}_bucket_btree"
        conn.execute(sa.text(f"CREATE INDEX IF NOT EXISTS {child} ON {partition} "
                             "(bucket_start)"))
        conn.execute(sa.text(f"ALTER INDEX {NEW} ATTACH PARTITION {child}"))
        conn.commit()
        if relock is not None:
            conn.execute(relock)
    return True


def swap(conn: Connection) -> None:
    """The BRIN goes (with its partitions' indexes) and the B-tree takes its name; the
    partitions' B-trees take the names PostgreSQL gives those of partitions created later."""
    if _method(conn, INDEX) == "btree":
        return
    conn.execute(sa.text(f"DROP INDEX IF EXISTS {INDEX}"))
    conn.execute(sa.text(f"ALTER INDEX {NEW} RENAME TO {INDEX}"))
    for child, partition in conn.execute(sa.text(
            "SELECT x.relname, t.relname FROM pg_inherits i JOIN pg_class x ON x.oid = "
            "i.inhrelid JOIN pg_index n ON n.indexrelid = x.oid JOIN pg_class t ON t.oid = "
            f"n.indrelid WHERE i.inhparent = '{INDEX}'::regclass")).all():
        name = f"{partition}_bucket_start_idx"
        if child != name and not _exists(conn, name):
            conn.execute(sa.text(f"ALTER INDEX {child} RENAME TO {name}"))


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    from hub.inventory._db import LOCK_KEY

    build(conn, sa.select(sa.func.pg_advisory_xact_lock(LOCK_KEY)))
    swap(conn)


def downgrade() -> None:
    """The BRIN again, built on the parent (and so on every partition) in one statement: a
    BRIN is one pass over the rows, and 0027's schema has it."""
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    conn.execute(sa.text(f"DROP INDEX IF EXISTS {INDEX}"))
    conn.execute(sa.text(f"DROP INDEX IF EXISTS {NEW}"))
    conn.execute(sa.text(f"CREATE INDEX {INDEX} ON usage_rows {BRIN}"))
