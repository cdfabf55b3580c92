"""Reconcile and report as plain functions over the project's doors (database, hub client).

The `reconcile` and `report` commands and the `serve` scheduler all run exactly these, so a
finding on the service's /api/v1/findings is the finding `gpufleet report` prints.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from hub import inventory as inv
from hub import usage
from hub.common import UnavailableError, for_people, format_duration, human_duration
from hub.kube import Catalog, shipped_catalog
from hub.store import HubClient, PartialResponse
from hub.validate import _checks as checks
from hub.validate import _reconcile as rc
from hub.validate import _reconcile_store as store


def nodes_from_hub(client: HubClient, *, stale_after: float, cluster_label: str,
                   keep: tuple[str, ...] = ()) -> tuple[list[rc.NodeView], set[str]]:
    """The Kubernetes view through the hub: kube-state-metrics, a fixed pair of queries
    (``keep``: node labels an instance-type catalog's selectors read)."""
    results = []
    for promql in rc.ksm_queries(format_duration(stale_after), cluster_label, keep):
        res = client.query(promql)
        if res.warnings:
            raise PartialResponse(f"hub {client.safe_url} returned a partial response "
                                  f"({res.warnings[0]}): nothing stored")
        results.append(res.result)
    return rc.nodes_from_ksm(results[0], results[1], cluster_label, keep)


def reconcile_run(engine: Engine, views: list[rc.NodeView], covered: set[str], *, source: str,
                  managed: list[rc.ManagedCluster] | None = None,
                  claims: dict[str, list[Any]] | None = None,
                  catalog: Catalog | None = None) -> tuple[int, rc.Reconciliation]:
    """Compare the Kubernetes view with the inventory and store the run, with the DRA claims
    read per cluster (for `capacity`); (run id, result). ``catalog``: GPUs per instance type
    (default: the one shipped in hub.kube)."""
    inv.ensure_schema(engine)
    started = inv.now_utc()
    with engine.connect() as conn:
        observed = store.observed_nodes(conn)
    result = rc.compare(views, observed, covered=covered, fleet_wide=source == "hub",
                        managed=managed, catalog=catalog or shipped_catalog())
    with engine.begin() as conn:
        run_id = store.save_run(conn, result, source=source, started_at=started,
                                managed_clusters=managed is not None, claims=claims)
    return run_id, result


@dataclass
class Assessment:
    """Everything a report shows: the facts, the findings, and whether the hub answered."""

    facts: Any  # checks.Facts
    findings: list[checks.Finding]
    now: dt.datetime
    hub_url: str | None = None
    hub_failure: UnavailableError | None = field(default=None)
    usage: dict[str, Any] | None = None


def assess(engine: Engine, client: HubClient | None, *, max_age: float, push_interval: float,
           window: float, cluster_label: str, idle_threshold: float | None = None,
           idle_for: float | None = None,
           naming_mix_for: float = checks.NAMING_MIX_FOR,
           acm_silent_after: float = checks.ACM_SILENT_AFTER,
           lemon_threshold: float = checks.LEMON_THRESHOLD) -> Assessment:
    """Run every check on the latest inventory (and the hub's recent history, given a client).

    A hub that fails is not fatal here: the assessment carries an error finding and the
    failure, so a scheduled page shows the problem instead of yesterday's all-green.
    """
    from hub.validate._alerts import read_history

    now = inv.now_utc()
    if inv.current(engine) is None:
        raise UnavailableError(f"inventory database {inv.safe_url(engine)} is empty: "
                               "run `gpufleet sync` first")
    inv.ensure_schema(engine)
    with engine.connect() as conn:
        facts = store.report_facts(conn, now)
    failure: UnavailableError | None = None
    if client is not None:
        try:
            facts.history = read_history(client, window=window, max_age=max_age,
                                         push_interval=push_interval,
                                         cluster_label=cluster_label, at=time.time())
        except UnavailableError as exc:
            failure = exc
            facts.hub_skipped = None
    else:
        facts.hub_skipped = "no hub URL configured (--hub-url or GPUFLEET_HUB_URL)"
    findings = checks.run_checks(facts, max_age=max_age, push_interval=push_interval,
                                 naming_mix_for=naming_mix_for,
                                 acm_silent_after=acm_silent_after)
    rule = idle_rule(idle_threshold, idle_for)
    with engine.connect() as conn:
        usage_view = usage_summary(conn, now, *rule)
        findings += idle_allocated_findings(usage_view["idle"], rule[0])
        findings += metering_findings(conn, now - dt.timedelta(seconds=IDLE_LOOKBACK))
        findings += checks.check_lemons(
            inv.lemons(conn, since=inv.LEMON_SINCE_S, by="gpu", now=now),
            inv.lemons(conn, since=inv.LEMON_SINCE_S, by="slot", now=now), lemon_threshold)
        # the fleet's delivered / healthy / reserved / active GPUs (issue 38), per cluster
        usage_view["states"] = inv.fleet_states(
            conn, by=("cluster",),
            idle=usage.idle_now(conn, now, threshold=rule[0], for_seconds=rule[1]))
    if failure is not None:
        findings.insert(0, checks.Finding(checks.ERROR, "hub", "hub checks failed: "
                                          + failure.format_message()))
    return Assessment(facts, findings, now, client.safe_url if client else None, failure,
                      usage_view)


#: The report looks back one day; its idle rule is `gpufleet idle`'s (hub.usage's defaults).
IDLE_LOOKBACK = 24 * 3600.0
#: days of the report's GPU-hours-per-day chart (today included)
CHART_DAYS = 14


def idle_rule(threshold: float | None, for_seconds: float | None) -> tuple[float, float]:
    """(threshold %, seconds in a row): the given values, else the shared idle defaults."""
    return (usage.IDLE_THRESHOLD_PCT if threshold is None else threshold,
            usage.IDLE_FOR_S if for_seconds is None else for_seconds)


def idle_allocated_findings(idle: list[dict[str, Any]],
                            threshold: float) -> list[checks.Finding]:
    """One finding per entry of the report's idle list (usage_summary's "idle", read by
    hub.usage.idle_runs like `gpufleet idle`): the list a platform team reclaims from."""
    return [checks.Finding(
        checks.WARNING, "idle_allocated_gpu",
        f"allocated to {r['namespace']}/{r['pod']} but under {threshold:g}% "
        f"utilisation for {human_duration(r['idle_hours'] * 3600)} in a row "
        f"({for_people(r['wasted_gpu_hours'])} GPU-hours wasted)",
        r["cluster"], r["node"], r["uuid"] + (f" {r['slice']}" if r["slice"] else ""),
        r["namespace"])
        for r in idle]


def metering_findings(conn: Any, since: dt.datetime) -> list[checks.Finding]:
    """One warning per pod and kind the meter corrected in the buckets since ``since``
    (usage_flags, hub/usage/_meter.py): a request beyond its node's GPUs, edges that cannot
    be. The bill stayed bounded; what the spoke sent is wrong and someone should look."""
    f = inv.usage_flags
    latest = (sa.select(f.c.cluster, f.c.namespace, f.c.pod, f.c.flag,
                        sa.func.count().label("buckets"),
                        sa.func.max(f.c.bucket_start).label("last"))
              .where(f.c.bucket_start >= since)
              .group_by(f.c.cluster, f.c.namespace, f.c.pod, f.c.flag).subquery())
    rows = conn.execute(
        sa.select(latest, f.c.node, f.c.detail)
        .join(f, sa.and_(f.c.cluster == latest.c.cluster, f.c.namespace == latest.c.namespace,
                         f.c.pod == latest.c.pod, f.c.flag == latest.c.flag,
                         f.c.bucket_start == latest.c.last))).mappings()
    return [checks.Finding(
        checks.WARNING, f"metering_{r['flag']}",
        f"{r['namespace']}/{r['pod']}: {r['detail']} (in {r['buckets']} bucket(s) of the last "
        f"{human_duration(IDLE_LOOKBACK)}, the latest from {r['last'].isoformat()}Z)",
        r["cluster"], r["node"] or None, None, r["namespace"]) for r in rows]


def usage_summary(conn: Any, now: dt.datetime, threshold: float | None = None,
                  for_seconds: float | None = None) -> dict[str, Any]:
    """The report's usage section: the last day by namespace, idle allocated GPUs, capacity,
    with one idle rule for the figures and the list, and for its charts GPU-hours per day by
    namespace (CHART_DAYS) and utilisation per bucket over the last day."""
    threshold, for_seconds = idle_rule(threshold, for_seconds)
    since = now - dt.timedelta(seconds=IDLE_LOOKBACK)
    days_since = inv.day_of(now) - (CHART_DAYS - 1) * inv.DAY
    return {"since": since,
            "days_since": days_since,
            "by_day": usage.daily_by_namespace(conn, days_since, now,
                                               idle_threshold=threshold,
                                               idle_for=for_seconds),
            "utilisation": usage.utilisation_over_time(conn, since, now),
            "by_namespace": usage.usage_summary(conn, since, now, ["namespace"], threshold,
                                                idle_for=for_seconds),
            "idle": usage.idle_allocated(conn, since, now, threshold=threshold,
                                         for_seconds=for_seconds),
            "capacity": usage.capacity(conn, ["model"], now=now, idle_threshold=threshold,
                                       idle_for=for_seconds),
            # per cluster the largest job of whole GPUs that fits on one node now (MultiKueue
            # managers ask it per worker cluster): `capacity --fits`'s reading of free
            "fits": usage.fits(usage.read_fleet(conn, now=now, idle_threshold=threshold,
                                                idle_for=for_seconds), 1)}
