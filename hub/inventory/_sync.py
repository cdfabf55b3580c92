"""One sync: ask the hub a fixed set of PromQL queries per shard of clusters, fold them into
the inventory.

GPUs per cluster plan the shards: whole clusters, about ``--shard-size`` GPUs each, each
selected by an exact ``cluster=~"a|b"`` matcher added to every selector (the last shard
takes the complement, ``cluster!~"..."``, so a cluster that appeared since, a cluster
whose GPUs send no sample-time series and series without the label are still read). The
sizes are the inventory's, from the last sync; only a sync on an empty inventory has the
store count them (in its planning request, which otherwise asks each cluster's sources
alone). The request count is a constant per shard (one query per neutral field and one for
sample times, per vendor); at most ``--query-concurrency`` run at once, across shards, and
each answer is folded and dropped as it arrives. A shard whose answers are all in becomes
observations, set aside on disk, and its records go: memory follows the shard, not the
fleet.

The fetch comes first, outside any lock; the database work is then one transaction under
the sync lock, fed shard by shard from what was set aside: a failure anywhere (hub down,
5xx, timeout, partial response, PromQL error, in any shard) leaves the inventory as it was,
names the shard's clusters, and the failed run is recorded apart. A reader never sees half
a sync.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import operator
import time
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine

from hub import store
from hub.common import (
    QUERY_CONCURRENCY,
    SHARD_SIZE,
    GpufleetError,
    InputError,
    format_duration,
)
from hub.inventory import _db as inventory
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import FleetBuilder, Observation, Unlabelled
from hub.inventory._reads import cluster_sizes
from hub.inventory._writer import InventoryWriter

if TYPE_CHECKING:
    from hub.store import HubClient, QueryResult, Shard


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
    #: shards of clusters the queries were asked for (requests = 1 + shards x the set)
    shards: int = 1

    def as_dict(self) -> dict[str, object]:
        return {
            "status": "ok", "started_at": self.started_at, "finished_at": self.finished_at,
            "requests": self.requests, "shards": self.shards, "clusters": self.clusters,
            "nodes": self.nodes, "gpus": self.gpus, "note": self.note,
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


#: Requests in flight at once, across shards. The store evaluates queries in parallel
#: (Prometheus 2.42 answers the sync's selectors three to four times faster ten at once
#: than one by one) while the client decodes one answer at a time; four keep a store busy
#: and the client fed without taking a shared store's whole query budget (Thanos Query runs
#: 20 at once by default, for every user). Each request in flight holds only its socket.
DEFAULT_QUERY_CONCURRENCY = QUERY_CONCURRENCY
#: GPUs (and MIG slices) per shard. An answer then holds about this many series (the
#: sample-time one as many chunks), a hundred times under Mimir's 2,000,000 fetched chunks
#: per query, and the client's records of a shard ~20 MB; a fleet of that size or less is
#: one shard, asked without any cluster matcher.
DEFAULT_SHARD_SIZE = SHARD_SIZE
def cluster_counts(client: HubClient, window: str, cluster_label: str, at: float,
                   sizes: Mapping[str, int] | None = None
                   ) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """GPUs per cluster in the window (``""``: series without the label), and what else
    each cluster is seen through (store.source_arms), from one request. With ``sizes``
    (the inventory's, from the last sync) the store is asked for the sources alone and the
    plan is made from those: counting costs the store as much as a field's query."""
    res = client.query(store.planning_query(window, cluster_label, count=not sizes), time=at)
    _no_warnings(client, res.warnings)
    out: dict[str, int] = {}
    sources: dict[str, dict[str, int]] = {}
    for row in res.result or []:
        metric = row.get("metric") or {}
        try:
            count = int(float(row["value"][1]))
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        source = metric.get(store.SOURCE_LABEL)
        cluster = metric.get(cluster_label, "")
        if source is None:
            out[cluster] = count
        elif cluster:
            sources.setdefault(cluster, {})[source] = count
    return (dict(sizes) if sizes else out), sources


def _fetch(client: HubClient, query: store.Query, at: float,
           cluster_label: str = "cluster") -> tuple[store.Query, QueryResult]:
    ask = client.query_newest if query.kind == "timestamp" else client.query
    return query, ask(query.promql, time=at, stream=True, cluster_label=cluster_label)


def _no_warnings(client: HubClient, warnings: list[str]) -> None:
    if warnings:
        raise store.PartialResponse(
            f"hub {client.safe_url} returned a partial response ({warnings[0]}); "
            "inventory left unchanged"
        )


def _fold(builder: FleetBuilder, client: HubClient, query: store.Query,
          res: QueryResult) -> None:
    """Fold one answer (decoded row by row as it is folded); a partial one fails the sync.
    Series without the cluster label are left out as they come (FleetBuilder.unlabelled)."""
    if isinstance(res.result, store.StreamedRows):
        profile = store.profile(query.vendor)
        names = profile.naming_label if query.kind == "timestamp" else None
        builder.add_keyed(query, res.result.keyed(builder.known, names_of=names),
                          decode=res.result.labels)
        builder.add_names(profile, res.result.names)
        builder.refused.merge(res.result.refused)
    else:  # an answer without a result array to stream (no rows)
        builder.add(query, res.result)
    _no_warnings(client, res.warnings or getattr(res.result, "warnings", []))


def _labelled_note(gpus: int, left_out: Unlabelled, cluster_label: str) -> str | None:
    if not left_out:
        return None
    if gpus == 0:
        n = len(left_out.gpus)
        raise missing_label_error(cluster_label, n, n, sorted(left_out.labels))
    return left_out.describe(cluster_label)


def check_labelled(builder: FleetBuilder, cluster_label: str) -> str | None:
    """Exit 2 when GPU series came and none carries the cluster label (a typo'd
    ``--cluster-label``); when only some lack it (one spoke's agent without its external
    label), the others are synced and the returned note names what was left out."""
    return _labelled_note(builder.gpu_count, builder.unlabelled, cluster_label)


#: an Observation's fields in order (what its constructor takes back)
_observation_fields = operator.attrgetter(*(f.name for f in dataclasses.fields(Observation)))


def _as_tuples(group: list[Observation]) -> list[tuple[Any, ...]]:
    return [_observation_fields(obs) for obs in group]


def _as_observations(rows: list[tuple[Any, ...]]) -> list[Observation]:
    return [Observation(*fields) for fields in rows]


@dataclass
class Fetched:
    """Every shard's observations, set aside (on disk when there are several shards) until
    the write reads them back one shard at a time."""

    shards: list[Shard]
    #: hash(uuid) of GPUs reported from more than one place (node): written last, together
    #: (found by :meth:`settle` once every shard is in)
    contested: set[int] = field(default_factory=set)
    gpus: int = 0
    unlabelled: Unlabelled = field(default_factory=Unlabelled)
    #: cluster -> the dcgm naming its GPUs sent (clusters are whole in a shard)
    namings: dict[str, str] = field(default_factory=dict)
    #: cluster -> what else its GPUs are seen through (card info, ACM's list; the plan's query)
    sources: dict[str, dict[str, int]] = field(default_factory=dict)
    note: str | None = None
    #: series refused at the store's door and readings out of range, per cluster
    refused: store.Refused = field(default_factory=store.Refused)
    #: each shard's observations (on disk when there are several shards)
    _spill: store.Spill[Observation] = field(init=False)
    #: hash(uuid) and hash((cluster, node)) of every observation, side by side: 16 bytes
    #: each (a dict of them was ~100, what the fleet added to a sharded sync's peak)
    _uuids: array[int] = field(default_factory=lambda: array("q"))
    _places: array[int] = field(default_factory=lambda: array("q"))

    def __post_init__(self) -> None:
        # on disk as plain tuples: a slotted dataclass pickles through copyreg per object
        # (6x slower to write, 1.6x to read back with the objects rebuilt), and the
        # read-back is inside the locked write (closed by close(), which run_sync and
        # collect always call)
        self._spill = store.Spill("gpufleet-sync-", on_disk=len(self.shards) > 1,
                                  encode=_as_tuples, decode=_as_observations)

    def keep(self, builder: FleetBuilder) -> None:
        """A shard's records as observations, set aside; the builder is left empty."""
        self.gpus += builder.gpu_count
        self.unlabelled.merge(builder.unlabelled)
        self.namings.update(builder.cluster_namings())
        group = list(builder.observations())
        self.refused.merge(builder.refused)  # after observations(): readings judged there
        self._uuids.extend(hash(obs.uuid) for obs in group)
        self._places.extend(hash((obs.cluster, obs.node)) for obs in group)
        self._spill.add(group)

    def settle(self) -> None:
        """Find the contested GPUs: sorted by uuid and place, a uuid next to itself at
        another place was reported from two (a MIG GPU's slices share its uuid and place)."""
        import numpy  # with pandas already: one sort of 16 bytes a GPU

        uuids = numpy.frombuffer(self._uuids, dtype=numpy.int64)
        places = numpy.frombuffer(self._places, dtype=numpy.int64)
        order = numpy.lexsort((places, uuids))
        uuids, places = uuids[order], places[order]
        twice = (uuids[1:] == uuids[:-1]) & (places[1:] != places[:-1])
        self.contested = set(uuids[1:][twice].tolist())
        self._uuids, self._places = array("q"), array("q")

    def groups(self) -> Iterator[list[Observation]]:
        """Each shard's observations, one shard in memory at a time."""
        yield from self._spill.batches()

    def close(self) -> None:
        self._spill.close()


def collect(client: HubClient, *, stale_after: float, cluster_label: str,
            at: float | None = None, concurrency: int = DEFAULT_QUERY_CONCURRENCY,
            shard_size: int = DEFAULT_SHARD_SIZE,
            sizes: Mapping[str, int] | None = None) -> Fetched:
    """Plan the shards (by ``sizes``, GPUs per cluster as the inventory knows them, or else
    counted by the store), then fetch and fold every shard's queries, at most
    ``concurrency`` in flight across shards; raises on the first failure (naming its
    shard's clusters).

    Each answer is folded and dropped as it arrives, and a shard whose answers are all in is
    set aside as observations (Fetched.keep) and its records dropped, so memory holds the
    requests in flight and the shards they belong to (one or two), whatever the fleet size.
    Raises the missing-label error when no GPU series carries ``cluster_label``."""
    at = time.time() if at is None else at
    every = subquery_step(stale_after)
    window, step = format_duration(stale_after), format_duration(every)
    counts, sources = cluster_counts(client, window, cluster_label, at, sizes)
    # one cheap request (the store's index): no query asks for a name the store lacks
    held = client.metric_names(at - stale_after - every, at)
    shards = store.plan_shards(counts, shard_size, cluster_label)
    fetched = Fetched(shards, sources=sources)
    builders: dict[int, FleetBuilder] = {}

    def queries(shard: Shard) -> list[Callable[[], tuple[store.Query, QueryResult]]]:
        return [functools.partial(_fetch, client, query, at, cluster_label)
                for query in store.sync_queries(window, step, cluster_label, shard.matcher,
                                                 at=at, held=held)]

    def fold(shard: Shard, answer: tuple[store.Query, QueryResult]) -> None:
        builder = builders.setdefault(id(shard), FleetBuilder(cluster_label))
        _fold(builder, client, *answer)

    def done(shard: Shard) -> None:
        fetched.keep(builders.pop(id(shard), FleetBuilder(cluster_label)))

    try:
        store.run_shards(shards, queries, fold, done=done, concurrency=concurrency,
                         consequence="inventory left unchanged", name="sync-query")
        fetched.settle()
        fetched.note = _labelled_note(fetched.gpus, fetched.unlabelled, cluster_label)
    except BaseException:
        fetched.close()
        raise
    return fetched


def run_sync(engine: Engine, client: HubClient, *, stale_after: float = 600.0,
             cluster_label: str = "cluster", lock_timeout: float = 0.0,
             query_concurrency: int = DEFAULT_QUERY_CONCURRENCY,
             shard_size: int = DEFAULT_SHARD_SIZE,
             fence: Callable[[Connection], None] | None = None,
             replaced_within: float | None = None) -> SyncResult:
    """Run one sync. Raises a GpufleetError (with its exit code) when it fails.

    The hub is asked first, outside any lock: other writers (reconcile, another sync) never
    wait behind HTTP requests, and no database transaction stays open across them. Then one
    transaction under the sync lock writes everything, shard by shard; its time (``now``,
    which marks what this sync saw) is taken under the lock, so a sync that waited for the
    lock cannot stamp rows older than the one that held it.
    """
    migrate.ensure_schema(engine)
    started = inventory.now_utc()
    requests_before = client.requests
    with engine.connect() as conn:  # the last sync's sizes plan this one (cluster_sizes)
        sizes = cluster_sizes(conn)
    try:
        fetched = collect(client, stale_after=stale_after, cluster_label=cluster_label,
                          at=started.replace(tzinfo=dt.UTC).timestamp(),
                          concurrency=query_concurrency, shard_size=shard_size,
                          sizes=sizes)
        requests = client.requests - requests_before
        try:
            with inventory.locked_transaction(engine, lock_timeout) as conn:
                if fence is not None:
                    fence(conn)
                now = inventory.now_utc()
                writer = InventoryWriter(conn, now, replaced_within=replaced_within)
                held: list[Observation] = []
                for group in fetched.groups():
                    held += writer.add(group, fetched.contested)
                    del group
                writer.add(held, places=False)  # GPUs seen from several places: together
                if fetched.namings:
                    inventory.write_namings(conn, fetched.namings, now)
                inventory.write_sources(conn, fetched.sources, now)
                inventory.write_refused(conn, "sync", now, fetched.refused)
                counts = writer.finish()
                note = NO_GPU_SERIES if counts["gpus"] == 0 else fetched.note
                inventory.record_run(conn, started_at=started, status="ok",
                                     requests=requests, counts=counts, error=note,
                                     shards=len(fetched.shards))
        finally:
            fetched.close()
    except inventory.LockHeld:
        raise  # the other sync records its own run; we never touched the database
    except GpufleetError as exc:
        _record_failure(engine, started, client.requests - requests_before, exc.format_message())
        raise
    return SyncResult(started, inventory.now_utc(), requests, counts["clusters"],
                      counts["nodes"], counts["gpus"], note, len(fetched.shards))


def _record_failure(engine: Engine, started: dt.datetime, requests: int, error: str) -> None:
    with engine.begin() as conn:
        inventory.record_run(conn, started_at=started, status="failed", requests=requests,
                             error=error)
