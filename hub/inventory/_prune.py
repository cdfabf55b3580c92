"""Inventory retention: forget GPUs, nodes and clusters that have been stale for a long time.

The inventory never deletes on its own (a GPU that stops reporting is marked stale and kept,
DESIGN principle 3); a decommissioned cluster would otherwise stay forever. Pruning is the one
door that deletes, and only on request (`gpufleet inventory prune`, or `serve
--prune-stale-after`): a row goes when it is stale and was last seen longer ago than the
given age. A node goes only when none of its GPUs stay, a cluster only when none of its nodes
stay, so what remains is always consistent. The pruning runs in one transaction under the sync
lock, so it never interleaves with a sync; a dry run only reads (prune_plan: the same answer
from the same conditions), so it needs no lock and never waits for a running sync.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from hub.common import InputError
from hub.inventory._db import (
    STALE,
    allocations,
    clusters,
    events,
    gpus,
    locked_transaction,
    nodes,
    now_utc,
)


@dataclass
class PruneResult:
    """What was (or, on a dry run, would be) removed, and the cut-off used."""

    cutoff: dt.datetime
    dry_run: bool
    rows: list[dict[str, Any]] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for r in self.rows if r["kind"] == kind)

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        return (f"prune: {verb} {self.count('cluster')} clusters, {self.count('node')} nodes, "
                f"{self.count('gpu')} GPUs and {self.count('slice')} MIG slices stale since "
                f"before {self.cutoff.isoformat(timespec='seconds')}Z")


def _gone(table: sa.FromClause, cutoff: dt.datetime, cluster: str | None) -> Any:
    cond = sa.and_(table.c.state == STALE, table.c.last_seen < cutoff)
    return sa.and_(cond, table.c.cluster == cluster) if cluster else cond


def record_pruned_events(conn: Connection, removed_gpus: list[dict[str, Any]],
                         at: dt.datetime) -> None:
    """One ``pruned`` event per removed GPU or slice, in the prune's own transaction.

    The GPU's placements and health events go with it (hub.inventory._life.prune_life);
    its other events stay: what happened in the fleet survives the inventory row.
    """
    if not removed_gpus:
        return
    conn.execute(events.insert(), [
        {"at": at, "type": "pruned", "cluster": g["cluster"], "node": g["node"],
         "uuid": g["uuid"], "slice": g["slice_key"] or None,
         "details": json.dumps({"last_seen": g["last_seen"]}, default=str)}
        for g in removed_gpus])


def prune_conn(conn: Connection, *, stale_for: float, cluster: str | None = None,
               now: dt.datetime | None = None) -> PruneResult:
    """Delete, on ``conn`` (inside the caller's transaction), what is stale for longer than
    ``stale_for`` seconds; returns what went."""
    now = now or now_utc()
    cutoff = now - dt.timedelta(seconds=stale_for)
    result = PruneResult(cutoff=cutoff, dry_run=False)
    gone_gpus = [dict(r) for r in conn.execute(
        sa.select(gpus.c.cluster, gpus.c.node, gpus.c.uuid, gpus.c.slice_key,
                  gpus.c.last_seen)
        .where(_gone(gpus, cutoff, cluster))
        .order_by(gpus.c.cluster, gpus.c.node, gpus.c.uuid, gpus.c.slice_key)
    ).mappings()]
    for g in gone_gpus:
        result.rows.append({"kind": "slice" if g["slice_key"] else "gpu",
                            "cluster": g["cluster"], "node": g["node"], "uuid": g["uuid"],
                            "slice": g["slice_key"] or None, "last_seen": g["last_seen"]})
    if gone_gpus:  # their allocations first: one statement each, whatever the count
        key = (gpus.c.cluster, gpus.c.node, gpus.c.uuid, gpus.c.slice_key)
        conn.execute(allocations.delete().where(
            sa.tuple_(allocations.c.cluster, allocations.c.node, allocations.c.uuid,
                      allocations.c.slice_key)
            .in_(sa.select(*key).where(_gone(gpus, cutoff, cluster)))))
        conn.execute(gpus.delete().where(_gone(gpus, cutoff, cluster)))
        # its placements and health history are kept with the GPU, so they go with it
        from hub.inventory._life import prune_life

        prune_life(conn, {g["uuid"] for g in gone_gpus if not g["slice_key"]})
    record_pruned_events(conn, gone_gpus, now)
    still_has_gpu = sa.exists().where(gpus.c.cluster == nodes.c.cluster,
                                      gpus.c.node == nodes.c.node)
    node_cond = sa.and_(_gone(nodes, cutoff, cluster), ~still_has_gpu)
    for n in conn.execute(sa.select(nodes.c.cluster, nodes.c.node, nodes.c.last_seen)
                          .where(node_cond).order_by(nodes.c.cluster, nodes.c.node)).mappings():
        result.rows.append({"kind": "node", "cluster": n["cluster"], "node": n["node"],
                            "uuid": None, "slice": None, "last_seen": n["last_seen"]})
    conn.execute(nodes.delete().where(node_cond))
    still_has_node = sa.exists().where(nodes.c.cluster == clusters.c.cluster)
    cluster_cond = sa.and_(_gone(clusters, cutoff, cluster), ~still_has_node)
    for c in conn.execute(sa.select(clusters.c.cluster, clusters.c.last_seen)
                          .where(cluster_cond).order_by(clusters.c.cluster)).mappings():
        result.rows.append({"kind": "cluster", "cluster": c["cluster"], "node": None,
                            "uuid": None, "slice": None, "last_seen": c["last_seen"]})
    conn.execute(clusters.delete().where(cluster_cond))
    return result


def prune_plan(conn: Connection, *, stale_for: float, cluster: str | None = None,
               now: dt.datetime | None = None) -> PruneResult:
    """What prune_conn would remove, by reads alone: a node goes when none of its GPUs
    stays (each is gone or none exists), a cluster when none of its nodes stays."""
    now = now or now_utc()
    cutoff = now - dt.timedelta(seconds=stale_for)
    result = PruneResult(cutoff=cutoff, dry_run=True)
    for g in conn.execute(
            sa.select(gpus.c.cluster, gpus.c.node, gpus.c.uuid, gpus.c.slice_key,
                      gpus.c.last_seen).where(_gone(gpus, cutoff, cluster))
            .order_by(gpus.c.cluster, gpus.c.node, gpus.c.uuid, gpus.c.slice_key)).mappings():
        result.rows.append({"kind": "slice" if g["slice_key"] else "gpu",
                            "cluster": g["cluster"], "node": g["node"], "uuid": g["uuid"],
                            "slice": g["slice_key"] or None, "last_seen": g["last_seen"]})
    n = nodes.alias("n")
    keeps_gpu = sa.exists().where(gpus.c.cluster == n.c.cluster, gpus.c.node == n.c.node,
                                  sa.not_(_gone(gpus, cutoff, cluster)))
    node_goes = sa.and_(_gone(n, cutoff, cluster), ~keeps_gpu)
    for row in conn.execute(sa.select(n.c.cluster, n.c.node, n.c.last_seen).where(node_goes)
                            .order_by(n.c.cluster, n.c.node)).mappings():
        result.rows.append({"kind": "node", "cluster": row["cluster"], "node": row["node"],
                            "uuid": None, "slice": None, "last_seen": row["last_seen"]})
    keeps_node = sa.exists().where(n.c.cluster == clusters.c.cluster, sa.not_(node_goes))
    for c in conn.execute(sa.select(clusters.c.cluster, clusters.c.last_seen)
                          .where(_gone(clusters, cutoff, cluster), ~keeps_node)
                          .order_by(clusters.c.cluster)).mappings():
        result.rows.append({"kind": "cluster", "cluster": c["cluster"], "node": None,
                            "uuid": None, "slice": None, "last_seen": c["last_seen"]})
    return result


def prune(engine: Engine, *, stale_for: float, cluster: str | None = None,
          dry_run: bool = False, lock_timeout: float = 0.0,
          now: dt.datetime | None = None) -> PruneResult:
    """Prune in one transaction under the sync lock; a dry run only reads (no lock)."""
    if stale_for <= 0:
        raise InputError("--stale-for must be greater than 0")
    if dry_run:
        with engine.connect() as conn:
            return prune_plan(conn, stale_for=stale_for, cluster=cluster, now=now)
    with locked_transaction(engine, lock_timeout) as conn:
        return prune_conn(conn, stale_for=stale_for, cluster=cluster, now=now)
