"""Showback: what the GPU-hours of the usage ledger cost, from a price file.

The price file is YAML: the model name as the exporter spells it (the ledger's model column,
e.g. "NVIDIA H100 80GB HBM3") mapped to a price per GPU-hour, and an optional ``clusters:``
section with per-cluster prices that override it for that cluster::

    "NVIDIA H100 80GB HBM3": 2.5
    "AMD Instinct MI300X": 2.1
    clusters:
      prod-west:
        "NVIDIA H100 80GB HBM3": 2.0

A MIG slice costs its share: its GPU-hours are already share x hours. A model without a
price has no cost (null and a note), never 0: an invoice that silently charges nothing for
a GPU is worse than one that says it cannot price it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hub.common import InputError

#: The columns showback adds to usage rows (only when prices were given).
COST_COLUMNS = ["cost", "cost_note"]
CLUSTERS_KEY = "clusters"


@dataclass(frozen=True)
class Prices:
    """Price per GPU-hour per model, with per-cluster overrides."""

    models: Mapping[str, float] = field(default_factory=dict)
    clusters: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def price(self, cluster: str | None, model: str | None) -> float | None:
        """The price of one GPU-hour of ``model`` in ``cluster`` (None: no price)."""
        if model is None:
            return None
        override = self.clusters.get(cluster or "", {})
        if model in override:
            return override[model]
        return self.models.get(model)


def _price(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: the price must be a number, not {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise InputError(f"{where}: the price must be a finite number of 0 or more, "
                         f"not {value!r}")
    return number


def _models(data: Any, where: str) -> dict[str, float]:
    if not isinstance(data, Mapping):
        raise InputError(f"{where}: expected a mapping of model name to price per GPU-hour")
    out: dict[str, float] = {}
    for key, value in data.items():
        if not isinstance(key, str) or not key:
            raise InputError(f"{where}: model names are strings, not {key!r}")
        out[key] = _price(value, f"{where}: {key!r}")
    return out


def parse_prices(data: Any, source: str) -> Prices:
    """The price file's parsed YAML as Prices; InputError naming the first problem."""
    if not isinstance(data, Mapping) or not data:
        raise InputError(f"{source}: expected a mapping of model name to price per GPU-hour")
    top = {k: v for k, v in data.items() if k != CLUSTERS_KEY}
    models = _models(top, source) if top else {}
    clusters: dict[str, dict[str, float]] = {}
    section = data.get(CLUSTERS_KEY)
    if CLUSTERS_KEY in data:
        if not isinstance(section, Mapping):
            raise InputError(f"{source}: {CLUSTERS_KEY}: expected a mapping of cluster name "
                             "to prices")
        for cluster, prices in section.items():
            if not isinstance(cluster, str) or not cluster:
                raise InputError(f"{source}: {CLUSTERS_KEY}: cluster names are strings, "
                                 f"not {cluster!r}")
            clusters[cluster] = _models(prices, f"{source}: {CLUSTERS_KEY}: {cluster}")
    return Prices(models, clusters)


def load_prices(path: str | Path) -> Prices:
    """Read and check a price file (`usage --prices`, `serve --prices`)."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--prices {path}: cannot read it ({exc.__class__.__name__})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"--prices {path}: not valid YAML{at}") from None
    return parse_prices(data, f"--prices {path}")


def group_costs(rows: Iterable[Mapping[str, Any]], prices: Prices,
                columns: Sequence[str]) -> dict[tuple, tuple[float | None, str | None]]:
    """Cost per group of ``columns`` from rows that carry cluster, model and gpu_hours
    (finer than the groups): (sum of gpu_hours x price, None), or (None, a note naming the
    models without a price) when any GPU-hours of the group could not be priced."""
    totals: dict[tuple, float] = {}
    missing: dict[tuple, set[str]] = {}
    for row in rows:
        k = tuple(row[c] for c in columns)
        hours = float(row["gpu_hours"] or 0.0)
        price = prices.price(row["cluster"], row["model"])
        totals.setdefault(k, 0.0)
        if price is None:
            if hours > 0:
                missing.setdefault(k, set()).add(row["model"] or "(model unknown)")
            continue
        totals[k] += hours * price
    out: dict[tuple, tuple[float | None, str | None]] = {}
    for k, total in totals.items():
        if k in missing:
            out[k] = (None, "no price for " + ", ".join(sorted(missing[k])))
        else:
            out[k] = (total, None)
    return out
