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

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from hub import store
from hub.inventory import _health as health
from hub.store import Identity, Query, VendorProfile

Allocation = tuple[str, str, str]  # namespace, pod, container


@dataclass
class Observation:
    """One GPU or MIG slice as the hub last saw it."""

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
    allocations: set[Allocation] = field(default_factory=set)
    #: "ok" | "degraded" | "failed" (None: no health field reported), see inventory._health
    health: str | None = None
    health_reasons: str | None = None
    #: the neutral health fields behind ``health`` (kept to judge a slice-only GPU's parent)
    health_values: dict[str, float] = field(default_factory=dict)

    @property
    def is_slice(self) -> bool:
        return self.mig_profile is not None

    @property
    def slice_key(self) -> str:
        """'' for a physical GPU, 'profile/instance' for a MIG slice (a non-null key column)."""
        if self.mig_profile is None:
            return ""
        return f"{self.mig_profile}/{self.mig_instance or ''}"


Row = Mapping[str, Any]  # one element of a Prometheus vector result: {"metric": ..., "value": ...}


def _value(row: Row) -> float | None:
    try:
        v = float(row["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return None if v != v else v  # NaN is "no value"


def series_key(labels: dict[str, str]) -> int:
    """A series' label set without its name, as one int: the join key between a field's rows
    and the sample times (every family of one scrape carries the same labels). A 64-bit hash
    rather than the labels themselves keeps 100,000 GPUs' keys in a few MB. Drops
    ``__name__`` from the (decoded, throw-away) row it is given."""
    labels.pop("__name__", None)
    return hash(frozenset(labels.items()))


@dataclass(slots=True)
class _Series:
    """What one series (label set) of a GPU said: its attributes and its fields' values."""

    attrs: dict[str, Any]
    values: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class _Gpu:
    vendor: str
    series: dict[int, _Series] = field(default_factory=dict)
    allocations: set[Allocation] | None = None  # most GPUs have none: no empty set each


class FleetBuilder:
    """Accumulates query results of one sync into observations.

    Rows arrive in any order (the sync fetches concurrently); each is folded into its GPU and
    dropped, so the builder holds one small record per series, never the responses. A GPU
    with several series in the window (new pod, exporter restart, driver upgrade) takes each
    field from its newest series, ranked by the sample times, when observations are built.
    """

    def __init__(self, cluster_label: str = "cluster") -> None:
        self.cluster_label = cluster_label
        self._gpus: dict[Identity, _Gpu] = {}
        self._times: dict[int, float] = {}  # series key -> newest sample time
        #: series key -> its record, so a series' labels are parsed once, not once a field
        self._series: dict[int, _Series | None] = {}

    # -- feeding ----------------------------------------------------------------------------
    def add(self, query: Query, rows: Iterable[Row]) -> None:
        profile = store.profile(query.vendor)
        if query.kind == "timestamp":
            self.add_timestamps(profile, rows, query.field)
        else:
            self.add_values(profile, query.field or "", rows)

    def add_timestamps(self, profile: VendorProfile, rows: Iterable[Row],
                       fld: str | None = None) -> None:
        """Rows of HubClient.query_newest: ``value`` is [newest sample's time, its value];
        with ``fld`` the value fills that field too (rows are read once: they may stream)."""
        for row in rows:
            try:
                ts = float(row["value"][0])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            key = series_key(row["metric"])
            if ts > self._times.get(key, float("-inf")):
                self._times[key] = ts
            if fld:
                self.add_values(profile, fld, (row,))

    def add_values(self, profile: VendorProfile, fld: str, rows: Iterable[Row]) -> None:
        known = self._series
        convert = profile.convert
        for row in rows:
            labels = row["metric"]
            key = series_key(labels)
            if key in known:
                series = known[key]
            else:
                series = known[key] = self._new_series(profile, labels, key)
            value = _value(row)
            if series is not None and value is not None:
                series.values[fld] = convert(fld, value)

    def _new_series(self, profile: VendorProfile, labels: Mapping[str, str],
                    key: int) -> _Series | None:
        ident = profile.identity(labels, self.cluster_label)
        if ident is None:
            return None  # not a GPU's series (e.g. node-level)
        gpu = self._gpus.get(ident)
        if gpu is None:
            gpu = self._gpus[ident] = _Gpu(profile.vendor)
        series = gpu.series[key] = _Series(profile.attributes(labels))
        alloc = store.allocation(labels)
        if alloc is not None:
            if gpu.allocations is None:
                gpu.allocations = set()
            gpu.allocations.add(alloc)
        return series

    # -- results ----------------------------------------------------------------------------
    def observations(self) -> Iterator[Observation]:
        """Every GPU and slice seen, parents synthesised for slice-only GPUs."""
        slices_of: dict[Identity, list[Observation]] = {}
        physical: dict[Identity, Observation] = {}
        self._series.clear()  # only needed while answers arrive
        while self._gpus:  # each GPU's records go as its observation is made (memory)
            ident, gpu = self._gpus.popitem()
            obs = self._observation(ident, gpu)
            if obs.is_slice:
                parent = Identity(ident.cluster, ident.node, ident.uuid)
                slices_of.setdefault(parent, []).append(obs)
                yield obs
            else:
                physical[ident] = obs
        for parent, slices in slices_of.items():
            if parent not in physical:
                physical[parent] = _parent_from_slices(parent, slices)
        yield from physical.values()

    def _observation(self, ident: Identity, gpu: _Gpu) -> Observation:
        times = self._times
        if len(gpu.series) == 1:  # the common case: one series, nothing to choose
            (key, only), = gpu.series.items()
            sample_at = times.get(key)
            attrs, values = only.attrs, only.values
        else:
            ranked = sorted(gpu.series.items(),
                            key=lambda kv: times.get(kv[0], float("-inf")), reverse=True)
            sample_at = times.get(ranked[0][0])
            # The newest series decides; an older one only fills what the newest lacks.
            attrs, values = {}, {}
            for _, series in reversed(ranked):
                attrs.update((k, v) for k, v in series.attrs.items() if v is not None)
                values.update(series.values)
        obs = Observation(
            cluster=ident.cluster, node=ident.node, uuid=ident.uuid, vendor=gpu.vendor,
            mig_profile=ident.mig_profile, mig_instance=ident.mig_instance,
            index=attrs.get("index"), model=attrs.get("model"),
            driver_version=attrs.get("driver_version"), pci_bus_id=attrs.get("pci_bus_id"),
            serial=attrs.get("serial"), sample_at=sample_at,
            allocations=gpu.allocations or set(),
        )
        _apply_values(obs, values)
        return obs


def _first(values: Mapping[str, float], *names: str) -> float | None:
    for name in names:
        if values.get(name) is not None:
            return values[name]
    return None


def _apply_values(obs: Observation, values: Mapping[str, float]) -> None:
    used = values.get(store.MEMORY_USED)
    free = values.get(store.MEMORY_FREE)
    total = values.get(store.MEMORY_TOTAL)
    if total is None and used is not None and free is not None:
        total = used + free + (values.get(store.MEMORY_RESERVED) or 0.0)
    if used is None and total is not None and free is not None:
        used = total - free
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
    obs.health_values = values
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
