"""How many GPUs a node should have, from its instance type (or an on-premises server label).

A GPU node whose device plugin never started advertises nothing and runs no exporter, so a
compare of Kubernetes with the metrics sees nothing on either side. What the cloud says the
instance type has is a third witness: the catalog shipped beside this module
(``instance_types.yaml``, data with its sources) says it for the GPU families of AWS, Google
Cloud, Azure and Oracle Cloud, and a user file adds or overrides entries, also for servers
no cloud names, picked by a node label (``selectors``).

The catalog is plain data: nothing here talks to a cloud API.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hub.common import InputError, brief_repr, load_yaml

SHIPPED = Path(__file__).resolve().parent / "instance_types.yaml"
#: the node labels that name a node's instance type, preferred first (the beta one is what
#: clusters before Kubernetes 1.17 set, and some providers still set both)
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")


@dataclass(frozen=True)
class InstanceType:
    """One catalog entry: what a node of this type (or matching this selector) carries."""

    name: str
    gpus: int
    model: str | None = None
    memory_gib: float | None = None
    source: str | None = None  # the vendor page's title, or the user file's own words
    url: str | None = None
    date: str | None = None

    def describe(self) -> str:
        """"8 GPUs (NVIDIA H100 80GB HBM3, 80 GiB)", for reasons."""
        facts = ", ".join(x for x in (self.model, f"{self.memory_gib:g} GiB"
                                      if self.memory_gib else None) if x)
        word = "GPU" if self.gpus == 1 else "GPUs"
        return f"{self.gpus} {word}" + (f" ({facts})" if facts else "")


@dataclass(frozen=True)
class Selector:
    """An entry for nodes with these labels (an on-premises server model, say)."""

    labels: Mapping[str, str]
    entry: InstanceType

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.labels.items())


@dataclass(frozen=True)
class Catalog:
    """Entries by instance type (matched case-insensitively) and by label selector."""

    types: Mapping[str, InstanceType] = field(default_factory=dict)  # lower-cased keys
    selectors: tuple[Selector, ...] = ()

    @property
    def label_keys(self) -> tuple[str, ...]:
        """Node labels the selectors read: the sources must keep them on a node's view."""
        return tuple(sorted({k for s in self.selectors for k in s.labels}))

    def get(self, instance_type: str | None) -> InstanceType | None:
        return self.types.get(instance_type.lower()) if instance_type else None

    def lookup(self, instance_type: str | None,
               labels: Mapping[str, str] | None = None) -> InstanceType | None:
        """A selector that matches the node's labels first (the user's own servers), then
        its instance type; None when neither is known."""
        for selector in self.selectors:
            if labels and selector.matches(labels):
                return selector.entry
        return self.get(instance_type)

    def merged(self, other: Catalog) -> Catalog:
        """This catalog with ``other``'s entries added or overriding, its selectors first."""
        return Catalog({**self.types, **other.types}, other.selectors + self.selectors)

    def sources(self) -> list[dict[str, str | None]]:
        """Each distinct source with the number of entries taken from it (for docs and the
        closing note of a release)."""
        seen: dict[tuple, int] = {}
        for e in self.types.values():
            key = (e.source, e.url, e.date)
            seen[key] = seen.get(key, 0) + 1
        return [{"source": s, "url": u, "date": d, "entries": str(n)}
                for (s, u, d), n in sorted(seen.items(), key=lambda kv: str(kv[0]))]


def instance_type_of(labels: Mapping[str, Any] | None) -> str | None:
    """The node's instance type from its labels (GA label first, then the beta one)."""
    for key in INSTANCE_TYPE_LABELS:
        value = (labels or {}).get(key)
        if value:
            return str(value)
    return None


#: more GPUs than any one node carries (an 8-GPU server is the common large one; a rack-scale
#: system is several nodes): a count past it is a typo, and one past 2^31 would fail the
#: database's integer column with a traceback
MAX_GPUS = 4096


def _count(raw: Any, where: str) -> int:
    if raw is None:
        raise InputError(f"{where}: no 'gpus' count")
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or (
            isinstance(raw, float) and (not math.isfinite(raw) or raw != int(raw))):
        raise InputError(f"{where}: gpus {raw!r} is not a whole number")
    if raw < 0:
        raise InputError(f"{where}: gpus {raw!r} is negative")
    if raw > MAX_GPUS:
        raise InputError(f"{where}: gpus {brief_repr(raw)} is more than the {MAX_GPUS:,} "
                         "GPUs a node may have")
    return int(raw)


def _entry(name: str, raw: Any, where: str,
           sources: Mapping[str, Mapping[str, Any]]) -> InstanceType:
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: expected a mapping with gpus, model, memory_gib, source")
    unknown = sorted(set(map(str, raw)) - {"gpus", "model", "memory_gib", "source", "url",
                                           "date", "name"})
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r} (gpus, model, memory_gib, "
                         "source, url, date, name)")
    gpus = _count(raw.get("gpus"), where)
    memory = raw.get("memory_gib")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, float))
                               or not math.isfinite(memory) or memory < 0):
        raise InputError(f"{where}: memory_gib {memory!r} is not a size in GiB")
    source = raw.get("source")
    ref = sources.get(str(source)) if source is not None else None
    date = raw.get("date", (ref or {}).get("date"))
    return InstanceType(
        name=str(raw.get("name") or name), gpus=gpus,
        model=str(raw["model"]) if raw.get("model") is not None else None,
        memory_gib=float(memory) if memory is not None else None,
        source=str((ref or {}).get("title") or source) if source is not None else None,
        url=str(raw.get("url") or (ref or {}).get("url") or "") or None,
        date=date.isoformat() if isinstance(date, dt.date) else (str(date) if date else None))


def _selector(text: Any, where: str) -> dict[str, str]:
    """``key=value[,key=value]``: equality only, like a node label selector's simple form."""
    out: dict[str, str] = {}
    for part in str(text).split(","):
        key, sep, value = part.strip().partition("=")
        key, value = key.strip(), value.strip().lstrip("=")
        if not sep or not key or not value:
            raise InputError(f"{where}: selector {text!r} is not key=value[,key=value]")
        out[key] = value
    return out


def parse_catalog(raw: Any, source: str = "instance-type file") -> Catalog:
    """A catalog from parsed YAML; a one-line InputError names what is wrong."""
    if not isinstance(raw, Mapping):
        raise InputError(f"{source}: expected a mapping with instance_types and/or selectors")
    unknown = sorted(set(map(str, raw)) - {"sources", "instance_types", "selectors"})
    if unknown:
        raise InputError(f"{source}: unknown key {unknown[0]!r} (sources, instance_types, "
                         "selectors)")
    sources = raw.get("sources") or {}
    types_raw = raw.get("instance_types") or {}
    selectors_raw = raw.get("selectors") or {}
    for name, value in (("sources", sources), ("instance_types", types_raw),
                        ("selectors", selectors_raw)):
        if not isinstance(value, Mapping):
            raise InputError(f"{source}: {name} must be a mapping")
    types: dict[str, InstanceType] = {}
    for name, value in types_raw.items():
        if not isinstance(name, str) or not name.strip():
            raise InputError(f"{source}: {name!r} is not an instance type name")
        types[name.lower()] = _entry(name, value, f"{source}: instance type {name}", sources)
    selectors = []
    for text, value in selectors_raw.items():
        where = f"{source}: selector {text}"
        labels = _selector(text, where)
        entry = _entry(str(text), value, where, sources)
        selectors.append(Selector(labels, entry))
    return Catalog(types, tuple(selectors))


def _read_yaml(path: Path, what: str) -> Any:
    """Bounded like every YAML file a user hands us (hub.common.load_yaml): size, UTF-8,
    alias expansion, a type named twice."""
    return load_yaml(path, f"{what} {path}")


_shipped: Catalog | None = None


def shipped_catalog() -> Catalog:
    """The catalog in the package (read once)."""
    global _shipped
    if _shipped is None:
        _shipped = parse_catalog(_read_yaml(SHIPPED, "instance-type catalog"),
                                 f"instance-type catalog {SHIPPED.name}")
    return _shipped


def load_catalog(extra: str | Path | None = None) -> Catalog:
    """The shipped catalog, with a user file's entries added or overriding."""
    base = shipped_catalog()
    if extra is None:
        return base
    path = Path(extra)
    return base.merged(parse_catalog(_read_yaml(path, "instance-type file"),
                                     f"instance-type file {path}"))
