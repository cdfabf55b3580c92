"""What the inventory holds of a group's GPUs, read once per group by the sync's writer
(hub/inventory/_writer.py) and compared by its events and the GPUs' life
(hub/inventory/_life.py): compact rows, so the write's memory follows the group.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Collection, Iterator, MutableMapping
from typing import Any, NamedTuple

from sqlalchemy.engine import Connection

from hub.inventory._db import _batches, gpus, plain_rows

GPU_KEY = ("uuid", "slice_key")  # a GPU is its UUID wherever it reports
#: what a sync writes of a GPU besides its key and first/last seen: compared with the table's
#: row, so an unchanged GPU is not rewritten
GPU_COMPARE = ("cluster", "node", "mig_profile", "mig_instance", "vendor", "gpu_index",
               "model", "driver_version", "pci_bus_id", "serial", "memory_total_mib",
               "memory_used_mib", "utilisation_pct", "power_w", "temperature_c", "health",
               "health_reasons", "state", "also_reporting", "last_sample_at")


class HeldPlace(NamedTuple):
    """What events compare of a GPU row (its place, state and CHANGE_FIELDS): the same for
    the GPUs of a node (one place, state, model, size and driver), so held once for them."""

    cluster: str
    node: str
    state: str
    model: str | None
    memory_total_mib: float | None
    driver_version: str | None
    health: str | None
    health_reasons: str | None


_HELD = [GPU_COMPARE.index(c) for c in HeldPlace._fields]
_PCI, _INDEX = GPU_COMPARE.index("pci_bus_id"), GPU_COMPARE.index("gpu_index")
_pick_held = operator.itemgetter(*_HELD)


class HeldGpu:
    """One GPU row as the table holds it: what events compare (a shared HeldPlace) and a
    digest (hash) of every GPU_COMPARE column for the write. With its key and place in
    HeldGpus ~220 bytes a GPU (370 as one tuple under a tuple key), where the row itself
    is ~1 kB: the write holds one for every GPU of a group."""

    __slots__ = ("digest", "same", "slot")

    def __init__(self, same: HeldPlace, digest: int, slot: str | None = None) -> None:
        self.same, self.digest, self.slot = same, digest, slot

    # its HeldPlace's fields (a property in C: the write reads them for every GPU)
    cluster = property(operator.attrgetter("same.cluster"))
    node = property(operator.attrgetter("same.node"))
    state = property(operator.attrgetter("same.state"))
    model = property(operator.attrgetter("same.model"))
    memory_total_mib = property(operator.attrgetter("same.memory_total_mib"))
    driver_version = property(operator.attrgetter("same.driver_version"))
    health = property(operator.attrgetter("same.health"))
    health_reasons = property(operator.attrgetter("same.health_reasons"))


class HeldGpus(MutableMapping[tuple[str, str], HeldGpu]):
    """(uuid, slice_key) -> HeldGpu, a physical GPU (slice_key '') keyed by its uuid alone:
    a key tuple is 56 bytes a GPU, what a group adds to the write's peak memory."""

    __slots__ = ("_rows",)

    def __init__(self) -> None:
        self._rows: dict[str | tuple[str, str], HeldGpu] = {}

    def __getitem__(self, key: tuple[str, str]) -> HeldGpu:
        return self._rows[key[0] if not key[1] else key]

    def get(self, key: tuple[str, str], default: Any = None) -> Any:  # type: ignore[override]
        return self._rows.get(key[0] if not key[1] else key, default)

    def __setitem__(self, key: tuple[str, str], value: HeldGpu) -> None:
        self._rows[key[0] if not key[1] else key] = value

    def __delitem__(self, key: tuple[str, str]) -> None:
        del self._rows[key[0] if not key[1] else key]

    def pop(self, key: tuple[str, str], default: Any = None) -> Any:  # type: ignore[override]
        return self._rows.pop(key[0] if not key[1] else key, default)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple):
            return False
        return (key[0] if not key[1] else key) in self._rows

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for key in self._rows:
            yield (key, "") if type(key) is str else key  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self._rows)

    def items(self) -> Iterator[tuple[tuple[str, str], HeldGpu]]:  # type: ignore[override]
        """One pass (the mixin's view would look every key up again)."""
        for key, row in self._rows.items():
            yield ((key, "") if type(key) is str else key), row  # type: ignore[misc]

    def clear(self) -> None:
        self._rows.clear()


def digest(values: tuple[Any, ...]) -> int:
    """The one hash a held row and a row to write are compared by: of the GPU_COMPARE
    values as the table stores them (hub.inventory._db.stored: last_sample_at is SQLite's
    text), so the held side is hashed as read, never parsed."""
    return hash(values)


def held_gpus(conn: Connection, uuids: Collection[str]) -> HeldGpus:
    """The rows the table holds of these GPUs (every slice of each uuid), keyed by
    (uuid, slice_key), asked BATCH uuids at a time (under SQLite's 32,766 bound parameters,
    and PostgreSQL's 65,535)."""
    intern = sys.intern
    out = HeldGpus()
    places: dict[tuple[Any, ...], HeldPlace] = {}
    for chunk in _batches(sorted(uuids)):
        for row in plain_rows(conn, gpus, _READ, "uuid", chunk):
            values = row[2:]
            # one HeldPlace for the GPUs of a place, its repeated strings (cluster, node,
            # state, model, driver) one object each
            raw = _pick_held(values)
            same = places.get(raw)
            if same is None:
                same = places[raw] = HeldPlace._make(intern(v) if type(v) is str else v
                                                     for v in raw)
            # the slot (hub.inventory._life.slot_of): bus ids repeat from node to node
            slot = (intern(values[_PCI][:32]) if values[_PCI]
                    else None if values[_INDEX] is None else f"index {values[_INDEX]}")
            out[(row[0], intern(row[1]))] = HeldGpu(same, digest(values), slot)
    return out


_READ = (*GPU_KEY, *GPU_COMPARE)
