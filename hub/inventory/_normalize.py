"""Turn the hub's aggregated PromQL rows into vendor-neutral GPU observations (pure).

A :class:`FleetBuilder` takes one query result at a time (so a sync holds one response in
memory, never all of them) and yields :class:`Observation` objects. It asks the vendor
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


class FleetBuilder:
    """Accumulates query results of one sync into observations."""

    def __init__(self, cluster_label: str = "cluster") -> None:
        self.cluster_label = cluster_label
        self._seen: dict[Identity, str] = {}  # identity -> vendor (existence)
        self._attrs: dict[Identity, dict[str, Any]] = {}
        self._allocs: dict[Identity, set[Allocation]] = {}
        self._times: dict[Identity, float] = {}
        self._values: dict[Identity, dict[str, float]] = {}

    # -- feeding ----------------------------------------------------------------------------
    def add(self, query: Query, rows: Iterable[Row]) -> None:
        profile = store.profile(query.vendor)
        if query.kind == "identity":
            self.add_identity(profile, rows)
        elif query.kind == "timestamp":
            self.add_timestamps(profile, rows)
        else:
            self.add_values(profile, query.field or "", rows)

    def add_identity(self, profile: VendorProfile, rows: Iterable[Row]) -> None:
        for row in rows:
            labels = row["metric"]
            ident = profile.identity(labels, self.cluster_label)
            if ident is None:
                continue
            self._seen[ident] = profile.vendor
            attrs = profile.attributes(labels)
            known = self._attrs.setdefault(ident, {})
            for key, value in attrs.items():
                if value is not None and known.get(key) is None:
                    known[key] = value
            alloc = store.allocation(labels)
            if alloc is not None:
                self._allocs.setdefault(ident, set()).add(alloc)

    def add_timestamps(self, profile: VendorProfile, rows: Iterable[Row]) -> None:
        for row in rows:
            ident = profile.identity(row["metric"], self.cluster_label)
            ts = _value(row)
            if ident is None or ts is None:
                continue
            if ts > self._times.get(ident, float("-inf")):
                self._times[ident] = ts

    def add_values(self, profile: VendorProfile, fld: str, rows: Iterable[Row]) -> None:
        for row in rows:
            ident = profile.identity(row["metric"], self.cluster_label)
            value = _value(row)
            if ident is None or value is None:
                continue
            self._values.setdefault(ident, {})[fld] = profile.convert(fld, value)

    # -- results ----------------------------------------------------------------------------
    def observations(self) -> Iterator[Observation]:
        """Every GPU and slice seen, parents synthesised for slice-only GPUs."""
        slices_of: dict[Identity, list[Observation]] = {}
        physical: dict[Identity, Observation] = {}
        for ident, vendor in self._seen.items():
            obs = self._observation(ident, vendor)
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

    def _observation(self, ident: Identity, vendor: str) -> Observation:
        attrs = self._attrs.get(ident, {})
        values = self._values.get(ident, {})
        obs = Observation(
            cluster=ident.cluster, node=ident.node, uuid=ident.uuid, vendor=vendor,
            mig_profile=ident.mig_profile, mig_instance=ident.mig_instance,
            index=attrs.get("index"), model=attrs.get("model"),
            driver_version=attrs.get("driver_version"), pci_bus_id=attrs.get("pci_bus_id"),
            serial=attrs.get("serial"), sample_at=self._times.get(ident),
            allocations=self._allocs.get(ident, set()),
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
