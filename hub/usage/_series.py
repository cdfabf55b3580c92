"""Usage over time, for charts: GPU-hours per day by namespace, utilisation per bucket.

Both read the same ledger the `usage` answers read, with the same rules: a day's GPU-hours
are ``usage_summary`` over that day (so the chart's columns add up to what `gpufleet usage
--from DAY --until DAY+1` prints), and utilisation is busy GPU-hours over GPU-hours, the
``avg_utilisation_pct`` of `usage`, per bucket. ``clusters`` and ``namespaces`` restrict
the rows as they do for the answers (a scoped caller's chart shows its own usage only).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub import inventory as inv
from hub.usage._answers import U, _within, usage_summary
from hub.usage._idle import IDLE_FOR_S, IDLE_THRESHOLD_PCT, idle_by_day

#: the ledger column of SM activity, when the ledger records it (a later schema adds it)
SM_ACTIVE_COLUMN = "avg_sm_active_pct"


def day_starts(start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """00:00 UTC of every day that [start, end) touches, in order."""
    days, day = [], inv.day_of(start)
    while day < end:
        days.append(day)
        day += inv.DAY
    return days


def daily_by_namespace(conn: Connection, start: dt.datetime, end: dt.datetime, *,
                       idle_threshold: float = IDLE_THRESHOLD_PCT,
                       idle_for: float = IDLE_FOR_S,
                       clusters: Collection[str] | None = None,
                       namespaces: Collection[str] | None = None) -> list[dict[str, Any]]:
    """One row per day and namespace with usage in [start, end): ``day`` plus the figures of
    ``usage_summary`` (gpu_hours, allocated, busy, idle allocated). The edge days count only
    their part inside the period. Whole days come from the daily rollup, one small query a
    day (a chart shows a few weeks). Idle runs are judged over the whole period and split
    into days (idle_by_day), so the days add up to `usage` over the period at any hour."""
    days = day_starts(start, end)
    idle = idle_by_day(conn, start, end, days, ("namespace",), threshold=idle_threshold,
                       for_seconds=idle_for, clusters=clusters, namespaces=namespaces)
    out = []
    for day in days:
        lo, hi = max(day, start), min(day + inv.DAY, end)
        for row in usage_summary(conn, lo, hi, ("namespace",), idle_threshold,
                                 clusters=clusters, namespaces=namespaces, idle=idle[day]):
            out.append({"day": day, **row})
    return out


def utilisation_over_time(conn: Connection, start: dt.datetime, end: dt.datetime, *,
                          clusters: Collection[str] | None = None,
                          namespaces: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Per bucket starting in [start, end): ``at`` (bucket start), ``gpu_hours``,
    ``utilisation_pct`` (100 x busy GPU-hours / GPU-hours, None without GPU-hours) and
    ``sm_active_pct`` (GPU-hour weighted over the rows that have it; None when the ledger
    has no such column or no row in the bucket has a value: "not exported", never 0)."""
    util = sa.func.coalesce(U.c.avg_utilisation_pct, 0.0)
    figures = [sa.func.sum(U.c.gpu_hours).label("gpu_hours"),
               sa.func.sum(U.c.gpu_hours * util / 100.0).label("busy_gpu_hours")]
    has_sm = SM_ACTIVE_COLUMN in U.c
    if has_sm:
        sm = U.c[SM_ACTIVE_COLUMN]
        figures += [sa.func.sum(U.c.gpu_hours * sm).label("sm_weighted"),
                    sa.func.sum(sa.case((sm.is_not(None), U.c.gpu_hours), else_=0.0))
                    .label("sm_gpu_hours")]
    stmt = _within(sa.select(U.c.bucket_start, *figures)
                   .where(U.c.bucket_start >= start, U.c.bucket_start < end)
                   .group_by(U.c.bucket_start).order_by(U.c.bucket_start),
                   clusters, namespaces)
    out = []
    for r in conn.execute(stmt).mappings():
        hours = float(r["gpu_hours"] or 0.0)
        sm_hours = float(r["sm_gpu_hours"] or 0.0) if has_sm else 0.0
        out.append({
            "at": r["bucket_start"], "gpu_hours": round(hours, 6),
            "utilisation_pct": (round(100.0 * float(r["busy_gpu_hours"] or 0.0) / hours, 3)
                                if hours else None),
            "sm_active_pct": (round(float(r["sm_weighted"] or 0.0) / sm_hours, 3)
                              if sm_hours else None),
        })
    return out
