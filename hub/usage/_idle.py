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
import math
from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub import inventory as inv
from hub.common import IDLE
from hub.inventory import next_month
from hub.usage._ledger import (
    BUCKET_KEY,
    idle_bucket,
    marked_spans,
    quick_answer,
    rollup_days,
    rollup_months,
)

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
                                namespaces=namespaces, at_least=for_seconds).items():
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
                 namespaces: Collection[str] | None = None,
                 at_least: float = 0.0) -> dict[tuple, list[Segment]]:
    """Every run of consecutive idle buckets starting in [start, end), however short, per
    GPU or slice and pod (the _KEY columns), in time order: idle_runs keeps those that
    lasted long enough, idle_by_day splits them into days. ``at_least``: the rollups'
    path may leave out runs shorter than that many seconds (the caller judges them)."""
    runs = _rollup_runs(conn, start, end, threshold, at_least, clusters, namespaces)
    if runs is not None:
        return runs
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


def _rollup_runs(conn: Connection, start: dt.datetime, end: dt.datetime, threshold: float,
                 at_least: float, clusters: Collection[str] | None,
                 namespaces: Collection[str] | None) -> dict[tuple, list[Segment]] | None:
    """The runs of at least ``at_least`` seconds, merged in the database from the rollups'
    idle segments: a month's (usage_idle_monthly) or a day's (usage_idle_daily) idle
    buckets of a GPU and pod where they are one unbroken run, the ledger's idle buckets
    for the other days and the hours at the period's edges. A window over the segments in
    time order starts a run wherever one does not begin where the previous ended; only
    the runs come back, not a row per idle GPU and day (a year at 100,000 GPUs is millions
    of them). None when the rollups cannot answer (another threshold, no whole day in the
    period, a ledger whose grid is not stored yet)."""
    if threshold != inv.ROLLUP_IDLE_THRESHOLD:
        return None
    days = rollup_days(conn, start, end)
    size = conn.execute(sa.select(inv.usage_ledger.c.value)
                        .where(inv.usage_ledger.c.key == BUCKET_KEY)).scalar()
    if days is None or size is None:
        return None
    quick_answer(conn)
    bucket = float(size)
    step = dt.timedelta(seconds=bucket)
    pg = conn.dialect.name == "postgresql"
    M, D = inv.usage_idle_monthly, inv.usage_idle_daily

    def unbroken(t: sa.FromClause) -> sa.ColumnElement[bool]:
        # on one grid the span is a whole number of buckets: one run when it is `buckets`
        return _seconds(pg, t.c.first_start, t.c.last_end) < (t.c.buckets + 0.5) * bucket

    def scoped(stmt: sa.Select, t: sa.FromClause) -> sa.Select:
        if clusters is not None:
            stmt = stmt.where(t.c.cluster.in_(sorted(clusters)))
        if namespaces is not None:
            stmt = stmt.where(t.c.namespace.in_(sorted(namespaces)))
        return stmt

    def same_key(a: sa.FromClause, b: sa.FromClause
                 ) -> sa.ColumnElement[bool]:
        return sa.and_(*[a.c[k] == b.c[k] for k in _KEY])

    def names(t: sa.FromClause) -> list[sa.ColumnElement]:
        # as text without a length: PostgreSQL guesses a varchar(253)'s width from its
        # length, and a guessed 2.8 kB a segment made it sort them rather than hash
        return [sa.cast(t.c[k], sa.Text).label(k) for k in (*_KEY, "model")]

    def segment(t: sa.Table) -> list[sa.ColumnElement]:
        return [*names(t), t.c.first_start.label("since"),
                t.c.last_end.label("until"), t.c.buckets, t.c.gpu_hours, t.c.busy]

    # the rollups' segments (read again, for the keys not one run only) and the others (the
    # edge hours' and the broken days', stored once: a CTE)
    rollups: list[sa.Select] = []
    parts: list[sa.Select] = []
    months = rollup_months(conn, days)
    spans = [days] if months is None else [(days[0], months[0]), (months[1], days[1])]
    day_rows: list[sa.ColumnElement[bool]] = [sa.and_(D.c.day >= a, D.c.day < b)
                                              for a, b in spans if a < b]
    if months is not None:
        in_months = (M.c.month >= months[0], M.c.month < months[1])
        rollups.append(scoped(sa.select(*segment(M)).where(*in_months, unbroken(M)), M))
        # a GPU and pod whose month is not one run: that month's days, for it alone
        broken: dict[dt.datetime, set[str]] = {}
        for month, uuid in conn.execute(scoped(sa.select(M.c.month, M.c.uuid).where(
                *in_months, sa.not_(unbroken(M))), M).distinct()):
            broken.setdefault(month, set()).add(uuid)
        whole = M.alias("whole")
        for month, uuids in sorted(broken.items()):
            read = [D.c.day >= month, D.c.day < next_month(month),
                    ~sa.exists().where(same_key(whole, D), whole.c.month == month,
                                       unbroken(whole))]
            if len(uuids) <= MAX_IN:
                read.append(D.c.uuid.in_(sorted(uuids)))
            day_rows.append(sa.and_(*read))
    broken_days: set[str] = set()
    if day_rows:
        rollups.append(scoped(sa.select(*segment(D)).where(sa.or_(*day_rows), unbroken(D)),
                              D))
        broken_days = set(conn.execute(scoped(sa.select(D.c.uuid).where(
            sa.or_(*day_rows), sa.not_(unbroken(D))), D).distinct()).scalars())
    # the ledger's idle buckets: the edge hours, and the days whose idle buckets are not
    # one run (their GPUs' rows found by the uuid index)
    edges = [(a, b) for a, b in ((start, days[0]), (days[1], end)) if a < b]
    reads: list[sa.ColumnElement[bool]] = []
    if edges and sa.inspect(conn).has_table(inv.usage_rows.name):
        for n, (a, b) in enumerate(edges):
            parts.extend(_edge_segments(conn, n, a, b, threshold, bucket, clusters,
                                        namespaces))
    else:  # a ledger from before 0025, whose `usage` is a table (the migrations' tests)
        reads += [sa.and_(U.c.bucket_start >= a, U.c.bucket_start < b) for a, b in edges]
    if broken_days:
        day = D.alias("day")
        read = [U.c.bucket_start >= days[0], U.c.bucket_start < days[1],
                sa.exists().where(same_key(day, U), day.c.day == _day_of(pg, U.c.bucket_start),
                                  sa.not_(unbroken(day)))]
        if len(broken_days) <= MAX_IN:
            read.append(U.c.uuid.in_(sorted(broken_days)))
        reads.append(sa.and_(*read))
    if reads:
        parts.append(scoped(sa.select(
            *names(U), U.c.bucket_start.label("since"),
            U.c.bucket_end.label("until"), sa.literal(1).label("buckets"), U.c.gpu_hours,
            (U.c.gpu_hours * U.c.avg_utilisation_pct).label("busy"))
            .where(sa.or_(*reads), *idle_bucket(U, threshold)), U))
    sources = list(rollups)
    if parts:
        stored = (sa.union_all(*parts) if len(parts) > 1 else parts[0]).cte("seg")
        sources.append(sa.select(stored))
    if not sources:
        return {}
    seg = (sa.union_all(*sources) if len(sources) > 1 else sources[0]).subquery("seg")
    least = _least_buckets(step, at_least)
    # First per GPU and pod (a hash, no sort): where all its segments are one unbroken run
    # (the span is as many buckets as they hold) that is its run; in the bench's fleet, and
    # for any GPU idle all period, that is every one.
    per_key = (sa.select(*[seg.c[k] for k in _KEY], sa.func.sum(seg.c.buckets).label("n"),
                         sa.func.min(seg.c.since).label("since"),
                         sa.func.max(seg.c.until).label("until"),
                         sa.func.sum(seg.c.gpu_hours).label("gpu_hours"),
                         sa.func.sum(seg.c.busy).label("busy"),
                         sa.func.min(seg.c.model).label("model"),
                         # a number for the GPU and pod: the window sorts by it, not by
                         # its six names (ordered: the same on every read of the CTE)
                         sa.func.row_number().over(
                             order_by=[seg.c[k] for k in _KEY]).label("kid"))
               .group_by(*[seg.c[k] for k in _KEY])).cte("per_key")
    one_run = _seconds(pg, per_key.c.since, per_key.c.until) < (per_key.c.n + 0.5) * bucket
    single = sa.select(*[per_key.c[k] for k in _KEY], per_key.c.since, per_key.c.until,
                       per_key.c.gpu_hours, per_key.c.busy, per_key.c.model).where(
        one_run, per_key.c.n >= least)
    # The others' segments in time order: a window starts a run wherever a segment does not
    # begin where the previous one ended; a running sum numbers the runs. Their segments
    # are found source by source, each joined to those keys (hashed): the rollups' rows are
    # read again rather than all segments stored for this (at 100,000 GPUs 300,000-430,000
    # of them, 0.1-0.15 s to store), and with every key one run not at all.
    others = (sa.select(per_key.c.kid, *[per_key.c[k] for k in _KEY])
              .where(sa.not_(one_run))).cte("others")
    stitch_parts = []
    for source in sources:
        src = source.subquery()
        stitch_parts.append(sa.select(others.c.kid, src.c.since, src.c.until, src.c.buckets,
                                      src.c.gpu_hours, src.c.busy, src.c.model)
                            .select_from(src.join(others, same_key(src, others))))
    stitch = (sa.union_all(*stitch_parts) if len(stitch_parts) > 1
              else stitch_parts[0]).subquery("b")
    follows = sa.func.lag(stitch.c.until).over(partition_by=stitch.c.kid,
                                               order_by=stitch.c.since) == stitch.c.since
    flagged = sa.select(stitch, sa.case((follows, 0), else_=1).label("starts")).subquery("f")
    island = sa.func.sum(flagged.c.starts).over(
        partition_by=flagged.c.kid, order_by=flagged.c.since, rows=(None, 0)).label("island")
    runs = sa.select(flagged, island).subquery("r")
    stitched = (sa.select(runs.c.kid, sa.func.min(runs.c.since).label("since"),
                          sa.func.max(runs.c.until).label("until"),
                          sa.func.sum(runs.c.gpu_hours).label("gpu_hours"),
                          sa.func.sum(runs.c.busy).label("busy"),
                          sa.func.min(runs.c.model).label("model"))
                .group_by(runs.c.kid, runs.c.island)
                .having(sa.func.sum(runs.c.buckets) >= least)).subquery("s")
    stmt = sa.union_all(single, sa.select(
        *[per_key.c[k] for k in _KEY], stitched.c.since, stitched.c.until,
        stitched.c.gpu_hours, stitched.c.busy, stitched.c.model)
        .select_from(stitched.join(per_key, per_key.c.kid == stitched.c.kid)))
    out: dict[tuple, list[Segment]] = {}
    if pg:
        # The stitch joins the segments to the few keys not one run: PostgreSQL hashes
        # those when its segments are costed narrow (the casts above), unless it sorts
        # every segment by its six names for a merge join instead (at 100,000 GPUs half
        # a million rows, on disk). Only for this statement.
        conn.exec_driver_sql("SET LOCAL enable_mergejoin = off")
    for r in conn.execute(stmt):
        since, until, wasted, busy, model = r[6:]
        out.setdefault(tuple(r[:6]), []).append(
            (since, until, wasted or 0.0, busy or 0.0, model))
    if pg:
        conn.exec_driver_sql("SET LOCAL enable_mergejoin TO DEFAULT")
    for found in out.values():
        found.sort(key=lambda s: s[0])
    return out


def _edge_segments(conn: Connection, n: int, start: dt.datetime, end: dt.datetime,
                   threshold: float, bucket: float, clusters: Collection[str] | None,
                   namespaces: Collection[str] | None) -> list[sa.Select]:
    """The idle segments of the ledger's rows in [start, end) (an answer's edge hours), as
    _rollup_runs' segments: per place and pod one segment where its idle buckets there are
    one unbroken run, their rows one by one where not. The idle rows are found on
    usage_rows' own columns and summed by its small keys before any name is joined: at
    100,000 GPUs a day's edge is 2 million rows, some 200,000 of them idle (the bench's
    tenth), and through the ``usage`` view each was joined to its place, pod and mark and
    then hashed by six names. A row counts once its bucket is marked, as in the view."""
    R, P, D, B = inv.usage_rows, inv.usage_places, inv.usage_pods, inv.usage_buckets
    pg = conn.dialect.name == "postgresql"
    rows = (sa.select(R.c.place, R.c.pod, R.c.bucket_start, R.c.gpu_hours,
                      (R.c.gpu_hours * R.c.avg_utilisation_pct).label("busy"))
            .where(R.c.bucket_start >= start, R.c.bucket_start < end,
                   marked_spans(conn, start, end, R.c.bucket_start),
                   R.c.gpu_hours > 0, R.c.avg_utilisation_pct.is_not(None),
                   R.c.avg_utilisation_pct < threshold)).subquery(f"edge{n}")
    summed = (sa.select(rows.c.place, rows.c.pod, sa.func.count().label("n"),
                        sa.func.min(rows.c.bucket_start).label("first"),
                        sa.func.max(rows.c.bucket_start).label("last"),
                        sa.func.sum(rows.c.gpu_hours).label("gpu_hours"),
                        sa.func.sum(rows.c.busy).label("busy"))
              .group_by(rows.c.place, rows.c.pod)).cte(f"edge{n}_sums")
    last = B.alias(f"edge{n}_last")
    one_run = _seconds(pg, summed.c.first, last.c.bucket_end) < (summed.c.n + 0.5) * bucket
    names = [sa.cast(P.c[k] if k not in ("namespace", "pod") else D.c[k], sa.Text).label(k)
             for k in (*_KEY, "model")]
    scope = [D.c.pod != ""]
    if clusters is not None:
        scope.append(P.c.cluster.in_(sorted(clusters)))
    if namespaces is not None:
        scope.append(D.c.namespace.in_(sorted(namespaces)))
    whole = (sa.select(*names, summed.c.first.label("since"), last.c.bucket_end.label("until"),
                       summed.c.n.label("buckets"), summed.c.gpu_hours, summed.c.busy)
             .select_from(summed.join(last, last.c.bucket_start == summed.c.last)
                          .join(P, P.c.id == summed.c.place).join(D, D.c.id == summed.c.pod))
             .where(one_run, *scope))
    # The few places and pods not one run are hashed and their idle rows read again (a
    # subquery, not a CTE: PostgreSQL's CTE would store all 200,000 of them for that); none,
    # and they are not read again at all.
    broken = (sa.select(summed.c.place, summed.c.pod)
              .select_from(summed.join(last, last.c.bucket_start == summed.c.last))
              .where(sa.not_(one_run))).cte(f"edge{n}_broken")
    each = (sa.select(*names, rows.c.bucket_start.label("since"), B.c.bucket_end.label("until"),
                      sa.literal(1).label("buckets"), rows.c.gpu_hours, rows.c.busy)
            .select_from(rows.join(broken, sa.and_(broken.c.place == rows.c.place,
                                                   broken.c.pod == rows.c.pod))
                         .join(B, B.c.bucket_start == rows.c.bucket_start)
                         .join(P, P.c.id == rows.c.place).join(D, D.c.id == rows.c.pod))
            .where(*scope))
    return [whole, each]


#: at most this many uuids in one IN (SQLite's limit is 32,766 parameters a statement);
#: more, and the rows are told apart by the rollup alone
MAX_IN = 10_000


def _least_buckets(step: dt.timedelta, seconds: float) -> int:
    """The fewest buckets of ``step`` whose run lasts at least ``seconds``, as idle_runs
    measures it ((until - since).total_seconds()): the database compares whole numbers."""
    n = max(0, math.floor(seconds / step.total_seconds()) - 1)
    while (step * n).total_seconds() < seconds:
        n += 1
    return n


def _seconds(pg: bool, a: sa.ColumnElement, b: sa.ColumnElement) -> sa.ColumnElement:
    """b - a in seconds (SQLite stores times as text: julianday's float is exact to well
    under a millisecond, and the only use is against a half-bucket margin)."""
    if pg:
        return sa.extract("epoch", b - a)
    return (sa.func.julianday(b) - sa.func.julianday(a)) * 86400.0


def _day_of(pg: bool, moment: sa.ColumnElement) -> sa.ColumnElement:
    """00:00 of a stored time's day, as the rollup's day column holds it."""
    if pg:
        return sa.func.date_trunc("day", moment)
    return sa.func.strftime("%Y-%m-%d 00:00:00.000000", moment)


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
