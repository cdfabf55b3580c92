"""Turn the hub's PromQL rows into vendor-neutral GPU observations (pure).

A :class:`FleetBuilder` takes one query result at a time (so a sync holds only the responses
in flight, never all of them) and yields :class:`Observation` objects. It asks the vendor
profiles what labels and names mean; it knows nothing about any exporter itself.

Rules that hold for every vendor:
- a GPU exists when any of its device-level series has a sample in the window; a field it
  does not report is None, never a reason to drop the GPU;
- a MIG slice is its own observation with its parent's uuid, and its parent physical GPU
  always exists (synthesised from its slices when the exporter only reports slices).
"""

from __future__ import annotations

import enum
import json
import math
import sys
from array import array
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Final

from hub import store
from hub.inventory import _health as health
from hub.store import Identity, Query, Refused, VendorProfile

Allocation = tuple[str, str, str]  # namespace, pod, container


@dataclass(slots=True)
class Observation:
    """One GPU or MIG slice as the hub last saw it (slots: a sync holds 100,000 at once)."""

    cluster: str
    node: str
    uuid: str
    vendor: str
    mig_profile: str | None = None
    mig_instance: str | None = None
    index: int | None = None
    model: str | None = None
    driver_version: str | None = None
    pci_bus_id: str | None = None
    serial: str | None = None
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    utilisation_pct: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    sample_at: float | None = None  # epoch seconds of the newest sample (the data's own time)
    allocations: AbstractSet[Allocation] = field(default_factory=frozenset)
    #: "ok" | "degraded" | "failed" (None: no health field reported), see inventory._health
    health: str | None = None
    health_reasons: str | None = None
    #: the neutral health fields behind ``health`` (kept to judge a slice-only GPU's parent)
    health_values: dict[str, float] = field(default_factory=lambda: _NO_HEALTH_VALUES)

    @property
    def is_slice(self) -> bool:
        return self.mig_profile is not None

    @property
    def slice_key(self) -> str:
        """'' for a physical GPU, 'profile/instance' for a MIG slice (a non-null key column)."""
        if self.mig_profile is None:
            return ""
        return f"{self.mig_profile}/{self.mig_instance or ''}"


class _Unseen(enum.Enum):
    """A series key not met before (a typed sentinel: None means "not a GPU's series")."""

    UNSEEN = 0


_UNSEEN: Final = _Unseen.UNSEEN

#: the health values of the many GPUs that report none: one shared, never written, dict
#: rather than 64 bytes each at 100,000 GPUs (read only: inventory._health.merge, the DB)
_NO_HEALTH_VALUES: dict[str, float] = {}

#: what most GPUs' ``allocations`` is: one shared empty set, not 200 bytes each
_NO_ALLOCATIONS: frozenset[Allocation] = frozenset()

Row = Mapping[str, Any]  # one element of a Prometheus vector result: {"metric": ..., "value": ...}


def _float(text: str) -> float:
    """A sample's value or time as written ("NaN", "+Inf" included); NaN when unreadable."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def keyed_rows(rows: Iterable[Row]) -> Iterator[tuple[str, str, str]]:
    """Decoded rows (an answer not streamed, tests) as StreamedRows.keyed gives them:
    (label set as JSON without ``__name__``, time, value as written). Keys sorted, as
    Prometheus writes them, so a series' rows of two answers give one key; every answer
    then folds through the one path, :meth:`FleetBuilder.add_keyed`."""
    for row in rows:
        labels = {k: v for k, v in (row.get("metric") or {}).items() if k != "__name__"}
        sample = row.get("value")
        ts, value = (sample if isinstance(sample, list | tuple) and len(sample) == 2
                     else ("", ""))
        yield (json.dumps(labels, sort_keys=True, separators=(",", ":"), ensure_ascii=False),
               str(ts), str(value))


#: Every neutral field a query can fill, and its slot in a series' value array.
_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(
    f for p in store.PROFILES for f in (*p.value_fields, *p.health_fields)))
_SLOT = {f: i for i, f in enumerate(_FIELDS)}
#: each field's physical range (hub.store._bounds), in slot order
_BOUNDS = tuple(store.bounds(f) for f in _FIELDS)
_AT = len(_FIELDS)  # the last slot: the series' newest sample time
_EMPTY = array("d", [math.nan] * (len(_FIELDS) + 1))
_ATTRS = ("index", "model", "driver_version", "pci_bus_id", "serial")


def _shared(text: Any) -> Any:
    """One string object for a label value that thousands of series repeat (model, driver,
    cluster, node): each decoded row brings its own copy otherwise."""
    return sys.intern(text) if type(text) is str else text


class _Series:
    """What one series (label set) of a GPU said, in a few machine words: at 100,000 GPUs a
    dict per series and per field would hold ~300 MB, these hold ~40 MB."""

    __slots__ = ("alloc", "attrs", "more", "vals", "vendor")

    def __init__(self, vendor: str, attrs: tuple, alloc: Allocation | None) -> None:
        self.vendor = vendor
        self.attrs = attrs  # in _ATTRS order
        self.alloc = alloc
        self.vals = array("d", _EMPTY)  # NaN: not reported; last slot: sample time
        self.more: _Series | None = None  # the GPU's next series (a chain, rarely long)


#: how many names of unlabelled series' hosts a report line lists before "and N more"
UNLABELLED_HOSTS_SHOWN = 10


class Unlabelled:
    """What a sync saw of GPU series without the cluster label: how many GPUs (and MIG
    slices), which labels they do carry, and which hosts they come from. Enough for an
    operator to find the one spoke whose agent lost its external label."""

    __slots__ = ("gpus", "hosts", "labels")

    def __init__(self) -> None:
        self.gpus: set[tuple[str, str, str, str | None, str | None]] = set()
        self.labels: set[str] = set()
        self.hosts: set[str] = set()

    def add(self, profile: VendorProfile, labels: Mapping[str, str],
            cluster_label: str) -> None:
        found = profile.identity(labels, cluster_label)
        if found is None:
            return
        self.gpus.add((profile.vendor, found.node, found.uuid, found.mig_profile,
                       found.mig_instance))
        self.labels.update(k for k in labels if k != "__name__")
        if found.node:
            self.hosts.add(found.node)

    def __bool__(self) -> bool:
        return bool(self.gpus)

    def merge(self, other: Unlabelled) -> None:
        """What another shard of the same sync saw."""
        self.gpus |= other.gpus
        self.labels |= other.labels
        self.hosts |= other.hosts

    def describe(self, cluster_label: str) -> str:
        """One line: ``unlabelled_series: 3 GPU series lack label 'cluster' (they carry: ...;
        hosts: a, b)``; the report's finding and the sync run's note."""
        hosts = sorted(self.hosts)
        shown = ", ".join(hosts[:UNLABELLED_HOSTS_SHOWN]) or "none named"
        if len(hosts) > UNLABELLED_HOSTS_SHOWN:
            shown += f" and {len(hosts) - UNLABELLED_HOSTS_SHOWN} more"
        return (f"{UNLABELLED_SERIES}: {len(self.gpus)} GPU series lack label "
                f"{cluster_label!r} and were left out of the sync (they carry: "
                f"{', '.join(sorted(self.labels))}; hosts: {shown}); fix the external "
                "labels of the spoke that pushes them")


#: The check name of the finding (and the sync run's note) about series without the label.
UNLABELLED_SERIES = "unlabelled_series"


class FleetBuilder:
    """Accumulates query results of one sync into observations.

    Rows arrive in any order (the sync fetches concurrently); each is folded into its GPU and
    dropped, so the builder holds one small record per series, never the responses. A GPU
    with several series in the window (new pod, exporter restart, driver upgrade) takes each
    field from its newest series, ranked by the sample times, when observations are built.
    """

    def __init__(self, cluster_label: str = "cluster") -> None:
        self.cluster_label = cluster_label
        #: GPU (identity tuple) -> its first series; the others hang off ``older``
        self._gpus: dict[tuple, _Series] = {}
        #: series key -> its record, so a series' labels are parsed once, not once a field
        self._series: dict[int, _Series | None] = {}
        #: sample times of series no value row has named yet (the answers race)
        self._early: dict[int, float] = {}
        #: series without the cluster label: left out of the sync (a GPU filed without its
        #: cluster would sit under a cluster named '' and look healthy) and described here
        self.unlabelled = Unlabelled()
        self._left_out: set[int] = set()  # their series keys
        #: set by the sync once every answer is in: Unlabelled.describe, or None
        #: cluster -> the namings its GPUs send (read off the sample-time answer)
        self.namings: dict[str, set[str]] = {}
        #: series the store's door turned away and readings out of their physical range,
        #: per cluster (hub.store._bounds): left out of the inventory, named by the report
        self.refused = Refused(cluster_label)

    @property
    def known(self) -> Container[int]:
        """Hashes of the label texts met so far: the door checked them when first met
        (StreamedRows.keyed), so it need not decode them again."""
        return self._series

    # -- feeding ----------------------------------------------------------------------------
    def add(self, query: Query, rows: Iterable[Row]) -> tuple[int, int]:
        """Decoded rows of one answer: see add_keyed."""
        return self.add_keyed(query, keyed_rows(rows))

    def add_timestamps(self, profile: VendorProfile, rows: Iterable[Row],
                       fld: str | None = None) -> None:
        """Rows of HubClient.query_newest: ``value`` is [newest sample's time, its value];
        with ``fld`` the value fills that field too."""
        self._fold(profile, fld, True, keyed_rows(rows))

    def add_values(self, profile: VendorProfile, fld: str, rows: Iterable[Row]) -> None:
        self._fold(profile, fld, False, keyed_rows(rows))

    def add_keyed(self, query: Query, rows: Iterable[tuple[str, str, str]],
                  decode: Callable[[str], Any] = json.loads) -> tuple[int, int]:
        """Rows of a streamed answer as (labels JSON, time, value) (StreamedRows.keyed): the
        labels text is the series key, decoded (``decode``: StreamedRows.labels) only for
        a series not seen before. Returns how many rows came and how many lacked the
        cluster label (left out)."""
        return self._fold(store.profile(query.vendor), query.field, query.kind == "timestamp",
                          rows, presence=query.kind == "presence", decode=decode)

    def add_names(self, profile: VendorProfile, names: Iterable[tuple[str, str]]) -> None:
        """(cluster, clock-family metric name) pairs of a sample-time answer
        (StreamedRows.names): the namings each cluster's GPUs send."""
        for cluster, name in names:
            naming = profile.naming(name)
            if cluster and naming:
                self.namings.setdefault(cluster, set()).add(naming)

    def cluster_namings(self) -> dict[str, str]:
        """cluster -> legacy | dcgm-4.7 | both, for the clusters whose GPUs sent either."""
        return {c: store.BOTH if len(n) > 1 else next(iter(n))
                for c, n in self.namings.items()}

    def _fold(self, profile: VendorProfile, fld: str | None, stamps: bool,
              rows: Iterable[tuple[str, str, str]], presence: bool = False,
              decode: Callable[[str], Any] = json.loads) -> tuple[int, int]:
        """Fold rows into their series. A presence row's value is its newest sample's time
        (the presence query's answer), and it makes its GPU like a value row does."""
        slot = _SLOT[fld] if fld else None
        field_name = fld or ""  # the field whenever there is a slot
        makes = slot is not None or presence
        convert = profile.convert
        known, early, unlabelled = self._series, self._early, self.unlabelled
        left_out = self._left_out
        count = missing = 0
        for text, ts, raw in rows:
            count += 1
            key = hash(text)
            series = known.get(key, _UNSEEN)
            if series is _UNSEEN:
                labels = decode(text)
                if not labels.get(self.cluster_label):
                    missing += 1
                    unlabelled.add(profile, labels, self.cluster_label)
                    left_out.add(key)
                    known[key] = None  # left out: never a GPU of this sync
                    early.pop(key, None)
                    continue
                if not makes:  # a time alone makes no GPU
                    t = _float(ts)
                    if t > early.get(key, -math.inf):
                        early[key] = t
                    continue
                series = known[key] = self._new_series(profile, labels, key)
            if series is None:
                missing += key in left_out
                continue
            if slot is not None:
                value = _float(raw)
                if value == value:
                    series.vals[slot] = convert(field_name, value)
            if stamps or presence:
                t = _float(raw if presence else ts)
                if t == t and not t <= series.vals[_AT]:  # no time yet is NaN
                    series.vals[_AT] = t
        return count, missing

    @property
    def gpu_count(self) -> int:
        """GPUs and slices (carrying the cluster label) seen so far."""
        return len(self._gpus)

    def _new_series(self, profile: VendorProfile, labels: Mapping[str, str],
                    key: int) -> _Series | None:
        found = profile.identity(labels, self.cluster_label)
        if found is None:
            return None  # not a GPU's series (e.g. node-level)
        ident = (_shared(found.cluster), _shared(found.node), found.uuid,
                 _shared(found.mig_profile), _shared(found.mig_instance))
        attrs = profile.attributes(labels)
        series = _Series(profile.vendor, tuple(map(_shared, map(attrs.get, _ATTRS))),
                         store.allocation(labels))
        last = self._gpus.get(ident)
        if last is None:
            self._gpus[ident] = series
        else:  # a second series of one GPU: chained after the others, in arrival order
            while last.more is not None:
                last = last.more
            last.more = series
        ts = self._early.pop(key, None)
        if ts is not None:
            series.vals[_AT] = ts
        return series

    # -- results ----------------------------------------------------------------------------
    def observations(self) -> Iterator[Observation]:
        """Every GPU and slice seen, parents synthesised for slice-only GPUs."""
        slices_of: dict[Identity, list[Observation]] = {}
        physical: dict[Identity, Observation] = {}
        self._series.clear()  # only needed while answers arrive
        self._early.clear()
        self._left_out.clear()
        while self._gpus:  # each GPU's records go as its observation is made (memory)
            ident, first = self._gpus.popitem()
            obs = self._observation(ident, first)
            if obs.is_slice:
                parent = Identity(ident[0], ident[1], ident[2])
                slices_of.setdefault(parent, []).append(obs)
                yield obs
            else:
                physical[Identity(*ident)] = obs
        for parent, slices in slices_of.items():
            if parent not in physical:
                physical[parent] = _parent_from_slices(parent, slices)
        yield from physical.values()

    def _observation(self, ident: tuple, first: _Series) -> Observation:
        cluster = ident[0]
        attrs: Sequence[Any]
        allocations: AbstractSet[Allocation]
        if first.more is None:  # one series, as nearly every GPU has: nothing to merge
            newest, attrs = first, first.attrs
            present = [(f, b, v) for f, b, v in zip(_FIELDS, _BOUNDS, first.vals,
                                                      strict=False) if v == v]
            values = {f: v for f, (low, high), v in present if low <= v <= high}
            if len(values) < len(present):  # out of its range: unknown
                for f, (low, high), v in present:
                    if not low <= v <= high:
                        self.refused.add(cluster, f, store.describe_reading(f, v))
            allocations = (_NO_ALLOCATIONS if first.alloc is None
                           else frozenset((first.alloc,)))
        else:
            newest, attrs, values, allocations = self._merged(cluster, first)
        sample_at = newest.vals[_AT]
        cluster, node, uuid, mig_profile, mig_instance = ident
        obs = Observation(
            cluster=cluster, node=node, uuid=uuid, vendor=first.vendor,
            mig_profile=mig_profile, mig_instance=mig_instance,
            index=attrs[0], model=attrs[1], driver_version=attrs[2], pci_bus_id=attrs[3],
            serial=attrs[4], sample_at=None if sample_at != sample_at else sample_at,
            allocations=allocations,
        )
        _apply_values(obs, values, self.refused)
        return obs

    def _merged(self, cluster: str, first: _Series
                ) -> tuple[_Series, Sequence[Any], dict[str, float], AbstractSet[Allocation]]:
        """A GPU's several series as one: the newest series decides, an older one only
        fills what the newest lacks (and a reading out of its range is unknown, so an
        older series' stands)."""
        chain = [first]
        while chain[-1].more is not None:
            chain.append(chain[-1].more)
        chain.sort(key=lambda s: -math.inf if s.vals[_AT] != s.vals[_AT] else s.vals[_AT],
                   reverse=True)
        attrs = list(chain[0].attrs)
        values: dict[str, float] = {}
        for series in reversed(chain):
            for i, v in enumerate(series.attrs):
                if v is not None:
                    attrs[i] = v
            for f, (low, high), v in zip(_FIELDS, _BOUNDS, series.vals, strict=False):
                if v == v:  # NaN: not reported
                    if low <= v <= high:
                        values[f] = v
                    else:
                        self.refused.add(cluster, f, store.describe_reading(f, v))
        allocations = {s.alloc for s in chain if s.alloc is not None} or _NO_ALLOCATIONS
        return chain[0], attrs, values, allocations


def _first(values: Mapping[str, float], *names: str) -> float | None:
    for name in names:
        if values.get(name) is not None:
            return values[name]
    return None


def _apply_values(obs: Observation, values: Mapping[str, float],
                  refused: Refused | None = None) -> None:
    used = values.get(store.MEMORY_USED)
    free = values.get(store.MEMORY_FREE)
    total = values.get(store.MEMORY_TOTAL)
    if total is None and used is not None and free is not None:
        total = used + free + (values.get(store.MEMORY_RESERVED) or 0.0)
    if used is None and total is not None and free is not None:
        used = total - free
    if used is not None and total is not None and not store.within(store.MEMORY_USED, used,
                                                                  total):
        # more used than the GPU has (or free beyond it): the reading, not the GPU, is wrong
        if refused is not None:
            refused.add(obs.cluster, store.MEMORY_USED,
                        store.describe_reading(store.MEMORY_USED, used, total))
        used = None
    obs.memory_total_mib = total
    obs.memory_used_mib = used
    # DCGM's GPU_UTIL is 0 or absent on MIG slices; the profiling counter is the real one there.
    if obs.is_slice:
        obs.utilisation_pct = _first(values, store.ENGINE_ACTIVE, store.UTILISATION)
    else:
        obs.utilisation_pct = _first(values, store.UTILISATION, store.ENGINE_ACTIVE)
    obs.power_w = values.get(store.POWER)
    obs.temperature_c = values.get(store.TEMPERATURE)
    _apply_health(obs, {k: v for k, v in values.items() if k in _HEALTH_FIELDS})


_HEALTH_FIELDS = frozenset(f for p in store.PROFILES for f in p.health_fields)


def _apply_health(obs: Observation, values: dict[str, float]) -> None:
    obs.health_values = values or _NO_HEALTH_VALUES
    obs.health, obs.health_reasons = health.assess(values)


def _sum(values: list[float | None]) -> float | None:
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def _max(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _parent_from_slices(ident: Identity, slices: list[Observation]) -> Observation:
    """dcgm-exporter under MIG reports only slices: the physical GPU is their sum.

    Memory adds up across slices; power and temperature are device-wide readings repeated on
    every slice, so the maximum is the device's value; utilisation of the whole GPU is not
    reported and stays None rather than being invented.
    """
    first = slices[0]
    times = [s.sample_at for s in slices if s.sample_at is not None]
    parent = Observation(
        cluster=ident.cluster, node=ident.node, uuid=ident.uuid, vendor=first.vendor,
        index=first.index, model=first.model, driver_version=first.driver_version,
        pci_bus_id=first.pci_bus_id, serial=first.serial,
        memory_total_mib=_sum([s.memory_total_mib for s in slices]),
        memory_used_mib=_sum([s.memory_used_mib for s in slices]),
        power_w=_max([s.power_w for s in slices]),
        temperature_c=_max([s.temperature_c for s in slices]),
        sample_at=max(times) if times else None,
    )
    _apply_health(parent, health.merge([s.health_values for s in slices]))
    return parent
