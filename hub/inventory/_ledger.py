"""The usage ledger: one row per GPU or MIG slice, allocation and bucket (hourly by default).

``collect_usage`` asks the hub a fixed set of PromQL requests per bucket (store.usage_queries;
their number does not depend on the fleet) and replaces that bucket's rows in one transaction,
so re-running a bucket changes nothing and a bucket the store could not answer (hub down,
partial response) is not written at all: it stays missing and the next collect retries it,
up to ``max_backfill`` back. Usage rows older than the retention are removed; events are not.

The daily rollup (``usage_daily``) pre-sums the ledger per UTC day and per GPU or slice,
namespace and model, so `usage` over a month reads whole days from it and only the edge
hours from the ledger. Every write to the ledger (a bucket, retention) rebuilds the days it
touched from the ledger's rows in the same transaction: the rollup is always exactly the sum
of the rows, whatever was re-collected. Its idle figure is for ROLLUP_IDLE_THRESHOLD only.

Counting: a whole GPU is 1 GPU-equivalent, a MIG slice its share of the GPU's compute slices
(store.mig_share) and the parent of a MIG layout counts only through its slices.
gpu_hours = share x coverage x bucket hours; energy_wh = avg_power_w x coverage x hours, times
the share for a slice (dcgm-exporter repeats the device's power on every slice).
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from hub import store
from hub.common import GpufleetError, format_duration
from hub.inventory._db import _batches, _insert, gpus, metadata, now_utc, utc

if TYPE_CHECKING:
    from hub.store import HubClient

usage = sa.Table(
    "usage", metadata,
    sa.Column("bucket_start", sa.DateTime, primary_key=True),
    sa.Column("cluster", sa.String(253), primary_key=True),
    sa.Column("node", sa.String(253), primary_key=True),
    sa.Column("uuid", sa.String(128), primary_key=True),
    sa.Column("slice", sa.String(64), primary_key=True),  # '' = the whole GPU
    sa.Column("namespace", sa.String(253), primary_key=True),  # '' = unallocated
    sa.Column("pod", sa.String(253), primary_key=True),
    sa.Column("bucket_end", sa.DateTime, nullable=False),
    sa.Column("vendor", sa.String(16), nullable=False),
    sa.Column("model", sa.String(128)),
    sa.Column("gpu_share", sa.Float, nullable=False),
    sa.Column("gpu_hours", sa.Float, nullable=False),
    sa.Column("avg_utilisation_pct", sa.Float),
    sa.Column("max_utilisation_pct", sa.Float),
    sa.Column("avg_memory_used_mib", sa.Float),
    sa.Column("max_memory_used_mib", sa.Float),
    sa.Column("avg_power_w", sa.Float),
    sa.Column("energy_wh", sa.Float),
    sa.Column("coverage", sa.Float, nullable=False),
    sa.Index("ix_usage_uuid_bucket", "uuid", "bucket_start"),
)

usage_buckets = sa.Table(
    "usage_buckets", metadata,
    sa.Column("bucket_start", sa.DateTime, primary_key=True),
    sa.Column("bucket_end", sa.DateTime, nullable=False),
    sa.Column("collected_at", sa.DateTime, nullable=False),
    sa.Column("rows", sa.Integer, nullable=False),
    sa.Column("requests", sa.Integer, nullable=False),
)

#: The idle threshold (%) the rollup's idle_allocated_gpu_hours is computed for (the default
#: of `usage --idle-threshold`); another threshold reads the hourly ledger.
ROLLUP_IDLE_THRESHOLD = 5.0
DAY = dt.timedelta(days=1)

usage_daily = sa.Table(
    "usage_daily", metadata,
    # No primary key: model may be NULL (not known). The rows of a day are only ever
    # replaced together (rebuild_days), never upserted one by one.
    sa.Column("day", sa.DateTime, nullable=False),  # 00:00 UTC; buckets starting that day
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
    sa.Index("ix_usage_daily_day", "day"),
)

USAGE_COLUMNS = [
    "cluster", "node", "uuid", "slice", "namespace", "pod", "bucket_start", "bucket_end",
    "vendor", "model", "gpu_share", "gpu_hours", "avg_utilisation_pct", "max_utilisation_pct",
    "avg_memory_used_mib", "max_memory_used_mib", "avg_power_w", "energy_wh", "coverage",
]


@dataclass
class CollectResult:
    collected: list[dt.datetime] = field(default_factory=list)
    failed: list[tuple[dt.datetime, str]] = field(default_factory=list)
    rows: int = 0
    requests: int = 0
    removed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"collected": self.collected, "rows": self.rows, "requests": self.requests,
                "removed_by_retention": self.removed,
                "failed": [{"bucket_start": b, "error": e} for b, e in self.failed]}


def buckets_between(start: float, end: float, bucket: float) -> list[float]:
    """Starts of the whole buckets inside [start, end), aligned to multiples of the size."""
    first = math.ceil(start / bucket) * bucket
    return [first + i * bucket for i in range(int((end - first) // bucket))] if end > first else []


def pending_buckets(conn: Connection, *, now: float, bucket: float, max_backfill: float,
                    delay: float) -> list[float]:
    """Completed buckets (end + delay <= now) within max_backfill not collected yet."""
    starts = buckets_between(now - max_backfill, now - delay, bucket)
    if not starts:
        return []
    done = {r for (r,) in conn.execute(sa.select(usage_buckets.c.bucket_start).where(
        usage_buckets.c.bucket_start >= utc(starts[0])))}
    return [s for s in starts if utc(s) not in done]


# -- one bucket -------------------------------------------------------------------------------
Key = tuple[str, str, str, str, str, str]  # cluster, node, uuid, slice, namespace, pod


@dataclass(slots=True)
class _Acc:
    vendor: str
    model: str | None = None
    is_slice: bool = False
    profile: str | None = None
    weight: dict[str, float] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)
    maxes: dict[str, float] = field(default_factory=dict)
    minutes: float = 0.0


def _num(row: Mapping[str, Any]) -> float | None:
    try:
        v = float(row["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return None if v != v else v


def _series(labels: Mapping[str, str]) -> str:
    """One series' label set as a compact key (a str, not a frozenset of pairs: 100,000
    series of one bucket are held at once)."""
    return "\x1f".join(f"{k}\x1e{v}" for k, v in sorted(labels.items()))


def _key(p: store.VendorProfile, labels: Mapping[str, str], cl: str) -> tuple[Key, Any] | None:
    ident = p.identity(labels, cl)
    if ident is None:
        return None
    alloc = store.allocation(labels) or ("", "", "")
    slice_key = f"{ident.mig_profile}/{ident.mig_instance or ''}" if ident.mig_profile else ""
    return (ident.cluster, ident.node, ident.uuid, slice_key, alloc[0], alloc[1]), ident


def fold_bucket(answers: Iterable[tuple[store.Query, Iterable[Mapping[str, Any]]]], *,
                start: float, bucket: float, step: float, cluster_label: str,
                known: Mapping[tuple[str, str], tuple[str | None, float | None]]
                ) -> list[dict[str, Any]]:
    """Ledger rows of one bucket from the answers to its queries (pure).

    Series that differ only in labels we do not keep (an exporter pod's restart, two label
    spellings) fold into one row; their averages are weighted by their sample coverage, so a
    vendor's coverage answer must come before its other answers (_ask's order).
    ``known`` gives (model, memory_total_mib) per (uuid, slice) from the inventory.
    """
    accs: dict[Key, _Acc] = {}
    cover: dict[tuple[str, str], float] = {}
    for query, rows in answers:
        p = store.profile(query.vendor)
        for row in rows:
            labels = row["metric"]
            value = _num(row)
            if query.kind == "coverage" and value:
                cover[(query.vendor, _series(labels))] = value
            found = _key(p, labels, cluster_label)
            if found is None or (value is None and query.kind != "coverage"):
                continue
            key, ident = found
            acc = accs.get(key)
            if acc is None:
                model = next((labels[m] for m in store.MODEL_LABELS[p.vendor]
                              if labels.get(m)), None)
                acc = accs[key] = _Acc(p.vendor, model, ident.mig_profile is not None,
                                       ident.mig_profile)
            if query.kind == "coverage":
                acc.minutes += value or 0.0
                continue
            weight = cover.get((query.vendor, _series(labels)), 1.0)
            value = p.convert(query.field or "", value)
            fld = f"{query.field}:{query.kind.split(':')[1]}"
            if fld.endswith(":max"):
                acc.maxes[fld] = max(acc.maxes.get(fld, value), value)
            else:
                acc.sums[fld] = acc.sums.get(fld, 0.0) + value * weight
                acc.weight[fld] = acc.weight.get(fld, 0.0) + weight
    sliced = {k[2] for k, a in accs.items() if a.is_slice}
    hours = bucket / 3600.0
    points = bucket / step
    out = []
    for key, acc in accs.items():
        cluster, node, uuid, slice_key, namespace, pod = key
        if not acc.is_slice and uuid in sliced:
            continue  # the parent of a MIG layout counts only through its slices
        avg = {f.split(":")[0]: acc.sums[f] / acc.weight[f] for f in acc.sums if acc.weight[f]}
        mx = {f.split(":")[0]: v for f, v in acc.maxes.items()}
        order = ((store.ENGINE_ACTIVE, store.UTILISATION) if acc.is_slice
                 else (store.UTILISATION, store.ENGINE_ACTIVE))
        util = next((avg[f] for f in order if f in avg), None)
        util_max = next((mx[f] for f in order if f in mx), None)
        share = 1.0
        model = acc.model
        if acc.is_slice:
            mine = known.get((uuid, slice_key), (None, None))
            parent = known.get((uuid, ""), (None, None))
            model = model or mine[0] or parent[0]
            share = store.mig_share(model, acc.profile, mine[1], parent[1])
        coverage = min(1.0, acc.minutes / points) if points else 0.0
        power = avg.get(store.POWER)
        out.append({
            "bucket_start": utc(start), "bucket_end": utc(start + bucket),
            "cluster": cluster, "node": node, "uuid": uuid, "slice": slice_key,
            "namespace": namespace, "pod": pod, "vendor": acc.vendor, "model": model,
            "gpu_share": share, "gpu_hours": share * coverage * hours,
            "avg_utilisation_pct": util, "max_utilisation_pct": util_max,
            "avg_memory_used_mib": avg.get(store.MEMORY_USED),
            "max_memory_used_mib": mx.get(store.MEMORY_USED),
            "avg_power_w": power,
            "energy_wh": None if power is None else power * coverage * hours * share,
            "coverage": coverage,
        })
    return out


def _ask(client: HubClient, queries: list[store.Query], start: float, bucket: float,
         step: float) -> Iterator[tuple[store.Query, Iterable[Mapping[str, Any]]]]:
    """Each query's answer in turn, coverage first (fold_bucket weighs averages by it),
    decoded row by row as the fold reads it: one answer's rows exist at a time, not the
    whole bucket's (~7 KB a GPU). A partial answer raises once its rows are read (Thanos
    sends the warnings after them), before anything is written."""
    end = start + bucket
    for query in sorted(queries, key=lambda q: q.kind != "coverage"):
        # avg/max: the samples in [start, end) (ms before the end, so a sample exactly on a
        # boundary belongs to one bucket); coverage: one step later, see usage_queries.
        at = end - 0.001 + (step if query.kind == "coverage" else 0.0)
        res = client.query(query.promql, time=at, stream=True)
        yield query, res.result
        warnings = getattr(res.result, "warnings", None) or res.warnings
        if warnings:
            raise store.PartialResponse(f"hub {client.safe_url} returned a partial response "
                                        f"({warnings[0]}); bucket left for a later collect")


def collect_usage(engine: Engine, client: HubClient, *, bucket: float = 3600.0,
                  starts: list[float] | None = None, max_backfill: float = 48 * 3600.0,
                  delay: float = 300.0, step: float = 60.0, retention: float = 400 * 86400.0,
                  cluster_label: str = "cluster", now: float | None = None,
                  on_bucket: Callable[[dt.datetime, int], None] | None = None
                  ) -> CollectResult:
    """Collect the given buckets (or every pending one), one transaction per bucket."""
    if bucket <= 0 or step <= 0 or bucket % step:
        raise GpufleetError(f"--bucket {format_duration(bucket)} must be a whole number of "
                            f"--step {format_duration(step)}")
    now = time.time() if now is None else now
    result = CollectResult()
    queries = store.usage_queries(format_duration(bucket), format_duration(step), cluster_label)
    with engine.connect() as conn:
        if starts is None:
            starts = pending_buckets(conn, now=now, bucket=bucket, max_backfill=max_backfill,
                                     delay=delay)
        known = {(r.uuid, r.slice_key): (r.model, r.memory_total_mib) for r in conn.execute(
            sa.select(gpus.c.uuid, gpus.c.slice_key, gpus.c.model, gpus.c.memory_total_mib))}
    for start in starts:
        before = client.requests
        try:
            rows = fold_bucket(_ask(client, queries, start, bucket, step), start=start,
                               bucket=bucket, step=step, cluster_label=cluster_label,
                               known=known)
        except GpufleetError as exc:
            result.requests += client.requests - before
            result.failed.append((utc(start), exc.format_message()))  # type: ignore[arg-type]
            continue
        requests = client.requests - before
        with engine.begin() as conn:
            write_bucket(conn, start, bucket, rows, requests)
        result.collected.append(utc(start))  # type: ignore[arg-type]
        result.rows += len(rows)
        result.requests += requests
        if on_bucket:
            on_bucket(utc(start), len(rows))  # type: ignore[arg-type]
    with engine.begin() as conn:
        result.removed = apply_retention(conn, now - retention)
    return result


def write_bucket(conn: Connection, start: float, bucket: float, rows: list[dict[str, Any]],
                 requests: int) -> None:
    """Replace one bucket's rows (idempotent), rebuild its day's rollup, mark it collected."""
    begin = utc(start)
    conn.execute(usage.delete().where(usage.c.bucket_start == begin))
    for batch in _batches(rows):
        conn.execute(usage.insert(), batch)
    rebuild_days(conn, [day_of(begin)])  # type: ignore[arg-type]
    stmt = _insert(conn, usage_buckets).values(
        bucket_start=begin, bucket_end=utc(start + bucket), collected_at=now_utc(),
        rows=len(rows), requests=requests)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=["bucket_start"],
        set_={c: stmt.excluded[c] for c in ("bucket_end", "collected_at", "rows", "requests")}))


def apply_retention(conn: Connection, before: float) -> int:
    cut = utc(before)
    removed = conn.execute(usage.delete().where(usage.c.bucket_start < cut)).rowcount or 0
    conn.execute(usage_buckets.delete().where(usage_buckets.c.bucket_start < cut))
    conn.execute(usage_daily.delete().where(usage_daily.c.day < day_of(cut)))
    if removed:
        rebuild_days(conn, [day_of(cut)])  # the day the cut falls in lost its first hours
    return removed


def day_of(moment: dt.datetime) -> dt.datetime:
    """00:00 UTC of the day a (naive UTC) moment falls in."""
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def rollup_sums(table: sa.Table, when: sa.ColumnElement) -> list[sa.ColumnElement]:
    """The summed figures of ledger rows, labelled like usage_daily's columns (the one place
    that says how a ledger row counts; usage answers use it on the ledger's edge hours)."""
    allocated = table.c.pod != ""
    util = sa.func.coalesce(table.c.avg_utilisation_pct, 0.0)
    zero = sa.literal(0.0)
    return [
        sa.func.sum(table.c.gpu_hours).label("gpu_hours"),
        sa.func.sum(sa.case((allocated, table.c.gpu_hours), else_=zero))
        .label("allocated_gpu_hours"),
        sa.func.sum(table.c.gpu_hours * util / 100.0).label("busy_gpu_hours"),
        sa.func.sum(sa.case((sa.and_(allocated, when), table.c.gpu_hours), else_=zero))
        .label("idle_allocated_gpu_hours"),
        sa.func.sum(sa.func.coalesce(table.c.energy_wh, 0.0)).label("energy_wh"),
    ]


ROLLUP_KEYS = ["cluster", "node", "uuid", "slice", "namespace", "model"]


def rebuild_days(conn: Connection, days: Iterable[dt.datetime]) -> None:
    """Replace the rollup rows of these days by the sums of the ledger rows starting in them."""
    util = sa.func.coalesce(usage.c.avg_utilisation_pct, 0.0)
    for day in sorted(set(days)):
        conn.execute(usage_daily.delete().where(usage_daily.c.day == day))
        sums = rollup_sums(usage, util < ROLLUP_IDLE_THRESHOLD)
        select = (sa.select(sa.literal(day, sa.DateTime).label("day"),
                            *[usage.c[k] for k in ROLLUP_KEYS], *sums)
                  .where(usage.c.bucket_start >= day, usage.c.bucket_start < day + DAY)
                  .group_by(*[usage.c[k] for k in ROLLUP_KEYS]))
        conn.execute(usage_daily.insert().from_select(
            ["day", *ROLLUP_KEYS, *[c.name for c in sums]], select))


def recent_usage(conn: Connection, uuid: str, limit: int = 48) -> list[dict[str, Any]]:
    stmt = (sa.select(usage).where(usage.c.uuid == uuid)
            .order_by(usage.c.bucket_start.desc(), usage.c.slice, usage.c.namespace,
                      usage.c.pod).limit(limit))
    return [dict(r) for r in conn.execute(stmt).mappings()]
