"""One sync: ask the hub a fixed set of PromQL queries, fold them into the inventory.

The request count is a constant (one query per neutral field and one for sample times, per
vendor), whatever the number of clusters, nodes or GPUs; a bounded number run at once and
each response is folded and dropped as it arrives. The fetch comes first, outside any lock;
the database work is then one short transaction under the sync lock: a failure anywhere (hub
down, 5xx, timeout, partial response, PromQL error) leaves the inventory as it was, and the
failed run is recorded apart.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine

from hub import store
from hub.common import QUERY_CONCURRENCY, GpufleetError, InputError, format_duration
from hub.inventory import _db as inventory
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import FleetBuilder

if TYPE_CHECKING:
    from hub.store import HubClient, QueryResult


@dataclass
class SyncResult:
    started_at: dt.datetime
    finished_at: dt.datetime
    requests: int
    clusters: int
    nodes: int
    gpus: int
    #: NO_GPU_SERIES or the unlabelled_series line: ok, but worth a reader's attention
    note: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "status": "ok", "started_at": self.started_at, "finished_at": self.finished_at,
            "requests": self.requests, "clusters": self.clusters, "nodes": self.nodes,
            "gpus": self.gpus, "note": self.note,
        }


#: Recorded on a sync run that succeeded without a single GPU series: `report` reads it.
NO_GPU_SERIES = "the hub returned no GPU series"


def missing_label_error(cluster_label: str, missing: int, total: int,
                        carried: list[str]) -> InputError:
    """The one line a user reads when --cluster-label names a label the series lack."""
    which = "no GPU series" if missing == total else f"{missing} of {total} GPU series"
    verb = "carries" if missing == total else "lack"
    head = (f"{which} carries label {cluster_label!r}" if verb == "carries"
            else f"{which} lack label {cluster_label!r}")
    they = f"; they carry: {', '.join(carried)}" if carried else ""
    return InputError(f"{head}{they} (check --cluster-label); inventory left unchanged")


def subquery_step(window: float) -> float:
    """Resolution of the look-back subquery: fine enough for short test windows, never
    coarser than a minute (well inside Prometheus's 5 min look-back, so no sample is missed)."""
    return min(60.0, max(1.0, window / 10))


#: Requests in flight at once. Two keeps one query evaluating on the hub while the client
#: decodes the previous answer, and asks of the shared store no more than two of its cores;
#: more buys nothing on a busy hub and holds more decoded responses in memory at once.
DEFAULT_QUERY_CONCURRENCY = QUERY_CONCURRENCY


def _fetch(client: HubClient, query: store.Query, at: float) -> tuple[store.Query, QueryResult]:
    ask = client.query_newest if query.kind == "timestamp" else client.query
    return query, ask(query.promql, time=at, stream=True)


def _fold(builder: FleetBuilder, client: HubClient, query: store.Query,
          res: QueryResult) -> None:
    """Fold one answer (decoded row by row as it is folded); a partial one fails the sync.
    Series without the cluster label are left out as they come (FleetBuilder.unlabelled)."""
    if isinstance(res.result, store.StreamedRows):
        builder.add_keyed(query, res.result.keyed())
    else:  # an answer without a result array to stream (no rows)
        builder.add(query, res.result)
    warnings = res.warnings or getattr(res.result, "warnings", [])
    if warnings:
        raise store.PartialResponse(
            f"hub {client.safe_url} returned a partial response ({warnings[0]}); "
            "inventory left unchanged"
        )


def check_labelled(builder: FleetBuilder, cluster_label: str) -> str | None:
    """Exit 2 when GPU series came and none carries the cluster label (a typo'd
    ``--cluster-label``); when only some lack it (one spoke's agent without its external
    label), the others are synced and the returned note names what was left out."""
    left_out = builder.unlabelled
    if not left_out:
        return None
    if builder.gpu_count == 0:
        n = len(left_out.gpus)
        raise missing_label_error(cluster_label, n, n, sorted(left_out.labels))
    return left_out.describe(cluster_label)


def collect(client: HubClient, *, stale_after: float, cluster_label: str,
            at: float | None = None,
            concurrency: int = DEFAULT_QUERY_CONCURRENCY) -> FleetBuilder:
    """Fetch and fold every sync query, at most ``concurrency`` in flight; raises on the
    first failure. Each answer is folded and dropped as it arrives, so memory holds at most
    ``concurrency`` responses, whatever the request count. Raises the missing-label error
    when no GPU series carries ``cluster_label`` (see check_labelled)."""
    at = time.time() if at is None else at
    builder = FleetBuilder(cluster_label)
    window, step = format_duration(stale_after), format_duration(subquery_step(stale_after))
    queries = iter(store.sync_queries(window, step, cluster_label))
    with ThreadPoolExecutor(max_workers=max(1, concurrency),
                            thread_name_prefix="sync-query") as pool:
        pending = {pool.submit(_fetch, client, q, at)
                   for q in itertools.islice(queries, max(1, concurrency))}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    query, res = future.result()
                    _fold(builder, client, query, res)
                    del res
                    for q in itertools.islice(queries, 1):
                        pending.add(pool.submit(_fetch, client, q, at))
        finally:
            for future in pending:
                future.cancel()
    builder.labelled_note = check_labelled(builder, cluster_label)
    return builder


def run_sync(engine: Engine, client: HubClient, *, stale_after: float = 600.0,
             cluster_label: str = "cluster", lock_timeout: float = 0.0,
             query_concurrency: int = DEFAULT_QUERY_CONCURRENCY) -> SyncResult:
    """Run one sync. Raises a GpufleetError (with its exit code) when it fails.

    The hub is asked first, outside any lock: other writers (reconcile, another sync) never
    wait behind HTTP requests, and no database transaction stays open across them. Then one
    short transaction under the sync lock writes everything; its time (``now``, which marks
    what this sync saw) is taken under the lock, so a sync that waited for the lock cannot
    stamp rows older than the one that held it.
    """
    migrate.ensure_schema(engine)
    started = inventory.now_utc()
    requests_before = client.requests
    try:
        builder = collect(client, stale_after=stale_after, cluster_label=cluster_label,
                          at=started.replace(tzinfo=dt.UTC).timestamp(),
                          concurrency=query_concurrency)
        requests = client.requests - requests_before
        with inventory.locked_transaction(engine, lock_timeout) as conn:
            now = inventory.now_utc()
            counts = inventory.apply_observations(conn, builder.observations(), now,
                                                  builder.cluster_namings())
            note = NO_GPU_SERIES if counts["gpus"] == 0 else builder.labelled_note
            inventory.record_run(conn, started_at=started, status="ok", requests=requests,
                                 counts=counts, error=note)
        del builder
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
