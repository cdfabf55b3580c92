"""Reconcile runs in the inventory database, and the inventory reads that reconcile and report do.

The tables are the inventory's (hub/inventory/_reconcile_runs.py; Alembic revision 0002). A run is
stored whole, in one transaction, with one row per node and per cluster, so that ``report``
can use the latest run's count mismatches and the ACM ManagedCluster set it read. Old runs are
pruned (the latest :data:`KEEP_RUNS` stay), so a reconcile every few minutes does not grow the
database without bound.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub import inventory as inv
from hub.inventory import (
    gpus,
    nodes,
    reconcile_claims,
    reconcile_clusters,
    reconcile_results,
    reconcile_runs,
)
from hub.kube import ClaimAllocation, normalise_pci
from hub.validate._checks import (
    REFUSED_LOOKBACK,
    ClusterFacts,
    DriverVanished,
    ExpectedFacts,
    Facts,
    GpuFacts,
    NodeFacts,
    ReconcileFacts,
    RefusedFacts,
    SyncFacts,
)
from hub.validate._reconcile import (
    CLUSTER_NO_GPUS,
    MATCH,
    NODE_PASSING,
    ObservedNode,
    Reconciliation,
    resources_json,
)

#: runs kept in the database; older ones are deleted with their rows
KEEP_RUNS = 100

# -- the inventory side of a reconcile ----------------------------------------------------------
def observed_nodes(conn: Connection) -> list[ObservedNode]:
    """Every node of the inventory with its active physical GPUs and MIG slices.

    One grouped query: the cost does not grow with more than the size of the answer.
    """
    active = gpus.c.state == inv.ACTIVE
    physical = sa.and_(active, gpus.c.slice_key == "")
    is_slice = sa.and_(active, gpus.c.slice_key != "")
    counts = (
        sa.select(
            gpus.c.cluster, gpus.c.node,
            sa.func.count().filter(physical).label("gpus"),
            sa.func.count().filter(is_slice).label("slices"),
            sa.func.count(sa.distinct(sa.case((is_slice, gpus.c.uuid)))).label("mig_gpus"),
            sa.func.max(gpus.c.vendor).label("vendor"),
        )
        .group_by(gpus.c.cluster, gpus.c.node)
        .subquery()
    )
    stmt = (
        sa.select(nodes.c.cluster, nodes.c.node, nodes.c.state, nodes.c.last_sample_at,
                  counts.c.gpus, counts.c.slices, counts.c.mig_gpus, counts.c.vendor)
        .select_from(nodes.outerjoin(counts, sa.and_(counts.c.cluster == nodes.c.cluster,
                                                     counts.c.node == nodes.c.node)))
        .order_by(nodes.c.cluster, nodes.c.node)
    )
    uuids, pci_ids = _identities(conn)
    models = _models(conn)
    return [
        ObservedNode(r.cluster, r.node, r.state, r.gpus or 0, r.slices or 0, r.mig_gpus or 0,
                     r.vendor, r.last_sample_at,
                     frozenset(uuids.get((r.cluster, r.node), ())),
                     frozenset(pci_ids.get((r.cluster, r.node), ())),
                     frozenset(models.get((r.cluster, r.node), ())))
        for r in conn.execute(stmt)
    ]


def _models(conn: Connection) -> dict[tuple[str, str], set[str]]:
    """Per node, the models its active whole GPUs report: what its instance type's catalog
    entry is checked against (a slice's model is its parent's)."""
    out: dict[tuple[str, str], set[str]] = {}
    rows = conn.execute(
        sa.select(gpus.c.cluster, gpus.c.node, gpus.c.model)
        .where(gpus.c.state == inv.ACTIVE, gpus.c.slice_key == "",
               gpus.c.model.is_not(None)).distinct())
    for r in rows:
        out.setdefault((r.cluster, r.node), set()).add(r.model)
    return out


def _identities(conn: Connection) -> tuple[dict[tuple[str, str], set[str]],
                                           dict[tuple[str, str], set[str]]]:
    """Per node, the UUIDs and PCI bus ids of its active GPUs: what a DRA node's slices are
    joined on (NVIDIA ``uuid`` = dcgm's UUID; AMD has only its PCI bus id in DRA)."""
    uuids: dict[tuple[str, str], set[str]] = {}
    pci_ids: dict[tuple[str, str], set[str]] = {}
    rows = conn.execute(
        sa.select(gpus.c.cluster, gpus.c.node, gpus.c.uuid, gpus.c.pci_bus_id)
        .where(gpus.c.state == inv.ACTIVE).distinct())
    for r in rows:
        key = (r.cluster, r.node)
        uuids.setdefault(key, set()).add(r.uuid)
        if r.pci_bus_id:
            pci_ids.setdefault(key, set()).add(normalise_pci(r.pci_bus_id))
    return uuids, pci_ids


# -- runs ----------------------------------------------------------------------------------------
def save_run(conn: Connection, rec: Reconciliation, *, source: str, started_at: dt.datetime,
             managed_clusters: bool, keep: int = KEEP_RUNS,
             claims: dict[str, list[ClaimAllocation]] | None = None) -> int:
    """Store one run with its node and cluster rows, and the DRA claims it read per cluster
    (``claims``: cluster -> allocations; a cluster present with none read its claims and
    found none held); returns the run id."""
    claims = claims or {}
    result = conn.execute(reconcile_runs.insert().values(
        started_at=started_at, finished_at=inv.now_utc(), source=source,
        managed_clusters=managed_clusters,
        clusters=sum(1 for c in rec.clusters if c.k8s_gpus is not None),
        nodes=len(rec.nodes),
        problems=sum(1 for r in rec.nodes if r.status not in NODE_PASSING),
    ))
    key = result.inserted_primary_key
    assert key is not None, "an INSERT of one row returns its primary key"
    run_id = int(key[0])
    rows = [{
        "run_id": run_id, "cluster": r.cluster, "node": r.node, "status": r.status,
        "mode": r.mode, "k8s_gpus": r.k8s_gpus, "k8s_allocatable": r.k8s_allocatable,
        "expected_gpus": r.expected_gpus, "observed_gpus": r.observed_gpus,
        "k8s_slices": r.k8s_slices, "observed_slices": r.observed_slices,
        "resources": resources_json(r.resources), "metrics_node": r.metrics_node,
        "reason": r.reason, "instance_type": r.instance_type, "provider_id": r.provider_id,
        "unschedulable": r.unschedulable,
    } for r in rec.nodes]
    for start in range(0, len(rows), 5000):
        conn.execute(reconcile_results.insert(), rows[start:start + 5000])
    cluster_rows = [{
        "run_id": run_id, "cluster": c.cluster, "status": c.status, "managed": c.managed,
        "available": c.available, "k8s_gpu_nodes": c.k8s_gpu_nodes, "k8s_gpus": c.k8s_gpus,
        "observed_nodes": c.observed_nodes, "observed_gpus": c.observed_gpus,
        "reason": c.reason, "claims_read": True if c.cluster in claims else None,
    } for c in rec.clusters]
    if cluster_rows:
        conn.execute(reconcile_clusters.insert(), cluster_rows)
    claim_rows = [{
        "run_id": run_id, "cluster": cluster, "node": a.node, "gpu": a.gpu, "device": a.slice,
        "namespace": a.namespace, "pod": a.pod, "claim": a.claim, "profile": a.profile,
    } for cluster, allocations in sorted(claims.items()) for a in allocations]
    for start in range(0, len(claim_rows), 5000):
        conn.execute(reconcile_claims.insert(), claim_rows[start:start + 5000])
    _prune(conn, keep)
    return run_id


def _prune(conn: Connection, keep: int) -> None:
    # Children first: SQLite does not enforce ON DELETE CASCADE unless asked per connection.
    cutoff = conn.execute(
        sa.select(reconcile_runs.c.id).order_by(reconcile_runs.c.id.desc())
        .offset(keep).limit(1)
    ).scalar()
    if cutoff is None:
        return
    for table in (reconcile_results, reconcile_clusters, reconcile_claims):
        conn.execute(table.delete().where(table.c.run_id <= cutoff))
    conn.execute(reconcile_runs.delete().where(reconcile_runs.c.id <= cutoff))


@dataclass(frozen=True)
class StoredRun:
    """One reconcile run as stored: its header, node rows and cluster rows."""

    id: int
    started_at: dt.datetime
    finished_at: dt.datetime
    source: str
    managed_clusters: bool
    nodes: list[dict[str, Any]]
    clusters: list[dict[str, Any]]


def _run(conn: Connection, where: Any = None) -> StoredRun | None:
    stmt = sa.select(reconcile_runs).order_by(reconcile_runs.c.id.desc()).limit(1)
    if where is not None:
        stmt = stmt.where(where)
    head = conn.execute(stmt).mappings().first()
    if head is None:
        return None
    node_rows = []
    for row in conn.execute(
        sa.select(reconcile_results).where(reconcile_results.c.run_id == head["id"])
        .order_by(reconcile_results.c.cluster, reconcile_results.c.node)
    ).mappings():
        item = {k: v for k, v in row.items() if k != "run_id"}
        item["resources"] = json.loads(item["resources"] or "{}")
        node_rows.append(item)
    cluster_rows = [
        {k: v for k, v in row.items() if k != "run_id"}
        for row in conn.execute(
            sa.select(reconcile_clusters).where(reconcile_clusters.c.run_id == head["id"])
            .order_by(reconcile_clusters.c.cluster)
        ).mappings()
    ]
    return StoredRun(head["id"], head["started_at"], head["finished_at"], head["source"],
                     bool(head["managed_clusters"]), node_rows, cluster_rows)


def latest_run(conn: Connection) -> StoredRun | None:
    return _run(conn)


def latest_managed_run(conn: Connection) -> StoredRun | None:
    """The latest run that read the ACM ManagedCluster list (a plain run does not forget it)."""
    return _run(conn, reconcile_runs.c.managed_clusters.is_(True))


def expected_clusters(run: StoredRun | None) -> dict[str, str | None]:
    """Clusters that should report GPU metrics -> their ACM Available condition.

    A managed cluster the node source showed to have no GPUs at all is not expected to.
    """
    if run is None:
        return {}
    return {c["cluster"]: c["available"] for c in run.clusters
            if c["managed"] and c["status"] != CLUSTER_NO_GPUS}


# -- what `report` checks ------------------------------------------------------------------------
#: "Right after": a GPU whose stale event follows its driver change within this long.
VANISHED_WITHIN = dt.timedelta(hours=1)
#: how far back the report looks for driver changes
DRIVER_LOOKBACK = dt.timedelta(days=7)


def driver_vanished(conn: Connection, now: dt.datetime) -> list[DriverVanished]:
    """Per cluster and driver change, the GPUs that went stale within VANISHED_WITHIN after
    their driver changed and are still stale: the sign of an exporter that did not survive
    a driver upgrade (or sends names the hub does not read)."""
    ev = inv.events
    changes = conn.execute(
        sa.select(ev.c.at, ev.c.cluster, ev.c.uuid, ev.c.details)
        .where(ev.c.type == "changed", ev.c.at >= now - DRIVER_LOOKBACK,
               ev.c.details.like('%"field": "driver_version"%'))).all()
    if not changes:
        return []
    uuids = {c.uuid for c in changes}
    stale_at: dict[str, list[dt.datetime]] = {}
    for row in conn.execute(sa.select(ev.c.uuid, ev.c.at)
                            .where(ev.c.type == "stale", ev.c.uuid.in_(uuids))):
        stale_at.setdefault(row.uuid, []).append(row.at)
    still = set(conn.execute(sa.select(gpus.c.uuid).where(
        gpus.c.uuid.in_(uuids), gpus.c.slice_key == "", gpus.c.state != inv.ACTIVE)).scalars())
    groups: dict[tuple[str, str, str], tuple[int, dt.datetime]] = {}
    for c in changes:
        details = json.loads(c.details)
        if c.uuid not in still or not any(
                c.at <= t <= c.at + VANISHED_WITHIN for t in stale_at.get(c.uuid, [])):
            continue
        key = (c.cluster, str(details.get("old")), str(details.get("new")))
        count, first = groups.get(key, (0, c.at))
        groups[key] = (count + 1, min(first, c.at))
    return [DriverVanished(cluster, n, old, new, at)
            for (cluster, old, new), (n, at) in sorted(groups.items())]


def report_facts(conn: Connection, now: dt.datetime) -> Facts:
    """Everything the report's database checks need, read in a handful of queries."""
    clusters = inv.list_clusters(conn)
    node_rows = inv.list_nodes(conn)
    gpu_rows = conn.execute(
        sa.select(gpus.c.cluster, gpus.c.node, gpus.c.uuid, gpus.c.state, gpus.c.last_sample_at,
                  gpus.c.gpu_index, gpus.c.health, gpus.c.health_reasons,
                  gpus.c.also_reporting)
        .where(gpus.c.slice_key == "")
        .order_by(gpus.c.cluster, gpus.c.node, gpus.c.gpu_index, gpus.c.uuid)
    ).all()
    gpu_facts = [GpuFacts(r.cluster, r.node, r.uuid, r.state, r.last_sample_at, r.gpu_index,
                          r.health, r.health_reasons)
                 for r in gpu_rows]
    # a GPU is one row wherever it reports; the places reporting it beside (the latest sync
    # saw them concurrently) stand beside it, so check_duplicate_uuids sees every place
    gpu_facts += [GpuFacts(c, n, r.uuid, r.state, r.last_sample_at, r.gpu_index, r.health,
                           r.health_reasons)
                  for r in gpu_rows if r.also_reporting and r.state == inv.ACTIVE
                  for c, n in json.loads(r.also_reporting)]
    stale_per_node: dict[tuple[str, str], int] = {}
    for g in gpu_facts:
        if g.state != inv.ACTIVE:
            stale_per_node[(g.cluster, g.node)] = stale_per_node.get((g.cluster, g.node), 0) + 1
    runs = inv.list_sync_runs(conn, limit=1)
    last_sync = SyncFacts(runs[0]["started_at"], runs[0]["status"], runs[0]["error"]) \
        if runs else None
    ok = conn.execute(
        sa.select(inv.sync_runs.c.started_at)
        .where(inv.sync_runs.c.status == "ok")
        .order_by(inv.sync_runs.c.id.desc()).limit(1)
    ).scalar()
    run = latest_run(conn)
    managed = latest_managed_run(conn) if run is not None and not run.managed_clusters else run
    return Facts(
        now=now,
        clusters=[ClusterFacts(c["cluster"], c["state"], c["last_sample_at"], c["nodes"],
                               c["known_nodes"], c["gpus"], c["stale_gpus"],
                               c["naming"], c["naming_since"], c["seen_through"],
                               c["cards"], c["acm"])
                  for c in clusters],
        driver_vanished=driver_vanished(conn, now),
        nodes=[NodeFacts(n["cluster"], n["node"], n["state"], n["last_sample_at"], n["gpus"],
                         stale_per_node.get((n["cluster"], n["node"]), 0)) for n in node_rows],
        gpus=gpu_facts,
        last_sync=last_sync,
        last_ok_sync=SyncFacts(ok, "ok") if ok is not None else None,
        reconcile=ReconcileFacts(
            run.finished_at, run.source, [r for r in run.nodes if r["status"] != MATCH],
            run.clusters) if run is not None else None,
        expected=ExpectedFacts(managed.finished_at, expected_clusters(managed))
        if managed is not None and managed.managed_clusters else None,
        refused=[RefusedFacts(**r) for r in inv.list_refused(
            conn, since=now - dt.timedelta(seconds=REFUSED_LOOKBACK))],
    )
