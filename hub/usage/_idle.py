"""The one idle answer: allocated GPUs and MIG slices whose bucket averages stayed under a
threshold for at least a given time in a row.

`idle`, the idle GPU-hours of `usage`, the report's idle_allocated_gpu finding, the live
page and the demo all read idle time through :func:`idle_runs`, with the same defaults
(IDLE_THRESHOLD_PCT, IDLE_FOR_S), so on one database over one period they cannot disagree:
idle GPU-hours of a group are exactly the wasted GPU-hours of the idle list's entries in it.

A bucket counts as idle only when the pod had samples in it (gpu_hours > 0) and a
utilisation was measured: an empty bucket or an unknown utilisation is not evidence of
idleness, so a run never starts before the pod's first sample.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub import inventory as inv
from hub.common import IDLE
from hub.usage._ledger import BUCKET_KEY, idle_bucket, rollup_days

U = inv.usage
#: The defaults every idle answer shares (`idle --threshold/--for`, `usage --idle-threshold
#: /--idle-for`, the report, the live page).
#: Declared with their options in hub.common's IdleSettings.
IDLE_THRESHOLD_PCT: float = IDLE.idle_threshold
IDLE_FOR_S: float = IDLE.idle_for



class IdleRule(NamedTuple):
    """The idle rule one surface answers with: `serve --idle-threshold/--idle-for` hands the
    same one to its page and its API defaults as the CLI's flags do to `usage` and `idle`."""

    threshold: float = IDLE_THRESHOLD_PCT
    for_seconds: float = IDLE_FOR_S


IDLE_COLUMNS = ["cluster", "node", "uuid", "slice", "namespace", "pod", "idle_since",
                "idle_until", "idle_hours", "wasted_gpu_hours", "avg_utilisation_pct"]
_KEY = ["cluster", "node", "uuid", "slice", "namespace", "pod"]
#: one idle stretch: (since, until, wasted GPU-hours, busy GPU-hours x pct, model)
Segment = tuple[dt.datetime, dt.datetime, float, float, "str | None"]


def _blank(value: Any) -> Any:
    return None if value == "" else value


def idle_runs(conn: Connection, start: dt.datetime, end: dt.datetime, *,
              threshold: float = IDLE_THRESHOLD_PCT, for_seconds: float = IDLE_FOR_S,
              clusters: Collection[str] | None = None,
              namespaces: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Idle allocated GPUs/slices over the buckets starting in [start, end), most wasted
    first: one entry per GPU or slice and pod, summing its runs of consecutive idle buckets
    that lasted at least ``for_seconds``. Each entry also carries ``model`` (for grouping by
    model); the IDLE_COLUMNS are what a user is shown."""
    found: dict[tuple, dict[str, Any]] = {}
    for k, runs in maximal_runs(conn, start, end, threshold=threshold, clusters=clusters,
                                namespaces=namespaces).items():
        for since, until, wasted, busy, model in runs:
            seconds = (until - since).total_seconds()
            if seconds < for_seconds:
                continue
            item = found.setdefault(k, {
                **{c: _blank(v) for c, v in zip(_KEY, k, strict=True)}, "model": model,
                "idle_since": since, "idle_until": until,
                "idle_hours": 0.0, "wasted_gpu_hours": 0.0, "_busy": 0.0})
            item["idle_until"] = until
            item["idle_hours"] += seconds / 3600.0
            item["wasted_gpu_hours"] += wasted
            item["_busy"] += busy
    out = []
    for item in found.values():
        busy = item.pop("_busy")
        item["avg_utilisation_pct"] = (round(busy / item["wasted_gpu_hours"], 3)
                                       if item["wasted_gpu_hours"] else None)
        item["idle_hours"] = round(item["idle_hours"], 6)
        item["wasted_gpu_hours"] = round(item["wasted_gpu_hours"], 6)
        out.append(item)
    return sorted(out, key=lambda i: (-i["wasted_gpu_hours"], i["cluster"], i["node"],
                                      i["uuid"], i["slice"] or "", i["pod"] or ""))


def maximal_runs(conn: Connection, start: dt.datetime, end: dt.datetime, *,
                 threshold: float = IDLE_THRESHOLD_PCT,
                 clusters: Collection[str] | None = None,
                 namespaces: Collection[str] | None = None) -> dict[tuple, list[Segment]]:
    """Every run of consecutive idle buckets starting in [start, end), however short, per
    GPU or slice and pod (the _KEY columns), in time order: idle_runs keeps those that
    lasted long enough, idle_by_day splits them into days."""
    segments = _day_segments(conn, start, end, threshold, clusters, namespaces)
    if segments is not None:
        return {k: _merged(parts) for k, parts in segments.items()}
    key = [U.c[c] for c in _KEY]
    where = [U.c.bucket_start >= start, U.c.bucket_start < end, U.c.pod != "",
             U.c.gpu_hours > 0, U.c.avg_utilisation_pct.is_not(None),
             U.c.avg_utilisation_pct < threshold]
    if clusters is not None:
        where.append(U.c.cluster.in_(sorted(clusters)))
    if namespaces is not None:
        where.append(U.c.namespace.in_(sorted(namespaces)))
    candidates = _candidates(conn, start, end, threshold)
    if candidates is not None:
        where.append(U.c.uuid.in_(candidates))
    out: dict[tuple, list[Segment]] = {}
    # First the idle buckets summed per GPU and pod in the database: where they are one
    # unbroken run (as many buckets as fit between the first start and the last end, on
    # the ledger's one grid) that sum is the run. Only the others are walked row by row.
    busy_sum = sa.func.sum(U.c.gpu_hours * U.c.avg_utilisation_pct)
    summed = (sa.select(*key, sa.func.min(U.c.model), sa.func.count(),
                        sa.func.min(U.c.bucket_start), sa.func.max(U.c.bucket_start),
                        sa.func.max(U.c.bucket_end), sa.func.sum(U.c.gpu_hours), busy_sum)
              .where(*where).group_by(*key))
    broken: set[tuple] = set()
    for r in conn.execute(summed):
        k, (model, n, first, last, until, wasted, busy) = tuple(r[:6]), tuple(r[6:])
        if (until - first) == n * (until - last):
            out[k] = [(first, until, wasted or 0.0, busy or 0.0, model)]
        else:
            broken.add(k)
    if broken:
        rows = conn.execute(
            sa.select(*key, U.c.model, U.c.bucket_start, U.c.bucket_end, U.c.gpu_hours,
                      U.c.avg_utilisation_pct)
            .where(*where, U.c.uuid.in_(sorted({k[2] for k in broken})))
            .order_by(*key, U.c.bucket_start))
        for r in rows:
            k = tuple(r[:6])
            if k in broken:
                # only idle buckets are read: a busy or missing bucket between two is a gap
                out.setdefault(k, []).append((r.bucket_start, r.bucket_end, r.gpu_hours,
                                              r.gpu_hours * r.avg_utilisation_pct, r.model))
        for k in broken:
            out[k] = _merged(out.get(k, []))
    return out


def idle_by_day(conn: Connection, start: dt.datetime, end: dt.datetime,
                days: Sequence[dt.datetime], columns: Sequence[str], *,
                threshold: float = IDLE_THRESHOLD_PCT, for_seconds: float = IDLE_FOR_S,
                clusters: Collection[str] | None = None,
                namespaces: Collection[str] | None = None) -> dict[dt.datetime, dict]:
    """Idle GPU-hours per day (of ``days``, 00:00 UTC) and group (``columns``): the runs are
    judged over the whole period [start, end), then each run's buckets are counted on the
    day they start. A run crossing midnight counts on both days whatever its part on each,
    so the days add up to the period's idle answer at any hour of the day."""
    qualifying = {k: [(a, b) for a, b, *_ in runs if (b - a).total_seconds() >= for_seconds]
                  for k, runs in maximal_runs(conn, start, end, threshold=threshold,
                                              clusters=clusters,
                                              namespaces=namespaces).items()}
    out: dict[dt.datetime, dict] = {}
    for day in days:
        lo, hi = max(day, start), min(day + inv.DAY, end)
        sums = out.setdefault(day, {})
        if lo >= hi:
            continue
        for k, parts in maximal_runs(conn, lo, hi, threshold=threshold, clusters=clusters,
                                     namespaces=namespaces).items():
            runs = qualifying.get(k, [])
            values = dict(zip(_KEY, (_blank(v) for v in k), strict=True))
            group = tuple(values[c] for c in columns)
            for since, until, wasted, _, _ in parts:
                # a day's part of a run lies inside exactly one run of the whole period
                if any(a <= since and until <= b for a, b in runs):
                    sums[group] = sums.get(group, 0.0) + wasted
    return out




def _merged(parts: list[Segment]) -> list[Segment]:
    """Runs from time-ordered idle segments (a bucket, or a day's unbroken idle run): two
    touch when one ends where the next starts."""
    runs: list[list[Any]] = []
    for since, until, wasted, busy, model in sorted(parts, key=lambda p: p[0]):
        if runs and runs[-1][1] == since:
            run = runs[-1]
            run[1] = until
            run[2] += wasted
            run[3] += busy
        else:
            runs.append([since, until, wasted, busy, model])
    return [tuple(r) for r in runs]


def _day_segments(conn: Connection, start: dt.datetime, end: dt.datetime, threshold: float,
                  clusters: Collection[str] | None, namespaces: Collection[str] | None
                  ) -> dict[tuple, list[Segment]] | None:
    """Idle segments per GPU and pod read by days: a month is one row per idle GPU and day
    (inv.usage_idle_daily, kept by the ledger's writer at ROLLUP_IDLE_THRESHOLD) where that
    day's idle buckets are one unbroken run, the ledger's rows only for the other days and
    the hours at the period's edges. None when the days cannot answer (another threshold,
    no whole day in the period, a ledger whose grid is not stored yet)."""

    if threshold != inv.ROLLUP_IDLE_THRESHOLD:
        return None
    days = rollup_days(conn, start, end)
    size = conn.execute(sa.select(inv.usage_ledger.c.value)
                        .where(inv.usage_ledger.c.key == BUCKET_KEY)).scalar()
    if days is None or size is None:
        return None
    bucket = dt.timedelta(seconds=float(size))
    D = inv.usage_idle_daily
    stmt = sa.select(D).where(D.c.day >= days[0], D.c.day < days[1])
    if clusters is not None:
        stmt = stmt.where(D.c.cluster.in_(sorted(clusters)))
    if namespaces is not None:
        stmt = stmt.where(D.c.namespace.in_(sorted(namespaces)))
    out: dict[tuple, list[Segment]] = {}
    broken: set[tuple] = set()  # (key, day) whose idle buckets are not one run
    for r in conn.execute(stmt):
        k = tuple(getattr(r, c) for c in _KEY)
        if r.last_end - r.first_start == r.buckets * bucket:
            out.setdefault(k, []).append((r.first_start, r.last_end, r.gpu_hours, r.busy,
                                          r.model))
        else:
            broken.add((k, r.day))
    reads: list[sa.ColumnElement[bool]] = [
        U.c.bucket_start.between(a, b - dt.timedelta(microseconds=1))
        for a, b in ((start, days[0]), (days[1], end)) if a < b]
    if broken:
        reads.append(sa.and_(U.c.uuid.in_(sorted({k[2] for k, _ in broken})),
                             U.c.bucket_start >= days[0], U.c.bucket_start < days[1]))
    if reads:

        rows = sa.select(*[U.c[c] for c in _KEY], U.c.model, U.c.bucket_start,
                         U.c.bucket_end, U.c.gpu_hours, U.c.avg_utilisation_pct).where(
            sa.or_(*reads), *idle_bucket(U, threshold))
        if clusters is not None:
            rows = rows.where(U.c.cluster.in_(sorted(clusters)))
        if namespaces is not None:
            rows = rows.where(U.c.namespace.in_(sorted(namespaces)))
        for r in conn.execute(rows):
            k = tuple(r[:6])
            inside = days[0] <= r.bucket_start < days[1]
            if inside and (k, inv.day_of(r.bucket_start)) not in broken:
                continue  # that day came whole from usage_idle_daily
            out.setdefault(k, []).append((r.bucket_start, r.bucket_end, r.gpu_hours,
                                          r.gpu_hours * r.avg_utilisation_pct, r.model))
    return out


def _candidates(conn: Connection, start: dt.datetime, end: dt.datetime,
                threshold: float) -> sa.Select | sa.CompoundSelect | None:
    """The GPUs that can have an idle bucket in [start, end), so a month's idle runs read
    the idle GPUs' rows by the ledger's uuid index instead of every row of the month: those
    with idle allocated hours in the daily rollup's whole days (counted there at
    ROLLUP_IDLE_THRESHOLD, with an unknown utilisation as 0: a superset for any threshold
    up to it) and those with an idle bucket in the hours at the edges. None: no narrowing
    (a higher threshold, or no whole day in the period)."""

    if threshold > inv.ROLLUP_IDLE_THRESHOLD:
        return None
    days = rollup_days(conn, start, end)
    if days is None:
        return None
    D = inv.usage_daily
    parts: list[sa.Select] = [
        sa.select(D.c.uuid).where(D.c.day >= days[0], D.c.day < days[1],
                                  D.c.idle_allocated_gpu_hours > 0)]
    for a, b in ((start, days[0]), (days[1], end)):
        if a < b:
            parts.append(sa.select(U.c.uuid).where(
                U.c.bucket_start >= a, U.c.bucket_start < b, U.c.pod != "",
                U.c.avg_utilisation_pct < threshold))
    return sa.union(*parts) if len(parts) > 1 else parts[0].distinct()


def idle_gpu_hours(runs: Sequence[dict[str, Any]],
                   columns: Sequence[str]) -> dict[tuple, float]:
    """The idle runs' wasted GPU-hours summed per group (the group's column values, None
    for '' as the usage rows show them): usage's idle_allocated_gpu_hours."""
    sums: dict[tuple, float] = {}
    for run in runs:
        k = tuple(run[c] for c in columns)
        sums[k] = sums.get(k, 0.0) + run["wasted_gpu_hours"]
    return sums


def idle_allocated(conn: Connection, start: dt.datetime, end: dt.datetime, *,
                   threshold: float = IDLE_THRESHOLD_PCT, for_seconds: float = IDLE_FOR_S,
                   clusters: Collection[str] | None = None,
                   namespaces: Collection[str] | None = None) -> list[dict[str, Any]]:
    """The idle list as `idle`, the API and the page show it: idle_runs in IDLE_COLUMNS."""
    return [{c: run[c] for c in IDLE_COLUMNS}
            for run in idle_runs(conn, start, end, threshold=threshold,
                                 for_seconds=for_seconds, clusters=clusters,
                                 namespaces=namespaces)]


def idle_now(conn: Connection, now: dt.datetime, *, threshold: float = IDLE_THRESHOLD_PCT,
             for_seconds: float = IDLE_FOR_S,
             clusters: Collection[str] | None = None) -> set[str]:
    """GPUs (uuids) idle now by the one idle rule: an idle run of at least ``for_seconds``
    reaching the latest ended buckets (two hours' slack for the ledger's lag). What the
    fleet states take off ``active`` (hub.inventory.fleet_states)."""
    slack = dt.timedelta(hours=2)
    start = now - dt.timedelta(seconds=for_seconds) - slack - dt.timedelta(hours=1)
    return {run["uuid"] for run in idle_runs(conn, start, now + dt.timedelta(seconds=1),
                                              threshold=threshold, for_seconds=for_seconds,
                                              clusters=clusters)
            if run["idle_until"] >= now - slack}
