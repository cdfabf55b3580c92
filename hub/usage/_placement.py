"""Where a job fits now, and what is free per cluster: the one reading of "free" that
`capacity`, `capacity --fits`, the API, the page, the report and the ACM placement scores share.

A GPU (or MIG slice) is in exactly one of these, first match wins:

* ``stale``: it, or its whole cluster, is not reporting (the sync marked it stale, or with a
  ``max_age`` its cluster's newest sample is older);
* ``failed``: its health (or its GPU's, for a slice) is failed (XID 79, ECC, row remapping);
* ``allocated``: a pod holds it (pod labels the latest sync saw, or a DRA claim);
* ``cordoned``: its node is unschedulable per the latest reconcile that read the node;
* ``free``: none of the above. Health not reported (null) is not failed: most exporters send
  no XID until one happens.

``reclaimable`` is a part of ``allocated``: held GPUs idle by the usage ledger's rule (the
`idle` list's) up to the ledger's newest bucket. It is shown beside free, never counted in it.

A job of N GPUs fits a cluster when one node has N free GPUs of the model (or N free slices
of a MIG profile): a pod's GPUs come from one node.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub import inventory as inv
from hub import store
from hub.common import InputError, ServeOptions, check_full_at
from hub.usage._dra import claim_held
from hub.usage._idle import IDLE_FOR_S, IDLE_THRESHOLD_PCT, idle_runs

STALE, FAILED, ALLOCATED, CORDONED, FREE = "stale", "failed", "allocated", "cordoned", "free"
#: a fits answer per cluster
FITS, FRAGMENTED, SHORT = "fits", "fragmented", "short"
FITS_STATUSES = (FITS, FRAGMENTED, SHORT, STALE)
MAX_FITS = 1000
FITS_COLUMNS = ["cluster", "status", "free", "largest_on_one_node", "reclaimable", "nodes"]
#: the MIG profile grammar: ``3g.40gb``, ``1g.10gb+me``, ``1c.3g.40gb``, ``1g.18gb``
_MIG_PROFILE = re.compile(r"^(\d+c\.)?[1-8]g\.\d{1,4}gb(\+[a-z]+)?$")


@dataclass(frozen=True)
class Unit:
    """One schedulable GPU or MIG slice and where it stands now."""

    cluster: str
    node: str
    uuid: str
    slice_key: str  # '' for a whole GPU
    model: str | None
    mig_profile: str | None
    share: float  # GPU-equivalents (a slice its share of its GPU)
    status: str  # stale | failed | allocated | cordoned | free
    reclaimable: bool = False


@dataclass(frozen=True)
class Fleet:
    """The units of the clusters read, and the clusters whose data is out of date."""

    units: list[Unit]
    clusters: list[str]
    stale_clusters: frozenset[str]


# -- input ----------------------------------------------------------------------------------------
def check_fits(fits: int | None, mig: str | None, model: str | None) -> None:
    """--fits 1..1,000; --mig and --model only with it; --mig a MIG profile's name."""
    if fits is None:
        if mig is not None or model is not None:
            raise InputError("--model and --mig go with --fits N")
        return
    if not 1 <= fits <= MAX_FITS:
        raise InputError(f"--fits {fits} is out of range: a job of 1 to {MAX_FITS:,} GPUs")
    if mig is not None and not _MIG_PROFILE.match(mig):
        raise InputError(f"--mig {mig[:64]!r} is not a MIG profile (e.g. 1g.10gb, 3g.40gb, "
                         "1g.10gb+me)")
    if model is not None and not model.strip():
        raise InputError("--model is empty")


def family(model: str | None) -> str:
    """A model's family for score names: ``NVIDIA H100 80GB HBM3`` -> ``h100``, ``AMD
    Instinct MI300X`` -> ``mi300x``; a model without such a token, its name as a slug."""
    text = model or "unknown"
    for token in re.split(r"[\s_/-]+", text):
        if re.fullmatch(r"[A-Za-z]{1,3}\d{1,4}[A-Za-z]{0,3}", token) and \
                token.upper() not in ("HBM3", "HBM3E", "HBM2", "HBM2E", "PCIE", "SXM4", "SXM5"):
            return token.lower()
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:40].strip("-") or "unknown"


def model_matches(wanted: str | None, model: str | None) -> bool:
    """``--model H100`` names the family or a part of the model's name between word
    boundaries (``A100`` is not ``A1000``), case-insensitively."""
    if wanted is None:
        return True
    if model is None:
        return False
    w = wanted.strip().lower()
    if family(model) == w or model.lower() == w:
        return True
    return re.search(rf"(?<![a-z0-9]){re.escape(w)}(?![a-z0-9])", model.lower()) is not None


# -- reading the inventory ----------------------------------------------------------------------
def read_fleet(conn: Connection, *, clusters: Collection[str] | None = None,
               now: dt.datetime | None = None, max_age: float | None = None,
               idle_threshold: float = IDLE_THRESHOLD_PCT,
               idle_for: float = IDLE_FOR_S) -> Fleet:
    """Every GPU and slice of these clusters (None: all) with its status now. ``now`` (naive
    UTC) dates the reclaimable check and ``max_age``; None reads no reclaimable GPUs."""
    g = inv.gpus
    select = sa.select(g.c.uuid, g.c.slice_key, g.c.cluster, g.c.node, g.c.model,
                       g.c.mig_profile, g.c.memory_total_mib, g.c.state, g.c.health)
    if clusters is not None:
        select = select.where(g.c.cluster.in_(sorted(clusters)))
    rows = conn.execute(select).all()
    held = held_now(conn, clusters)
    stale = stale_clusters(conn, clusters, now, max_age)
    cordoned = cordoned_nodes(conn, clusters)
    idle = reclaimable_now(conn, now, clusters, idle_threshold, idle_for) if now else set()
    parents = {r.uuid: r for r in rows if r.slice_key == ""}
    sliced = {r.uuid for r in rows if r.slice_key != ""}
    units = []
    for r in rows:
        if r.slice_key == "" and r.uuid in sliced:
            continue  # a MIG layout's parent counts through its slices
        parent = parents.get(r.uuid) if r.slice_key else None
        model = r.model or (parent.model if parent else None)
        share = 1.0
        if r.slice_key:
            share = store.mig_share(model, r.mig_profile, r.memory_total_mib,
                                    parent.memory_total_mib if parent else None)
        key = (r.uuid, r.slice_key)
        failed = "failed" in (r.health, parent.health if parent else None)
        status = (STALE if r.state != inv.ACTIVE or r.cluster in stale
                  else FAILED if failed
                  else ALLOCATED if key in held
                  else CORDONED if (r.cluster, r.node) in cordoned
                  else FREE)
        units.append(Unit(r.cluster, r.node, r.uuid, r.slice_key, model, r.mig_profile,
                          share, status, status == ALLOCATED and key in idle))
    known = _cluster_names(conn, clusters) | {u.cluster for u in units}
    return Fleet(units, sorted(known), frozenset(stale & known))


def held_now(conn: Connection, clusters: Collection[str] | None) -> set[tuple[str, str]]:
    """(uuid, slice_key) a pod holds now: an allocation the latest sync that saw the GPU
    also saw, or a DRA claim the latest reconcile read (hub.usage._dra)."""
    g, a = inv.gpus, inv.allocations
    stmt = sa.select(a.c.uuid, a.c.slice_key).join(
        g, sa.and_(g.c.uuid == a.c.uuid, g.c.slice_key == a.c.slice_key,
                   g.c.cluster == a.c.cluster, g.c.node == a.c.node,
                   g.c.last_seen == a.c.last_seen))
    if clusters is not None:
        stmt = stmt.where(a.c.cluster.in_(sorted(clusters)))
    held = {(r.uuid, r.slice_key) for r in conn.execute(stmt)}
    return held | claim_held(conn, clusters, held)


def _cluster_names(conn: Connection, clusters: Collection[str] | None) -> set[str]:
    c = inv.clusters_table
    stmt = sa.select(c.c.cluster)
    if clusters is not None:
        stmt = stmt.where(c.c.cluster.in_(sorted(clusters)))
    return {r.cluster for r in conn.execute(stmt)}


def stale_clusters(conn: Connection, clusters: Collection[str] | None,
                   now: dt.datetime | None, max_age: float | None) -> set[str]:
    """Clusters the latest sync marked stale, and with ``max_age`` those whose newest sample
    is older than that (a sync that stopped running marks nothing stale)."""
    c = inv.clusters_table
    stmt = sa.select(c.c.cluster, c.c.state, c.c.last_sample_at, c.c.last_seen)
    if clusters is not None:
        stmt = stmt.where(c.c.cluster.in_(sorted(clusters)))
    out = set()
    for r in conn.execute(stmt):
        newest = r.last_sample_at or r.last_seen
        if r.state != inv.ACTIVE or (
                max_age is not None and now is not None
                and (newest is None or (now - newest).total_seconds() > max_age)):
            out.add(r.cluster)
    return out


def cordoned_nodes(conn: Connection, clusters: Collection[str] | None) -> set[tuple[str, str]]:
    """(cluster, node) the latest reconcile run that read each cluster's nodes found
    unschedulable (a cordon): a node it did not mark stays schedulable."""
    rr = inv.reconcile_results
    latest = (sa.select(rr.c.cluster, sa.func.max(rr.c.run_id).label("run_id"))
              .group_by(rr.c.cluster).subquery())
    stmt = (sa.select(rr.c.cluster, rr.c.node)
            .join(latest, sa.and_(latest.c.cluster == rr.c.cluster,
                                  latest.c.run_id == rr.c.run_id))
            .where(rr.c.unschedulable.is_(True)))
    if clusters is not None:
        stmt = stmt.where(rr.c.cluster.in_(sorted(clusters)))
    return {(r.cluster, r.node) for r in conn.execute(stmt)}


def reclaimable_now(conn: Connection, now: dt.datetime, clusters: Collection[str] | None,
                    threshold: float, for_seconds: float) -> set[tuple[str, str]]:
    """(uuid, slice_key) whose idle run by the ledger's rule (`idle --threshold --for`) lasts
    to the GPU's newest ledger bucket: idle now, as far as the ledger knows."""
    start = now - dt.timedelta(seconds=for_seconds) - dt.timedelta(hours=6)
    U = inv.usage
    newest = sa.select(U.c.uuid, U.c.slice, sa.func.max(U.c.bucket_end).label("end")) \
        .where(U.c.bucket_start >= start, U.c.bucket_start < now).group_by(U.c.uuid, U.c.slice)
    if clusters is not None:
        newest = newest.where(U.c.cluster.in_(sorted(clusters)))
    last = {(r.uuid, r.slice): r.end for r in conn.execute(newest)}
    out = set()
    for run in idle_runs(conn, start, now, threshold=threshold, for_seconds=for_seconds,
                         clusters=clusters):
        key = (run["uuid"], run["slice"] or "")
        if key in last and run["idle_until"] >= last[key]:
            out.add(key)
    return out


# -- the answers (pure) --------------------------------------------------------------------------
def totals(units: Iterable[Unit], by: Sequence[str]) -> list[dict[str, Any]]:
    """GPU-equivalents per group (columns ``by`` of model, cluster, node): total, active, the
    statuses, and reclaimable (a part of allocated)."""
    groups: dict[tuple, dict[str, Any]] = {}
    for u in units:
        values = {"model": u.model, "cluster": u.cluster, "node": u.node}
        k = tuple(values[c] for c in by)
        item = groups.setdefault(k, {**{c: values[c] for c in by},
                                     **dict.fromkeys(CAPACITY_FIGURES, 0.0)})
        item["total"] += u.share
        item[u.status] += u.share
        if u.status != STALE:
            item["active"] += u.share
        if u.reclaimable:
            item["reclaimable"] += u.share
    out = []
    for k in sorted(groups, key=lambda t: tuple(x or "" for x in t)):
        item = groups[k]
        for f in CAPACITY_FIGURES:
            item[f] = round(item[f], 6)
        out.append(item)
    return out


CAPACITY_FIGURES = ["total", "active", "stale", "failed", "allocated", "cordoned", "free",
                    "reclaimable"]


def _wanted(u: Unit, model: str | None, mig: str | None) -> bool:
    """A unit of the job's kind: a whole GPU (or a slice of the profile) of the model."""
    if mig is None:
        return u.slice_key == "" and model_matches(model, u.model)
    return u.slice_key != "" and u.mig_profile == mig and model_matches(model, u.model)


def fits(fleet: Fleet, n: int, *, model: str | None = None,
         mig: str | None = None) -> list[dict[str, Any]]:
    """Per cluster, whether a job of ``n`` GPUs (or slices of ``mig``) of ``model`` fits on
    one node now: fits (with the nodes that can take it), fragmented (enough free, not on
    one node), short (not enough healthy free), stale (the cluster's data is out of date).
    Counts are GPUs (or slices), not GPU-equivalents."""
    free: dict[str, dict[str, int]] = {c: {} for c in fleet.clusters}
    reclaim: dict[str, int] = dict.fromkeys(fleet.clusters, 0)
    for u in fleet.units:
        if not _wanted(u, model, mig):
            continue
        nodes = free.setdefault(u.cluster, {})
        reclaim.setdefault(u.cluster, 0)
        if u.status == FREE:
            nodes[u.node] = nodes.get(u.node, 0) + 1
        reclaim[u.cluster] += u.reclaimable
    out = []
    for cluster in sorted(free):
        nodes = free[cluster]
        largest = max(nodes.values(), default=0)
        total = sum(nodes.values())
        status = (STALE if cluster in fleet.stale_clusters else FITS if largest >= n
                  else FRAGMENTED if total >= n else SHORT)
        able = sorted((nd for nd, k in nodes.items() if k >= n), key=lambda nd: (-nodes[nd], nd))
        out.append({"cluster": cluster, "status": status, "free": total,
                    "largest_on_one_node": largest, "reclaimable": reclaim.get(cluster, 0),
                    "nodes": able if status == FITS else []})
    return out


# -- ACM placement scores (pure) ----------------------------------------------------------------
SCORE_RESOURCE = "gpufleet"
SCORE_API_VERSION = "cluster.open-cluster-management.io/v1alpha1"
SCORE_KIND = "AddOnPlacementScore"
FULL_AT: float = ServeOptions.default("full_at")
NODE_FULL_AT = 8


def scale(value: float, full_at: float) -> int:
    """-100 at 0, 100 at ``full_at`` and beyond, linear between: an AddOnPlacementScore
    value."""
    if full_at <= 0:
        raise InputError("--full-at must be greater than 0")
    return round(-100 + 200 * min(max(value, 0.0), full_at) / full_at)


def cluster_scores(fleet: Fleet, *, full_at: float = FULL_AT) -> dict[str, dict[str, int]]:
    """Per cluster: gpuFree (healthy free GPU-equivalents, every model), gpuFreeNode (the
    largest free block of whole GPUs on one node, 100 at 8), gpuReclaimable and
    gpuFree-<family>. A stale cluster's GPUs are not free: it scores -100."""
    free: dict[str, float] = dict.fromkeys(fleet.clusters, 0.0)
    reclaim: dict[str, float] = dict.fromkeys(fleet.clusters, 0.0)
    node_free: dict[str, dict[str, int]] = {c: {} for c in fleet.clusters}
    families: dict[str, dict[str, float]] = {c: {} for c in fleet.clusters}
    for u in fleet.units:
        per_family = families.setdefault(u.cluster, {})
        per_family.setdefault(family(u.model), 0.0)
        free.setdefault(u.cluster, 0.0)
        reclaim.setdefault(u.cluster, 0.0)
        if u.reclaimable:
            reclaim[u.cluster] += u.share
        if u.status != FREE:
            continue
        free[u.cluster] += u.share
        per_family[family(u.model)] += u.share
        if u.slice_key == "":
            nodes = node_free.setdefault(u.cluster, {})
            nodes[u.node] = nodes.get(u.node, 0) + 1
    out = {}
    for cluster in sorted(free):
        scores = {"gpuFree": scale(free[cluster], full_at),
                  "gpuFreeNode": scale(max(node_free.get(cluster, {}).values(), default=0),
                                       NODE_FULL_AT),
                  "gpuReclaimable": scale(reclaim[cluster], full_at)}
        for fam, value in sorted(families.get(cluster, {}).items()):
            scores[f"gpuFree-{fam}"] = scale(value, full_at)
        out[cluster] = scores
    return out


def score_objects(scores: Mapping[str, Mapping[str, int]],
                  valid_until: dt.datetime) -> list[dict[str, Any]]:
    """One AddOnPlacementScore per managed cluster, in the cluster's namespace on the hub
    (ACM's managed cluster namespace is the cluster's name), scores in its status."""
    until = valid_until.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
    return [{
        "apiVersion": SCORE_API_VERSION, "kind": SCORE_KIND,
        "metadata": {"name": SCORE_RESOURCE, "namespace": cluster,
                     "labels": {"app.kubernetes.io/managed-by": "gpufleet"}},
        "status": {"scores": [{"name": k, "value": v} for k, v in values.items()],
                   "validUntil": until},
    } for cluster, values in sorted(scores.items())]


#: how long scores stay valid: a few sync intervals (serve: 3 x --every)
VALID_FOR_S = 900.0


def placement_scores(conn: Connection, *, now: dt.datetime, full_at: float = FULL_AT,
                     valid_for: float = VALID_FOR_S,
                     clusters: Collection[str] | None = None,
                     idle_threshold: float = IDLE_THRESHOLD_PCT,
                     idle_for: float = IDLE_FOR_S) -> list[dict[str, Any]]:
    """The AddOnPlacementScore objects of these clusters (None: all) as the inventory
    stands at ``now`` (naive UTC), valid for ``valid_for`` seconds."""
    check_full_at(full_at)
    fleet = read_fleet(conn, clusters=clusters, now=now, idle_threshold=idle_threshold,
                       idle_for=idle_for)
    return score_objects(cluster_scores(fleet, full_at=full_at),
                         now + dt.timedelta(seconds=valid_for))
