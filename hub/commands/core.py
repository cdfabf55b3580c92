"""`query`, `sync`, `inventory` and `db`: thin click wrappers over hub.* functions."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from typing import TYPE_CHECKING, Any

import click
from sqlalchemy.engine import Engine

from hub import inventory as inv
from hub import usage
from hub.common import (
    DURATION,
    EXIT_FINDINGS,
    PERCENT,
    ConfiguredCommand,
    ConfiguredGroup,
    GpufleetError,
    IdleSettings,
    InputError,
    SyncSettings,
    UnavailableError,
    cluster_label_option,
    db_option,
    emit,
    env,
    format_duration,
    frame_to_csv,
    hub_options,
    iso,
    lock_timeout_option,
    options_of,
    output_option,
    parse_duration,
    pick,
    progress,
    stale_after_option,
    to_json,
)
from hub.store import PRESETS, preset_query

if TYPE_CHECKING:
    from hub.store import HubClient, HubSettings


def hub_settings(opts: dict[str, Any]) -> HubSettings:
    """How to reach the hub store, from the hub options (hub.common.hub_options)."""
    try:
        timeout = parse_duration(opts.get("hub_timeout") or "60s")
    except ValueError as exc:
        raise InputError(f"--read-timeout: {exc}") from None
    try:
        connect_timeout = parse_duration(opts.get("hub_connect_timeout") or "5s")
    except ValueError as exc:
        raise InputError(f"--connect-timeout: {exc}") from None
    from hub.store import HubSettings  # requests loads only for hub commands

    return HubSettings(
        url=opts.get("hub_url") or "",
        token_file=opts.get("token_file"),
        ca_file=opts.get("ca_file"),
        cert_file=opts.get("cert_file"),
        key_file=opts.get("key_file"),
        insecure_skip_verify=bool(opts.get("insecure_skip_verify")),
        timeout=timeout,
        connect_timeout=connect_timeout,
    )


def hub_client(opts: dict[str, Any]) -> HubClient:
    from hub.store import HubClient

    return HubClient.from_settings(hub_settings(opts))


#: the inventory's engine for a command: connection failures are one-line exit-3 errors
database = inv.open_engine


def require_schema(engine: Engine) -> None:
    """Reads need the schema: a database file with none yet is empty, not broken."""
    if inv.current(engine) is None:
        raise UnavailableError(f"inventory database {inv.safe_url(engine)} is empty: "
                               "run `gpufleet sync` first")
    inv.ensure_schema(engine)


# -- query ----------------------------------------------------------------------------------
def _point(ts: float, value: str) -> dict[str, Any]:
    try:
        number: Any = float(value)
    except ValueError:
        number = value
    return {"time": iso(dt.datetime.fromtimestamp(float(ts), dt.UTC)), "value": number}


def _series(result_type: str, result: Any) -> list[dict[str, Any]]:
    """A Prometheus result as plain objects: metric labels plus typed points."""
    if result_type in ("scalar", "string"):
        return [_point(*result)]
    out = []
    for series in result:
        if "values" in series:
            out.append({"metric": series.get("metric", {}),
                        "values": [_point(*p) for p in series["values"]]})
        else:
            out.append({"metric": series.get("metric", {}), **_point(*series["value"])})
    return out


def _sample_rows(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per sample, labels as columns (tables and CSV)."""
    rows = []
    for item in series:
        labels = item.get("metric", {})
        for point in item.get("values") or [item]:
            rows.append({**labels, "time": point["time"], "value": point["value"]})
    return rows


#: the columns of `inventory gpus` and `inventory gpu` as a table (-o json has every field)
GPU_TABLE_COLUMNS = [
    "cluster", "node", "uuid", "index", "vendor", "model", "memory_total_mib", "mig_profile",
    "mig_instance", "state", "health", "utilisation_pct", "last_sample_at",
]
PRUNE_COLUMNS = ["kind", "cluster", "node", "uuid", "slice", "last_seen"]
HISTORY_COLUMNS = ["bucket_start", "cluster", "node", "slice", "namespace", "pod", "gpu_hours",
                   "avg_utilisation_pct", "energy_wh", "coverage", "allocation_basis"]

_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset", "atan2", "inf", "nan"}


def metric_names(expr: str) -> list[str]:
    """Metric names an expression selects (best effort: strings, matchers, ranges, grouping
    clauses and function names removed), for the "no such metric" hint only."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', "", expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    names = []
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(?!\w)(?!\s*\()", text):
        if m.group(1).lower() not in _KEYWORDS and m.group(1) not in names:
            names.append(m.group(1))
    return names


def unknown_metrics(client: HubClient, expr: str) -> list[str]:
    """Names in ``expr`` of which the hub holds no series at all (at most three asked).

    An expression with ``or`` names alternatives (the dashboard's vendor alternatives,
    NVIDIA's metric or AMD's): one the hub lacks is expected there, so only when it lacks
    every name is that worth a warning."""
    unknown, names = [], metric_names(expr)[:3]
    for name in names:
        try:
            found = client.query(f'count({{__name__="{name}"}})').result
        except GpufleetError:
            return []
        if not found:
            unknown.append(name)
    if re.search(r"\bor\b", _GROUPING.sub(" ", expr)) and len(unknown) < len(names):
        return []
    return unknown


@click.command(cls=ConfiguredCommand)
@click.argument("expr", required=False)
@click.option("--preset", type=click.Choice(PRESETS), metavar="|".join(PRESETS),
              help="Instead of EXPR, a question asked in every naming the vendor profiles know "
                   "(both dcgm namings, both AMD spellings, gpufleet's own). gpus-per-cluster: "
                   "GPUs reporting per cluster, each physical GPU once, a cluster silent for "
                   "longer than --stale-after left out.")
@stale_after_option
@click.option("--range", "range_", type=DURATION, metavar="DURATION",
              help="Run a range query over the last DURATION (e.g. 1h) instead of an instant one.")
@click.option("--step", type=DURATION, default="1m", show_default=True, metavar="DURATION",
              help="Resolution of a range query.")
@cluster_label_option
@hub_options
@output_option()
def query(expr: str | None, preset: str | None, stale_after: float, range_: float | None,
          step: float, cluster_label: str, output: str, **opts: Any) -> None:
    """Run a PromQL expression (or a --preset) against the hub store.

    \b
    Examples:
      gpufleet query --preset gpus-per-cluster      # is every cluster reporting?
      gpufleet query 'avg(DCGM_FI_DEV_GPU_UTIL)' --range 1h --step 5m -o csv

    ``--range`` with ``-o csv`` writes prometheus-api-client's MetricRangeDataFrame (one row
    per sample: labels, time, value), the frame hub.store.prometheus_connect() gives a
    notebook. A PromQL error prints the store's message and exits 2; an unreachable hub exits 3.
    """
    if (range_ is not None and range_ <= 0) or step <= 0:
        raise InputError("--range and --step must be greater than 0")
    if (expr is None) == (preset is None):
        raise InputError("give a PromQL EXPR or --preset NAME (one of them)")
    if preset is not None:
        if stale_after <= 0:
            raise InputError("--stale-after must be greater than 0")
        expr = preset_query(preset, format_duration(stale_after), cluster_label)
    assert expr is not None
    with hub_client(opts) as client:
        if range_:
            end = time.time()
            res = client.query_range(expr, end - range_, end, step)
        else:
            res = client.query(expr)
        if not range_ and res.result_type == "vector" and not res.result:
            for name in unknown_metrics(client, expr):
                click.echo(f"warning: the hub has no series named {name!r} (a typo, or not "
                           "in the allowlist?)", err=True)
    for warning in res.warnings:
        click.echo(f"warning: hub returned a partial response: {warning}", err=True)
    if range_ and output == "csv" and res.result_type == "matrix":
        # prometheus-api-client's DataFrame, as a notebook would get it (store.range_frame)
        from hub.store import range_frame

        click.echo(frame_to_csv(range_frame(res.result)), nl=False)
        return
    series = _series(res.result_type, res.result)
    if output == "json":
        click.echo(to_json(series))
        return
    rows = _sample_rows(series)
    labels = sorted({k for row in rows for k in row} - {"time", "value", "__name__"})
    named = ["__name__"] if any("__name__" in r for r in rows) else []
    # label names as the hub spells them (Hostname, not HOSTNAME): they go back into PromQL
    emit(rows, [*named, *labels, "time", "value"], output, upper=False)


# -- sync -----------------------------------------------------------------------------------
@click.command(cls=ConfiguredCommand)
@click.option("--once", is_flag=True, help="Run one sync and exit (the default).")
@click.option("--every", type=DURATION, envvar=env("every"), metavar="DURATION",
              help="Keep running, one sync every DURATION (e.g. 5m).")
@options_of(SyncSettings)
@hub_options
@db_option
@output_option("text", "json", default="text", json_is="one object")
def sync(once: bool, every: float | None, db: str | None, output: str, **opts: Any) -> None:
    """Fill the inventory database from the hub (one transaction per sync).

    Counts GPUs per cluster (one request), then issues a fixed set of PromQL queries per
    shard of whole clusters of about --shard-size GPUs (at most --query-concurrency at
    once), then writes in one transaction, shard by shard, marks
    GPUs, nodes and clusters without a sample in --stale-after as stale (never deleting
    them) and records the run in sync_runs. Exits 3 when the hub or database is unavailable
    or another sync holds the lock; 2 on a PromQL error.
    """
    from hub.inventory import run_sync

    if once and every:
        raise InputError("--once and --every exclude each other")
    if every is not None and every <= 0:
        raise InputError("--every must be greater than 0 (leave it out to sync once)")
    settings = SyncSettings.build(**pick(SyncSettings, opts))
    with hub_client(opts) as client, database(db, create=True) as engine:
        while True:
            try:  # at scale a sync takes a while: a bar on a terminal, silent when piped
                with progress("sync: reading the hub, writing the inventory"):
                    result = run_sync(engine, client, **settings.of(SyncSettings))
            except UnavailableError as exc:
                if not every:
                    raise
                exc.show()
            else:
                if output == "json":
                    click.echo(to_json(result.as_dict()))
                else:
                    took = (result.finished_at - result.started_at).total_seconds()
                    click.echo(
                        f"sync ok: {result.clusters} clusters, {result.nodes} nodes, "
                        f"{result.gpus} GPUs ({result.requests} requests, "
                        f"{result.shards} shard{'s' if result.shards != 1 else ''}, "
                        f"{took:.1f}s)"
                        + (f"; {result.note}" if result.note else "")
                    )
            if not every:
                return
            time.sleep(every)


# -- inventory ------------------------------------------------------------------------------
@click.group(cls=ConfiguredGroup)
def inventory_group() -> None:
    """List what the inventory database knows: clusters, nodes, GPUs, allocations, runs."""


def _inventory_command(name: str, lister, columns: list[str], doc: str,
                       table_columns: list[str] | None = None):
    @inventory_group.command(name, cls=ConfiguredCommand, help=doc)
    @click.option("--cluster", metavar="NAME", help="Only this cluster.")
    @db_option
    @output_option()
    def command(cluster: str | None, db: str | None, output: str, **_: Any) -> None:
        with database(db) as engine:
            require_schema(engine)
            with engine.connect() as conn:
                rows = lister(conn, cluster)
        emit(rows, columns, output, table_columns)

    return command


_inventory_command("clusters", inv.list_clusters, inv.CLUSTER_COLUMNS,
                   "One row per cluster: active nodes and physical GPUs, state, last sample.")
_inventory_command("nodes", inv.list_nodes, inv.NODE_COLUMNS,
                   "One row per node: active physical GPUs, state, last seen.")
_inventory_command("gpus", inv.list_gpus, inv.GPU_COLUMNS,
                   "One row per physical GPU and one per MIG slice (same uuid as its parent). "
                   "The table shows the main columns; -o json and -o csv carry all of them.",
                   GPU_TABLE_COLUMNS)
_inventory_command("allocations", inv.list_allocations, inv.ALLOCATION_COLUMNS,
                   "Which pod (namespace/pod/container) used which GPU, first and last seen.")


@inventory_group.command("sync-runs", cls=ConfiguredCommand)
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=20, show_default=True,
              help="How many runs to show, newest first.")
@db_option
@output_option()
def sync_runs(limit: int, db: str | None, output: str, **_: Any) -> None:
    """The latest sync runs: status, requests made, counts, and the error if any."""
    with database(db) as engine:
        require_schema(engine)
        with engine.connect() as conn:
            rows = inv.list_sync_runs(conn, limit)
    emit(rows, ["id", "started_at", "finished_at", "status", "requests", "shards", "clusters",
                "nodes", "gpus", "error"], output)


def _since(value: float | None) -> dt.datetime | None:
    return None if value is None else inv.now_utc() - dt.timedelta(seconds=value)


@inventory_group.command("events", cls=ConfiguredCommand)
@click.option("--since", type=DURATION, metavar="DURATION",
              help="Only events of the last DURATION (e.g. 7d); default: all, kept forever.")
@click.option("--cluster", metavar="NAME", help="Only events in this cluster.")
@click.option("--uuid", metavar="UUID", help="Only events of this GPU (and its MIG slices).")
@click.option("--type", "type_", type=click.Choice(inv.EVENT_TYPES), help="Only this type.")
@click.option("--limit", type=click.IntRange(1, 1_000_000),
              help="At most this many (newest first), 1,000,000 at most.")
@db_option
@output_option()
def events(since: float | None, cluster: str | None, uuid: str | None, type_: str | None,
           limit: int | None, db: str | None, output: str, **_: Any) -> None:
    """What changed in the fleet, newest first.

    \b
    appeared  a GPU or MIG slice seen for the first time
    stale     it stopped reporting (no sample within --stale-after of a sync)
    returned  a stale one reports again
    moved     it reports from another node or cluster (details: from, to)
    changed   model, memory_total_mib, driver_version or MIG layout changed
              (details: field, old, new)
    """
    with database(db) as engine:
        require_schema(engine)
        with engine.connect() as conn:
            rows = inv.list_events(conn, since=_since(since), cluster=cluster, uuid=uuid,
                                   type_=type_, limit=limit)
    if output != "json":
        rows = [{**r, "details": json.dumps(r["details"], sort_keys=True, default=str)
                 if r["details"] else ""} for r in rows]
    emit(rows, inv.EVENT_COLUMNS, output)


class UnknownGpu(GpufleetError):
    exit_code = EXIT_FINDINGS


@inventory_group.command("gpu", cls=ConfiguredCommand)
@click.argument("uuid")
@db_option
@output_option("table", "json", json_is="one object")
def gpu(uuid: str, db: str | None, output: str, **_: Any) -> None:
    """One GPU by UUID, a unique prefix of it (GPU-5c0f) or its serial: where it is, where it
    sat (placements: cluster, node, slot, from, until), its health history, MIG slices,
    events, allocations and recent usage.

    An unknown UUID prints one line and exits 1; a prefix of several GPUs' UUIDs prints one
    line naming some of them and exits 2.
    """
    with database(db) as engine:
        require_schema(engine)
        with engine.connect() as conn:
            found = inv.uuids_starting(conn, uuid) if uuid else []
            if len(found) > 1:
                raise InputError(f"{uuid!r} starts more than one GPU's uuid ("
                                 f"{', '.join(found[:2])}, ...): give more of it")
            detail = usage.gpu_history(conn, found[0]) if found else None
    if detail is None:
        raise UnknownGpu(f"no GPU with uuid {uuid} in the inventory")
    if output == "json":
        click.echo(to_json(detail))
        return
    detail["events"] = [{**e, "details": json.dumps(e["details"], sort_keys=True, default=str)
                         if e.get("details") else ""} for e in detail["events"]]
    emit([detail["gpu"]], GPU_TABLE_COLUMNS, "table")
    for title, key, columns in (
        ("placements", "placements", inv.PLACEMENT_COLUMNS),
        ("health history", "health", inv.HEALTH_COLUMNS),
        ("MIG slices", "slices", GPU_TABLE_COLUMNS),
        ("events", "events", inv.EVENT_COLUMNS),
        ("allocations", "allocations", inv.ALLOCATION_COLUMNS),
        ("recent usage", "usage", HISTORY_COLUMNS),
    ):
        click.echo(f"\n{title}:")
        emit(detail[key], columns, "table")


def _evidence_text(evidence: list[dict[str, Any]], most: int = 3) -> str:
    """A row's evidence in a table cell: the newest few, and how many more -o json has."""
    shown = [f"{iso(e['at'])} {e['uuid']}: {e['what']}" for e in evidence[-most:]]
    more = len(evidence) - len(shown)
    return "; ".join(shown) + (f" (+{more} more)" if more > 0 else "")


@inventory_group.command("lemons", cls=ConfiguredCommand)
@click.option("--since", type=DURATION, default="90d", show_default=True, metavar="DURATION",
              help="Count failures and time in service over the last DURATION.")
@click.option("--by", "by", default="gpu", show_default=True, metavar="gpu|node|slot|model",
              help="Rank physical GPUs, nodes, slots (cluster, node, PCI bus) or models.")
@db_option
@output_option()
def lemons(since: float, by: str, db: str | None, output: str, **_: Any) -> None:
    """GPUs (nodes, slots, models) that fail most, by failures per GPU-month in service.

    \b
    A failure is one of:
      health    the GPU turned degraded or failed (XID, ECC double-bit errors,
                row-remap failure, fell off the bus, the exporter's own health)
      replaced  another GPU took its slot (held against the part taken out)
      stale     it stopped reporting while a pod held it
    Time in service is its placements' time within --since (at least a day is
    counted, so a GPU seen for minutes does not top the list). Each row carries its
    evidence (the table shows the newest three; -o json has all). Only rows with a
    failure are listed.
    """
    inv.check_since(since)
    [key] = inv.parse_by(by, inv.LEMON_BY, many=False)
    with database(db) as engine:
        require_schema(engine)
        with engine.connect() as conn:
            rows = inv.lemons(conn, since=since, by=key, now=inv.now_utc())
    if output != "json":
        rows = [{**r, "evidence": _evidence_text(r["evidence"])} for r in rows]
    emit(rows, inv.lemon_columns(key), output)


@inventory_group.command("states", cls=ConfiguredCommand)
@click.option("--by", "by", default="", metavar="cluster,model,namespace",
              help="Group by any of cluster, model, namespace (comma-separated); default: "
                   "the whole fleet.")
@click.option("--idle-threshold", type=PERCENT, default=usage.IDLE_THRESHOLD_PCT,
              show_default=True, envvar="GPUFLEET_IDLE_THRESHOLD",
              help="Average utilisation % under which an allocated bucket is idle.")
@click.option("--idle-for", type=DURATION, default=IdleSettings.default("idle_for"),
              show_default=True, metavar="DURATION",
              envvar="GPUFLEET_IDLE_FOR",
              help="A reserved GPU idle this long in a row is not active.")
@db_option
@output_option()
def states(by: str, idle_threshold: float, idle_for: float, db: str | None, output: str,
           **_: Any) -> None:
    """The fleet's physical GPUs as delivered, healthy, reserved and active.

    \b
    delivered  what should be there: per node the most of Kubernetes' count at the
               latest reconcile, its instance type's catalog count and the GPUs known
               there (reporting or stale)
    healthy    reporting and not failed
    reserved   reporting and held by a pod (an allocation seen at the latest sync)
    active     reserved and not idle (under --idle-threshold for --idle-for, from the
               usage ledger: without `usage collect` no GPU reads as idle)
    Healthy and reserved never exceed delivered, nor active reserved: each is a count
    of one GPU's flags. --by namespace puts each GPU under the namespace holding it
    (none: not reserved).
    """
    keys = inv.parse_by(by, inv.STATE_BY, many=True) if by.strip() else ()
    if idle_for <= 0:
        raise InputError("--idle-for must be greater than 0")
    with database(db) as engine:
        require_schema(engine)
        with engine.connect() as conn:
            now = inv.now_utc()
            idle = usage.idle_now(conn, now, threshold=idle_threshold, for_seconds=idle_for)
            rows = inv.fleet_states(conn, by=keys, idle=idle)
    emit(rows, [*keys, *inv.STATES], output)


@inventory_group.command("prune", cls=ConfiguredCommand)
@click.option("--stale-for", type=DURATION, required=True, metavar="DURATION",
              help="Remove what has been stale for longer than this (e.g. 90d).")
@click.option("--cluster", metavar="NAME", help="Only this cluster.")
@click.option("--dry-run", is_flag=True, help="Print what would go; change nothing.")
@lock_timeout_option
@db_option
@output_option()
def prune(stale_for: float, cluster: str | None, dry_run: bool, lock_timeout: float,
          db: str | None, output: str, **_: Any) -> None:
    """Delete GPUs, nodes and clusters stale for longer than --stale-for.

    Nothing is ever deleted otherwise: a decommissioned cluster's GPUs stay, stale, until
    pruned. A node goes only with all its GPUs, a cluster only with all its nodes. One
    transaction under the sync lock; prints every removed row (kind, cluster, node, uuid,
    MIG slice, last seen) and a summary line on stderr.

    \b
    Examples:
      gpufleet inventory prune --stale-for 90d --dry-run
      gpufleet inventory prune --stale-for 30d --cluster decommissioned-east
    """
    with database(db) as engine:
        require_schema(engine)
        result = inv.prune(engine, stale_for=stale_for, cluster=cluster, dry_run=dry_run,
                           lock_timeout=lock_timeout)
    emit(result.rows, PRUNE_COLUMNS, output)
    click.echo(result.summary(), err=True)


inventory_group.name = "inventory"
inventory = inventory_group


# -- db -------------------------------------------------------------------------------------
@click.group(cls=ConfiguredGroup)
def db() -> None:
    """Manage the inventory database schema (Alembic migrations)."""


@db.command("upgrade", cls=ConfiguredCommand)
@db_option
def db_upgrade(db: str | None, **_: Any) -> None:
    """Create or migrate the schema to the version this gpufleet needs."""
    with database(db, create=True) as engine:
        before, after = inv.upgrade(engine)
    click.echo(f"inventory schema: {before or 'empty'} -> {after}")
