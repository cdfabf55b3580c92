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
from typing import Any

from sqlalchemy.engine import Engine

from hub import store
from hub.common import GpufleetError, InputError, format_duration
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
    note: str | None = None  # e.g. NO_GPU_SERIES: ok, but worth a reader's attention

    def as_dict(self) -> dict[str, object]:
        return {
            "status": "ok", "started_at": self.started_at, "finished_at": self.finished_at,
            "requests": self.requests, "clusters": self.clusters, "nodes": self.nodes,
            "gpus": self.gpus, "note": self.note,
        }


#: Recorded on a sync run that succeeded without a single GPU series: `report` reads it.
NO_GPU_SERIES = "the hub returned no GPU series"


def unlabelled(rows: list[dict[str, Any]], cluster_label: str) -> int:
    """How many GPU series of a (normalised) result lack the cluster label.

    A GPU filed without its cluster would sit under a cluster named '' and look healthy,
    so one such series is enough to refuse the whole sync."""
    return sum(1 for row in rows if not (row.get("metric") or {}).get(cluster_label))


def missing_label_error(cluster_label: str, missing: int, total: int,
                        carried: list[str]) -> InputError:
    """The one line a user reads when --cluster-label names a label the series lack."""
    which = "no GPU series" if missing == total else f"{missing} of {total} GPU series"
    verb = "carries" if missing == total else "lack"
    head = (f"{which} carries label {cluster_label!r}" if verb == "carries"
            else f"{which} lack label {cluster_label!r}")
    they = f"; they carry: {', '.join(carried)}" if carried else ""
    return InputError(f"{head}{they} (check --cluster-label); inventory left unchanged")


def _carried_labels(client: HubClient, query: store.Query, at: float) -> list[str]:
    """Label names one raw GPU series carries (only asked on the failure path)."""
    p = store.profile(query.vendor)
    try:
        res = client.query(f'topk(1, {{__name__=~"{p.device_names}", {p.device_matcher}}})',
                           time=at)
    except GpufleetError:
        return []
    names = {k for row in res.result for k in row.get("metric", {}) if k != "__name__"}
    return sorted(names)


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
        if query.kind == "identity" and res.result:
            missing = unlabelled(res.result, cluster_label)
            if missing:
                raise missing_label_error(cluster_label, missing, len(res.result),
                                          _carried_labels(client, query, at))
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
            note = NO_GPU_SERIES if counts["gpus"] == 0 else None
            inventory.record_run(conn, started_at=started, status="ok", requests=requests,
                                 counts=counts, error=note)
    except inventory.LockHeld:
        raise  # the other sync records its own run; we never touched the database
    except GpufleetError as exc:
        _record_failure(engine, started, client.requests - requests_before, exc.format_message())
        raise
    return SyncResult(started, inventory.now_utc(), requests, counts["clusters"],
                      counts["nodes"], counts["gpus"], note)


def _record_failure(engine: Engine, started: dt.datetime, requests: int, error: str) -> None:
    with engine.begin() as conn:
        inventory.record_run(conn, started_at=started, status="failed", requests=requests,
                             error=error)
