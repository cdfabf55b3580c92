"""GPUs held through DRA ResourceClaims, for `capacity` on nodes whose exporter gives no pod
labels.

On a DRA node a pod holds a GPU through a ResourceClaim, and an exporter without pod-resources
access (or one that does not read ``dynamic_resources``) labels no pod: the GPU looks free. The
latest reconcile run that read a cluster's claims (``reconcile --context`` or
``--resourceclaims-json``) stored which GPUs they hold; this module turns those rows into the
inventory rows ``capacity`` counts. It is kept apart from the answers so the ledger's code
does not change with it.

Claims are joined to the inventory by the GPU's UUID (NVIDIA), or by node and PCI bus id
(AMD, which has no UUID in DRA). A claimed MIG device counts one active slice of its profile
on its GPU (DRA names a placement, the inventory a GPU instance: any slice of the same profile
has the same share). An AMD partition holds its whole GPU here, because the exporter reports
partition 0 only and partitions have no rows of their own.
"""

from __future__ import annotations

from collections.abc import Collection

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub import inventory as inv
from hub.kube import normalise_pci


def claim_held(conn: Connection, clusters: Collection[str] | None = None,
               already: Collection[tuple[str, str]] = frozenset()) -> set[tuple[str, str]]:
    """(uuid, slice_key) of active inventory rows that DRA claims hold, per the latest
    reconcile run that read each cluster's claims; ``already`` are rows pod labels hold (a
    claimed MIG device takes a slice of its profile that is not among them)."""
    rc, claims, g = inv.reconcile_clusters, inv.reconcile_claims, inv.gpus
    latest = (sa.select(rc.c.cluster, sa.func.max(rc.c.run_id).label("run_id"))
              .where(rc.c.claims_read.is_(True)).group_by(rc.c.cluster).subquery())
    stmt = (sa.select(claims.c.cluster, claims.c.node, claims.c.gpu, claims.c.device,
                      claims.c.profile)
            .join(latest, sa.and_(latest.c.cluster == claims.c.cluster,
                                  latest.c.run_id == claims.c.run_id))
            .distinct())
    if clusters is not None:
        stmt = stmt.where(claims.c.cluster.in_(sorted(clusters)))
    claimed = conn.execute(stmt).all()
    if not claimed:
        return set()
    nodes = sorted({(c.cluster, c.node) for c in claimed})
    rows = conn.execute(
        sa.select(g.c.cluster, g.c.node, g.c.uuid, g.c.slice_key, g.c.pci_bus_id,
                  g.c.mig_profile)
        .where(g.c.state == inv.ACTIVE,
               sa.tuple_(g.c.cluster, g.c.node).in_(nodes))
        .order_by(g.c.uuid, g.c.slice_key)).all()
    physical: dict[tuple[str, str, str], str] = {}
    slices: dict[tuple[str, str, str, str], list[str]] = {}
    for r in rows:
        if r.slice_key == "":
            physical[(r.cluster, r.node, r.uuid)] = r.uuid
            if r.pci_bus_id:
                physical[(r.cluster, r.node, normalise_pci(r.pci_bus_id))] = r.uuid
        else:
            slices.setdefault((r.cluster, r.node, r.uuid, r.mig_profile or ""), []).append(
                r.slice_key)
    held: set[tuple[str, str]] = set()
    for c in claimed:
        uuid = physical.get((c.cluster, c.node, c.gpu))
        if c.device and c.profile is not None and c.gpu.startswith("GPU-"):
            free = [k for k in slices.get((c.cluster, c.node, c.gpu, c.profile)) or []
                    if (c.gpu, k) not in already and (c.gpu, k) not in held]
            if free:
                held.add((c.gpu, free[0]))
            continue
        if uuid is not None:
            held.add((uuid, ""))
    return held
