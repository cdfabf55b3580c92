"""The sync's writer: what a sync saw becomes the inventory's rows and events, group by group
(a sharded sync: one shard of clusters at a time), in the caller's transaction.

It sits above the schema (hub/inventory/_db.py), the held rows it compares against
(hub/inventory/_held.py) and the GPUs' life (hub/inventory/_life.py); none of them imports
it, so the sync's walk goes one way.
"""

from __future__ import annotations

import datetime as dt
import json
import operator
from array import array
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub.inventory._db import (
    ACTIVE,
    BATCH,
    STALE,
    _batches,
    _event,
    allocations,
    clusters,
    events,
    gpus,
    nodes,
    stored,
    upsert,
    utc,
    write_namings,
)
from hub.inventory._held import GPU_COMPARE, GPU_KEY, HeldGpu, digest, held_gpus
from hub.inventory._life import (
    REPLACED_WITHIN_S,
    allocated_at_last_sight,
    health_event,
    write_placements,
)
from hub.inventory._normalize import Observation

#: columns a sync leaves as they were when it does not know them (a series without labels)
GPU_KEEP_IF_NULL = ("last_sample_at", "model", "driver_version", "pci_bus_id", "serial",
                    "gpu_index")

#: Attributes whose change is a `changed` event (the MIG layout is compared separately).
CHANGE_FIELDS = ("model", "memory_total_mib", "driver_version")


#: Two places whose newest samples of one GPU are this close both report it now (a
#: duplicate, not a move). Allows one ACM push interval (300 s) between them.
CONCURRENT_S = 300.0


Twins = dict[tuple[str, str], list[Observation]]


def _gather(observations: Iterable[Observation]) -> tuple[
        dict[tuple[str, str], Observation], Twins, list[Observation]]:
    """Every observation (for its allocations, which belong to the node that saw them), one
    per (uuid, slice), and the rare identities reported from several places."""
    chosen: dict[tuple[str, str], Observation] = {}
    twins: Twins = {}
    every: list[Observation] = []
    for obs in observations:
        every.append(obs)
        key = (obs.uuid, obs.slice_key)
        first = chosen.setdefault(key, obs)
        if first is not obs:
            twins.setdefault(key, [first]).append(obs)
    return chosen, twins, every


def _newest_per_identity(chosen: dict[tuple[str, str], Observation], twins: Twins,
                         known: Mapping[tuple[str, str], HeldGpu]
                         ) -> dict[tuple[str, str], list[list[str]]]:
    """Settle each twin identity in ``chosen`` on one place; returns the places reporting
    it beside.

    Right after a move the look-back window still shows the GPU's last samples from its old
    node; the newest sample says where it is now. Places whose newest samples are within
    CONCURRENT_S of each other report at the same time: the GPU stays where the inventory
    had it (no flapping `moved` events) and the others are kept as ``also_reporting``.
    """
    def t(o: Observation) -> float:
        return o.sample_at if o.sample_at is not None else float("-inf")

    others: dict[tuple[str, str], list[list[str]]] = {}
    for key, group in twins.items():
        # ties (both places' newest samples at one time) go by place, never by the order
        # the answers happened to arrive in (or the shard that held each place)
        newest = max(group, key=lambda o: (t(o), o.cluster, o.node))
        current = [o for o in group if t(o) >= t(newest) - CONCURRENT_S]
        row = known.get(key)
        pick = next((o for o in current if row is not None
                     and (o.cluster, o.node) == (row.cluster, row.node)), newest)
        chosen[key] = pick
        beside = sorted({(o.cluster, o.node) for o in current} - {(pick.cluster, pick.node)})
        if beside:
            others[key] = [list(p) for p in beside]
    return others


#: Total memory is a property of the GPU, not a reading: where the exporter does not say it
#: (FB_CAPACITY / FB_TOTAL), used + free (+ reserved) of the newest samples jitters by up to
#: ~1.5 % between syncs (the fields' samples are not all of one instant). Within this share
#: of the stored size the inventory keeps the stored size, so no sync writes a `changed`
#: event for it (issue 30); a real change (another model or MIG profile) differs by > 8 %.
MEMORY_TOLERANCE = 0.05


def same_memory(old: float | None, new: float | None) -> bool:
    """Two totals of one GPU that are the same size (see MEMORY_TOLERANCE)."""
    if old is None or new is None:
        return old is new
    return abs(float(old) - float(new)) <= MEMORY_TOLERANCE * max(abs(float(old)), 1.0)


def _same(old: Any, new: Any, fld: str = "") -> bool:
    if fld == "memory_total_mib":
        return same_memory(old, new)
    if isinstance(old, float) or isinstance(new, float):
        return old is not None and new is not None and abs(float(old) - float(new)) < 0.5
    return old == new


def _layout(known: Mapping[tuple[str, str], HeldGpu]) -> dict[str, list[str]]:
    """The MIG slices the table holds as active, per GPU uuid (few: MIG GPUs only); a GPU
    whose slices all went stale is there with none, one never seen with slices is absent."""
    layout: dict[str, list[str]] = {}
    for (uuid, key), row in known.items():
        if key:
            keys = layout.setdefault(uuid, [])
            if row.state == ACTIVE:
                keys.append(key)
    return layout


def _seen_events(known: Mapping[tuple[str, str], HeldGpu],
                 seen: Mapping[tuple[str, str], Observation],
                 layout_old: Mapping[str, list[str]], now: dt.datetime,
                 unchanged: AbstractSet[tuple[str, str]] = frozenset()
                 ) -> Iterator[dict[str, Any]]:
    """The events of what ``seen`` holds (every slice of a GPU is in the same ``seen``: a
    GPU's slices report from one node, so from one shard of a sync). A row in ``unchanged``
    holds what its observation says (place, state, fields and health), so only its MIG
    layout, which is its slices' rows, can have changed."""
    layout_new: dict[str, list[str]] = {}
    for uuid, key in seen:
        if key:
            layout_new.setdefault(uuid, []).append(key)
    for ident, obs in seen.items():
        uuid, key = ident
        if ident in unchanged:
            if not key and uuid in layout_old:
                yield from _layout_event(obs, layout_old, layout_new, now)
            continue
        row = known.get(ident)
        where = (obs.cluster, obs.node, uuid, key)
        if not key and (health := health_event(obs, row, now)) is not None:
            yield health
        if row is None:
            yield _event(now, "appeared", *where)
            continue
        if row.state != ACTIVE:
            yield _event(now, "returned", *where)
        if (row.cluster, row.node) != (obs.cluster, obs.node):
            yield _event(now, "moved", *where,
                         **{"from": {"cluster": row.cluster, "node": row.node},
                            "to": {"cluster": obs.cluster, "node": obs.node}})
        for fld in CHANGE_FIELDS:
            new, old = getattr(obs, fld), getattr(row, fld)
            if new is not None and old is not None and not _same(old, new, fld):
                yield _event(now, "changed", *where, field=fld, old=old, new=new)
        # the first slices a GPU shows record its layout (their `appeared` events say so):
        # its own series often reach the hub a sync before its slices' (the demo's first
        # syncs had a `changed mig_layout` for every MIG GPU a second after `appeared`)
        if not key and uuid in layout_old:
            yield from _layout_event(obs, layout_old, layout_new, now)


def _layout_event(obs: Observation, layout_old: Mapping[str, list[str]],
                  layout_new: Mapping[str, list[str]], now: dt.datetime
                  ) -> Iterator[dict[str, Any]]:
    before = sorted(layout_old[obs.uuid])
    after = sorted(layout_new.get(obs.uuid, []))
    if before != after:
        yield _event(now, "changed", obs.cluster, obs.node, obs.uuid, "",
                     field="mig_layout", old=" ".join(before), new=" ".join(after))


def apply_observations(conn: Connection, observations: Iterable[Observation],
                       now: dt.datetime,
                       namings: Mapping[str, str] | None = None) -> dict[str, int]:
    """Upsert what this sync saw as active, mark everything it did not see stale, and write
    the events that this implies (all in the caller's transaction)."""
    writer = InventoryWriter(conn, now)
    writer.add(observations)
    if namings:
        write_namings(conn, namings, now)
    return writer.finish()


class InventoryWriter:
    """One sync's write, fed group by group (a sharded sync: one shard of clusters at a time)
    in the caller's transaction, so memory follows the group, not the fleet.

    Each group reads the table's rows of its own GPUs only (by uuid, so a GPU that moved in
    from another shard's cluster is found too), as compact tuples: what events compare and a
    digest of the rest. Rows and events are made and written a batch at a time. What the
    sync keeps across groups is the hash of each GPU it saw, 8 bytes a GPU: at
    :meth:`finish` an active row whose hash is not there was not seen and turns stale (a
    64-bit collision, under 1 in 10^7 at a million GPUs, would leave one gone GPU active
    for one more sync). Clusters and nodes a group saw are stamped ``last_seen = now``; at
    the end every active one not stamped turns stale, so a cluster absent from every group
    is stale, never deleted.

    A group must hold every place that reports its GPUs: a GPU reported from two clusters
    of two shards (a move inside the window, a mislabelled spoke) is held back with
    ``held`` and written with the others so held in one last group, where the newest place
    is chosen among all (as one unsharded write would).
    """

    def __init__(self, conn: Connection, now: dt.datetime, *,
                 replaced_within: float | None = None) -> None:
        self.conn, self.now = conn, now
        self.replaced_within = (REPLACED_WITHIN_S if replaced_within is None
                                else replaced_within)
        self.seen = array("q")  # hash((uuid, slice_key)) of every GPU a group wrote
        self.rewritten = 0  # of them, rows the groups upserted (the others were unchanged)
        self.counts = {"clusters": 0, "nodes": 0, "gpus": 0, "events": 0}

    def add(self, observations: Iterable[Observation], held: AbstractSet[int] = frozenset(),
            *, places: bool = True) -> list[Observation]:
        """Write a group: its clusters, nodes and allocations (of every observation, unless
        ``places`` is false: a held-back group's were written with their shards), and its
        GPUs and their events, less those whose ``hash(uuid)`` is in ``held``: returned."""
        every = observations if isinstance(observations, list) else list(observations)
        back: list[Observation] = []
        if held:
            kept: list[Observation] = []
            for obs in every:
                (back if hash(obs.uuid) in held else kept).append(obs)
        else:
            kept = every
        if places:
            self._places(every)
        self._gpus(kept)
        return back

    def _places(self, every: list[Observation]) -> None:
        conn, now = self.conn, self.now
        # newest sample times as seconds, made datetimes once a node and cluster
        node_last: dict[tuple[str, str], float | None] = {}
        cluster_last: dict[str, float | None] = {}
        for obs in every:
            sample_at = obs.sample_at
            key = (obs.cluster, obs.node)
            if sample_at is not None:
                prev = node_last.get(key)
                if prev is None or sample_at > prev:
                    node_last[key] = sample_at
                prev = cluster_last.get(obs.cluster)
                if prev is None or sample_at > prev:
                    cluster_last[obs.cluster] = sample_at
            else:
                node_last.setdefault(key, None)
                cluster_last.setdefault(obs.cluster, None)
        seen_cols = ["state", "last_seen", "last_sample_at"]
        upsert(conn, clusters, [
            {"cluster": c, "state": ACTIVE, "first_seen": now, "last_seen": now,
             "last_sample_at": utc(t)}
            for c, t in cluster_last.items()
        ], seen_cols, keep_if_null=["last_sample_at"])
        upsert(conn, nodes, [
            {"cluster": c, "node": n, "state": ACTIVE, "first_seen": now, "last_seen": now,
             "last_sample_at": utc(t)}
            for (c, n), t in node_last.items()
        ], seen_cols, keep_if_null=["last_sample_at"])
        # each sample time made a datetime once (the GPUs of a scrape share one)
        times = {t: utc(t) for t in {obs.sample_at for obs in every if obs.allocations}}
        upsert(conn, allocations, (
            {"cluster": obs.cluster, "node": obs.node, "uuid": obs.uuid,
             "slice_key": obs.slice_key, "namespace": namespace, "pod": pod,
             "container": container, "first_seen": now, "last_seen": now,
             "last_sample_at": times[obs.sample_at]}
            for obs in every if obs.allocations
            for namespace, pod, container in obs.allocations
        ), ["last_seen", "last_sample_at"], keep_if_null=["last_sample_at"])
        self.counts["clusters"] += len(cluster_last)
        self.counts["nodes"] += len(node_last)

    def _gpus(self, group: list[Observation]) -> None:
        if not group:
            return
        now = self.now
        seen, twins, _ = _gather(group)
        # read before the write: every slice of each uuid, so the old MIG layout is whole
        known = held_gpus(self.conn, {uuid for uuid, _ in seen})
        beside = _newest_per_identity(seen, twins, known)
        self.counts["gpus"] += sum(not obs.is_slice for obs in seen.values())
        unchanged: set[tuple[str, str]] = set()
        self.rewritten += upsert(self.conn, gpus, self._changed(seen, beside, known, unchanged),
                                 ["last_seen", *GPU_COMPARE], keep_if_null=GPU_KEEP_IF_NULL)
        self._events(_seen_events(known, seen, _layout(known), now, unchanged))
        self._events(write_placements(self.conn, known, seen, now, self.replaced_within))
        self.seen.extend(map(hash, seen))

    def _changed(self, seen: Mapping[tuple[str, str], Observation],
                 beside: Mapping[tuple[str, str], list[list[str]]],
                 held: Mapping[tuple[str, str], HeldGpu],
                 unchanged: set[tuple[str, str]]) -> Iterator[dict[str, Any]]:
        """The rows to write: only what changed, so a steady-state sync costs little more than
        a first one. The keys of the others go into ``unchanged``.

        ``held`` is what the table holds; a row whose columns (other than last_seen) are
        unchanged is not rewritten but touched by one UPDATE of last_seen with every other active
        row the sync saw (InventoryWriter.finish). A row compares by digest of its values as
        stored (the table's rows are hashed as read), made from the observation before any row
        is: one whose label went missing (None, which the upsert does not write over a known
        value) is rewritten each sync, never wrongly left as it was. An observation's total
        memory becomes its row's where the two are the same size (see same_memory), before the
        compare and the events.
        """
        now = self.now
        as_stored = stored(self.conn, gpus.c.last_sample_at)
        times: dict[float | None, Any] = {}  # sample time -> as stored (a node's GPUs share it)
        for key, obs in seen.items():
            also = beside.get(key)
            also_json = json.dumps(also) if also else None
            old = held.get(key)
            if old is not None:
                # the stored total where the new one is the same size (see same_memory)
                size = old.memory_total_mib
                if (size is not None and obs.memory_total_mib is not None
                        and same_memory(size, obs.memory_total_mib)):
                    obs.memory_total_mib = size
                at = obs.sample_at
                sample = times.get(at)
                if sample is None:
                    sample = times[at] = as_stored(utc(at))
                if old.digest == digest((*_from_observation(obs), ACTIVE, also_json, sample)):
                    unchanged.add(key)
                    continue
            yield _gpu_row(obs, also_json, now)

    def _events(self, rows: Iterable[dict[str, Any]]) -> None:
        for batch in _batches(rows):
            self.conn.execute(events.insert(), batch)
            self.counts["events"] += len(batch)

    def finish(self) -> dict[str, int]:
        """Mark what no group saw stale (GPUs, nodes, clusters), with its events; the counts
        of what the groups saw."""
        conn, now = self.conn, self.now
        for table in (clusters, nodes):
            conn.execute(
                table.update()
                .where(table.c.state == ACTIVE, table.c.last_seen < now)
                .values(state=STALE)
            )
        import numpy  # with pandas already: sorted hashes and a vectorised lookup

        seen = numpy.sort(numpy.frombuffer(self.seen, dtype=numpy.int64))
        # Active rows this sync did not write: seen unchanged, or gone. The seen unchanged
        # are the seen the groups did not upsert (an unchanged row is active: a stale one
        # seen again changes state), so as many such rows as those means none is gone,
        # the common case, told by one count. Else one streamed pass
        # (paging in key order had SQLite sort every active row once a page), keeping the
        # gone only: memory follows what went stale this sync, not the fleet.
        # uuid, slice_key, cluster, node, last_seen
        gone: list[tuple[str, str, str, str, dt.datetime]] = []
        untouched = conn.execute(sa.select(sa.func.count()).select_from(gpus).where(
            gpus.c.state == ACTIVE, gpus.c.last_seen < now)).scalar() or 0
        result = None if untouched <= len(self.seen) - self.rewritten else conn.execute(
            sa.select(gpus.c.uuid, gpus.c.slice_key, gpus.c.cluster, gpus.c.node,
                      gpus.c.last_seen)
            .where(gpus.c.state == ACTIVE, gpus.c.last_seen < now)
            .execution_options(yield_per=BATCH))
        for rows in result.partitions() if result is not None else ():
            hashes = numpy.fromiter((hash((r.uuid, r.slice_key)) for r in rows),
                                    dtype=numpy.int64, count=len(rows))
            if len(seen):
                found = seen[numpy.searchsorted(seen, hashes).clip(max=len(seen) - 1)] == hashes
                gone += (tuple(r) for r, was in zip(rows, found.tolist(), strict=True)
                         if not was)
            else:
                gone += (tuple(r) for r in rows)
        stale = (gpus.update().where(*(gpus.c[c] == sa.bindparam(f"k_{c}") for c in GPU_KEY))
                 .values(state=STALE))
        for batch in _batches({"k_uuid": uuid, "k_slice_key": key}
                              for uuid, key, _, _, _ in gone):
            conn.execute(stale, batch)
        # a physical GPU lost while a pod held it: the stale event says whose (lemons)
        held = allocated_at_last_sight(
            conn, ((uuid, last) for uuid, key, _, _, last in gone if not key))
        self._events(_event(now, "stale", cluster, node, uuid, key,
                            **({"allocated": held[uuid]} if uuid in held and not key else {}))
                     for uuid, key, cluster, node, _ in gone)
        # every row still active was seen by this sync (the gone ones just turned stale)
        conn.execute(gpus.update().where(gpus.c.state == ACTIVE, gpus.c.last_seen < now)
                     .values(last_seen=now))
        del self.seen[:]
        self.rewritten = 0
        return dict(self.counts)


def _gpu_row(obs: Observation, also: str | None, now: dt.datetime) -> dict[str, Any]:
    return {
        "cluster": obs.cluster, "node": obs.node, "uuid": obs.uuid,
        "slice_key": obs.slice_key,
        "mig_profile": obs.mig_profile, "mig_instance": obs.mig_instance,
        "vendor": obs.vendor, "gpu_index": obs.index, "model": obs.model,
        "driver_version": obs.driver_version, "pci_bus_id": obs.pci_bus_id,
        "serial": obs.serial, "memory_total_mib": obs.memory_total_mib,
        "memory_used_mib": obs.memory_used_mib, "utilisation_pct": obs.utilisation_pct,
        "power_w": obs.power_w, "temperature_c": obs.temperature_c,
        "health": obs.health, "health_reasons": obs.health_reasons, "state": ACTIVE,
        "also_reporting": also,
        "first_seen": now, "last_seen": now, "last_sample_at": utc(obs.sample_at),
    }


#: GPU_COMPARE but its last three, read off an observation (gpu_index is its ``index``)
_from_observation = operator.attrgetter(*(
    {"gpu_index": "index"}.get(c, c) for c in GPU_COMPARE[:-3]))
assert GPU_COMPARE[-3:] == ("state", "also_reporting", "last_sample_at")
