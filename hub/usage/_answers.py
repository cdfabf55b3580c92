"""usage, idle and capacity: answers from the usage ledger and the inventory (reads only).

Figures (docs/usage.md says the same to users):
- gpu_hours: GPU-equivalents x hours with samples (a MIG slice is its share of the GPU);
- allocated_gpu_hours: the part of it during which a pod held the GPU or slice;
- busy_gpu_hours: sum of hours x average utilisation / 100;
- idle_allocated_gpu_hours: the wasted GPU-hours of the idle list (hub.usage._idle): allocated
  buckets under the idle threshold in runs of at least the idle time, the same answer `idle`,
  the report and the live page give;
- sm_active_gpu_hours: sum of hours x average SM activity / 100 (DCGM_FI_PROF_SM_ACTIVE,
  else GR_ENGINE_ACTIVE; AMD's GPU_PROF_SM_ACTIVE), over the rows that export it: null, never
  0, where none does; avg_sm_active_pct is it over those rows' GPU-hours;
- energy_kwh: average power x hours with samples (a slice's share of its GPU's power); null
  where no GPU of the group reported power.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from hub import inventory as inv
from hub.usage._bills import Bill, cloud_nodes, needs_nodes, node_prices, showback_currency
from hub.usage._idle import IDLE_FOR_S, IDLE_THRESHOLD_PCT, idle_gpu_hours, idle_runs
from hub.usage._ledger import (
    groups_built,
    marked_spans,
    quick_answer,
    rollup_days,
    rollup_months,
    rollup_sums,
)
from hub.usage._meter import BASES
from hub.usage._placement import read_fleet, totals
from hub.usage._prices import Prices, add_costs

U = inv.usage
GROUPS: dict[str, list[str]] = {
    "cluster": ["cluster"], "namespace": ["namespace"], "model": ["model"],
    "node": ["cluster", "node"], "gpu": ["cluster", "node", "uuid", "slice"],
}
USAGE_FIGURES = ["gpu_hours", "allocated_gpu_hours", "busy_gpu_hours",
                 "idle_allocated_gpu_hours", "avg_utilisation_pct", "sm_active_gpu_hours",
                 "avg_sm_active_pct", "energy_kwh", "allocation_basis"]


def group_columns(by: Sequence[str]) -> list[str]:
    out: list[str] = []
    for name in by:
        for col in GROUPS[name]:
            if col not in out:
                out.append(col)
    return out


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    """'' in the ledger's key columns means 'none': show it as null."""
    for key in ("namespace", "pod", "slice"):
        if row.get(key) == "":
            row[key] = None
    return row


def _settled(value: float, digits: int) -> float:
    """``value`` rounded to ``digits`` decimals after its last few bits of floating-point
    noise are settled: a database sums a group's rows in whatever order its plan reads them,
    and a figure on a decimal tie (24.8825) must not come out 24.882 one way and 24.883 the
    other (the rollup's day sums and the hourly rows' one sum are added in other orders)."""
    return round(round(value, digits + 4), digits)


def _blank(value: Any) -> Any:
    return None if value == "" else value


def _within(stmt: sa.Select, clusters: Collection[str] | None,
            namespaces: Collection[str] | None, table: sa.Table = U) -> sa.Select:
    """Only rows of these clusters and namespaces (None: all), for a scoped caller."""
    if clusters is not None:
        stmt = stmt.where(table.c.cluster.in_(sorted(clusters)))
    if namespaces is not None:
        stmt = stmt.where(table.c.namespace.in_(sorted(namespaces)))
    return stmt


#: what summary_select sums; idle_allocated_gpu_hours is not among them: usage_summary takes
#: it from the idle runs (the rollups' figure is for the default rule, without idle_for)
SUMS = ["gpu_hours", "allocated_gpu_hours", "busy_gpu_hours", "energy_wh",
        "energy_measured_gpu_hours", "sm_active_gpu_hours", "sm_measured_gpu_hours"]
RANK = "allocation_basis_rank"


def summary_select(conn: Connection, start: dt.datetime, end: dt.datetime,
                   by: Sequence[str], idle_threshold: float, *,
                   clusters: Collection[str] | None = None,
                   namespaces: Collection[str] | None = None,
                   rollup: bool = True,
                   columns: Sequence[str] | None = None) -> sa.Select | None:
    """The statement usage_summary runs (None: nothing to read), also for EXPLAIN.

    Whole UTC months come from the monthly rollup (inv.usage_monthly, where built: the
    months before the latest bucket's), the other whole days from the daily rollup
    (inv.usage_daily, an index range on its day) and only the edge hours from the hourly
    ledger (a range of its key): a month is ~30 rows per GPU, not 720, and a year ~12 plus
    the days of its edge months, not 365. Grouped by cluster, namespace or model (not by
    node or GPU) the rollups read are their group sums (inv.usage_daily_groups,
    inv.usage_monthly_groups): a row per group and day, not per GPU. The rollup's idle
    figure is for the default threshold, so another ``idle_threshold`` (or
    ``rollup=False``) reads the whole period from the ledger; both give the same sums.
    ``columns`` replaces the grouping columns ``by`` names."""
    cols = list(columns) if columns is not None else group_columns(by)
    parts: list[sa.Select] = []
    hourly = [(start, end)]
    days = (rollup_days(conn, start, end)
            if rollup and idle_threshold == inv.ROLLUP_IDLE_THRESHOLD else None)
    if days is not None:
        months = rollup_months(conn, days)
        spans = [days] if months is None else [(days[0], months[0]), (months[1], days[1])]
        # grouped by cluster, namespace or model only: the group rollups' rows
        grouped = set(cols) <= set(inv.GROUP_KEYS) and groups_built(conn)
        daily, monthly = ((inv.usage_daily_groups, inv.usage_monthly_groups) if grouped
                          else (inv.usage_daily, inv.usage_monthly))
        reads = [(daily, "day", a, b) for a, b in spans if a < b]
        if months is not None:
            reads.append((monthly, "month", *months))
        for D, period, a, b in reads:
            parts.append(_within(
                sa.select(*[D.c[c] for c in cols],
                          *[sa.func.sum(D.c[f]).label(f) for f in SUMS],
                          sa.func.max(D.c[RANK]).label(RANK))
                .where(D.c[period] >= a, D.c[period] < b)
                .group_by(*[D.c[c] for c in cols]), clusters, namespaces, D))
        hourly = [(a, b) for a, b in ((start, days[0]), (days[1], end)) if a < b]
    compact = bool(hourly) and sa.inspect(conn).has_table(inv.usage_rows.name)
    idle = sa.func.coalesce(U.c.avg_utilisation_pct, 0.0) < idle_threshold
    for a, b in hourly:
        if compact:
            parts.append(_hours_select(conn, a, b, cols, clusters, namespaces))
        else:  # a ledger from before 0025, whose `usage` is a table (the migrations' tests)
            parts.append(_within(
                sa.select(*[U.c[c] for c in cols],
                          *[f for f in rollup_sums(U, idle) if f.name in (*SUMS, RANK)])
                .where(U.c.bucket_start >= a, U.c.bucket_start < b)
                .group_by(*[U.c[c] for c in cols]), clusters, namespaces))
    if not parts:
        return None
    both = (sa.union_all(*parts) if len(parts) > 1 else parts[0]).subquery()
    return (sa.select(*[both.c[c] for c in cols],
                      *[sa.func.sum(both.c[f]).label(f) for f in SUMS],
                      sa.func.max(both.c[RANK]).label(RANK))
            .group_by(*[both.c[c] for c in cols])
            .order_by(*[both.c[c] for c in cols]))


def _hours_select(conn: Connection, start: dt.datetime, end: dt.datetime,
                  cols: Sequence[str], clusters: Collection[str] | None,
                  namespaces: Collection[str] | None) -> sa.Select:
    """The ledger's rows of [start, end) summed by ``cols`` as rollup_sums sums the
    ``usage`` view's, read from usage_rows: first summed by the rows' own small keys (the
    pod's, and the place's where ``cols`` name a place column), then joined to the
    dictionaries, one row per key. Through the view every row was joined to its place,
    pod and bucket mark before it was summed: at 100,000 GPUs a day's edge hours are 2
    million rows. A row counts once its bucket is marked, as in the view (marked_spans)."""
    R, P, D = inv.usage_rows, inv.usage_places, inv.usage_pods
    marked = marked_spans(conn, start, end, R.c.bucket_start)
    places = clusters is not None or any(c not in ("namespace", "pod") for c in cols)
    keys = [R.c.place, R.c.pod] if places else [R.c.pod]
    # Sums that skip a NULL rather than add a 0 (the same float sums): at 100,000 GPUs a
    # day's edge is 2 million rows, and a CASE or COALESCE per row and figure was a fifth
    # of summing them. basis is 0, 1 or 2 (BASIS_CODES), so its greatest is the rank.
    measured = sa.func.sum(R.c.gpu_hours).filter
    inner = (sa.select(
        *keys,
        sa.func.sum(R.c.gpu_hours).label("gpu_hours"),
        sa.func.sum(R.c.gpu_hours * R.c.avg_utilisation_pct / 100.0).label("busy_gpu_hours"),
        sa.func.sum(R.c.energy_wh).label("energy_wh"),
        measured(R.c.energy_wh.is_not(None)).label("energy_measured_gpu_hours"),
        sa.func.sum(R.c.gpu_hours * R.c.avg_sm_active_pct / 100.0)
        .label("sm_active_gpu_hours"),
        measured(R.c.avg_sm_active_pct.is_not(None)).label("sm_measured_gpu_hours"),
        sa.func.max(R.c.basis).label("rank"))
        .where(R.c.bucket_start >= start, R.c.bucket_start < end, marked)
        .group_by(*keys)).subquery("h")
    joined = inner.join(D, D.c.id == inner.c.pod)
    if places:
        joined = joined.join(P, P.c.id == inner.c.place)
    named = [(D if c in ("namespace", "pod") else P).c[c] for c in cols]
    allocated = D.c.pod != ""
    stmt = (sa.select(
        *[n.label(c) for n, c in zip(named, cols, strict=True)],
        sa.func.sum(inner.c.gpu_hours).label("gpu_hours"),
        sa.func.sum(inner.c.gpu_hours).filter(allocated).label("allocated_gpu_hours"),
        *[sa.func.sum(inner.c[f]).label(f) for f in (
            "busy_gpu_hours", "energy_wh", "energy_measured_gpu_hours",
            "sm_active_gpu_hours", "sm_measured_gpu_hours")],
        sa.func.max(inner.c.rank).filter(allocated).label(RANK))
        .select_from(joined).group_by(*named))
    if clusters is not None:
        stmt = stmt.where(P.c.cluster.in_(sorted(clusters)))
    if namespaces is not None:
        stmt = stmt.where(D.c.namespace.in_(sorted(namespaces)))
    return stmt


def usage_summary(conn: Connection, start: dt.datetime, end: dt.datetime,
                  by: Sequence[str] = ("namespace",),
                  idle_threshold: float = IDLE_THRESHOLD_PCT, *,
                  idle_for: float = IDLE_FOR_S,
                  clusters: Collection[str] | None = None,
                  namespaces: Collection[str] | None = None,
                  rollup: bool = True, prices: Prices | None = None,
                  missing: dict | None = None, bill: Bill | None = None,
                  node_priced: dict | None = None,
                  idle: dict[tuple, float] | None = None,
                  beside: Engine | None = None) -> list[dict[str, Any]]:
    """One row per group over the buckets starting in [start, end), summed in the database
    (summary_select says from where). ``clusters`` and ``namespaces`` restrict the rows
    counted (a scoped API caller sees only its own). With ``prices`` each row also has
    ``cost`` and ``unpriced_gpu_hours`` (hub/usage/_prices.py): the database sums per group,
    cluster and model (a price is per cluster and model), and the groups add those up;
    ``missing`` (a dict) receives the unpriced GPU-hours per (cluster, model).
    idle_allocated_gpu_hours comes from idle_runs with ``idle_threshold`` and ``idle_for``,
    so it is exactly what `idle` lists (hub/usage/_idle.py); ``idle``, when given, is that
    figure per group already judged over a longer period (a day of the daily chart).
    ``bill`` (and instance-type prices) price a node's GPU-hours at what its node-hour cost
    (hub/usage/_bills.py); ``node_priced`` (a dict) receives those prices per GPU-hour per
    (cluster, node). Every cost row carries ``currency``: the bill's or the price file's
    (showback_currency refuses the two in different currencies before anything is read).

    ``beside`` (an engine of the same PostgreSQL database): the idle runs are asked on a
    connection of their own while ``conn`` sums the period, two statements of about the
    same cost at once (`usage --since 30d` at 100,000 GPUs on two cores: 0.78-0.86 s one
    after the other, 0.56-0.65 s side by side). One command holds two connections for
    it, so the CLI passes its engine; the service, whose requests share one pool, does
    not. As before, the two are separate statements: each sees whole buckets, and a bucket
    committed between them is in one only. Ignored on SQLite (one writer, one file)."""
    cols = group_columns(by)
    currency = showback_currency(prices, bill)
    if bill is not None and prices is None:
        prices = Prices({})
    per_node = needs_nodes(prices, bill)
    priced_by = ("cluster", "model", "node") if per_node else ("cluster", "model")
    read = cols + [c for c in priced_by if prices is not None and c not in cols]
    stmt = summary_select(conn, start, end, read, idle_threshold, clusters=clusters,
                          namespaces=namespaces, rollup=rollup, columns=read)
    if stmt is None:
        return []
    quick_answer(conn)

    def idle_hours(c: Connection) -> dict[tuple, float]:
        return idle_gpu_hours(idle_runs(c, start, end, threshold=idle_threshold,
                                        for_seconds=idle_for, clusters=clusters,
                                        namespaces=namespaces), cols)

    groups: dict[tuple, dict[str, Any]] = {}
    parts: list[tuple[tuple, Any]] = []
    with contextlib.ExitStack() as stack:
        pending: Future[dict[tuple, float]] | None = None
        if idle is None and beside is not None and beside.dialect.name == "postgresql":
            pool = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="usage-idle"))
            pending = pool.submit(_on_own_connection, beside, idle_hours)
            if set(read) <= set(inv.GROUP_KEYS):
                # The sums then read the group rollups and the edge hours, about as much
                # as the idle runs (one process) beside them: the answer takes as long as
                # the longer, and parallel workers for the sums would only take the idle
                # runs' cores (0.56-0.65 s against 0.73-0.83 s on two cores).
                conn.exec_driver_sql("SET LOCAL max_parallel_workers_per_gather = 0")
        elif idle is None:
            idle = idle_hours(conn)
        for r in conn.execute(stmt).mappings():
            key = tuple(r[c] for c in cols)
            group = groups.setdefault(key, {**{c: r[c] for c in cols},
                                            **dict.fromkeys(SUMS, 0.0), RANK: None})
            for f in SUMS:
                group[f] += float(r[f] or 0.0)
            if r[RANK] is not None:
                group[RANK] = max(group[RANK] or 0, int(r[RANK]))
            parts.append((key, r))
        judged = idle or {}
        if pending is not None:
            conn.exec_driver_sql("SET LOCAL max_parallel_workers_per_gather TO DEFAULT")
            judged = pending.result()
    if prices is not None:
        per_gpu_hour = node_prices(cloud_nodes(conn), prices, bill, start, end) \
            if per_node else None
        if node_priced is not None and per_gpu_hour:
            node_priced.update(per_gpu_hour)
        found = add_costs(groups, parts, prices, per_gpu_hour)
        if missing is not None:
            missing.update(found)
    out = []
    for group in groups.values():
        row = {c: group[c] for c in cols}
        for f in ("gpu_hours", "allocated_gpu_hours", "busy_gpu_hours"):
            row[f] = _settled(group[f], 6)
        row["idle_allocated_gpu_hours"] = _settled(
            judged.get(tuple(_blank(group[c]) for c in cols), 0.0), 6)
        row["avg_utilisation_pct"] = (_settled(100.0 * group["busy_gpu_hours"] /
                                            group["gpu_hours"], 3)
                                      if group["gpu_hours"] else None)
        # SM activity only over the GPU-hours that exported it: null where none did
        measured = group["sm_measured_gpu_hours"]
        row["sm_active_gpu_hours"] = (_settled(group["sm_active_gpu_hours"], 6)
                                      if measured else None)
        row["avg_sm_active_pct"] = (_settled(100.0 * group["sm_active_gpu_hours"] / measured, 3)
                                    if measured else None)
        # likewise energy: null where no GPU-hour of the group reported power (missing is
        # not zero); a group with some measured hours keeps the energy they measured
        row["energy_kwh"] = (_settled(group["energy_wh"] / 1000.0, 6)
                             if group["energy_measured_gpu_hours"] else None)
        row["allocation_basis"] = None if group[RANK] is None else BASES[group[RANK]]
        if prices is not None:
            row["cost"] = group["cost"]
            row["unpriced_gpu_hours"] = group["unpriced_gpu_hours"]
            row["currency"] = currency
        out.append(_clean(row))
    return out


def _on_own_connection(engine: Engine, read: Callable[[Connection], Any]) -> Any:
    """``read`` on a connection of ``engine``'s own, for an answer's part asked beside it."""
    with engine.connect() as conn:
        quick_answer(conn)
        return read(conn)


CAPACITY_GROUPS = {"model": ["model"], "cluster": ["cluster"], "node": ["cluster", "node"]}


def capacity(conn: Connection, by: Sequence[str] = ("model",), *,
             clusters: Collection[str] | None = None, now: dt.datetime | None = None,
             max_age: float | None = None, idle_threshold: float = IDLE_THRESHOLD_PCT,
             idle_for: float = IDLE_FOR_S) -> list[dict[str, Any]]:
    """GPU-equivalents per group now: total, active, then each GPU in one of stale, failed,
    allocated, cordoned, free (hub.usage._placement says which, the one reading of free the
    fits answer and the placement scores share), and reclaimable, the idle part of
    allocated (read only with ``now``). ``clusters`` limits it to those clusters (a caller
    whose scope hides fleet-wide counts)."""
    cols: list[str] = []
    for name in by:
        cols += [c for c in CAPACITY_GROUPS[name] if c not in cols]
    fleet = read_fleet(conn, clusters=clusters, now=now, max_age=max_age,
                       idle_threshold=idle_threshold, idle_for=idle_for)
    return totals(fleet.units, cols)


def usage_frame(conn: Connection, start: dt.datetime, end: dt.datetime):  # -> pandas.DataFrame
    """The ledger rows of buckets starting in [start, end) as a pandas DataFrame, for
    analysts (one row per GPU or slice, allocation and bucket; see docs/usage.md)."""
    import pandas as pd

    stmt = (sa.select(*[U.c[c] for c in inv.USAGE_COLUMNS])
            .where(U.c.bucket_start >= start, U.c.bucket_start < end)
            .order_by(U.c.bucket_start, U.c.cluster, U.c.node, U.c.uuid, U.c.slice))
    return pd.read_sql(stmt, conn)


def models_used(conn: Connection, start: dt.datetime, end: dt.datetime
                ) -> set[tuple[str | None, str | None]]:
    """The (cluster, model) pairs with GPU-hours in the buckets starting in [start, end):
    what a price file must name to bill them (hub.usage.unused_note)."""
    return {(r.cluster, r.model) for r in conn.execute(
        sa.select(U.c.cluster, U.c.model).where(U.c.bucket_start >= start,
                                                U.c.bucket_start < end,
                                                U.c.gpu_hours > 0).distinct())}
