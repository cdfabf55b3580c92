"""Showback: what the GPU-hours of the ledger cost, from a price per GPU-hour per model.

A price file is YAML: the model name exactly as the exporter spells it (``modelName``,
``card_series``) to a price per GPU-hour, and optionally per-cluster overrides::

    "NVIDIA H100 80GB HBM3": 2.5
    "AMD Instinct MI300X OAM": 3.1
    clusters:
      prod-east:
        "NVIDIA H100 80GB HBM3": 2.1

Prices per instance type (the cloud's hourly price of the whole node) go under
``instance_types``; a node of that type (as the latest reconcile read it) is priced at the
price / its GPUs per GPU-hour, before the model prices (hub/usage/_bills.py, which also reads
what a cloud bill says was paid)::

    instance_types:
      p5.48xlarge: 55.04

A MIG slice is priced at its share: its GPU-hours are already share x hours. A model without
a price is never billed as 0: its hours are counted in ``unpriced_gpu_hours`` and the cost of
every group they fall in is left empty (null), so nobody sends a bill that silently leaves
hardware out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hub.common import InputError, brief_repr, load_yaml

CLUSTERS_KEY = "clusters"
INSTANCE_TYPES_KEY = "instance_types"
#: optional: the currency of every price (ISO 4217, e.g. EUR), carried into the showback
CURRENCY_KEY = "currency"
COST_FIGURES = ["cost", "unpriced_gpu_hours"]
#: the most an hour of a GPU or a node may cost, in any currency (a p5.48xlarge is about
#: 2.5 million an hour in Vietnamese dong): past it a price is a typo or an attack, and
#: 5e301 made the costs infinite
MAX_PRICE = 1e9


def check_price(value: float, what: str) -> float:
    """``value`` when it is a price at all: finite, 0 or more, at most MAX_PRICE; a one-line
    InputError naming ``what`` otherwise."""
    if not math.isfinite(value) or not 0 <= value <= MAX_PRICE:
        raise InputError(f"{what} is {value!r}; prices are 0 or more and at most "
                         f"{MAX_PRICE:,.0f}")
    return float(value)


@dataclass(frozen=True)
class Prices:
    """Prices per GPU-hour by model, with per-cluster overrides."""

    models: Mapping[str, float]
    clusters: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: hourly price of a whole node per instance type (hub.usage._bills divides by its GPUs)
    instance_types: Mapping[str, float] = field(default_factory=dict)
    currency: str | None = None

    def price(self, cluster: str | None, model: str | None) -> float | None:
        if model is None:
            return None
        override = self.clusters.get(cluster or "", {})
        if model in override:
            return override[model]
        return self.models.get(model)


def _price_table(raw: Any, where: str, what: str = "model names to prices per GPU-hour"
                 ) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        raise InputError(f"{where} must map {what}")
    out: dict[str, float] = {}
    for model, value in raw.items():
        if not isinstance(model, str) or not model.strip() or not model.isprintable():
            raise InputError(f"{where}: {brief_repr(model)} is not a model name")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"{where}: the price of {model!r} is {brief_repr(value)}, not a "
                             "number")
        out[model] = check_price(value, f"{where}: the price of {model!r}")
    return out


def parse_prices(raw: Any, source: str = "price file") -> Prices:
    """Prices from parsed YAML; a one-line InputError names what is wrong."""
    if not isinstance(raw, Mapping) or not raw:
        raise InputError(f"{source}: expected a mapping of model names to prices per "
                         'GPU-hour, e.g. "NVIDIA H100 80GB HBM3": 2.5')
    currency = raw.get(CURRENCY_KEY)
    if currency is not None and not (isinstance(currency, str) and len(currency) == 3
                                     and currency.isalpha() and currency.isupper()):
        raise InputError(f"{source}: {CURRENCY_KEY} {currency!r} is not an ISO 4217 code "
                         "(e.g. EUR, USD)")
    models = {k: v for k, v in raw.items()
              if k not in (CLUSTERS_KEY, INSTANCE_TYPES_KEY, CURRENCY_KEY)}
    clusters_raw = raw.get(CLUSTERS_KEY, {}) or {}
    if not isinstance(clusters_raw, Mapping):
        raise InputError(f"{source}: {CLUSTERS_KEY} must map cluster names to price tables")
    clusters = {}
    for name, table in clusters_raw.items():
        if not isinstance(name, str) or not name or not name.isprintable():
            raise InputError(f"{source}: {brief_repr(name)} under {CLUSTERS_KEY} is not a "
                             "cluster name")
        clusters[name] = _price_table(table, f"{source}: {CLUSTERS_KEY}.{name}")
    types = _price_table(raw.get(INSTANCE_TYPES_KEY) or {}, f"{source}: {INSTANCE_TYPES_KEY}",
                         "instance types to hourly prices")
    return Prices(_price_table(models, source), clusters, types, currency)


def load_prices(path: str | Path) -> Prices:
    """The price file; too large, not UTF-8, not YAML, an alias bomb or a model named twice
    is a one-line InputError (hub.common's bounded reader)."""
    what = f"price file {path}"
    return parse_prices(load_yaml(path, what), what)


def add_costs(groups: dict[tuple, dict[str, Any]], parts: Iterable[tuple[tuple, Mapping]],
              prices: Prices, node_prices: Mapping[tuple[str, str], float] | None = None
              ) -> dict[tuple[str | None, str | None], float]:
    """Add ``cost`` and ``unpriced_gpu_hours`` to each group from its parts: (group key,
    row with cluster, model and gpu_hours, and node with ``node_prices``: a price per
    GPU-hour per (cluster, node) from a bill or an instance-type price, which comes before
    the model's). Returns the unpriced GPU-hours per (cluster, model), for the note that
    says which prices are missing."""
    missing: dict[tuple[str | None, str | None], float] = {}
    for key, part in parts:
        group = groups[key]
        hours = float(part["gpu_hours"] or 0.0)
        group.setdefault("_cost", 0.0)
        group.setdefault("unpriced_gpu_hours", 0.0)
        price = (node_prices.get((part["cluster"], part["node"]))
                 if node_prices else None)
        if price is None:
            price = prices.price(part["cluster"], part["model"])
        if price is None:
            if hours > 0:
                group["unpriced_gpu_hours"] += hours
                where = (part["cluster"], part["model"])
                missing[where] = missing.get(where, 0.0) + hours
            continue
        group["_cost"] += hours * price
    for group in groups.values():
        cost = group.pop("_cost", 0.0)
        unpriced = round(group.get("unpriced_gpu_hours", 0.0), 6)
        group["unpriced_gpu_hours"] = unpriced
        group["cost"] = None if unpriced > 0 else round(cost, 6)
    return missing


def missing_note(missing: Mapping[tuple[str | None, str | None], float]) -> str | None:
    """One line naming the models without a price (None when every hour is priced)."""
    if not missing:
        return None
    by_model: dict[str, float] = {}
    for (_, model), hours in missing.items():
        name = model or "(model not known)"
        by_model[name] = by_model.get(name, 0.0) + hours
    listed = ", ".join(f"{m} ({h:.2f} GPU-hours)" for m, h in sorted(by_model.items()))
    return (f"no price for {listed}: the cost of the groups they fall in is left empty; "
            "add them to the price file")


def unused_note(prices: Prices, seen: Iterable[tuple[str | None, str | None]]) -> str | None:
    """One line naming the prices no GPU-hour of the period used: a model spelled otherwise
    than the exporter spells it is billed nowhere, and nobody would notice (None: all used)."""
    seen = set(seen)
    models = {m for _, m in seen}
    unused = [f"{m!r}" for m in sorted(prices.models) if m not in models]
    unused += [f"{m!r} (clusters.{c})" for c, table in sorted(prices.clusters.items())
               for m in sorted(table) if (c, m) not in seen]
    if not unused:
        return None
    return (f"the price file prices {', '.join(unused)}, which no GPU-hour of the period has: "
            "spelled as the exporter spells the model (see `gpufleet capacity`)?")
