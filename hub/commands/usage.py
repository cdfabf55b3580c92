"""`usage`, `usage collect`, `idle` and `capacity`: thin click wrappers over hub.usage and
the inventory's usage ledger."""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from typing import Any

import click

from hub import inventory as inv
from hub import usage as answers
from hub.commands.core import database, hub_client, require_schema
from hub.common import (
    DURATION,
    PERCENT,
    CollectSettings,
    ConfiguredCommand,
    ConfiguredGroup,
    IdleSettings,
    InputError,
    UnavailableError,
    db_option,
    emit,
    format_duration,
    hub_options,
    on_sigterm,
    options_of,
    output_option,
    pick,
    progress,
    to_json,
)


def _iso(text: str, flag: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InputError(f"{flag} {text!r} is not an ISO-8601 time "
                         "(e.g. 2026-11-23T10:00:00Z)") from None
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def period(since: float | None, from_: str | None, until: str | None,
           default_since: float | None = 86400.0) -> tuple[dt.datetime, dt.datetime] | None:
    """[start, end) from --since or --from/--until (naive UTC, like the database)."""
    if since is not None and (from_ or until):
        raise InputError("--since and --from/--until exclude each other")
    now = inv.now_utc()
    if from_ or until:
        start = _iso(from_, "--from") if from_ else dt.datetime.min
        end = _iso(until, "--until") if until else now
        if end <= start:
            raise InputError("--until must be after --from")
        return start, end
    if since is None:
        if default_since is None:
            return None
        since = default_since
    return now - dt.timedelta(seconds=since), now + dt.timedelta(seconds=1)


#: --idle-threshold and --idle-for: the one idle rule (hub.common.IdleSettings) of `usage`'s
#: idle GPU-hours and `report`'s idle list; `idle --threshold/--for` default to the same.
idle_options = options_of(IdleSettings)


def period_options(func):
    func = click.option("--until", "until", metavar="ISO", help="End of the period (UTC).")(func)
    func = click.option("--from", "from_", metavar="ISO",
                        help="Start of the period, e.g. 2026-11-23T00:00:00Z.")(func)
    return click.option("--since", type=DURATION, metavar="DURATION",
                        help="The last DURATION (default 24h).")(func)


class _UsageGroup(ConfiguredCommand, ConfiguredGroup):
    """``usage`` answers by itself and has subcommands: it takes ``--config`` like both."""


@click.group(cls=_UsageGroup, invoke_without_command=True)
@period_options
@click.option("--by", "by", multiple=True, type=click.Choice(list(answers.GROUPS)),
              help="Group by (repeatable; default namespace).")
@idle_options
@click.option("--prices", "prices_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="Showback: YAML of prices per GPU-hour by model (as the exporter spells "
              "it), with optional per-cluster overrides and hourly prices per instance type "
              "(instance_types:, divided by the type's GPUs); adds cost and "
              "unpriced_gpu_hours.")
@click.option("--bill", "bill_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="Showback at what was paid: a cloud bill export (AWS Cost and Usage Report, "
              "Google Cloud billing export or Azure cost details CSV); a node's GPU-hours "
              "cost its bill lines' cost per node-hour / its GPUs, joined by the providerID "
              "the latest `reconcile --context/--nodes-json` stored. Nodes without a bill "
              "line keep --prices, or stay unpriced.")
@db_option
@output_option()
@click.pass_context
def usage(ctx: click.Context, since: float | None, from_: str | None, until: str | None,
          by: tuple[str, ...], idle_threshold: float, idle_for: float,
          prices_file: str | None, bill_file: str | None,
          db: str | None, output: str, **_: Any) -> None:
    """GPU-hours per group from the usage ledger (fill it with `gpufleet usage collect`).

    \b
    gpu_hours                 GPU-equivalents x hours reporting (MIG slice = its share);
                              a pod's are metered from its allocation's start and end
    allocated_gpu_hours       the part of it a pod held the GPU or slice
    busy_gpu_hours            sum of hours x average utilisation / 100
    idle_allocated_gpu_hours  allocated hours under --idle-threshold in runs of at
                              least --idle-for (the wasted hours `idle` lists)
    avg_utilisation_pct       busy / gpu_hours x 100
    sm_active_gpu_hours       hours x average SM activity / 100 (null: not exported)
    avg_sm_active_pct         SM activity over the hours that exported it
    energy_kwh                average power x hours reporting (null: no power sent)
    allocation_basis          how the allocated hours were measured, the least exact of
                              the group's: interval (both edges exported), estimated
                              (an edge known to the push interval), sampled
    cost                      with --prices or --bill: GPU-hours x price (empty when a
                              model in the group has no price; unpriced_gpu_hours says
                              how many); a billed node at what its node-hour cost
    Unallocated GPU time has an empty namespace. A monthly showback export:
    `gpufleet usage --since 30d --by namespace --prices prices.yaml -o csv`.
    See docs/usage.md.
    """
    if ctx.invoked_subcommand is not None:
        return
    start, end = period(since, from_, until)  # type: ignore[misc]
    by = by or ("namespace",)
    prices = answers.load_prices(prices_file) if prices_file else None
    bill = answers.load_bill(bill_file) if bill_file else None
    currency = answers.showback_currency(prices, bill)  # two currencies: exit 2 before reading
    missing: dict = {}
    priced: dict = {}
    with database(db) as engine:
        require_schema(engine)
        with engine.connect() as conn:
            rows = answers.usage_summary(conn, start, end, by, idle_threshold,
                                         idle_for=idle_for, prices=prices,
                                         missing=missing, bill=bill, node_priced=priced,
                                         beside=engine)
            span = None if rows else answers.ledger_span(conn)
    if not rows:
        click.echo(f"note: {_why_none(span, start, end)}", err=True)
    figures = [*answers.USAGE_FIGURES,
               *(answers.COST_FIGURES if prices or bill else [])]
    columns = [*answers.group_columns(by), *figures]
    if prices is not None or bill is not None:  # a showback says its period and currency
        stamp = {"period_start": start, "period_end": end, "currency": currency}
        rows = [{**row, **stamp} for row in rows]
        columns += list(stamp)
    if prices is not None:
        with database(db) as engine, engine.connect() as conn:
            seen = answers.models_used(conn, start, end)
        if note := answers.unused_note(prices, seen):
            click.echo(f"note: {note}", err=True)
    emit(rows, columns, output)
    if bill is not None:
        click.echo(f"note: {answers.describe_bill(bill, priced)}", err=True)
    if note := answers.missing_note(missing):
        click.echo(f"note: {note}", err=True)


def _why_none(span: tuple[dt.datetime, dt.datetime] | None, start: dt.datetime,
              end: dt.datetime) -> str:
    """Why `usage` has no row: a first hour is collected only after it ends, which a new
    user cannot guess from "(none)"."""
    if span is None:
        return ("the usage ledger is empty: `gpufleet usage collect` (or `serve`) writes a "
                "bucket once it has ended, so the first hour shows after it ends")
    return (f"no usage in {start.isoformat()}Z to {end.isoformat()}Z; the ledger holds "
            f"{span[0].isoformat()}Z to {span[1].isoformat()}Z (a bucket is collected once "
            "it has ended)")


@usage.command("collect", cls=ConfiguredCommand)
@period_options
@options_of(CollectSettings, "usage_bucket", "push_interval", "min_charge",
            flags={"usage_bucket": "--bucket"},
            helps={"usage_bucket": "Bucket length (buckets are aligned to multiples of it). "
                   "The ledger keeps one size: another is refused unless --replace-grid."})
@click.option("--step", type=DURATION, metavar="DURATION",
              help="Expert: coverage resolution, default the push interval (never below it). "
              "A coarser step costs the hub less at 1s pushes.")
@options_of(CollectSettings, "usage_max_backfill", "usage_retention",
            flags={"usage_max_backfill": "--max-backfill"})
@click.option("--replace-grid", is_flag=True,
              help="Start the ledger over on --bucket's grid: removes every row (with --yes), "
                   "in one transaction with the new grid's first bucket, once collected; "
                   "refused, the ledger unchanged, while the hub does not answer.")
@click.option("--yes", is_flag=True, help=f"Confirm --replace-grid, or a period (or a "
              f"catch-up of --max-backfill) of more than {answers.CONFIRM_BUCKETS:,} buckets.")
@options_of(CollectSettings, "lock_timeout")
@hub_options
@options_of(CollectSettings, "cluster_label")
@db_option
@output_option("text", "json", default="text", json_is="one object")
def collect(since: float | None, from_: str | None, until: str | None, step: float | None,
            replace_grid: bool, yes: bool, db: str | None, output: str, **opts: Any) -> None:
    """Fill the usage ledger: every ended bucket not collected yet (or those asked for).

    A bucket is collected once it ended a push interval ago (its last push has arrived);
    a period reaching past that is clipped and the output says so. Coverage is measured in
    push-interval slots, so hours are exact at ACM's 300s as at 1s; a pod's allocated time
    comes from its allocation's own start and end where kube-state-metrics or gpufleet's
    exporter publish them (allocation_basis interval or estimated), else from its samples
    (sampled). A fixed set of PromQL
    requests per bucket, whatever the fleet size; re-collecting a bucket replaces it, also
    beside a running `serve`. A bucket the hub cannot answer is not written and is retried
    by the next collect; exits 3 when any bucket failed.
    """
    from hub.inventory import ensure_schema

    ledger = CollectSettings.build(**pick(CollectSettings, opts))
    bucket, push_interval = ledger.usage_bucket, ledger.push_interval
    max_backfill = ledger.usage_max_backfill
    answers.check_settings(bucket=bucket, push_interval=push_interval, resolution=step,
                           retention=ledger.usage_retention, max_backfill=max_backfill)
    if replace_grid and not yes:
        raise InputError("--replace-grid removes every row of the usage ledger; add --yes")
    chosen = period(since, from_, until, default_since=None)
    starts = None
    now = time.time()
    if chosen is not None:
        start, end = (t.replace(tzinfo=dt.UTC).timestamp() for t in chosen)
        starts = answers.buckets_between(start, end, bucket)
        if len(starts) > answers.CONFIRM_BUCKETS and not yes:
            raise InputError(f"the period holds {len(starts):,} buckets of "
                             f"{format_duration(bucket)} (more than "
                             f"{answers.CONFIRM_BUCKETS:,}); add --yes to collect them all")
    elif not replace_grid:
        backfill_guard(max_backfill, bucket)
    with hub_client(opts) as client, database(db, create=True) as engine:
        ensure_schema(engine)
        settings: dict[str, Any] = dict(
            bucket=bucket, push_interval=push_interval, resolution=step, starts=starts,
            max_backfill=max_backfill, retention=ledger.usage_retention,
            cluster_label=ledger.cluster_label, lock_timeout=ledger.lock_timeout,
            min_charge=ledger.min_charge)
        if replace_grid:
            removed, result = answers.collect_on_new_grid(engine, client, **settings)
            click.echo(f"usage ledger started over on buckets of {format_duration(bucket)} "
                       f"({removed} rows removed)", err=True)
        else:
            if starts is None:  # a catch-up: as many buckets as were missed, asked the same way
                starts = pending_plan(engine, now=now, bucket=bucket,
                                      max_backfill=max_backfill,
                                      push_interval=push_interval, yes=yes)
            stop = threading.Event()  # SIGTERM: end between two buckets; the next resumes
            with on_sigterm(lambda signum, frame: stop.set()), \
                    progress(f"usage buckets of {format_duration(bucket)}",
                             len(starts)) as advance:
                result = answers.collect_usage(
                    engine, client, **{**settings, "starts": starts}, now=now,
                    on_bucket=lambda _start, _rows: advance(1), stop=stop.is_set)
    if output == "json":
        click.echo(to_json(result.as_dict()))
    else:
        click.echo(answers.describe(result, push_interval, bucket=bucket, now=time.time()))
    if result.failed:
        first, error = result.failed[0]
        raise UnavailableError(f"{len(result.failed)} bucket(s) not collected, first "
                               f"{first.isoformat()}Z: {error}; the next collect retries them")


@usage.command("export", cls=ConfiguredCommand)
@click.option("--from", "from_", metavar="ISO", help="Start of the period (UTC), e.g. "
              "2026-11-01T00:00:00Z: rows of buckets starting at or after it.")
@click.option("--until", "until", metavar="ISO", help="End of the period (UTC): rows of "
              "buckets starting before it.")
@click.option("--format", "fmt", metavar="parquet|csv", help="parquet (zstd) or csv.")
@click.option("--focus", is_flag=True, help="FinOps FOCUS 1.x columns (BilledCost, "
              "ChargePeriodStart, ResourceId, SkuId, Tags, ...) and gpufleet's x_ columns "
              "(x_GpuHours, x_BusyGpuHours, x_SmActiveGpuHours, x_EnergyKwh, "
              "x_AllocationBasis) instead of the ledger's.")
@click.option("--prices", "prices_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="With --focus: the price file of `usage --prices` fills BilledCost and "
              "EffectiveCost (empty without a price).")
@click.option("--out", metavar="FILE", help="The file to write (written whole, or not at "
              "all).")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@db_option
def export(from_: str | None, until: str | None, fmt: str | None, focus: bool,
           prices_file: str | None, out: str | None, force: bool, db: str | None,
           **_: Any) -> None:
    """Write the ledger's rows of a period to a Parquet or CSV file, for analysts and FinOps
    tools: one row per GPU or MIG slice, allocation and bucket, streamed (a month of a large
    fleet never sits in memory). Its GPU-hours are what `usage --from --until` sums.
    """
    from_, until = _required(from_, "--from"), _required(until, "--until")
    fmt, out = _required(fmt, "--format"), _required(out, "--out")
    if fmt not in answers.EXPORT_FORMATS:
        raise InputError(f"--format {fmt!r} is not one of "
                         f"{', '.join(answers.EXPORT_FORMATS)}")
    if prices_file and not focus:
        raise InputError("--prices fills FOCUS's cost columns: add --focus")
    start, end = _iso(from_, "--from"), _iso(until, "--until")
    prices = answers.load_prices(prices_file) if prices_file else None
    # Arrow's allocator is chosen once, when pyarrow first allocates (not loaded yet: only
    # the Parquet writer loads it): malloc's rather than mimalloc, which kept about 20 MB of
    # freed row groups to itself (a day at 100,000 GPUs peaked at 163 MB instead of 141);
    # an ARROW_DEFAULT_MEMORY_POOL the user set stands
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    with database(db) as engine, on_sigterm(_stop_export):
        require_schema(engine)
        with engine.connect() as conn:
            result = answers.export_usage(conn, start, end, out, fmt=fmt, focus=focus,
                                          force=force, prices=prices)
    click.echo(f"usage export: {result.rows:,} rows, {result.gpu_hours:,.6g} GPU-hours "
               f"written to {result.path}", err=True)


def _stop_export(signum: int, frame: Any) -> None:
    """SIGTERM mid-export: unwind like Ctrl-C, so the temporary file is removed."""
    raise KeyboardInterrupt


def _required(value: str | None, flag: str) -> str:
    if not value:
        raise InputError(f"{flag} is required")
    return value


def backfill_guard(max_backfill: float, bucket: float) -> None:
    """A catch-up can never hold more than MAX_BUCKETS buckets (refused before anything is
    asked, with the count): the limit of an explicit period, said about --max-backfill."""
    most = int(max_backfill // bucket)
    if most > answers.MAX_BUCKETS:
        raise InputError(f"--max-backfill {format_duration(max_backfill)} holds {most:,} "
                         f"buckets of {format_duration(bucket)} (at most "
                         f"{answers.MAX_BUCKETS:,}); shorten --max-backfill or use a larger "
                         "--bucket")


def pending_plan(engine: Any, *, now: float, bucket: float, max_backfill: float,
                 push_interval: float, yes: bool) -> list[float]:
    """The buckets a catch-up would collect; more than CONFIRM_BUCKETS need --yes, as an
    explicit period's do (14,077 buckets of 12s once ran 18 minutes unasked)."""
    with engine.connect() as conn:
        starts = answers.pending_buckets(conn, now=now, bucket=bucket,
                                         max_backfill=max_backfill, delay=push_interval)
    if len(starts) > answers.CONFIRM_BUCKETS and not yes:
        raise InputError(f"catching up --max-backfill {format_duration(max_backfill)} means "
                         f"{len(starts):,} buckets of {format_duration(bucket)} not collected "
                         f"yet (more than {answers.CONFIRM_BUCKETS:,}); add --yes to collect "
                         "them all, or shorten --max-backfill")
    return starts


@click.command(cls=ConfiguredCommand)
@click.option("--threshold", type=PERCENT,
              default=IdleSettings.default("idle_threshold"), show_default=True,
              envvar="GPUFLEET_IDLE_THRESHOLD",
              help="Average utilisation % under which an allocated bucket is idle.")
@click.option("--for", "for_", type=DURATION, default=IdleSettings.default("idle_for"),
              show_default=True, envvar="GPUFLEET_IDLE_FOR",
              metavar="DURATION", help="Idle at least this long in a row.")
@period_options
@db_option
@output_option()
def idle(threshold: float, for_: float, since: float | None, from_: str | None,
         until: str | None, db: str | None, output: str, **_: Any) -> None:
    """Allocated GPUs and MIG slices idle for at least --for in a row: the reclaim list.

    wasted_gpu_hours is the GPU-equivalent hours of those idle runs.
    """
    start, end = period(since, from_, until)  # type: ignore[misc]
    with database(db) as engine:
        require_schema(engine)
        with engine.connect() as conn:
            rows = answers.idle_allocated(conn, start, end, threshold=threshold,
                                          for_seconds=for_)
    emit(rows, answers.IDLE_COLUMNS, output)


@click.command(cls=ConfiguredCommand)
@click.option("--by", "by", multiple=True, type=click.Choice(list(answers.CAPACITY_GROUPS)),
              help="Group by (repeatable; default model).")
@click.option("--fits", type=int, metavar="N",
              help="Where a job of N GPUs (or N slices of --mig) fits now on one node, per "
                   f"cluster: fits (with the nodes), fragmented, short or stale (1 to "
                   f"{answers.MAX_FITS:,}).")
@click.option("--model", metavar="M",
              help="With --fits: only GPUs of this model or family (e.g. H100; a part of "
                   "the exporter's model name between word boundaries).")
@click.option("--mig", metavar="PROFILE",
              help="With --fits: N slices of this MIG profile (e.g. 3g.40gb) instead of "
                   "whole GPUs.")
@click.option("--max-age", type=DURATION, metavar="DURATION", envvar="GPUFLEET_MAX_AGE",
              help="Also count a cluster whose newest sample is older than this as stale "
                   "(default: only what the latest sync marked stale).")
@idle_options
@db_option
@output_option()
def capacity(by: tuple[str, ...], fits: int | None, model: str | None, mig: str | None,
             max_age: float | None, idle_threshold: float, idle_for: float,
             db: str | None, output: str, **_: Any) -> None:
    """GPU-equivalents per group now, or with --fits N where a job of N GPUs fits.

    \b
    total        GPU-equivalents known (a MIG slice counts as its share of its GPU)
    active       reporting now (total - stale)
    stale        not reporting, or its cluster is stale
    failed       health failed (XID 79, double-bit ECC, row remap failure)
    allocated    held by a pod (pod labels, or a DRA claim `reconcile` read)
    cordoned     on a node Kubernetes marks unschedulable (the latest `reconcile`)
    free         none of the above: reporting, healthy, not allocated, not cordoned
    reclaimable  allocated and idle by the idle rule up to the ledger's newest bucket
                 (--idle-threshold/--idle-for, as `idle` lists); never counted as free
    With --fits N: per cluster, fits (N free on one node; nodes lists those that can take
    it), fragmented (N free, not on one node), short (fewer than N healthy free) or stale
    (the cluster's data is out of date); free, largest_on_one_node and reclaimable count
    GPUs (or slices of --mig) of --model. See docs/usage.md.
    """
    answers.check_fits(fits, mig, model)
    if max_age is not None and max_age <= 0:
        raise InputError("--max-age must be greater than 0")
    by = by or ("model",)
    now = inv.now_utc()
    with database(db) as engine:
        require_schema(engine)
        with engine.connect() as conn:
            if fits is not None:
                fleet = answers.read_fleet(conn, now=now, max_age=max_age,
                                           idle_threshold=idle_threshold, idle_for=idle_for)
                rows = answers.fits(fleet, fits, model=model, mig=mig)
            else:
                rows = answers.capacity(conn, by, now=now, max_age=max_age,
                                        idle_threshold=idle_threshold, idle_for=idle_for)
    if fits is not None:
        if output != "json":  # a cell, not a list
            rows = [{**r, "nodes": ", ".join(r["nodes"]) or None} for r in rows]
        emit(rows, answers.FITS_COLUMNS, output)
        return
    cols = [c for name in by for c in answers.CAPACITY_GROUPS[name]]
    emit(rows, [*dict.fromkeys(cols), *answers.CAPACITY_FIGURES], output)
    if output == "table" and rows:  # 69.8571 beside the sync's whole GPUs, said what it is
        click.echo(CAPACITY_FOOTER)


#: under capacity's table: its figures are not the whole GPUs `sync` and `inventory` count
CAPACITY_FOOTER = ("GPU-equivalents (a MIG slice is its share of the GPU; sync and inventory "
                   "count whole GPUs)")
