"""One sync: ask the hub a fixed set of PromQL queries, fold them into the inventory.

The request count is a constant (three queries per vendor), whatever the number of clusters,
nodes or GPUs; each response is parsed and dropped before the next is fetched. The database
work is one transaction under the sync lock: a failure anywhere (hub down, 5xx, timeout,
partial response, PromQL error) rolls it back whole, and the failed run is recorded apart.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from hub import store
from hub.common import GpufleetError, format_duration
from hub.inventory import _db as inventory
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import FleetBuilder
from hub.store import HubClient, PartialResponse


@dataclass
class SyncResult:
    started_at: dt.datetime
    finished_at: dt.datetime
    requests: int
    clusters: int
    nodes: int
    gpus: int

    def as_dict(self) -> dict[str, object]:
        return {
            "status": "ok", "started_at": self.started_at, "finished_at": self.finished_at,
            "requests": self.requests, "clusters": self.clusters, "nodes": self.nodes,
            "gpus": self.gpus,
        }


def subquery_step(window: float) -> float:
    """Resolution of the look-back subquery: fine enough for short test windows, never
    coarser than a minute (well inside Prometheus's 5 min look-back, so no sample is missed)."""
    return min(60.0, max(1.0, window / 10))


def collect(client: HubClient, *, stale_after: float, cluster_label: str,
            at: float | None = None) -> FleetBuilder:
    """Fetch and fold every sync query; raises on the first failure."""
    at = time.time() if at is None else at
    builder = FleetBuilder(cluster_label)
    window, step = format_duration(stale_after), format_duration(subquery_step(stale_after))
    for query in store.sync_queries(window, step, cluster_label):
        res = client.query(query.promql, time=at)
        if res.warnings:
            raise PartialResponse(
                f"hub {client.safe_url} returned a partial response ({res.warnings[0]}); "
                "inventory left unchanged"
            )
        builder.add(query, res.result)
        del res
    return builder


def run_sync(engine: Engine, client: HubClient, *, stale_after: float = 600.0,
             cluster_label: str = "cluster", lock_timeout: float = 0.0) -> SyncResult:
    """Run one sync. Raises a GpufleetError (with its exit code) when it fails."""
    migrate.ensure_schema(engine)
    started = inventory.now_utc()
    requests_before = client.requests
    try:
        with inventory.locked_transaction(engine, lock_timeout) as conn:
            builder = collect(client, stale_after=stale_after, cluster_label=cluster_label,
                              at=started.replace(tzinfo=dt.UTC).timestamp())
            counts = inventory.apply_observations(conn, builder.observations(), started)
            del builder
            requests = client.requests - requests_before
            inventory.record_run(conn, started_at=started, status="ok", requests=requests,
                                 counts=counts)
    except inventory.LockHeld:
        raise  # the other sync records its own run; we never touched the database
    except GpufleetError as exc:
        _record_failure(engine, started, client.requests - requests_before, exc.format_message())
        raise
    return SyncResult(started, inventory.now_utc(), requests, counts["clusters"],
                      counts["nodes"], counts["gpus"])


def _record_failure(engine: Engine, started: dt.datetime, requests: int, error: str) -> None:
    with engine.begin() as conn:
        inventory.record_run(conn, started_at=started, status="failed", requests=requests,
                             error=error)
