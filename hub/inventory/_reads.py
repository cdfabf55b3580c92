"""The inventory as the service reads it: a read-only engine, GPUs a page at a time, one
GPU with its places, GPU counts, events a page at a time; and the nodes, each with how
Kubernetes publishes its GPUs as the latest reconcile read it (so the schema in _db.py
never reaches up to the reconcile tables).

The service's JSON handlers, its pages and its /metrics all read through these; a scoped
caller's reach comes in as plain ``clusters`` (None: every cluster), never as the service's
own scope object, so the reads know nothing about who asks.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from hub.inventory._db import (
    ACTIVE,
    STALE,
    _gpu_counts,
    _where_cluster,
    event_item,
    events,
    gpu_item,
    gpus,
    make_engine,
    nodes,
)
from hub.inventory._reconcile_runs import reconcile_results

#: a GPU row's primary key, the order of a page of GPUs
GPU_KEY = (gpus.c.cluster, gpus.c.node, gpus.c.uuid,
           gpus.c.slice_key)


def read_only_engine(url: str | None) -> Engine:
    """An inventory engine that cannot write, so no API bug can alter the inventory.

    SQLite: ``PRAGMA query_only`` on every connection. PostgreSQL: every transaction starts
    read-only (``default_transaction_read_only``), set as a connection option so that no
    rollback can undo it, and a connect timeout so a dead server fails a request rather than
    hanging it.
    """
    engine = make_engine(url, create=True)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _query_only(dbapi_conn: Any, record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA query_only = ON")
            cur.close()

    elif engine.dialect.name == "postgresql":

        @event.listens_for(engine, "do_connect")
        def _read_only(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
            options = cparams.get("options", "")
            cparams["options"] = f"{options} -c default_transaction_read_only=on".strip()
            cparams.setdefault("connect_timeout", 5)

    return engine


def page_gpus(conn: Connection, *, cluster: str | None = None, node: str | None = None,
              state: str | None = None, vendor: str | None = None,
              health: str | None = None, limit: int = 500,
              after: Sequence[str] | None = None, within: frozenset[str] | None = None
              ) -> tuple[list[dict[str, Any]], tuple[str, ...] | None]:
    """One page of GPUs (physical and MIG slices) in primary-key order, and the key to go on.

    Keyset paging: ``WHERE (cluster, node, uuid, slice_key) > :after ORDER BY ... LIMIT n+1``
    rides the primary-key index on both databases. The extra row only tells whether another
    page exists, so the last page says so itself instead of a trailing empty one.
    """
    table = gpus
    stmt = sa.select(table)
    for column, value in (("cluster", cluster), ("node", node), ("state", state),
                          ("vendor", vendor), ("health", health)):
        if value is not None:
            stmt = stmt.where(table.c[column] == value)
    if within is not None:  # a scope: only these clusters, in SQL so paging stays exact
        stmt = stmt.where(table.c.cluster.in_(sorted(within)))
    if after is not None:
        stmt = stmt.where(sa.tuple_(*GPU_KEY) > sa.tuple_(*(sa.literal(v) for v in after)))
    rows = conn.execute(stmt.order_by(*GPU_KEY).limit(limit + 1)).mappings().all()
    more = len(rows) > limit
    rows = rows[:limit]
    last = tuple(rows[-1][c.name] for c in GPU_KEY) if more else None
    return [gpu_item(r) for r in rows], last


def uuids_starting(conn: Connection, prefix: str, limit: int = 3) -> list[str]:
    """The uuid itself when the inventory has it, else up to ``limit`` uuids that start with
    ``prefix`` (the page's search takes a prefix too): one is the GPU meant, more are
    ambiguous. ``%`` and ``_`` in the prefix are literal."""
    exact = conn.execute(sa.select(gpus.c.uuid).where(gpus.c.uuid == prefix).limit(1)).first()
    if exact is not None:
        return [prefix]
    return list(conn.execute(
        sa.select(gpus.c.uuid).where(gpus.c.uuid.startswith(prefix, autoescape=True))
        .distinct().order_by(gpus.c.uuid).limit(limit)).scalars())


def gpu_detail(conn: Connection, uuid: str, *, clusters: Collection[str] | None = None
               ) -> dict[str, Any] | None:
    """A GPU by uuid with its MIG slices; None when unknown.

    A uuid normally lives on one node. When it appears on several (a GPU moved between nodes,
    or an exporter that reports a serial-derived id twice), the answer is deterministic: the
    node whose physical row is active, then the most recently seen, then primary-key order;
    the other places are listed in ``also_seen_on`` so nothing is hidden. ``clusters``: only
    the places in these (None: all), for a scoped caller.
    """
    table = gpus
    rows = conn.execute(
        sa.select(table).where(table.c.uuid == uuid).order_by(*GPU_KEY)
    ).mappings().all()
    rows = [r for r in rows if clusters is None or r["cluster"] in clusters]
    if not rows:
        return None
    places: dict[tuple[str, str], list[Mapping[Any, Any]]] = {}
    for row in rows:
        places.setdefault((row["cluster"], row["node"]), []).append(row)

    def physical_of(group: list[Mapping[Any, Any]]) -> Mapping[Any, Any]:
        return next((r for r in group if r["slice_key"] == ""), group[0])

    # Stable sorts, last key first: active before stale, then newest, then primary key.
    ordered = sorted(places.items(), key=lambda item: item[0])
    ordered.sort(key=lambda item: physical_of(item[1])["last_seen"] or dt.datetime.min,
                 reverse=True)
    ordered.sort(key=lambda item: physical_of(item[1])["state"] != ACTIVE)
    chosen = ordered[0][1]
    physical = next((r for r in chosen if r["slice_key"] == ""), None)
    others = []
    for (cluster, node), group in ordered[1:]:
        first = physical_of(group)
        others.append({"cluster": cluster, "node": node, "state": first["state"],
                       "last_seen": first["last_seen"]})
    return {
        "gpu": gpu_item(physical) if physical is not None else None,
        "slices": [gpu_item(r) for r in chosen if r["slice_key"] != ""],
        "also_seen_on": others,
    }


def cluster_sizes(conn: Connection) -> dict[str, int]:
    """GPUs and MIG slices per cluster as the inventory knows them (stale ones included):
    what a sync or a usage collect plans its shards of whole clusters by, without asking the
    store to count them. A cluster the inventory does not know yet falls to the last shard,
    the complement of the others, so a plan from old sizes is never wrong, only uneven
    until the next sync writes the new ones."""
    return {c: n for c, n in conn.execute(
        sa.select(gpus.c.cluster, sa.func.count()).group_by(gpus.c.cluster))}


def gpu_counts(conn: Connection) -> list[tuple[str, str, int]]:
    """Physical GPUs by (cluster, state), every known state present for every cluster."""
    table = gpus
    rows = conn.execute(
        sa.select(table.c.cluster, table.c.state, sa.func.count())
        .where(table.c.slice_key == "")
        .group_by(table.c.cluster, table.c.state)
    ).all()
    counts = {(c, s): n for c, s, n in rows}
    for cluster in {c for c, _ in counts}:
        for state in (ACTIVE, STALE):
            counts.setdefault((cluster, state), 0)
    return sorted((c, s, n) for (c, s), n in counts.items())


def page_events(conn: Connection, *, since: dt.datetime | None = None,
                cluster: str | None = None, clusters: Collection[str] | None = None,
                uuid: str | None = None, type: str | None = None, limit: int = 500,
                before: int | None = None) -> tuple[list[dict[str, Any]], int | None]:
    """One page of events, newest first (a keyset on the event id, written in time order:
    only ids below ``before``), and the ``before`` of the next page (None: the last).
    ``clusters``: only these (None: all), for a scoped caller."""
    table = events
    stmt = sa.select(table)
    if since is not None:
        stmt = stmt.where(table.c.at >= since)
    if cluster is not None:
        stmt = stmt.where(table.c.cluster == cluster)
    if clusters is not None:
        stmt = stmt.where(table.c.cluster.in_(sorted(clusters)))
    if uuid:
        stmt = stmt.where(table.c.uuid == uuid)
    if type is not None:
        stmt = stmt.where(table.c.type == type)
    if before is not None:
        stmt = stmt.where(table.c.id < before)
    rows = conn.execute(stmt.order_by(table.c.id.desc()).limit(limit + 1)).mappings().all()
    more = len(rows) > limit
    rows = rows[:limit]
    return [event_item(r) for r in rows], rows[-1]["id"] if more else None


def list_nodes(conn: Connection, cluster: str | None = None) -> list[dict[str, Any]]:
    """One row per node; ``gpus_via`` says how Kubernetes publishes its GPUs as the latest
    reconcile that judged the node read it: ``dra`` (ResourceSlices), ``device-plugin``,
    ``dra+device-plugin``; None before any reconcile saw the node or when it saw none."""
    results = reconcile_results  # each node as the reconcile runs judged it
    counts = _gpu_counts(gpus.c.cluster, gpus.c.node, cluster=cluster)
    latest = (sa.select(results.c.cluster, results.c.node,
                        sa.func.max(results.c.run_id).label("run_id"))
              .group_by(results.c.cluster, results.c.node).subquery())
    mode = (sa.select(results.c.cluster, results.c.node, results.c.mode)
            .join(latest, sa.and_(latest.c.cluster == results.c.cluster,
                                  latest.c.node == results.c.node,
                                  latest.c.run_id == results.c.run_id)).subquery())
    joined = nodes.outerjoin(counts, sa.and_(counts.c.cluster == nodes.c.cluster,
                                             counts.c.node == nodes.c.node)
                             ).outerjoin(mode, sa.and_(mode.c.cluster == nodes.c.cluster,
                                                       mode.c.node == nodes.c.node))
    via = sa.case((mode.c.mode.in_(("dra", "dra+device-plugin")), mode.c.mode),
                  (sa.or_(mode.c.mode.is_(None), mode.c.mode == "none"), None),
                  else_="device-plugin")
    stmt = _where_cluster(
        sa.select(nodes.c.cluster, nodes.c.node,
                  sa.func.coalesce(counts.c.gpus, 0).label("gpus"),
                  sa.func.coalesce(counts.c.stale_gpus, 0).label("stale_gpus"),
                  nodes.c.state, nodes.c.last_seen, nodes.c.last_sample_at,
                  via.label("gpus_via")
                  ).select_from(joined), nodes, cluster,
    ).order_by(nodes.c.cluster, nodes.c.node)
    return [dict(r) for r in conn.execute(stmt).mappings()]
