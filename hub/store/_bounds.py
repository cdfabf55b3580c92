"""What a spoke may send: the physical range of every reading the hub keeps, and the shape of
every label value it stores. One table each, read by the store's door (hub/store/_client.py:
labels), the sync (hub/inventory/_normalize.py: readings) and the usage ledger
(hub/usage/_fold.py: readings).

A spoke is someone else's cluster. A dcgm-exporter 4.9 that sends utilisation as 1e9, a
framebuffer of -4,768 MiB or -1e9 W, or an agent that pushes a label value with a NUL byte,
must cost that spoke its own readings and nothing more: a reading out of its range is
dropped as unknown (never stored, never billed), a series whose labels cannot be stored is
turned away at the door, and both are counted against the cluster that sent them
(:class:`Refused`), so the report names the spoke instead of the bill absorbing it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping

from hub.store._fields import (
    CLOCKS_EVENT_REASONS,
    DEVICE_HEALTH,
    ECC_DBE,
    ENGINE_ACTIVE,
    LAST_XID,
    MEMORY_FREE,
    MEMORY_RESERVED,
    MEMORY_TOTAL,
    MEMORY_USED,
    POWER,
    ROW_REMAP_FAILURE,
    TEMPERATURE,
    UTILISATION,
)
from hub.store._usage import DRAM_ACTIVE, SM_ACTIVE, TENSOR_ACTIVE

#: No GPU has a terabyte of memory yet (B300 and MI355X: 288 GB); a reading above is not one.
MEMORY_CEILING_MIB = float(1 << 20)
#: Twice the largest board limit shipping (a GB200 superchip's module reports up to 2,700 W).
#: No exporter's board limit is collected, so the fixed ceiling stands for "2x the limit".
POWER_CEILING_W = 5400.0

#: neutral field -> (lowest, highest) a real GPU can report, in the hub's units (%, MiB, W,
#: °C). A field without a row here is not bounded. Clocks have none: the hub reads the clock
#: families for their sample times only, never stores their values.
RANGES: dict[str, tuple[float, float]] = {
    UTILISATION: (0.0, 100.0),
    ENGINE_ACTIVE: (0.0, 100.0),
    SM_ACTIVE: (0.0, 100.0),
    TENSOR_ACTIVE: (0.0, 100.0),
    DRAM_ACTIVE: (0.0, 100.0),
    MEMORY_USED: (0.0, MEMORY_CEILING_MIB),
    MEMORY_FREE: (0.0, MEMORY_CEILING_MIB),
    MEMORY_RESERVED: (0.0, MEMORY_CEILING_MIB),
    MEMORY_TOTAL: (0.0, MEMORY_CEILING_MIB),
    POWER: (0.0, POWER_CEILING_W),
    # below -40 °C no datacentre runs; above 150 °C every GPU has shut itself down
    TEMPERATURE: (-40.0, 150.0),
    LAST_XID: (0.0, 65535.0),
    ECC_DBE: (0.0, 1e15),
    ROW_REMAP_FAILURE: (0.0, 1.0),
    CLOCKS_EVENT_REASONS: (0.0, 2.0 ** 64),
    DEVICE_HEALTH: (0.0, 1.0),
}
#: relative slack at the edges: an average of in-range samples is in range up to rounding
SLACK = 1e-9


def bounds(field: str, ceiling: float | None = None) -> tuple[float, float]:
    """The finite (lowest, highest) of ``field``, slack included: ``lo <= v <= hi`` is
    :func:`within` for hot loops (NaN and ±Inf fail it)."""
    low, high = RANGES.get(field, (-sys.float_info.max, sys.float_info.max))
    if ceiling is not None and ceiling >= low:
        high = min(high, ceiling)
    return (low - SLACK * abs(low),
            min(sys.float_info.max, high + SLACK * max(1.0, abs(high))))


def within(field: str, value: float, ceiling: float | None = None) -> bool:
    """Whether ``value`` (in the hub's unit of ``field``) is a reading a GPU can give; a
    ``ceiling`` (the GPU's own memory, where known) narrows the top. NaN and ±Inf never are."""
    low, high = bounds(field, ceiling)
    return low <= value <= high


def describe_reading(field: str, value: float, ceiling: float | None = None) -> str:
    """``utilisation_pct 1e+09 (range 0-100)``: one refused reading, for the finding."""
    low, high = RANGES.get(field, (-sys.float_info.max, sys.float_info.max))
    if ceiling is not None and ceiling >= low:
        high = min(high, ceiling)
    return f"{field} {value:g} (range {low:g} to {high:g})"


# -- labels ---------------------------------------------------------------------------------
#: The longest label value the hub stores: a Kubernetes object name (DNS subdomain).
MAX_LABEL_VALUE = 253
#: Labels stored in narrower columns (hub/inventory/_db.py), by the column they fill.
NARROW_LABELS: dict[str, int] = {
    "UUID": 128, "gpu_uuid": 128,  # gpus.uuid
    "modelName": 128, "card_series": 128, "card_model": 128,  # gpus.model
    "DCGM_FI_DRIVER_VERSION": 64, "DCGM_FI_SYSTEM_DRIVER_VERSION": 64,
    "driver_version": 64,  # gpus.driver_version
    "serial": 64, "serial_number": 64,  # gpus.serial (and an AMD uuid "serial:...")
    "pci_bus_id": 32,  # gpus.pci_bus_id
    "GPU_I_PROFILE": 32, "GPU_I_ID": 16,  # gpus.mig_profile, mig_instance
}
#: control characters (C0, DEL, C1) and lone surrogates: PostgreSQL refuses a NUL outright,
#: the others break every line a finding, log or CSV is written on
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def label_problem(labels: Mapping[str, str]) -> str | None:
    """Why a series' label set cannot be stored (one short phrase), or None when it can.

    Every label of the set is held to the rule, not only those the hub keeps today: a label
    value is a Kubernetes name or a short attribute, and one holding a NUL byte or running
    past 253 characters says the series was not made by an exporter."""
    text = "".join(labels.values())
    if not (text.isascii() and text.isprintable()):
        for name, value in labels.items():
            found = _CONTROL.search(value)
            if found:
                return f"label {_safe(name)} holds a control character ({found[0]!a})"
    if max(map(len, labels.values()), default=0) > MAX_LABEL_VALUE:
        name = next(k for k, v in labels.items() if len(v) > MAX_LABEL_VALUE)
        return (f"label {_safe(name)} is {len(labels[name]):,} characters long "
                f"(at most {MAX_LABEL_VALUE})")
    for label, limit in NARROW_LABELS.items():
        narrow = labels.get(label)
        if narrow is not None and len(narrow) > limit:
            return f"label {label} is {len(narrow):,} characters long (at most {limit})"
    names = "".join(labels)  # checked at once: a regex a name made this the door's cost
    if not (names.isascii() and names.isprintable()) and any(_CONTROL.search(k)
                                                             for k in labels):
        return "a label name holds a control character"
    return None


def _safe(text: str, limit: int = 64) -> str:
    """A label's name or value fit to print and store: control characters as '?', cut."""
    clean = _CONTROL.sub("?", text)
    return clean if len(clean) <= limit else clean[:limit - 1] + "…"


class Refused:
    """What was left out of one run (a sync, a usage bucket) because a spoke sent it out of
    shape, counted per cluster and kind: ``label`` for a series turned away at the door, a
    field's name for a reading out of its range. The first reason of each is kept, shown by
    the finding. ``cluster_label`` names the label a refused series is counted under."""

    __slots__ = ("_series", "cluster_label", "counts", "examples")

    def __init__(self, cluster_label: str = "cluster") -> None:
        self.cluster_label = cluster_label
        self.counts: dict[tuple[str, str], int] = {}
        self.examples: dict[tuple[str, str], str] = {}
        #: refused series (hash of the label set) -> where they count: a series appears in
        #: many answers of one run and is one series
        self._series: dict[int, tuple[str, str]] = {}

    def add(self, cluster: str, kind: str, reason: str, count: int = 1) -> None:
        key = (cluster_name(cluster), kind)
        self.counts[key] = self.counts.get(key, 0) + count
        self.examples.setdefault(key, reason)

    def series(self, labels: Mapping[str, str], reason: str) -> None:
        """A series the door turned away (its cluster read from its own labels), once."""
        try:
            ident = hash(tuple(sorted(labels.items())))
        except TypeError:  # not a set of strings: counted each time, never twice-keyed
            ident = id(labels)
        if ident in self._series:
            return
        cluster = labels.get(self.cluster_label, "")
        self._series[ident] = (cluster_name(cluster if isinstance(cluster, str) else ""),
                               LABEL)
        self.add(self._series[ident][0], LABEL, reason)

    def merge(self, other: Refused) -> None:
        for ident, key in other._series.items():
            if ident not in self._series:
                self._series[ident] = key
                self.add(*key, other.examples[key])
        for key, n in other.counts.items():
            if key[1] != LABEL:
                self.add(*key, other.examples[key], count=n)

    def __bool__(self) -> bool:
        return bool(self.counts)

    def total(self) -> int:
        return sum(self.counts.values())

    def rows(self) -> list[dict[str, object]]:
        """(cluster, kind, count, example) rows, as the inventory stores them."""
        return [{"cluster": c, "kind": k, "count": n, "example": self.examples[(c, k)]}
                for (c, k), n in sorted(self.counts.items())]


#: the kind of a series refused for its labels
LABEL = "label"


def cluster_name(value: str) -> str:
    """The cluster a refusal is counted under, storable whatever the spoke sent (a cluster
    label with a NUL is shown with '?' in its place and cut to the column)."""
    return _safe(value, MAX_LABEL_VALUE)
