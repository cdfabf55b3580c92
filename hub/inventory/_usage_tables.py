"""The usage ledger's tables. The inventory owns every table (one metadata, one migration
chain, one prune); the ledger's writer and readers live in hub/usage (hub/usage/_ledger.py).

- ``usage``: one row per GPU or MIG slice, allocation and bucket, as readers see it: a view
  over ``usage_rows`` (the figures and small integer keys) joined to its dictionaries
  ``usage_places`` and ``usage_pods`` and to the bucket marks;
- ``usage_buckets``: which buckets are collected (a bucket is written whole or not at all);
- ``usage_daily``: the rollup, per UTC day, of the ledger's rows (rebuilt with every write);
- ``usage_monthly``, ``usage_idle_monthly``: the daily rollups summed by month, for the
  months before the latest bucket's;
- ``usage_daily_groups``, ``usage_monthly_groups``: usage_daily and usage_monthly summed by
  cluster, namespace and model, for the answers grouped by those;
- ``usage_flags``: what the meter corrected in a bucket, naming the pod;
- ``usage_ledger``: properties of the ledger itself, today its bucket size: buckets of two
  sizes must never be summed side by side, so the size is stored once, with the rows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub.common import json_number
from hub.inventory._db import _batches, metadata
from hub.inventory._partitions import ensure_partitions, month_of

#: What a ledger row refers to, once: the GPU or MIG slice where it was (cluster, node, uuid,
#: slice), what it is (vendor, model) and the share of a GPU it counts for. A row holds the
#: small key instead of the strings, which a year of hourly rows would otherwise repeat
#: thousands of times (issue 40). An entry changes never: another model or share is another
#: entry. Entries are added under the ledger's lock (write_usage_rows), so no unique
#: constraint is needed (and model may be NULL, which a unique key would not tell apart).
usage_places = sa.Table(
    "usage_places", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("cluster", sa.String(253), nullable=False),
    sa.Column("node", sa.String(253), nullable=False),
    sa.Column("uuid", sa.String(128), nullable=False),
    sa.Column("slice", sa.String(64), nullable=False),  # '' = the whole GPU
    sa.Column("vendor", sa.String(16), nullable=False),
    sa.Column("model", sa.String(128)),
    sa.Column("gpu_share", sa.Float, nullable=False),
    sa.Index("ix_usage_places_uuid", "uuid"),
)

#: Who held it: namespace and pod ('' and '' = unallocated time).
usage_pods = sa.Table(
    "usage_pods", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("namespace", sa.String(253), nullable=False),
    sa.Column("pod", sa.String(253), nullable=False),
    sa.UniqueConstraint("namespace", "pod", name="uq_usage_pods"),
)

#: The ledger's rows as stored: one per GPU or MIG slice, allocation and bucket, with the
#: figures only (the bucket's end is its usage_buckets mark's). Columns are ordered so that
#: PostgreSQL pads nothing (8-byte first, the 2-byte basis last). Two B-trees: one on
#: bucket_start (every answer, export and rollup rebuild asks a period), one on place for a
#: GPU's own history. Both keys repeat (a bucket's ~100,000 rows share one bucket_start), so
#: PostgreSQL's deduplicated B-trees store some 6-7 bytes a row each. Not a BRIN, though it
#: would be a few pages for a year: autovacuum's summaries of it were cancelled under bulk
#: writes at 100,000 GPUs, and one placeholder summary made PostgreSQL 15 read the whole
#: month's partition for any period (migration 0028; docs/architecture.md).
usage_rows = sa.Table(
    "usage_rows", metadata,
    sa.Column("bucket_start", sa.DateTime, nullable=False),
    sa.Column("place", sa.Integer, nullable=False),
    sa.Column("pod", sa.Integer, nullable=False),
    sa.Column("gpu_hours", sa.Float, nullable=False),
    sa.Column("coverage", sa.Float, nullable=False),
    sa.Column("avg_utilisation_pct", sa.Float),
    sa.Column("max_utilisation_pct", sa.Float),
    sa.Column("avg_memory_used_mib", sa.Float),
    sa.Column("max_memory_used_mib", sa.Float),
    sa.Column("avg_power_w", sa.Float),
    sa.Column("energy_wh", sa.Float),
    # profiling counters (DCGM_FI_PROF_*, AMD's equivalents); NULL where not exported
    sa.Column("avg_sm_active_pct", sa.Float),
    sa.Column("avg_tensor_active_pct", sa.Float),
    sa.Column("avg_dram_active_pct", sa.Float),
    # how the allocated time was measured: 0 interval, 1 estimated, 2 sampled (BASES)
    sa.Column("basis", sa.SmallInteger, nullable=False),
    sa.Index("ix_usage_rows_bucket", "bucket_start"),
    sa.Index("ix_usage_rows_place", "place"),
    # monthly partitions on PostgreSQL (hub/inventory/_partitions.py)
    postgresql_partition_by="RANGE (bucket_start)",
)

#: allocation_basis by its stored code (hub/usage/_meter.py's BASES, least exact last).
BASIS_CODES = ("interval", "estimated", "sampled")
FIGURES = ["gpu_hours", "coverage", "avg_utilisation_pct", "max_utilisation_pct",
           "avg_memory_used_mib", "max_memory_used_mib", "avg_power_w", "energy_wh",
           "avg_sm_active_pct", "avg_tensor_active_pct", "avg_dram_active_pct"]
# the figures in the order the ledger's table had them (a row read whole is the same tuple)
VIEW_FIGURES = ["gpu_hours", "avg_utilisation_pct", "max_utilisation_pct",
                "avg_memory_used_mib", "max_memory_used_mib", "avg_power_w", "energy_wh",
                "coverage", "avg_sm_active_pct", "avg_tensor_active_pct",
                "avg_dram_active_pct"]
PLACE_KEYS = ["cluster", "node", "uuid", "slice", "vendor", "model", "gpu_share"]

#: The ledger as every reader sees it: a view joining the rows to their dictionaries and
#: bucket marks, with the columns (and names) one row per GPU, allocation and bucket always
#: had, so answers, idle runs, exports, the rollup's rebuild and the pages read it as before.
#: Only the writer (write_usage_rows, hub/usage/_ledger.py) touches the tables under it.
USAGE_VIEW = """CREATE VIEW usage AS
SELECT r.bucket_start, p.cluster, p.node, p.uuid, p.slice, d.namespace, d.pod, b.bucket_end,
  p.vendor, p.model, p.gpu_share, {figures},
  CASE r.basis WHEN 0 THEN 'interval' WHEN 1 THEN 'estimated' ELSE 'sampled' END
    AS allocation_basis
FROM usage_rows r
  JOIN usage_places p ON p.id = r.place
  JOIN usage_pods d ON d.id = r.pod
  JOIN usage_buckets b ON b.bucket_start = r.bucket_start""".format(
    figures=", ".join(f"r.{f}" for f in VIEW_FIGURES))
DROP_USAGE_VIEW = "DROP VIEW IF EXISTS usage"
# a schema made from the metadata (tests, `metadata().create_all`) has the view too
sa.event.listen(metadata, "after_create", sa.DDL(USAGE_VIEW))
sa.event.listen(metadata, "before_drop", sa.DDL(DROP_USAGE_VIEW))

usage = sa.Table(
    "usage", sa.MetaData(),  # the view: not on the inventory's metadata, never created as a table
    sa.Column("bucket_start", sa.DateTime),
    sa.Column("cluster", sa.String(253)),
    sa.Column("node", sa.String(253)),
    sa.Column("uuid", sa.String(128)),
    sa.Column("slice", sa.String(64)),  # '' = the whole GPU
    sa.Column("namespace", sa.String(253)),  # '' = unallocated
    sa.Column("pod", sa.String(253)),
    sa.Column("bucket_end", sa.DateTime),
    sa.Column("vendor", sa.String(16)),
    sa.Column("model", sa.String(128)),
    sa.Column("gpu_share", sa.Float),
    *[sa.Column(f, sa.Float) for f in VIEW_FIGURES],
    sa.Column("allocation_basis", sa.String(16)),
)


usage_buckets = sa.Table(
    "usage_buckets", metadata,
    sa.Column("bucket_start", sa.DateTime, primary_key=True),
    sa.Column("bucket_end", sa.DateTime, nullable=False),
    sa.Column("collected_at", sa.DateTime, nullable=False),
    sa.Column("rows", sa.Integer, nullable=False),
    sa.Column("requests", sa.Integer, nullable=False),
)

usage_ledger = sa.Table(
    "usage_ledger", metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(255), nullable=False),
)

#: The idle threshold (%) the rollup's idle_allocated_gpu_hours is computed for (the default
#: of `usage --idle-threshold`); another threshold reads the ledger's buckets.
ROLLUP_IDLE_THRESHOLD = 5.0
DAY = dt.timedelta(days=1)


def _rollup_columns() -> list[sa.Column]:
    """The rollup's keys and sums after its period column: a day's (usage_daily) and a whole
    month's (usage_monthly) rows have the same shape."""
    return [
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("uuid", sa.String(128), nullable=False),
        sa.Column("slice", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("model", sa.String(128)),
        sa.Column("gpu_hours", sa.Float, nullable=False),
        sa.Column("allocated_gpu_hours", sa.Float, nullable=False),
        sa.Column("busy_gpu_hours", sa.Float, nullable=False),
        sa.Column("idle_allocated_gpu_hours", sa.Float, nullable=False),
        sa.Column("energy_wh", sa.Float, nullable=False),
        # the GPU-hours whose energy_wh was known (power reported): energy is null where 0
        sa.Column("energy_measured_gpu_hours", sa.Float, nullable=False, server_default="0"),
        # GPU-hours x SM activity, and the GPU-hours that had an SM activity figure: the
        # average is their ratio, over GPUs that export the counter only (never diluted by
        # zeros)
        sa.Column("sm_active_gpu_hours", sa.Float, nullable=False, server_default="0"),
        sa.Column("sm_measured_gpu_hours", sa.Float, nullable=False, server_default="0"),
        # the least exact allocation_basis of the allocated rows (0 interval, 1 estimated,
        # 2 sampled; NULL: none allocated)
        sa.Column("allocation_basis_rank", sa.Integer),
    ]


usage_daily = sa.Table(
    "usage_daily", metadata,
    # No primary key: model may be NULL (not known). The rows of a day are only ever
    # replaced together (rebuild_days), never upserted one by one.
    sa.Column("day", sa.DateTime, nullable=False),  # 00:00 UTC; buckets starting that day
    *_rollup_columns(),
    sa.Index("ix_usage_daily_day", "day"),
    postgresql_partition_by="RANGE (day)",
)

#: The daily rollup summed by calendar month (UTC), for the months before the latest
#: collected bucket's: a year's answer reads 12 rows per GPU instead of 365. A month's rows
#: are replaced together whenever one of its days is rebuilt (hub/usage/_ledger.py's
#: rebuild_months), so they are always exactly the sum of its days' rows; the current
#: month has none (its days change every hour). Not partitioned: one row per GPU and month.
usage_monthly = sa.Table(
    "usage_monthly", metadata,
    sa.Column("month", sa.DateTime, nullable=False),  # 00:00 UTC on the 1st
    *_rollup_columns(),
    sa.Index("ix_usage_monthly_month", "month"),
)

#: The rollup's keys a group rollup keeps: the ones `usage --by cluster/namespace/model`
#: (and their prices, per cluster and model) group by.
GROUP_KEYS = ["cluster", "namespace", "model"]


def _group_columns() -> list[sa.Column]:
    """A group rollup's keys and sums: usage_daily's without the GPU's own keys."""
    return [c for c in _rollup_columns() if c.name not in ("node", "uuid", "slice")]


#: usage_daily summed per day by cluster, namespace and model: an answer grouped by those
#: (`usage`'s default is by namespace) reads some thousands of rows a day at 100,000 GPUs
#: instead of one per GPU (a month of usage_daily is 3 million rows, 0.5-1 s to sum on a
#: 2-core machine). Rebuilt with the day's usage_daily rows (rebuild_days), so it is
#: always exactly their sum. Not partitioned: a year is some million rows at most.
usage_daily_groups = sa.Table(
    "usage_daily_groups", metadata,
    sa.Column("day", sa.DateTime, nullable=False),
    *_group_columns(),
    sa.Index("ix_usage_daily_groups_day", "day"),
)

#: usage_daily_groups summed by month, for the months usage_monthly has.
usage_monthly_groups = sa.Table(
    "usage_monthly_groups", metadata,
    sa.Column("month", sa.DateTime, nullable=False),
    *_group_columns(),
    sa.Index("ix_usage_monthly_groups_month", "month"),
)


def _idle_rollup_columns() -> list[sa.Column]:
    """The idle rollup's keys and sums after its period column (usage_idle_daily's and
    usage_idle_monthly's rows have the same shape)."""
    return [
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("uuid", sa.String(128), nullable=False),
        sa.Column("slice", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("pod", sa.String(253), nullable=False),
        sa.Column("model", sa.String(128)),
        sa.Column("buckets", sa.Integer, nullable=False),
        sa.Column("first_start", sa.DateTime, nullable=False),
        sa.Column("last_end", sa.DateTime, nullable=False),
        sa.Column("gpu_hours", sa.Float, nullable=False),
        sa.Column("busy", sa.Float, nullable=False),  # sum of gpu_hours x utilisation %
    ]


#: Per day and GPU or slice and pod: its idle allocated buckets at ROLLUP_IDLE_THRESHOLD (a pod
#: held it, it had samples, a utilisation was measured and stayed under the threshold): how
#: many, the first one's start, the last one's end and their sums. When count x bucket size =
#: last_end - first_start they are one unbroken run, so an idle answer over a month reads one
#: row per idle GPU and day instead of every idle bucket (hub/usage/_idle.py).
usage_idle_daily = sa.Table(
    "usage_idle_daily", metadata,
    sa.Column("day", sa.DateTime, nullable=False),
    *_idle_rollup_columns(),
    sa.Index("ix_usage_idle_daily_day", "day"),
    postgresql_partition_by="RANGE (day)",
)

#: usage_idle_daily summed by month, for the same months as usage_monthly: a GPU and pod
#: idle through a whole month is one row (one unbroken run when count x bucket size =
#: last_end - first_start), so a year's idle answer reads 12 rows for it instead of 365.
usage_idle_monthly = sa.Table(
    "usage_idle_monthly", metadata,
    sa.Column("month", sa.DateTime, nullable=False),
    *_idle_rollup_columns(),
    sa.Index("ix_usage_idle_monthly_month", "month"),
)

#: What the meter corrected in a bucket, one row per pod and kind (hub/usage/_meter.py): a
#: request beyond its node's GPUs (``capped``), edges that cannot be (``impossible_edges``).
#: Written and deleted with the bucket's rows; `gpufleet report` turns them into findings.
usage_flags = sa.Table(
    "usage_flags", metadata,
    sa.Column("bucket_start", sa.DateTime, primary_key=True),
    sa.Column("cluster", sa.String(253), primary_key=True),
    sa.Column("namespace", sa.String(253), primary_key=True),
    sa.Column("pod", sa.String(253), primary_key=True),
    sa.Column("flag", sa.String(32), primary_key=True),
    sa.Column("node", sa.String(253), nullable=False),
    sa.Column("detail", sa.Text, nullable=False),
)

USAGE_COLUMNS = [
    "cluster", "node", "uuid", "slice", "namespace", "pod", "bucket_start", "bucket_end",
    "vendor", "model", "gpu_share", "gpu_hours", "avg_utilisation_pct", "max_utilisation_pct",
    "avg_memory_used_mib", "max_memory_used_mib", "avg_power_w", "energy_wh", "coverage",
    "avg_sm_active_pct", "avg_tensor_active_pct", "avg_dram_active_pct", "allocation_basis",
]


#: keys looked up in one IN (4 parameters each: well under SQLite's 32,766 and
#: PostgreSQL's 65,535 parameters a statement)
FIND_CHUNK = 1000


class UsageKeys:
    """The dictionaries' keys of one write, read as its rows need them: a bucket reads the
    entries of its own places and pods, never the whole dictionaries (``usage_pods`` holds
    every pod the ledger has ever billed: read whole, it made each bucket's write grow with
    the ledger's history). The caller holds the ledger's lock: no other writer adds entries
    meanwhile."""

    #: the columns that find a place's entries (never NULL: an IN over row values cannot
    #: match NULLs); the whole key is then compared here
    _FIND = {"usage_places": ["cluster", "node", "uuid", "slice"],
             "usage_pods": ["namespace", "pod"]}

    def __init__(self) -> None:
        self.places: dict[tuple, int] = {}
        self.pods: dict[tuple, int] = {}
        #: months whose partitions this write has made sure of (PostgreSQL)
        self.months: set[dt.datetime] = set()

    def resolve(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Read the entries these rows need, then add those missing (one INSERT per
        dictionary)."""
        for table, known, keys in ((usage_places, self.places, PLACE_KEYS),
                                   (usage_pods, self.pods, ["namespace", "pod"])):
            wanted = {tuple(r.get(k) for k in keys) for r in rows} - known.keys()
            if not wanted:
                continue
            find = [table.c[k] for k in self._FIND[table.name]]
            prefixes = sorted({k[:len(find)] for k in wanted})
            for at in range(0, len(prefixes), FIND_CHUNK):
                chunk = prefixes[at:at + FIND_CHUNK]
                for r in conn.execute(sa.select(table.c.id, *[table.c[k] for k in keys])
                                      .where(sa.tuple_(*find).in_(chunk))):
                    known[tuple(r[1:])] = r[0]
            new = wanted - known.keys()
            if not new:
                continue
            last = conn.execute(sa.select(sa.func.max(table.c.id))).scalar() or 0
            conn.execute(table.insert(), [dict(zip(keys, k, strict=True)) for k in sorted(
                new, key=lambda k: tuple((v is None, v) for v in k))])
            for r in conn.execute(sa.select(table.c.id, *[table.c[k] for k in keys])
                                  .where(table.c.id > last)):
                known[tuple(r[1:])] = r[0]


def write_usage_rows(conn: Connection, rows: Iterable[Mapping[str, Any]],
                     keys: UsageKeys | None = None) -> int:
    """Store ledger rows (as the ``usage`` view shows them; bucket_end is the bucket mark's,
    written by the caller) in usage_rows, their strings as dictionary keys. ``rows`` may be a
    generator: it is written a batch at a time. Returns how many."""
    keys = keys or UsageKeys()
    count = 0
    for batch in _batches(dict(r) for r in rows):
        keys.resolve(conn, batch)
        months = {month_of(r["bucket_start"]) for r in batch} - keys.months
        ensure_partitions(conn, months)
        keys.months |= months
        conn.execute(usage_rows.insert(), [{
            "bucket_start": r["bucket_start"],
            "place": keys.places[tuple(r.get(k) for k in PLACE_KEYS)],
            "pod": keys.pods[(r["namespace"], r["pod"])],
            "basis": BASIS_CODES.index(r.get("allocation_basis") or "sampled"),
            **{f: r.get(f) for f in FIGURES}} for r in batch])
        count += len(batch)
    return count


def day_of(moment: dt.datetime) -> dt.datetime:
    """00:00 UTC of the day a (naive UTC) moment falls in."""
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def recent_usage(conn: Connection, uuid: str, limit: int = 48) -> list[dict[str, Any]]:
    stmt = (sa.select(usage).where(usage.c.uuid == uuid)
            .order_by(usage.c.bucket_start.desc(), usage.c.slice, usage.c.namespace,
                      usage.c.pod).limit(limit))
    # sane JSON precision: a 5-minute bucket is 0.083333 GPU-hours, not 0.08333333333333333
    return [{k: json_number(v) if isinstance(v, float) else v for k, v in r.items()}
            for r in conn.execute(stmt).mappings()]
