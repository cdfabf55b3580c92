"""The usage ledger's writer: one row per GPU or MIG slice, allocation and bucket.

``collect_usage`` asks the hub a fixed set of PromQL requests per bucket (store.usage_queries;
their number does not depend on the fleet), folds the answers (hub/usage/_fold.py) and
replaces that bucket's rows, its day's rollup and its "collected" mark in one transaction
under the ledger's lock, so two writers (serve and a manual collect, two replicas) give the
ledger and rollup one writer gives, and re-collecting a bucket replaces it whole. A bucket
the store could not answer (hub down, partial response) is not written: it stays missing and
the next collect retries it, up to ``max_backfill`` back.

Rules that keep the figures billable:
- one bucket grid: the size is stored with the ledger (usage_ledger); a collect with another
  size is refused, never summed beside it (``replace_grid`` starts the ledger over);
- only ended buckets: a bucket is written once it ended at least the push interval ago
  (the hub has its last push); later ones are clipped, never marked collected empty;
- coverage at the push interval (see _fold.py);
- guard rails on retention and on the size of a period.

The daily rollup (``usage_daily``) is exactly the sum of the ledger's rows of each day: every
write rebuilds the days it touched. Its idle figure is for ROLLUP_IDLE_THRESHOLD only.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from hub import store
from hub.common import (
    LEDGER,
    QUERY_CONCURRENCY,
    SHARD_SIZE,
    GpufleetError,
    InputError,
    UnavailableError,
    format_duration,
    human_duration,
)
from hub.inventory import (
    ACTIVE,
    BASIS_CODES,
    DAY,
    GROUP_KEYS,
    LEDGER_LOCK_KEY,
    ROLLUP_IDLE_THRESHOLD,
    STALE,
    UsageKeys,
    cluster_sizes,
    day_of,
    drop_partitions_before,
    ensure_ahead,
    gpus,
    insert_rows,
    locked_transaction,
    month_of,
    next_month,
    now_utc,
    partitions,
    refused_inputs,
    upsert,
    usage,
    usage_buckets,
    usage_daily,
    usage_daily_groups,
    usage_flags,
    usage_idle_daily,
    usage_idle_monthly,
    usage_ledger,
    usage_monthly,
    usage_monthly_groups,
    usage_places,
    usage_pods,
    usage_rows,
    write_refused,
    write_usage_rows,
)
from hub.usage._fold import fold_bucket, utc
from hub.usage._meter import BASES

if TYPE_CHECKING:
    from hub.store import HubClient, Shard

#: A period of more buckets than this needs --yes (a year of hours is 8,760) ...
CONFIRM_BUCKETS = 1000
#: ... and no period may hold more (11 years of hours; older samples no hub keeps).
MAX_BUCKETS = 100_000
#: Retention under this would delete rows a normal collect has just written.
MIN_RETENTION = 86400.0
BUCKET_KEY = "bucket_seconds"


@dataclass
class CollectResult:
    collected: list[dt.datetime] = field(default_factory=list)
    failed: list[tuple[dt.datetime, str]] = field(default_factory=list)
    rows: int = 0
    requests: int = 0
    removed: int = 0
    #: buckets of the period asked for that had not ended a push interval ago
    clipped: int = 0
    not_before: dt.datetime | None = None  # the first bucket a later collect will write
    #: buckets left for the next collect because this one was asked to stop (SIGTERM)
    stopped: int = 0
    #: series and readings left out because a spoke sent them out of shape (issue 42)
    refused: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"collected": self.collected, "rows": self.rows, "requests": self.requests,
                "removed_by_retention": self.removed,
                "clipped_not_ended": self.clipped, "next_bucket": self.not_before,
                "left_by_stop": self.stopped, "refused": self.refused,
                "failed": [{"bucket_start": b, "error": e} for b, e in self.failed]}


# -- the plan: which buckets, on which grid --------------------------------------------------
def buckets_between(start: float, end: float, bucket: float) -> list[float]:
    """Starts of the whole buckets inside [start, end), aligned to multiples of the size."""
    first = math.ceil(start / bucket) * bucket
    count = int((end - first) // bucket) if end > first else 0
    if count > MAX_BUCKETS:
        raise InputError(f"the period holds {count:,} buckets of {format_duration(bucket)} "
                         f"(at most {MAX_BUCKETS:,}); narrow --from/--until")
    return [first + i * bucket for i in range(count)]


def check_settings(*, bucket: float, push_interval: float, resolution: float | None = None,
                   retention: float, max_backfill: float) -> float:
    """The coverage resolution after the checks a collect needs; one-line errors else."""
    if push_interval <= 0:
        raise InputError("--push-interval must be more than 0s")
    resolution = push_interval if resolution is None else resolution
    if resolution < push_interval:
        raise InputError(f"--step {format_duration(resolution)} is below the push interval "
                         f"{format_duration(push_interval)}: slots without a push would "
                         "count as gaps")
    if bucket <= 0 or not _whole(bucket, resolution):
        raise InputError(f"--bucket {format_duration(bucket)} must be a whole number of "
                         f"push intervals ({format_duration(resolution)})")
    if retention < max(MIN_RETENTION, max_backfill):
        raise InputError(f"--usage-retention {format_duration(retention)} would delete rows "
                         f"a collect writes; use at least "
                         f"{format_duration(max(MIN_RETENTION, max_backfill))} "
                         "(1d, and no less than --max-backfill)")
    return resolution


def _whole(bucket: float, step: float) -> bool:
    n = bucket / step
    return abs(n - round(n)) < 1e-9 and round(n) >= 1


def ledger_bucket(conn: Connection) -> float | None:
    """The ledger's bucket size: stored, or (a ledger from before it was stored) read off
    its collected buckets; None for an empty ledger."""
    stored = conn.execute(sa.select(usage_ledger.c.value)
                          .where(usage_ledger.c.key == BUCKET_KEY)).scalar()
    if stored is not None:
        return float(stored)
    sizes = {(r.bucket_end - r.bucket_start).total_seconds() for r in conn.execute(
        sa.select(usage_buckets.c.bucket_start, usage_buckets.c.bucket_end).distinct())}
    if len(sizes) > 1:
        raise InputError("the usage ledger holds buckets of several sizes ("
                         + ", ".join(format_duration(s) for s in sorted(sizes))
                         + "); start it over on one grid with `gpufleet usage collect "
                         "--replace-grid --yes`")
    return sizes.pop() if sizes else None


def claim_grid(conn: Connection, bucket: float) -> None:
    """Store the bucket size with the ledger, or refuse another one (the caller holds the
    ledger's lock, so two first collects cannot store two sizes)."""
    have = ledger_bucket(conn)
    if have is None or have == bucket:
        if conn.execute(sa.select(usage_ledger.c.value)
                        .where(usage_ledger.c.key == BUCKET_KEY)).scalar() is None:
            conn.execute(usage_ledger.insert().values(key=BUCKET_KEY, value=f"{bucket:g}"))
        return
    raise InputError(f"the usage ledger's buckets are {format_duration(have)}, not "
                     f"{format_duration(bucket)}: buckets of two sizes would be summed side "
                     f"by side; use --bucket {format_duration(have)}, or start the ledger "
                     "over with --replace-grid --yes")


def replace_grid(engine: Engine, bucket: float, lock_timeout: float = 60.0) -> int:
    """Start the ledger over on a new grid, empty: every row, mark and rollup day goes.
    Returns rows removed. `usage collect --replace-grid` uses :func:`collect_on_new_grid`,
    which swaps only once the new grid's first bucket is in hand."""
    with _ledger_transaction(engine, lock_timeout) as conn:
        return _start_over(conn, bucket)


def _start_over(conn: Connection, bucket: float) -> int:
    removed = conn.execute(usage_rows.delete()).rowcount or 0
    conn.execute(usage_places.delete())
    conn.execute(usage_pods.delete())
    conn.execute(usage_flags.delete())
    conn.execute(usage_buckets.delete())
    conn.execute(usage_daily.delete())
    conn.execute(usage_idle_daily.delete())
    conn.execute(usage_monthly.delete())
    conn.execute(usage_idle_monthly.delete())
    conn.execute(usage_daily_groups.delete())
    conn.execute(usage_monthly_groups.delete())
    conn.execute(refused_inputs.delete().where(refused_inputs.c.source == "usage"))
    conn.execute(usage_ledger.delete().where(usage_ledger.c.key == BUCKET_KEY))
    conn.execute(usage_ledger.insert().values(key=BUCKET_KEY, value=f"{bucket:g}"))
    return removed


def pending_buckets(conn: Connection, *, now: float, bucket: float, max_backfill: float,
                    delay: float) -> list[float]:
    """Ended buckets (end + delay <= now) within max_backfill not collected yet."""
    starts = buckets_between(now - max_backfill, now - delay, bucket)
    if not starts:
        return []
    done = {r for (r,) in conn.execute(sa.select(usage_buckets.c.bucket_start).where(
        usage_buckets.c.bucket_start >= utc(starts[0])))}
    return [s for s in starts if utc(s) not in done]


# -- asking the hub ---------------------------------------------------------------------------
def _alloc_step(push_interval: float) -> float:
    """The step at which the allocations' last samples are found: at most a push interval
    and the store's 5-minute look-back, so every sample is the newest at one step."""
    return min(push_interval, 300.0)


def bucket_queries(bucket: float, resolution: float, push_interval: float,
                   cluster_label: str, allocations: bool = True,
                   shard: str = "", min_charge: float = 0.0,
                   held: Container[str] | None = None) -> list[store.Query]:
    """A bucket's fixed request set: the samples' (store.usage_queries) and, where the hub
    holds allocation series, the allocations' edges (store.allocation_queries), these over
    the bucket and a push interval each side, plus one step (see _ask), and ``min_charge``
    further back: an allocation that ended before the bucket is still charged in it up to
    its minimum, so its edges must be read (a 10 s pod charged 60 s on 12 s buckets was
    charged only in the bucket of its end). ``held``: the metric names the store holds
    (_held_names); a query none (or, for an allocation's, not all) of whose names it holds
    is left out, its answer being empty."""
    step = _alloc_step(push_interval)
    samples = store.usage_queries(format_duration(bucket), format_duration(resolution),
                                  cluster_label, shard, held)
    if not allocations:
        return samples
    window = bucket + 2 * push_interval + step + min_charge
    return [*samples,
            *store.allocation_queries(format_duration(window), format_duration(step),
                                      cluster_label, shard, held)]


def _held_names(client: HubClient, starts: list[float], bucket: float, resolution: float,
                push_interval: float, min_charge: float) -> frozenset[str] | None:
    """The metric names the store holds over every window these buckets' queries read (one
    request from its index; None: a store without that API, asked every query), as the
    sync asks: at 100,000 GPUs in the bench's fleet 16 of a bucket's 27 queries a shard
    read only names no exporter sent, each costing the store the shard's postings."""
    if not starts:
        return None
    reach = bucket + 2 * push_interval + _alloc_step(push_interval) + min_charge + resolution
    return client.metric_names(min(starts) - reach, max(starts) + bucket + reach)


def _has_allocations(client: HubClient, starts: list[float], now: float,
                     push_interval: float, cluster_label: str, min_charge: float = 0.0) -> bool:
    """Whether the hub holds any allocation series from the first bucket on, or from as
    far before it as an allocation's minimum charge reaches into it (one request per
    collect; without any, every bucket is sampled and asks 8 requests fewer)."""
    if not starts:
        return False
    window = format_duration(max(push_interval,
                                 math.ceil(now - min(starts) + push_interval + min_charge)))
    answer = client.query(store.allocation_probe(window, cluster_label), time=now)
    return any(float(r["value"][1]) > 0 for r in answer.result)


def _ask(client: HubClient, queries: list[store.Query], start: float, bucket: float,
         resolution: float, push_interval: float | None = None,
         refused: store.Refused | None = None
         ) -> Iterator[tuple[store.Query, Iterable[Mapping[str, Any]]]]:
    """Each query's answer in turn, coverage first (fold_bucket weighs averages by it),
    decoded row by row as the fold reads it: one answer's rows exist at a time, not the
    whole bucket's. A partial answer raises once its rows are read (Thanos sends the
    warnings after them), before anything is written. Series the store's door turned away
    are counted in ``refused`` (against their cluster) once their answer is read."""
    label = refused.cluster_label if refused is not None else "cluster"
    end = start + bucket
    for query in sorted(queries, key=lambda q: q.kind != "coverage"):
        # avg/max: the samples in [start, end) (1 ms before the end, so a sample exactly on a
        # boundary belongs to one bucket); coverage: one slot later, see usage_queries.
        at = end - 0.001 + (resolution if query.kind == "coverage" else 0.0)
        if query.kind.startswith(("alloc:", "edge:")):
            # allocations: a push interval later, so the push after a short pod carries its
            # edges and a pod held past the end has a sample after it, plus one step, the
            # subqueries' last point (steps are aligned to multiples of the step)
            push = push_interval or resolution
            at = end - 0.001 + push + _alloc_step(push)
        res = client.query(query.promql, time=at, stream=True, cluster_label=label)
        yield query, res.result
        if refused is not None and hasattr(res.result, "refused"):
            refused.merge(res.result.refused)
        warnings = getattr(res.result, "warnings", None) or res.warnings
        if warnings:
            raise store.PartialResponse(f"hub {client.safe_url} returned a partial response "
                                        f"({warnings[0]}); bucket left for a later collect")


class _LabelCheck:
    """Tells a typo'd --cluster-label from a quiet fleet when a bucket comes back empty: GPU
    series in the bucket while none carries the label, in that bucket's day nor in the last
    day (as `sync` says). A quiet fleet, or one spoke without the label beside labelled ones
    (left out, and named by the report), is not a typo. "Labelled series in the last day" is
    asked once per collect, not per empty bucket: a backfill over an idle history (a new hub,
    the demo's first hour) is many empty buckets with the same answer."""

    def __init__(self, client: HubClient, cluster_label: str, now: float) -> None:
        self.client, self.label, self.now = client, cluster_label, now
        self._labelled_now: bool | None = None

    def _some(self, promql: str, at: float) -> bool:
        return any(float(r["value"][1]) > 0 for r in self.client.query(promql, time=at).result)

    def typo(self, start: float, bucket: float) -> GpufleetError | None:
        day = format_duration(86400.0)
        if self._labelled_now is None:
            self._labelled_now = self._some(store.labelled_probe(day, self.label), self.now)
        if self._labelled_now:
            return None
        end = start + bucket
        if (not self._some(store.labelled_probe(format_duration(bucket)), end)
                or self._some(store.labelled_probe(day, self.label), end)):
            return None
        return InputError(f"no GPU series carries the cluster label {self.label!r} "
                          "(check --cluster-label and the spokes' external_labels); "
                          "nothing written")


def _known(conn: Connection) -> dict[tuple[str, str], tuple[str | None, float | None]]:
    """Model and memory of every GPU the inventory knows, for rows the hub labels less."""
    return {(r.uuid, r.slice_key): (r.model, r.memory_total_mib) for r in conn.execute(
        sa.select(gpus.c.uuid, gpus.c.slice_key, gpus.c.model, gpus.c.memory_total_mib))}


def _node_gpus(conn: Connection) -> dict[tuple[str, str], int]:
    """GPUs per (cluster, node) the inventory holds now (active or stale): a pod's requests
    never count more GPUs than its node has (hub/usage/_meter.py)."""
    return {(r.cluster, r.node): int(r.n) for r in conn.execute(
        sa.select(gpus.c.cluster, gpus.c.node,
                  sa.func.count(sa.distinct(gpus.c.uuid)).label("n"))
        .where(gpus.c.state.in_((ACTIVE, STALE))).group_by(gpus.c.cluster, gpus.c.node))}


# -- writing ----------------------------------------------------------------------------------
class _Spilled:
    """A bucket's rows, set aside on disk a shard at a time as each shard is folded (the
    write reads them back a shard at a time: memory follows the shard), with what else its
    shards said: the meter's corrections and what their answers left out."""

    def __init__(self, cluster_label: str = "cluster") -> None:
        self._rows: store.Spill[dict[str, Any]] = store.Spill("gpufleet-usage-")
        self.flags: list[dict[str, str]] = []  # the meter's corrections (few: kept here)
        #: what the bucket's shards left out (hub.store._bounds), per cluster
        self.refused = store.Refused(cluster_label)

    @property
    def rows(self) -> int:
        return self._rows.rows

    def add(self, rows: list[dict[str, Any]], flags: list[dict[str, str]],
            refused: store.Refused) -> None:
        self._rows.add(rows)
        self.flags += flags
        self.refused.merge(refused)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._rows)

    def close(self) -> None:
        self._rows.close()


def usage_shards(conn: Connection, shard_size: int, cluster_label: str) -> list[Shard]:
    """Shards of whole clusters by the inventory's GPUs (and slices) per cluster, as the sync
    plans its own (no request: the sync has counted them); the last shard has the rest, a
    cluster the inventory does not know yet included."""
    return store.plan_shards(cluster_sizes(conn), shard_size, cluster_label)


def _fold_shards(client: HubClient, shards: list[Shard], start: float, bucket: float,
                 resolution: float, cluster_label: str, known: Mapping[Any, Any],
                 concurrency: int, *, push_interval: float, min_charge: float,
                 metered: bool,
                 node_gpus: Mapping[tuple[str, str], int] | None = None,
                 held: Container[str] | None = None) -> _Spilled:
    """Every shard's rows of one bucket, at most ``concurrency`` shards asked at once (each
    shard's requests one after the other, coverage first, folded as they stream in: one
    job of store.run_shards), each shard's rows set aside as it finishes; the first failure
    raises, naming its shard's clusters. Shards hold whole clusters, so a pod's allocation
    and the GPUs it holds are always folded together."""

    def one(shard: Shard) -> tuple[list[dict[str, Any]], list[dict[str, str]], store.Refused]:
        queries = bucket_queries(bucket, resolution, push_interval, cluster_label, metered,
                                 shard.matcher, min_charge, held)
        flags: list[dict[str, str]] = []
        refused = store.Refused(cluster_label)
        return fold_bucket(_ask(client, queries, start, bucket, resolution, push_interval,
                                refused),
                           start=start, bucket=bucket, resolution=resolution,
                           cluster_label=cluster_label, known=known,
                           push_interval=push_interval, min_charge=min_charge,
                           node_gpus=node_gpus, flags=flags, refused=refused), flags, refused

    spilled = _Spilled(cluster_label)
    try:
        store.run_shards(shards, lambda shard: [functools.partial(one, shard)],
                         lambda _shard, folded: spilled.add(*folded),
                         concurrency=concurrency,
                         consequence="bucket left for a later collect", name="usage-shard")
    except BaseException:
        spilled.close()
        raise
    return spilled


def _ledger_transaction(engine: Engine, lock_timeout: float):
    return locked_transaction(engine, lock_timeout, key=LEDGER_LOCK_KEY,
                              holder="usage ledger writer")


def collect_usage(engine: Engine, client: HubClient, *,
                  bucket: float = LEDGER.usage_bucket,
                  push_interval: float = LEDGER.push_interval, resolution: float | None = None,
                  starts: list[float] | None = None,
                  max_backfill: float = LEDGER.usage_max_backfill,
                  retention: float = LEDGER.usage_retention,
                  cluster_label: str = LEDGER.cluster_label,
                  now: float | None = None, lock_timeout: float = 60.0,
                  on_bucket: Callable[[dt.datetime, int], None] | None = None,
                  shard_size: int = SHARD_SIZE, concurrency: int = QUERY_CONCURRENCY,
                  stop: Callable[[], bool] = lambda: False,
                  min_charge: float = 0.0) -> CollectResult:
    """Collect the given buckets (or every pending one), one locked transaction per bucket.

    A bucket's queries are asked per shard of whole clusters of about ``shard_size`` GPUs
    (planned from the inventory), ``concurrency`` shards at once; each shard's rows are set
    aside as they are folded and the bucket is written from them in one transaction.

    ``stop`` is asked before each bucket: once it says yes (SIGTERM) the collect ends
    between two buckets, every written bucket whole, and the next collect resumes with the
    ones left (they are still pending); ``stopped`` in the result says so.

    ``push_interval`` is the cadence samples reach the hub at (ACM: 300 s): the coverage
    resolution and the delay after a bucket's end before it is complete. ``resolution``
    (`--step`) may coarsen coverage, never go below the push interval. ``min_charge``
    (`--min-charge`, off by default) is the least an ended allocation is charged.
    """
    resolution = check_settings(bucket=bucket, push_interval=push_interval,
                                resolution=resolution, retention=retention,
                                max_backfill=max_backfill)
    now = time.time() if now is None else now
    delay = push_interval
    result = CollectResult()
    with _ledger_transaction(engine, lock_timeout) as conn:
        claim_grid(conn, bucket)
        shards = usage_shards(conn, shard_size, cluster_label)
        if starts is None:
            starts = pending_buckets(conn, now=now, bucket=bucket, max_backfill=max_backfill,
                                     delay=delay)
        known = _known(conn)
        node_gpus = _node_gpus(conn)
    ended = [s for s in starts if s + bucket + delay <= now]
    result.clipped = len(starts) - len(ended)
    if result.clipped:
        first_open = min(set(starts) - set(ended))
        result.not_before = utc(first_open)
    labels = _LabelCheck(client, cluster_label, now)
    before = client.requests
    try:
        metered = _has_allocations(client, ended, now, push_interval, cluster_label,
                                   min_charge)
    except GpufleetError:  # the hub did not answer: each bucket's own requests say so
        metered = True
    try:
        held = _held_names(client, ended, bucket, resolution, push_interval, min_charge)
    except GpufleetError:  # likewise: every query asked, each bucket's own failure named
        held = None
    result.requests += client.requests - before
    for start in ended:
        if stop():
            result.stopped = len(ended) - len(result.collected) - len(result.failed)
            break
        before = client.requests
        try:
            rows = _fold_shards(client, shards, start, bucket, resolution, cluster_label,
                                known, concurrency, push_interval=push_interval,
                                min_charge=min_charge, metered=metered, node_gpus=node_gpus,
                                held=held)
            try:
                if not rows.rows and (typo := labels.typo(start, bucket)):
                    raise typo
            except BaseException:
                rows.close()
                raise
        except InputError:
            raise
        except GpufleetError as exc:
            result.requests += client.requests - before
            result.failed.append((utc(start), exc.format_message()))
            continue
        requests = client.requests - before
        try:
            with _ledger_transaction(engine, lock_timeout) as conn:
                claim_grid(conn, bucket)
                write_bucket(conn, start, bucket, rows, requests, count=rows.rows,
                             flags=rows.flags, refused=rows.refused)
        finally:
            rows.close()
        result.collected.append(utc(start))
        result.rows += rows.rows
        result.refused += rows.refused.total()
        result.requests += requests
        if on_bucket:
            on_bucket(utc(start), rows.rows)
    if not result.stopped:  # stopping: out within the promised time, retention next time
        with _ledger_transaction(engine, lock_timeout) as conn:
            result.removed = apply_retention(conn, now - retention)
    return result


def collect_on_new_grid(engine: Engine, client: HubClient, *,
                        bucket: float = LEDGER.usage_bucket,
                        push_interval: float = LEDGER.push_interval,
                        resolution: float | None = None, starts: list[float] | None = None,
                        max_backfill: float = LEDGER.usage_max_backfill,
                        retention: float = LEDGER.usage_retention,
                        cluster_label: str = LEDGER.cluster_label,
                        now: float | None = None, lock_timeout: float = 60.0,
                        on_bucket: Callable[[dt.datetime, int], None] | None = None,
                        shard_size: int = SHARD_SIZE, concurrency: int = QUERY_CONCURRENCY,
                        min_charge: float = 0.0) -> tuple[int, CollectResult]:
    """`--replace-grid`: the ledger on ``bucket``'s grid without a moment of it empty for
    nothing. The hub is asked first (down: UnavailableError, the ledger untouched); the new
    grid's first bucket is folded, in shards as every bucket is (its rows set aside on disk
    meanwhile); only then, in one transaction under the ledger's lock, the old rows go and
    that bucket is written. The rest is an ordinary collect on the new grid. Returns (rows
    removed, the collect's result)."""
    resolution = check_settings(bucket=bucket, push_interval=push_interval,
                                resolution=resolution, retention=retention,
                                max_backfill=max_backfill)
    now = time.time() if now is None else now
    planned = (starts if starts is not None else
               buckets_between(now - max_backfill, now - push_interval, bucket))
    ended = [s for s in planned if s + bucket + push_interval <= now]
    try:
        client.query("vector(1)", time=now)
    except GpufleetError as exc:
        raise UnavailableError(f"the hub does not answer ({exc.format_message()}); the "
                               "usage ledger is unchanged (--replace-grid swaps grids "
                               "only once the new one's first bucket is collected)") from None
    with engine.connect() as conn:
        known = _known(conn)
        node_gpus = _node_gpus(conn)
        shards = usage_shards(conn, shard_size, cluster_label)
    first = ended[0] if ended else None
    rows: _Spilled | None = None
    requests = 0
    try:
        if first is not None:
            before = client.requests
            try:
                # allocation series or not, the first bucket asks for them (no probe first)
                held = _held_names(client, [first], bucket, resolution, push_interval,
                                   min_charge)
                rows = _fold_shards(client, shards, first, bucket, resolution, cluster_label,
                                    known, concurrency, push_interval=push_interval,
                                    min_charge=min_charge, metered=True, node_gpus=node_gpus,
                                    held=held)
                if not rows.rows and (
                        typo := _LabelCheck(client, cluster_label, now).typo(first, bucket)):
                    raise typo
            except InputError:
                raise
            except GpufleetError as exc:
                raise UnavailableError(f"the new grid's first bucket "
                                       f"{utc(first).isoformat()}Z could not be collected "
                                       f"({exc.format_message()}); the usage ledger is "
                                       "unchanged") from None
            requests = client.requests - before
        with _ledger_transaction(engine, lock_timeout) as conn:
            removed = _start_over(conn, bucket)
            if first is not None and rows is not None:
                write_bucket(conn, first, bucket, rows, requests, count=rows.rows,
                             flags=rows.flags, refused=rows.refused)
    finally:
        if rows is not None:
            rows.close()
    if first is not None and rows is not None and on_bucket:
        on_bucket(utc(first), rows.rows)
    rest = None if starts is None else [s for s in starts if s != first]
    result = collect_usage(engine, client, bucket=bucket, push_interval=push_interval,
                           resolution=resolution, starts=rest, max_backfill=max_backfill,
                           retention=retention, cluster_label=cluster_label, now=now,
                           lock_timeout=lock_timeout, on_bucket=on_bucket,
                           shard_size=shard_size, concurrency=concurrency,
                           min_charge=min_charge)
    if first is not None and rows is not None:
        result.collected.insert(0, utc(first))
        result.rows += rows.rows
        result.requests += requests
        result.refused += rows.refused.total()
    return removed, result


def write_bucket(conn: Connection, start: float, bucket: float,
                 rows: Iterable[dict[str, Any]], requests: int,
                 count: int | None = None, flags: Iterable[Mapping[str, str]] = (),
                 refused: store.Refused | None = None) -> None:
    """Replace one bucket's rows and the meter's flags, rebuild its day's rollup, mark it
    collected (the caller holds the ledger's lock and commits all of it at once). ``rows``
    may be read once (a shard at a time): then ``count`` says how many. ``refused``: what
    its answers left out, per cluster (replaced with the bucket)."""
    begin = utc(start)
    ensure_ahead(conn, begin)  # its month's partitions and the next's (PostgreSQL)
    built = months_built(conn)  # before the mark: this bucket may begin a new month
    keys = UsageKeys()
    keys.months.add(month_of(begin))  # just made sure of: the rows' write asks no more
    conn.execute(usage_rows.delete().where(usage_rows.c.bucket_start == begin))
    written = write_usage_rows(conn, rows, keys)
    count = written if count is None else count
    conn.execute(usage_flags.delete().where(usage_flags.c.bucket_start == begin))
    insert_rows(conn, usage_flags, _one_per_pod(begin, flags))
    write_refused(conn, "usage", begin, refused or store.Refused())
    # the mark before the rollup: the ledger's view takes each row's end from it
    upsert(conn, usage_buckets, [{
        "bucket_start": begin, "bucket_end": utc(start + bucket), "collected_at": now_utc(),
        "rows": count, "requests": requests}],
        update=("bucket_end", "collected_at", "rows", "requests"))
    rebuild_days(conn, [day_of(begin)])
    _keep_months(conn, built, [day_of(begin)])


def _one_per_pod(begin: dt.datetime,
                 flags: Iterable[Mapping[str, str]]) -> list[dict[str, Any]]:
    """The bucket's flags, one row per pod and kind (the meter may correct a pod twice:
    its details are joined)."""
    out: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for f in flags:
        key = (f["cluster"], f["namespace"], f["pod"], f["flag"])
        have = out.get(key)
        if have is None:
            out[key] = {**f, "bucket_start": begin}
        elif f["detail"] not in have["detail"]:
            have["detail"] += "; " + f["detail"]
            have["node"] = have["node"] or f["node"]
    return list(out.values())


def apply_retention(conn: Connection, before: float) -> int:
    """Remove the ledger's rows, marks, flags and rollups before ``before``. On PostgreSQL
    the months wholly before the cut go as whole partitions (their rows counted from their
    buckets' marks, without reading them); the rows of the month the cut falls in are
    deleted one by one, as on SQLite. Returns the rows removed."""
    cut = utc(before)
    removed = _drop_months(conn, cut)
    removed += conn.execute(usage_rows.delete().where(usage_rows.c.bucket_start < cut)
                           ).rowcount or 0
    conn.execute(usage_flags.delete().where(usage_flags.c.bucket_start < cut))
    conn.execute(usage_buckets.delete().where(usage_buckets.c.bucket_start < cut))
    conn.execute(usage_daily.delete().where(usage_daily.c.day < day_of(cut)))
    conn.execute(usage_idle_daily.delete().where(usage_idle_daily.c.day < day_of(cut)))
    conn.execute(usage_daily_groups.delete().where(usage_daily_groups.c.day < day_of(cut)))
    for table in (usage_monthly, usage_idle_monthly, usage_monthly_groups):
        conn.execute(table.delete().where(table.c.month < month_of(cut)))
    conn.execute(refused_inputs.delete().where(refused_inputs.c.source == "usage",
                                               refused_inputs.c.at < cut))
    if removed:
        rebuild_days(conn, [day_of(cut)])  # the day the cut falls in lost its first hours
    built = months_built(conn)
    if built is not None and month_of(cut) < built:
        # the cut's month lost the days (or hours) before it: its sums are its days' again
        rebuild_months(conn, [month_of(cut)])
    return removed


def _drop_months(conn: Connection, cut: dt.datetime) -> int:
    """Drop the ledger's partitions of the months wholly before ``cut`` (PostgreSQL; none
    on SQLite); returns how many rows they held, as their buckets' marks say."""
    months = partitions(conn, "usage_rows")
    gone = [m for m in months if next_month(m) <= cut]
    removed = 0
    for month in gone:
        removed += conn.execute(sa.select(sa.func.coalesce(sa.func.sum(usage_buckets.c.rows),
                                                           0)).where(
            usage_buckets.c.bucket_start >= month,
            usage_buckets.c.bucket_start < next_month(month))).scalar() or 0
    drop_partitions_before(conn, "usage_rows", cut)
    drop_partitions_before(conn, "usage_daily", day_of(cut))
    drop_partitions_before(conn, "usage_idle_daily", day_of(cut))
    return int(removed)


def rollup_sums(table: sa.Table | sa.Subquery, when: sa.ColumnElement
                ) -> list[sa.ColumnElement]:
    """The summed figures of ledger rows, labelled like usage_daily's columns (the one place
    that says how a ledger row counts; usage answers use it on the ledger's edge hours)."""
    allocated = table.c.pod != ""
    util = sa.func.coalesce(table.c.avg_utilisation_pct, 0.0)
    zero = sa.literal(0.0)
    sm = table.c.avg_sm_active_pct
    return [
        sa.func.sum(table.c.gpu_hours).label("gpu_hours"),
        sa.func.sum(sa.case((allocated, table.c.gpu_hours), else_=zero))
        .label("allocated_gpu_hours"),
        sa.func.sum(table.c.gpu_hours * util / 100.0).label("busy_gpu_hours"),
        sa.func.sum(sa.case((sa.and_(allocated, when), table.c.gpu_hours), else_=zero))
        .label("idle_allocated_gpu_hours"),
        sa.func.sum(sa.func.coalesce(table.c.energy_wh, 0.0)).label("energy_wh"),
        # the GPU-hours whose power was reported: a group where none was has unknown
        # energy (null), not 0 Wh (a GPU whose exporter sends no power series)
        sa.func.sum(sa.case((table.c.energy_wh.is_not(None), table.c.gpu_hours), else_=zero))
        .label("energy_measured_gpu_hours"),
        sa.func.sum(sa.func.coalesce(table.c.gpu_hours * sm / 100.0, zero))
        .label("sm_active_gpu_hours"),
        sa.func.sum(sa.case((sm.is_not(None), table.c.gpu_hours), else_=zero))
        .label("sm_measured_gpu_hours"),
        sa.func.max(sa.case((allocated, basis_rank(table.c.allocation_basis)), else_=None))
        .label("allocation_basis_rank"),
    ]


def basis_rank(column: sa.ColumnElement) -> sa.ColumnElement:
    """A row's allocation_basis as its rank (0 interval, 1 estimated, 2 sampled): the
    greatest rank of a group's allocated rows says how exact its allocated hours are."""
    return sa.case(*[(column == b, i) for i, b in enumerate(BASES[:-1])],
                   else_=len(BASES) - 1)


ROLLUP_KEYS = ["cluster", "node", "uuid", "slice", "namespace", "model"]


IDLE_KEYS = ["cluster", "node", "uuid", "slice", "namespace", "pod"]


def idle_bucket(table: sa.Table, threshold: float) -> list[sa.ColumnElement[bool]]:
    """A ledger row is an idle allocated bucket: a pod held the GPU, it had samples, and a
    measured utilisation stayed under the threshold (an unknown one is no evidence)."""
    return [table.c.pod != "", table.c.gpu_hours > 0,
            table.c.avg_utilisation_pct.is_not(None),
            table.c.avg_utilisation_pct < threshold]


def rebuild_days(conn: Connection, days: Iterable[dt.datetime], *,
                 by_names: bool = False) -> None:
    """Replace the rollup rows of these days (usage_daily and usage_idle_daily) by the sums
    of the ledger rows starting in them. ``by_names``: sum the ``usage`` relation by its
    names, as gpufleet did before the compact ledger (0024 and older, where ``usage`` is a
    table of strings: the migrations' tests build such a ledger)."""
    groups = groups_built(conn)
    for day in sorted(set(days)):
        conn.execute(usage_idle_daily.delete().where(usage_idle_daily.c.day == day))
        idle = (sa.select(sa.literal(day, sa.DateTime).label("day"),
                          *[usage.c[k] for k in IDLE_KEYS], sa.func.min(usage.c.model),
                          sa.func.count(), sa.func.min(usage.c.bucket_start),
                          sa.func.max(usage.c.bucket_end), sa.func.sum(usage.c.gpu_hours),
                          sa.func.sum(usage.c.gpu_hours * usage.c.avg_utilisation_pct))
                .where(usage.c.bucket_start >= day, usage.c.bucket_start < day + DAY,
                       *idle_bucket(usage, ROLLUP_IDLE_THRESHOLD))
                .group_by(*[usage.c[k] for k in IDLE_KEYS]))
        conn.execute(usage_idle_daily.insert().from_select(
            ["day", *IDLE_KEYS, "model", "buckets", "first_start", "last_end", "gpu_hours",
             "busy"], idle))
        conn.execute(usage_daily.delete().where(usage_daily.c.day == day))
        select = _daily_by_names(day) if by_names else _daily_select(day)
        conn.execute(usage_daily.insert().from_select(
            [c.name for c in select.selected_columns], select))
        if groups:
            _sum_days(conn, usage_daily, usage_daily_groups, "day", day, day + DAY,
                      GROUP_KEYS)


def months_built(conn: Connection) -> dt.datetime | None:
    """The months before this one have their monthly rollups (usage_monthly and
    usage_idle_monthly): every month before the latest collected bucket's. None: no bucket
    collected, so no month either; and none on a schema from before them (0027 and older:
    the migrations' tests write and read such a ledger with this code)."""
    if not sa.inspect(conn).has_table(usage_monthly.name):
        return None
    latest = conn.execute(sa.select(sa.func.max(usage_buckets.c.bucket_start))).scalar()
    return None if latest is None else month_of(latest)


def groups_built(conn: Connection) -> bool:
    """Whether the schema has the group rollups (usage_daily_groups, usage_monthly_groups):
    not before 0030 (the migrations' tests write and read older ledgers with this code)."""
    return sa.inspect(conn).has_table(usage_daily_groups.name)


def _sum_days(conn: Connection, source: sa.Table, target: sa.Table, period: str,
              start: dt.datetime, end: dt.datetime, keys: Sequence[str]) -> None:
    """Replace ``target``'s rows of the period ``start`` by the sums of ``source``'s days
    in [start, end) per ``keys``: a month of the daily rollup per GPU (usage_monthly), a
    day of it per cluster, namespace and model (usage_daily_groups), a month of those
    (usage_monthly_groups)."""
    conn.execute(target.delete().where(target.c[period] == start))
    key = [source.c[k] for k in keys]
    conn.execute(target.insert().from_select(
        [period, *keys, *MONTH_SUMS],
        sa.select(sa.literal(start, sa.DateTime), *key, *_month_sums(source))
        .where(source.c.day >= start, source.c.day < end)
        .group_by(*key)))


def _month_sums(daily: sa.Table) -> list[sa.ColumnElement]:
    """A daily rollup's figures summed over a month (or a day's into its groups), labelled
    as MONTH_SUMS: sums, and the allocation basis rank's greatest."""
    return [(sa.func.max if c == RANK_COLUMN else sa.func.sum)(daily.c[c]).label(c)
            for c in MONTH_SUMS]


def _keep_months(conn: Connection, built: dt.datetime | None,
                 days: Iterable[dt.datetime]) -> None:
    """After a write rebuilt ``days``: rebuild the built months they fall in, and build the
    months that the write made whole (``built``: months_built before it). A month is
    summed once when the first bucket after it is written (at 100,000 GPUs some 3 million
    daily rows, once a month) and again only when a bucket of it is collected again."""
    now = months_built(conn)
    if now is None:
        return
    months = {month_of(d) for d in days if month_of(d) < now}
    if built is not None:
        month = built
        while month < now:
            months.add(month)
            month = next_month(month)
    rebuild_months(conn, months)


def rebuild_months(conn: Connection, months: Iterable[dt.datetime]) -> None:
    """Replace the monthly rollup rows of these months (00:00 UTC on the 1st) by the sums
    of their daily rollup rows."""
    groups = groups_built(conn)
    for month in sorted(set(months)):
        until = next_month(month)
        _sum_days(conn, usage_daily, usage_monthly, "month", month, until, ROLLUP_KEYS)
        if groups:
            _sum_days(conn, usage_daily_groups, usage_monthly_groups, "month", month, until,
                      GROUP_KEYS)
        conn.execute(usage_idle_monthly.delete().where(usage_idle_monthly.c.month == month))
        idle = usage_idle_daily
        conn.execute(usage_idle_monthly.insert().from_select(
            ["month", *IDLE_KEYS, "model", "buckets", "first_start", "last_end",
             "gpu_hours", "busy"],
            sa.select(sa.literal(month, sa.DateTime), *[idle.c[k] for k in IDLE_KEYS],
                      sa.func.min(idle.c.model), sa.func.sum(idle.c.buckets),
                      sa.func.min(idle.c.first_start), sa.func.max(idle.c.last_end),
                      sa.func.sum(idle.c.gpu_hours), sa.func.sum(idle.c.busy))
            .where(idle.c.day >= month, idle.c.day < until)
            .group_by(*[idle.c[k] for k in IDLE_KEYS])))


def marked_spans(conn: Connection, start: dt.datetime, end: dt.datetime,
                 column: sa.ColumnElement) -> sa.ColumnElement[bool]:
    """``column`` (a usage_rows row's bucket_start in [start, end)) in a marked bucket: a
    row counts once its bucket is marked, as in the ``usage`` view. On PostgreSQL as ranges
    of the marks: the writer stores a bucket's rows at its mark's start (write_bucket, in
    one transaction with the mark), so consecutive marks (each ending where the next
    starts) are one range of their starts, which PostgreSQL reads with parallel workers (a
    semi-join on the marks read each bucket's rows alone: at 100,000 GPUs a day's edge
    hours took about twice as long). On SQLite a semi-join on the period's marks, compared
    as stored (older ledgers there store some times in another text form)."""
    B = usage_buckets
    marks = sa.select(B.c.bucket_start).where(B.c.bucket_start >= start,
                                              B.c.bucket_start < end)
    if conn.dialect.name != "postgresql":
        return column.in_(marks)
    ranges: list[list[dt.datetime]] = []
    for first, last_end in conn.execute(
            sa.select(B.c.bucket_start, B.c.bucket_end)
            .where(B.c.bucket_start >= start, B.c.bucket_start < end)
            .order_by(B.c.bucket_start)):
        if ranges and ranges[-1][2] == first:
            ranges[-1][1:] = [first, last_end]
        else:
            ranges.append([first, first, last_end])
    if not ranges:
        return sa.false()
    return sa.or_(*[sa.and_(column >= a, column <= b) for a, b, _ in ranges])


def quick_answer(conn: Connection) -> None:
    """Turn PostgreSQL's JIT off for the rest of this transaction, before an answer's
    statements. Their plans over rollups with a partition per month are estimated costly
    (above jit_above_cost) though they read some 10,000s of rows, and compiling them took
    0.2-1.2 s of statements that ran in 0.1-0.4 s (EXPLAIN ANALYZE on the bench's ledger:
    `usage --since 365d`'s idle runs, 1.65 s of which JIT 1.21 s). And more memory for
    their sorts and hashes than the default 4 MB: the idle runs' segments of a month at
    100,000 GPUs (half a million rows) went to disk twice. Nothing on SQLite."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL jit = off")
        conn.exec_driver_sql("SET LOCAL work_mem = '64MB'")


def rollup_months(conn: Connection, days: tuple[dt.datetime, dt.datetime]
                  ) -> tuple[dt.datetime, dt.datetime] | None:
    """[first, last) of the whole months inside the rollup days ``days`` (rollup_days) that
    have their monthly rows; None: no such month."""
    built = months_built(conn)
    if built is None:
        return None
    first = month_of(days[0])
    if first < days[0]:
        first = next_month(first)
    last = min(month_of(days[1]), built)
    return (first, last) if first < last else None


def _daily_select(day: dt.datetime) -> sa.Select:
    """A day's usage_daily rows, summed first by the ledger's small integer keys (place,
    and the pod's namespace) and only then by the names: grouping a day's rows by six
    strings sorted all of them (at 100,000 GPUs 2.4 million rows, 30-50 s on a loaded
    2-core machine, paid by the bucket writes of the day's last hours); the integer
    groups are one row per GPU and namespace, and the names are joined to those."""
    rows = (sa.select(usage_rows.c.place, usage_pods.c.namespace, usage_pods.c.pod,
                      usage_rows.c.gpu_hours, usage_rows.c.avg_utilisation_pct,
                      usage_rows.c.energy_wh, usage_rows.c.avg_sm_active_pct,
                      _basis_name(usage_rows.c.basis).label("allocation_basis"))
            .select_from(usage_rows
                         .join(usage_pods, usage_pods.c.id == usage_rows.c.pod)
                         # the view's join: a row counts once its bucket is marked
                         .join(usage_buckets,
                               usage_buckets.c.bucket_start == usage_rows.c.bucket_start))
            .where(usage_rows.c.bucket_start >= day, usage_rows.c.bucket_start < day + DAY)
            ).subquery("r")
    util = sa.func.coalesce(rows.c.avg_utilisation_pct, 0.0)
    sums = rollup_sums(rows, util < ROLLUP_IDLE_THRESHOLD)
    inner = (sa.select(rows.c.place, rows.c.namespace, *sums)
             .group_by(rows.c.place, rows.c.namespace)).subquery("i")
    # places differing only in vendor or share have the same rollup keys: summed again
    keys = [usage_places.c[k] if k != "namespace" else inner.c.namespace
            for k in ROLLUP_KEYS]
    return (sa.select(sa.literal(day, sa.DateTime).label("day"),
                      *[k.label(n) for k, n in zip(keys, ROLLUP_KEYS, strict=True)],
                      *[(sa.func.max if s.name == RANK_COLUMN else sa.func.sum)(
                          inner.c[s.name]).label(s.name) for s in sums])
            .select_from(inner.join(usage_places, usage_places.c.id == inner.c.place))
            .group_by(*keys))


def _daily_by_names(day: dt.datetime) -> sa.Select:
    util = sa.func.coalesce(usage.c.avg_utilisation_pct, 0.0)
    return (sa.select(sa.literal(day, sa.DateTime).label("day"),
                      *[usage.c[k] for k in ROLLUP_KEYS],
                      *rollup_sums(usage, util < ROLLUP_IDLE_THRESHOLD))
            .where(usage.c.bucket_start >= day, usage.c.bucket_start < day + DAY)
            .group_by(*[usage.c[k] for k in ROLLUP_KEYS]))


RANK_COLUMN = "allocation_basis_rank"
#: usage_daily's figures, summed into a month (the rank: its greatest)
MONTH_SUMS = ["gpu_hours", "allocated_gpu_hours", "busy_gpu_hours", "idle_allocated_gpu_hours",
              "energy_wh", "energy_measured_gpu_hours", "sm_active_gpu_hours",
              "sm_measured_gpu_hours", RANK_COLUMN]


def _basis_name(code: sa.ColumnElement) -> sa.ColumnElement:
    """usage_rows' basis code as the ``usage`` view names it."""
    return sa.case(*[(code == i, b) for i, b in enumerate(BASIS_CODES[:-1])],
                   else_=BASIS_CODES[-1])


def describe(result: CollectResult, push_interval: float, *, bucket: float | None = None,
             now: float | None = None) -> str:
    """The one-line summary `usage collect` prints (and the demo). With ``bucket`` and
    ``now``, a collect that wrote no row says when the current bucket will be collected: on
    a fresh install every bucket before the spokes pushed is empty, and "0 rows" alone reads
    as broken."""
    text = (f"usage collect: {len(result.collected)} buckets, {result.rows} rows "
            f"({result.requests} requests), {result.removed} old rows removed")
    if not result.rows and not result.failed and bucket and now is not None:
        text += "; " + next_bucket_note(bucket, push_interval, now)
    if result.clipped:
        text += (f"; {result.clipped} bucket(s) not ended a push interval "
                 f"({human_duration(push_interval)}) ago were left for a later collect, "
                 f"from {result.not_before.isoformat()}Z" if result.not_before else "")
    if result.refused:
        text += (f"; {result.refused:,} series or readings a spoke sent out of shape were "
                 "left out (`gpufleet report` names the clusters)")
    if result.stopped:
        text += (f"; stopped: {result.stopped} bucket(s) left, the next collect resumes "
                 "with them")
    return text


def next_bucket_note(bucket: float, push_interval: float, now: float) -> str:
    """When the bucket running at ``now`` (epoch seconds) can be collected: after it ends
    and its last push has arrived."""
    end = (math.floor(now / bucket) + 1) * bucket
    ready = dt.datetime.fromtimestamp(end + push_interval, dt.UTC).replace(tzinfo=None)
    started = dt.datetime.fromtimestamp(end - bucket, dt.UTC).replace(tzinfo=None)
    return (f"no GPU samples in the buckets that have ended; a bucket is collected once it "
            f"has ended, so the current one (from {started.isoformat()}Z) is collected after "
            f"{ready.isoformat()}Z")


def ledger_span(conn: Connection) -> tuple[dt.datetime, dt.datetime] | None:
    """The first bucket's start and the last one's end in the ledger; None when empty."""
    first, last = conn.execute(sa.select(sa.func.min(usage.c.bucket_start),
                                         sa.func.max(usage.c.bucket_end))).one()
    return None if first is None else (first, last)


def _ledger_has(conn: Connection, start: dt.datetime, end: dt.datetime) -> bool:
    """Whether any bucket starts in [start, end) (a probe of the ledger's key)."""
    return conn.execute(sa.select(sa.literal(1)).where(
        usage.c.bucket_start >= start, usage.c.bucket_start < end).limit(1)).first() is not None


def rollup_days(conn: Connection, start: dt.datetime,
                end: dt.datetime) -> tuple[dt.datetime, dt.datetime] | None:
    """[first, last) of the days whose rollup rows stand for exactly the buckets of [start,
    end) they cover: the whole days inside, plus an edge day when the ledger has no bucket
    in its part outside the period (``--since``: today, whose later hours have not come)."""
    first = day_of(start)
    if first < start and _ledger_has(conn, first, start):
        first += DAY
    last = day_of(end)
    if (last < end and last < dt.datetime.max - 2 * DAY
            and not _ledger_has(conn, end, last + DAY)):
        last += DAY
    return (first, last) if first < last else None
