"""A physical GPU's life (issue 38): where it sat and when, what replaced what, and how often
it failed; and the fleet's delivered / healthy / reserved / active counts.

A GPU is its identity (``gpus.uuid``: NVIDIA's UUID; AMD's uuid, or ``serial:...`` where the
exporter sends no uuid), never its slot: a part pulled from a slot under RMA and the part
put in its place keep two histories. The slot (cluster, node, PCI bus id) is where a
placement was, and a new identity in a slot another held within ``replaced_within`` writes
one ``replaced`` event (slot, old, new), so the two stay apart and yet the swap is on record.

The sync's writer (hub.inventory._writer.InventoryWriter) calls :func:`write_placements` for
each group with what it already holds of the group's GPUs: a placement is read and written
only when a GPU appears or changes place, so a steady-state sync costs nothing here.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub.common import InputError
from hub.inventory._db import (
    ACTIVE,
    _batches,
    _event,
    allocations,
    events,
    gpus,
    metadata,
)

if TYPE_CHECKING:
    from hub.inventory._held import HeldGpu
    from hub.inventory._normalize import Observation

#: a new identity in a slot another held this recently replaced it (`sync --replaced-within`)
REPLACED_WITHIN_S = 7 * 86400.0
#: the look-back of `inventory lemons` (`--since`)
LEMON_SINCE_S = 90 * 86400.0
#: a month in service, the unit of the failure rate
MONTH_S = 30 * 86400.0
#: the least time in service a rate is divided by, so a GPU seen for minutes that failed
#: once does not read as thousands of failures a month
MIN_SERVICE_S = 86400.0
LEMON_BY = ("gpu", "node", "slot", "model")
STATE_BY = ("cluster", "model", "namespace")
STATES = ("delivered", "healthy", "reserved", "active")
#: health levels that count as a failure when a GPU turns to them
FAILING = ("degraded", "failed")

#: Where each physical GPU was: one row per stay in a slot, ``until`` NULL while it is there
#: (revision 0021). Closed when the GPU reports from another slot, or when another identity
#: takes its slot; kept with the GPU and pruned with it.
placements = sa.Table(
    "placements", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("uuid", sa.String(128), nullable=False),
    sa.Column("cluster", sa.String(253), nullable=False),
    sa.Column("node", sa.String(253), nullable=False),
    # the PCI bus id; "index N" where the exporter sends none (AMD's); NULL: neither known
    sa.Column("slot", sa.String(32)),
    sa.Column("since", sa.DateTime, nullable=False),
    sa.Column("until", sa.DateTime),
    sa.Index("ix_placements_uuid", "uuid", "since"),
    sa.Index("ix_placements_slot", "cluster", "node", "slot"),
)


def slot_of(pci_bus_id: str | None, index: int | None) -> str | None:
    """The slot a GPU sits in: its PCI bus id, else its index on the node."""
    if pci_bus_id:
        return pci_bus_id[:32]
    return None if index is None else f"index {index}"


def _new_slot(obs: Observation, row: HeldGpu | None) -> str | None:
    """The observation's slot; a bus id the table holds stands where this sample lacks one
    (the upsert keeps it too), so a missing label is never a move."""
    slot = slot_of(obs.pci_bus_id, obs.index)
    if (row is not None and obs.pci_bus_id is None and row.slot is not None
            and not row.slot.startswith("index ")
            and (row.cluster, row.node) == (obs.cluster, obs.node)):
        return row.slot
    return slot


@dataclass(frozen=True)
class _Opening:
    uuid: str
    cluster: str
    node: str
    slot: str | None
    known: bool  # the GPU had a row: its open placement closes


def write_placements(conn: Connection, known: Mapping[tuple[str, str], HeldGpu],
                     seen: Mapping[tuple[str, str], Observation], now: dt.datetime,
                     replaced_within: float) -> list[dict[str, Any]]:
    """Open a placement for each physical GPU of ``seen`` that appeared or changed slot,
    close the ones they leave or take over, and return the ``replaced`` events."""
    opening: list[_Opening] = []
    back: list[_Opening] = []  # returning where it was: open again if another took the slot
    for (uuid, key), obs in seen.items():
        if key:
            continue
        row = known.get((uuid, ""))
        slot = _new_slot(obs, row)
        if row is None or (row.cluster, row.node, row.slot) != (obs.cluster, obs.node, slot):
            opening.append(_Opening(uuid, obs.cluster, obs.node, slot, row is not None))
        elif row.state != ACTIVE:
            back.append(_Opening(uuid, obs.cluster, obs.node, slot, True))
    if back:  # rare (a stale GPU reporting again): one query a batch
        p = placements
        still: set[str] = set()
        for chunk in _batches(sorted(o.uuid for o in back)):
            still.update(conn.execute(sa.select(p.c.uuid).where(
                p.c.uuid.in_(chunk), p.c.until.is_(None))).scalars())
        opening += [o for o in back if o.uuid not in still]
    if not opening:
        return []
    holders = _holders(conn, opening, now)
    replaced = list(_replaced(opening, holders, seen, known, now, replaced_within))
    p = placements
    mine = p.update().where(p.c.uuid == sa.bindparam("u"), p.c.until.is_(None)).values(until=now)
    for batch in _batches({"u": o.uuid} for o in opening if o.known):
        conn.execute(mine, batch)
    # only slots another GPU still holds open (none on a first sync: no per-GPU statement)
    theirs = p.update().where(p.c.cluster == sa.bindparam("c"), p.c.node == sa.bindparam("n"),
                              p.c.slot == sa.bindparam("s"), p.c.uuid != sa.bindparam("u"),
                              p.c.until.is_(None)).values(until=now)
    taken: Iterator[dict[str, Any]] = (
        {"c": o.cluster, "n": o.node, "s": o.slot, "u": o.uuid} for o in opening
        if any(uuid != o.uuid and until is None
               for until, uuid in holders.get((o.cluster, o.node, o.slot), ())))
    for batch in _batches(taken):
        conn.execute(theirs, batch)
    rows: Iterator[dict[str, Any]] = (
        {"uuid": o.uuid, "cluster": o.cluster, "node": o.node, "slot": o.slot, "since": now,
         "until": None} for o in opening)
    for rows_batch in _batches(rows):
        conn.execute(p.insert(), rows_batch)
    return replaced


Holders = dict[tuple[str, str, "str | None"], list[tuple["dt.datetime | None", str]]]


def _holders(conn: Connection, opening: list[_Opening], now: dt.datetime) -> Holders:
    """(cluster, node, slot) -> [(until, uuid)] of every placement in the slots GPUs open
    into, one query a batch (an empty table on a first sync answers at once)."""
    p = placements
    out: Holders = {}
    if not conn.execute(sa.select(p.c.id).limit(1)).first():
        return out
    slots = sorted({(o.cluster, o.node, o.slot) for o in opening if o.slot is not None})
    for chunk in _batches(slots):
        stmt = sa.select(p.c.cluster, p.c.node, p.c.slot, p.c.uuid, p.c.until).where(
            sa.tuple_(p.c.cluster, p.c.node, p.c.slot).in_(chunk))
        for cluster, node, slot, uuid, until in conn.execute(stmt):
            out.setdefault((cluster, node, slot), []).append((until, uuid))
    return out


def _replaced(opening: list[_Opening], holders: Holders,
              seen: Mapping[tuple[str, str], Observation],
              known: Mapping[tuple[str, str], HeldGpu], now: dt.datetime,
              within: float) -> Iterator[dict[str, Any]]:
    """One event per opening into a slot another identity held within ``within``: the
    latest other holder, unless it still reports from that very slot (two parts claiming
    one slot is a labelling fault, not a swap)."""
    cutoff = now - dt.timedelta(seconds=within)
    for o in opening:
        if o.slot is None:
            continue
        held = sorted(((until or now, uuid) for until, uuid
                       in holders.get((o.cluster, o.node, o.slot), ()) if uuid != o.uuid),
                      reverse=True)
        if not held or held[0][0] < cutoff:
            continue
        old = held[0][1]
        there = seen.get((old, ""))
        if there is not None and (there.cluster, there.node) == (o.cluster, o.node) \
                and _new_slot(there, known.get((old, ""))) == o.slot:
            continue
        yield _event(now, "replaced", o.cluster, o.node, o.uuid, "",
                     slot=o.slot, old=old, new=o.uuid)


def health_event(obs: Observation, row: HeldGpu | None, now: dt.datetime
                 ) -> dict[str, Any] | None:
    """A ``health`` event when a physical GPU's health or its reasons change (old, new,
    reasons); none when nothing was said (health None), nor for a GPU first seen healthy."""
    new, reasons = obs.health, obs.health_reasons
    old, old_reasons = (row.health, row.health_reasons) if row is not None else (None, None)
    if new is None or (old, old_reasons) == (new, reasons) or (old is None and new == "ok"):
        return None
    return _event(now, "health", obs.cluster, obs.node, obs.uuid, "", old=old, new=new,
                  reasons=reasons, old_reasons=old_reasons, slot=_new_slot(obs, row))


def allocated_at_last_sight(conn: Connection, gone: Iterable[tuple[str, dt.datetime]]
                            ) -> dict[str, list[str]]:
    """uuid -> namespaces holding it when it was last seen, for GPUs that just went stale
    (a GPU lost under a workload counts against it: issue 38). One query a batch."""
    last = dict(gone)
    out: dict[str, set[str]] = {}
    a = allocations
    for chunk in _batches(sorted(last)):
        for uuid, namespace, seen in conn.execute(
                sa.select(a.c.uuid, a.c.namespace, a.c.last_seen).where(a.c.uuid.in_(chunk))):
            if seen >= last[uuid]:
                out.setdefault(uuid, set()).add(namespace)
    return {u: sorted(ns) for u, ns in out.items()}


def prune_life(conn: Connection, uuids: Collection[str]) -> None:
    """A pruned GPU's placements and health events go with it (its other events stay)."""
    for chunk in _batches(sorted(uuids)):
        conn.execute(placements.delete().where(placements.c.uuid.in_(chunk)))
        conn.execute(events.delete().where(events.c.uuid.in_(chunk),
                                           events.c.type == "health"))


# -- reads ----------------------------------------------------------------------------------
PLACEMENT_COLUMNS = ["cluster", "node", "slot", "from", "until"]
HEALTH_COLUMNS = ["at", "cluster", "node", "old", "new", "reasons"]


def gpu_placements(conn: Connection, uuid: str) -> list[dict[str, Any]]:
    """Where the GPU sat, oldest first."""
    p = placements
    rows = conn.execute(sa.select(p).where(p.c.uuid == uuid).order_by(p.c.since, p.c.id))
    return [{"cluster": r.cluster, "node": r.node, "slot": r.slot, "from": r.since,
             "until": r.until} for r in rows]


def gpu_health(conn: Connection, uuid: str) -> list[dict[str, Any]]:
    """Its health events, oldest first; a repaired GPU keeps them."""
    e = events
    rows = conn.execute(sa.select(e).where(e.c.uuid == uuid, e.c.type == "health")
                        .order_by(e.c.at, e.c.id)).mappings()
    out = []
    for r in rows:
        d = json.loads(r["details"]) if r["details"] else {}
        out.append({"at": r["at"], "cluster": r["cluster"], "node": r["node"],
                    "old": d.get("old"), "new": d.get("new"), "reasons": d.get("reasons")})
    return out


def check_since(seconds: float) -> None:
    if not 0 < seconds <= 10 * 365 * 86400:
        raise InputError("--since must be greater than 0 and at most 3650d")


def parse_by(text: str, allowed: tuple[str, ...], *, many: bool) -> tuple[str, ...]:
    """``--by`` as a tuple of known keys, in the order given; one line naming what is off."""
    keys = tuple(k.strip() for k in text.split(",")) if many else (text.strip(),)
    bad = [k for k in keys if k not in allowed]
    if bad or not keys or len(set(keys)) != len(keys):
        raise InputError(f"--by {text!r}: expected {'one or more of' if many else 'one of'} "
                         f"{', '.join(allowed)}" + (" (comma-separated, each once)" if many
                                                    else ""))
    return keys


@dataclass
class _Failure:
    at: dt.datetime
    kind: str  # health | replaced | stale
    uuid: str
    cluster: str | None
    node: str | None
    slot: str | None
    what: str
    namespaces: tuple[str, ...] = ()


def _failures(conn: Connection, start: dt.datetime, clusters: Collection[str] | None
              ) -> list[_Failure]:
    e = events
    stmt = sa.select(e).where(e.c.at >= start, e.c.type.in_(("health", "replaced", "stale")),
                              e.c.slice.is_(None))
    if clusters is not None:
        stmt = stmt.where(e.c.cluster.in_(sorted(clusters)))
    out: list[_Failure] = []
    for r in conn.execute(stmt.order_by(e.c.at, e.c.id)).mappings():
        d = json.loads(r["details"]) if r["details"] else {}
        where = (r["cluster"], r["node"], d.get("slot"))
        if r["type"] == "health" and d.get("new") in FAILING:
            what = f"health {d.get('old') or 'unknown'} -> {d['new']}"
            out.append(_Failure(r["at"], "health", r["uuid"], *where,
                                what + (f" ({d['reasons']})" if d.get("reasons") else "")))
        elif r["type"] == "replaced" and d.get("old"):
            out.append(_Failure(r["at"], "replaced", d["old"], *where,
                                f"replaced by {d.get('new')} in {d.get('slot')}"))
        elif r["type"] == "stale" and d.get("allocated"):
            out.append(_Failure(r["at"], "stale", r["uuid"], *where,
                                "stopped reporting while allocated to "
                                + ", ".join(d["allocated"]), tuple(d["allocated"])))
    return out


def _key(by: str, uuid: str, cluster: str | None, node: str | None, slot: str | None,
         model: str | None) -> tuple[Any, ...]:
    return {"gpu": (uuid,), "node": (cluster, node), "slot": (cluster, node, slot),
            "model": (model,)}[by]


LEMON_KEYS = {"gpu": ["uuid", "model", "cluster", "node"], "node": ["cluster", "node"],
              "slot": ["cluster", "node", "slot"], "model": ["model"]}
LEMON_NUMBERS = ["gpus", "gpu_months", "failures", "health", "replaced", "stale_allocated",
                 "per_gpu_month"]


def lemon_columns(by: str) -> list[str]:
    return [*LEMON_KEYS[by], *LEMON_NUMBERS, "evidence"]


def lemons(conn: Connection, *, since: float, by: str, now: dt.datetime,
           clusters: Collection[str] | None = None,
           uuids: Collection[str] | None = None) -> list[dict[str, Any]]:
    """GPUs (nodes, slots, models) ranked by failures per GPU-month in service over the last
    ``since`` seconds: health events that turned a GPU degraded or failed, replacements (held
    against the part taken out) and times it went stale while allocated. Only rows with a
    failure; each carries its evidence. ``clusters``/``uuids``: a scoped caller's reach."""
    start = now - dt.timedelta(seconds=since)
    p = placements
    stmt = sa.select(p.c.uuid, p.c.cluster, p.c.node, p.c.slot, p.c.since, p.c.until).where(
        sa.or_(p.c.until.is_(None), p.c.until >= start), p.c.since <= now)
    if clusters is not None:
        stmt = stmt.where(p.c.cluster.in_(sorted(clusters)))
    stays = conn.execute(stmt.order_by(p.c.since, p.c.id)).all()
    models = dict(conn.execute(sa.select(gpus.c.uuid, gpus.c.model)
                               .where(gpus.c.slice_key == "")).all())
    service: dict[tuple[Any, ...], float] = {}
    members: dict[tuple[Any, ...], set[str]] = {}
    where_now: dict[str, tuple[str, str]] = {}
    for uuid, cluster, node, slot, begin, end in stays:
        if uuids is not None and uuid not in uuids:
            continue
        key = _key(by, uuid, cluster, node, slot, models.get(uuid))
        seconds = ((end or now) - max(begin, start)).total_seconds()
        service[key] = service.get(key, 0.0) + max(seconds, 0.0)
        members.setdefault(key, set()).add(uuid)
        where_now[uuid] = (cluster, node)
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for f in _failures(conn, start, clusters):
        if uuids is not None and f.uuid not in uuids:
            continue
        key = _key(by, f.uuid, f.cluster, f.node, f.slot, models.get(f.uuid))
        row = rows.setdefault(key, {"health": 0, "replaced": 0, "stale_allocated": 0,
                                    "evidence": []})
        row["stale_allocated" if f.kind == "stale" else f.kind] += 1
        row["evidence"].append({"at": f.at, "uuid": f.uuid, "cluster": f.cluster,
                                "node": f.node, "what": f.what,
                                "namespaces": list(f.namespaces)})
    out = []
    for key, row in rows.items():
        seconds = service.get(key, 0.0)
        failures = row["health"] + row["replaced"] + row["stale_allocated"]
        item = dict(zip(LEMON_KEYS[by], key, strict=False))
        if by == "gpu":
            item["model"] = models.get(key[0])
            item["cluster"], item["node"] = where_now.get(key[0], (None, None))
        item.update({"gpus": max(len(members.get(key, ())), 1),
                     "gpu_months": round(seconds / MONTH_S, 4), "failures": failures,
                     "health": row["health"], "replaced": row["replaced"],
                     "stale_allocated": row["stale_allocated"],
                     "per_gpu_month": round(failures * MONTH_S / max(seconds, MIN_SERVICE_S),
                                            2),
                     "evidence": row["evidence"]})
        out.append(item)
    out.sort(key=lambda r: (-r["per_gpu_month"], -r["failures"],
                            [str(r[k]) for k in LEMON_KEYS[by]]))
    return out


def mask_evidence(rows: list[dict[str, Any]], allowed: Collection[str]
                  ) -> list[dict[str, Any]]:
    """Lemon rows as a namespace-scoped caller sees them: another team's namespace in the
    evidence reads "other" (the row itself is a GPU the caller's namespaces hold)."""
    out = []
    for row in rows:
        evidence = []
        for item in row["evidence"]:
            if item["namespaces"]:
                names = sorted({n if n in allowed else "other" for n in item["namespaces"]})
                item = {**item, "namespaces": names,
                        "what": "stopped reporting while allocated to " + ", ".join(names)}
            evidence.append(item)
        out.append({**row, "evidence": evidence})
    return out


def reserved_by(conn: Connection, namespaces: Collection[str]) -> set[str]:
    """GPUs (uuids) these namespaces hold or held: what a namespace-scoped caller may see
    ranked, never another team's."""
    a = allocations
    return set(conn.execute(sa.select(a.c.uuid).where(a.c.namespace.in_(sorted(namespaces)))
                            .distinct()).scalars())


# -- fleet states ---------------------------------------------------------------------------
def _delivered_per_node(conn: Connection, clusters: Collection[str] | None
                        ) -> dict[tuple[str, str], int]:
    """What should be on each node: the most of Kubernetes' count at the latest reconcile
    that judged the node and its instance type's catalog count (what reports is added by
    the caller, per GPU)."""
    from hub.inventory._reconcile_runs import reconcile_results as r

    latest = (sa.select(r.c.cluster, r.c.node, sa.func.max(r.c.run_id).label("run_id"))
              .group_by(r.c.cluster, r.c.node).subquery())
    stmt = sa.select(r.c.cluster, r.c.node, r.c.k8s_gpus, r.c.expected_gpus).join(
        latest, sa.and_(latest.c.cluster == r.c.cluster, latest.c.node == r.c.node,
                        latest.c.run_id == r.c.run_id))
    if clusters is not None:
        stmt = stmt.where(r.c.cluster.in_(sorted(clusters)))
    return {(c, n): max(k or 0, e or 0) for c, n, k, e in conn.execute(stmt)}


def fleet_states(conn: Connection, *, by: tuple[str, ...] = (), idle: Collection[str] = (),
                 clusters: Collection[str] | None = None,
                 namespaces: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Delivered, healthy, reserved and active physical GPUs per ``by`` group.

    Each known GPU (active or stale) is delivered; healthy is reporting and not failed;
    reserved is reporting and held by a pod (an allocation seen at its latest sync); active
    is reserved and not in ``idle`` (uuids idle over --idle-for, from the ledger). A node's
    Kubernetes or catalog count above its known GPUs is delivered too, as GPUs of no
    namespace. Every count is a count of flags of one GPU, so Healthy, Reserved ⊆ Delivered
    and Active ⊆ Reserved hold in every group by construction. ``namespaces``: only the
    GPUs these reserve (a namespace-scoped caller: no delivered count of other teams')."""
    g, a = gpus, allocations
    stmt = sa.select(g.c.uuid, g.c.cluster, g.c.node, g.c.model, g.c.state, g.c.health,
                     g.c.last_seen).where(g.c.slice_key == "")
    if clusters is not None:
        stmt = stmt.where(g.c.cluster.in_(sorted(clusters)))
    holders: dict[str, set[str]] = {}
    held = sa.select(a.c.uuid, a.c.namespace).join(
        g, sa.and_(g.c.uuid == a.c.uuid, g.c.slice_key == "", a.c.last_seen >= g.c.last_seen,
                   g.c.state == ACTIVE)).distinct()
    for uuid, namespace in conn.execute(held):
        holders.setdefault(uuid, set()).add(namespace)
    idle = frozenset(idle)
    counts: dict[tuple[Any, ...], dict[str, int]] = {}
    node_known: dict[tuple[str, str], int] = {}
    node_model: dict[tuple[str, str], str | None] = {}

    def add(key: tuple[Any, ...], delivered: int, healthy: int, reserved: int,
            active: int) -> None:
        row = counts.setdefault(key, dict.fromkeys(STATES, 0))
        for state, n in zip(STATES, (delivered, healthy, reserved, active), strict=True):
            row[state] += n

    for uuid, cluster, node, model, state, health, _ in conn.execute(stmt):
        reporting = state == ACTIVE
        owners = sorted(holders.get(uuid, ())) if reporting else []
        healthy = int(reporting and health != "failed")
        node_known[(cluster, node)] = node_known.get((cluster, node), 0) + 1
        node_model.setdefault((cluster, node), model)
        reserved = int(bool(owners))
        active = int(bool(owners) and uuid not in idle)
        # a GPU several namespaces share (MIG) is counted once, under its first holder
        namespace = owners[0] if owners else None
        if namespaces is not None and namespace not in namespaces:
            continue
        values = {"cluster": cluster, "model": model, "namespace": namespace}
        add(tuple(values[b] for b in by), 1, healthy, reserved, active)
    if namespaces is None:
        for place, expected in _delivered_per_node(conn, clusters).items():
            extra = expected - node_known.get(place, 0)
            if extra > 0:
                values = {"cluster": place[0], "model": node_model.get(place),
                          "namespace": None}
                add(tuple(values[b] for b in by), extra, 0, 0, 0)
    rows = [{**dict(zip(by, key, strict=True)), **c} for key, c in counts.items()]
    rows.sort(key=lambda r: tuple(str(r[b] or "") for b in by))
    if not by and not rows:
        rows = [dict.fromkeys(STATES, 0)]
    return rows

