"""Monthly range partitions of the usage ledger on PostgreSQL (issue 40).

A year of hourly rows at 100,000 GPUs is hundreds of millions of rows; retention that deletes
them row by row leaves dead tuples for vacuum and never gives the disk back. So on PostgreSQL
the hourly rows (usage_rows, by bucket_start) and the daily rollups (usage_daily and
usage_idle_daily, by day) are partitioned by calendar month (UTC), one table per month named
``<table>_pYYYYMM``, and retention drops the months wholly past it. A row whose month has no
partition cannot be written, so the writer creates its bucket's month and the next before it
writes, and `gpufleet db upgrade` creates this month and the next. SQLite keeps one table
each: everything here is a no-op there.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, MutableMapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

#: The partitioned tables and the column each is partitioned by.
PARTITIONED = {"usage_rows": "bucket_start", "usage_daily": "day",
               "usage_idle_daily": "day"}
_SUFFIX = re.compile(r"_p(\d{4})(\d{2})$")


def not_a_partition(name: str | None, type_: str, parents: MutableMapping[Any, str | None]
                    ) -> bool:
    """Alembic's include_name: the monthly partitions (and their indexes) are made by the
    program, not by the metadata, so comparing the schema with the models leaves them out."""
    table = name if type_ == "table" else parents.get("table_name")
    return not (table and _SUFFIX.search(table))


def month_of(moment: dt.datetime) -> dt.datetime:
    """00:00 UTC on the first of the month a (naive UTC) moment falls in."""
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(month: dt.datetime) -> dt.datetime:
    return (month + dt.timedelta(days=32)).replace(day=1)


def partition_name(table: str, month: dt.datetime) -> str:
    return f"{table}_p{month:%Y%m}"


def is_partitioned(conn: Connection, table: str) -> bool:
    """Whether ``table`` is a partitioned table here (PostgreSQL, schema at 0027 or later)."""
    if conn.dialect.name != "postgresql":
        return False
    return conn.execute(sa.text(
        "SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(:t)"),
        {"t": table}).scalar() is True


def partitions(conn: Connection, table: str) -> dict[dt.datetime, str]:
    """The monthly partitions of ``table``: their month and name (none on SQLite)."""
    if not is_partitioned(conn, table):
        return {}
    names = conn.execute(sa.text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass(:t)"), {"t": table}).scalars()
    found = {}
    for name in names:
        match = _SUFFIX.search(name)
        if match:
            found[dt.datetime(int(match[1]), int(match[2]), 1)] = name
    return found


def ensure_partitions(conn: Connection, moments: Iterable[dt.datetime]) -> list[str]:
    """Create the missing partitions of the months these moments fall in, of every
    partitioned table (a bucket's rows and its day's rollup go to the same month). Returns
    the names created; nothing on SQLite or on a schema not partitioned (before 0027)."""
    months = {month_of(m) for m in moments}
    created: list[str] = []
    if not months:
        return created
    for table in PARTITIONED:
        if not is_partitioned(conn, table):
            continue
        have = partitions(conn, table)
        for month in sorted(months - have.keys()):
            name = partition_name(table, month)
            conn.execute(sa.text(
                f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {table} FOR VALUES FROM "
                f"('{month:%Y-%m-%d %H:%M:%S}') TO ('{next_month(month):%Y-%m-%d %H:%M:%S}')"))
            created.append(name)
    return created


def ensure_ahead(conn: Connection, moment: dt.datetime) -> list[str]:
    """The month of ``moment`` and the next: a writer never finds its month missing, and
    the next month's partition exists before its first bucket (created outside the hour
    boundary's rush)."""
    month = month_of(moment)
    return ensure_partitions(conn, [month, next_month(month)])


def drop_partitions_before(conn: Connection, table: str, cut: dt.datetime) -> list[str]:
    """Drop the partitions of ``table`` whose whole month is before ``cut``: retention of
    whole months without a row deleted one by one. Returns their names."""
    dropped = []
    for month, name in sorted(partitions(conn, table).items()):
        if next_month(month) <= cut:
            conn.execute(sa.text(f"DROP TABLE {name}"))
            dropped.append(name)
    return dropped
