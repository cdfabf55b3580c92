"""The scheduled work of `gpufleet serve`, built from its settings: what the leader runs and
writes (the sync, reconcile, prune, usage collect, placement scores, and the report's checks
with their outcome, :func:`checks_recorder`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Engine

from hub import inventory as inv
from hub import usage
from hub.common import SyncSettings, UnavailableError, format_duration
from hub.inventory import SyncResult, run_sync
from hub.service._leader import Leadership
from hub.service._scheduler import Jobs
from hub.service._settings import CATCH_UP, ServeSettings
from hub.store import HubClient

log = logging.getLogger("gpufleet.service")


def checks_recorder(engine: Engine, leader: Leadership | None = None
                    ) -> Callable[..., None]:
    """The checks' outcome into ``service_checks`` (hub.inventory.write_checks' keywords),
    where every process of the service reads it; fenced by ``leader``'s lease, so a leader
    that lost it overwrites nothing, and tied to the newest successful sync it followed."""

    def record(**outcome: Any) -> None:
        with engine.begin() as conn:
            if leader is not None:
                leader.fence(conn)
            if "findings" in outcome:
                outcome["sync_id"] = inv.latest_ok_sync_id(conn)
            inv.write_checks(conn, **outcome)

    return record


def service_jobs(engine: Engine, client: HubClient, settings: ServeSettings, *,
                 stopping: Callable[[], bool] = lambda: False,
                 leader: Leadership | None = None, clock: Callable[[], float] = time.time,
                 catch_up: int = CATCH_UP) -> Jobs:
    """The scheduled work: sync; then, when asked, a hub-side reconcile and a prune of what
    has been stale for longer than ``prune_stale_after``; then every completed usage bucket
    not collected yet (a push interval after its end); then the findings. ``stopping``
    (SIGTERM) ends a usage catch-up between two buckets; the next start resumes it.

    A round's usage catch-up is bounded twice, so it never starves the sync: at most
    ``catch_up`` buckets (`usage collect`'s --yes guard), and no bucket started past half an
    interval (``clock``) after the round began; either way the rest wait for the rounds
    after the next syncs, and one log line says so. ``leader``: its lease fences the sync's
    write, and a catch-up ends between two buckets once the lease is lost.

    The findings are exactly `gpufleet report`'s (hub.validate.assess with this client), so
    /api/v1/findings and `gpufleet_findings` agree with what an operator prints.
    """
    from hub import validate as validation

    s = settings
    catalog = s.catalog()  # GPUs per instance type (None without --reconcile)

    def sync() -> SyncResult:
        return run_sync(engine, client, **s.of(SyncSettings),
                        fence=leader.fence if leader is not None else None)

    def reconcile_job() -> None:
        views, covered = validation.nodes_from_hub(
            client, stale_after=s.stale_after, cluster_label=s.cluster_label,
            keep=catalog.label_keys if catalog is not None else ())
        validation.reconcile_run(engine, views, covered, source="hub", catalog=catalog)

    def findings() -> list[dict[str, Any]]:
        assessed = validation.assess(engine, client, max_age=s.max_age,
                                     push_interval=s.push_interval, window=s.window,
                                     cluster_label=s.cluster_label,
                                     lemon_threshold=s.lemon_threshold)
        # with the namespace a finding's message names, so the API can keep it from others
        return [{**f.as_dict(), "namespace": f.namespace} for f in assessed.findings]

    def usage_job() -> None:
        began = clock()
        with engine.connect() as conn:
            starts = usage.pending_buckets(conn, now=began, bucket=s.usage_bucket,
                                           max_backfill=s.usage_max_backfill,
                                           delay=s.push_interval)
        if not starts:
            return
        if len(starts) > catch_up:
            log.info("usage: %d buckets of %s not collected yet, more than %d a round: "
                     "collecting the oldest %d now, the rest in the rounds after the next "
                     "syncs", len(starts), format_duration(s.usage_bucket), catch_up,
                     catch_up)
            starts = starts[:catch_up]
        budget = began + s.every / 2
        late: list[bool] = []

        def stop() -> bool:
            if stopping() or (leader is not None and not leader.holds()):
                return True
            if clock() >= budget:
                late.append(True)
                return True
            return False

        result = usage.collect_usage(engine, client, bucket=s.usage_bucket,
                                     push_interval=s.push_interval, retention=s.usage_retention,
                                     max_backfill=s.usage_max_backfill, starts=starts,
                                     now=began, cluster_label=s.cluster_label,
                                     min_charge=s.min_charge,
                                     lock_timeout=max(s.lock_timeout, 60.0), stop=stop)
        if result.collected:
            log.info("usage: collected %d bucket(s), %d rows", len(result.collected),
                     result.rows)
        if result.stopped and late:
            log.info("usage: catch-up paused after half an interval (%s) so the next sync "
                     "is not late, %d bucket(s) left for the next rounds",
                     format_duration(s.every / 2), result.stopped)
        elif result.stopped:
            log.info("usage: stopped between buckets, %d left for the next start",
                     result.stopped)
        if result.failed:
            raise UnavailableError(f"usage: {len(result.failed)} bucket(s) not collected "
                                   f"({result.failed[0][1]}); retried after the next sync")

    def prune_job() -> None:
        assert s.prune_stale_after is not None
        result = inv.prune(engine, stale_for=s.prune_stale_after, lock_timeout=s.lock_timeout)
        if result.rows:
            log.info("%s", result.summary())
            for row in result.rows:
                log.info("pruned %s %s", row["kind"], " ".join(
                    str(row[k]) for k in ("cluster", "node", "uuid", "slice") if row[k]))

    def placement_job() -> None:
        """The scores as the sync (and the usage after it) left the inventory, valid for
        three intervals: a Placement stops trusting them when this leader stops."""
        from hub import kube, onboard

        with engine.connect() as conn:
            objects = usage.placement_scores(
                conn, now=inv.now_utc(), full_at=s.full_at, valid_for=3 * s.every,
                idle_threshold=s.idle_rule.threshold, idle_for=s.idle_rule.for_seconds)
        api = kube.hub_api_client(s.placement_kubeconfig, s.placement_context)
        with api:
            rows = onboard.apply_scores(api, objects)
        log.info("placement scores: %d applied, %d skipped (no namespace on the hub)",
                 sum(not r["action"].startswith("skipped") for r in rows),
                 sum(r["action"].startswith("skipped") for r in rows))

    after: list[Callable[[], None]] = []
    if s.reconcile:
        after.append(reconcile_job)
    if s.prune_stale_after:
        after.append(prune_job)
    after.append(usage_job)
    if s.placement_scores:  # after usage: reclaimable reads the newest bucket
        after.append(placement_job)
    return Jobs(sync=sync, after_sync=after, findings=findings,
                record_checks=checks_recorder(engine, leader))
