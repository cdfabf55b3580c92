"""Onboarding adds, never takes: what ``spoke render`` does about a collectors ConfigMap the
GPU Operator's ClusterPolicy already names.

The ConfigMap a ClusterPolicy names (``spec.dcgmExporter.config.name``) is dcgm-exporter's
whole metric list for every consumer of that exporter. Pointing the ClusterPolicy at
gpufleet's would silently take fields from whoever set theirs, so when the render can read the
cluster it decides here, from what it read: pin ours (nothing of anyone else's there), merge
(their rows kept as they are, gpufleet's added, under gpufleet's name; their ConfigMap is left
untouched), or refuse in one line naming theirs and the two ways forward. The reading itself
is the command's (the kubernetes client loads only when asked for).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from hub.common import InputError
from hub.onboard._spoke import (
    CLUSTER_POLICY,
    DCGM_CONFIGMAP,
    DCGM_CSV_KEY,
    SpokeValues,
    exporter_targets,
)

#: a collectors row's field: DCGM_FI_... (dcgm-exporter takes any DCGM field identifier)
_FIELD = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")

Row = tuple[str, str, str]


@dataclass(frozen=True)
class Reading:
    """What needs reading from the cluster before rendering (None: nothing to read)."""

    cluster_policy: str
    namespace: str  # the NVIDIA exporter's namespace: where a named ConfigMap lives


def needs_reading(values: SpokeValues) -> Reading | None:
    """The render pins our CSV on the ClusterPolicy only for an upstream NVIDIA exporter and
    no --dcgm-config-name: only then is there anything of someone else's to overwrite."""
    if values.exporter != "upstream" or "nvidia" not in values.vendors \
            or values.dcgm_config_name is not None:
        return None
    nvidia = next(t for t in exporter_targets(values) if t.vendor == "nvidia")
    return Reading(CLUSTER_POLICY, nvidia.namespace)


def configured_name(policy: Mapping[str, Any] | None) -> str | None:
    """``spec.dcgmExporter.config.name`` of a ClusterPolicy (None: unset, or no policy)."""
    if not isinstance(policy, Mapping):
        return None
    config = ((policy.get("spec") or {}).get("dcgmExporter") or {}).get("config") or {}
    name = config.get("name") if isinstance(config, Mapping) else None
    return str(name).strip() or None if name else None


def theirs_to_merge(existing: str | None, merge: bool) -> str | None:
    """The ConfigMap to merge (None: nothing of anyone else's, pin ours as before); refuses
    in one line (exit 2) when another config is set and --merge-dcgm-config was not asked."""
    if existing is None or existing == DCGM_CONFIGMAP:
        return None
    if not merge:
        raise InputError(
            f"ClusterPolicy {CLUSTER_POLICY} already names collectors ConfigMap {existing!r} "
            "(spec.dcgmExporter.config.name), which pinning gpufleet's would overwrite: "
            f"re-render with --dcgm-config-name {existing} to keep it (and add dcgm-fields.csv's "
            f"rows to it), or --merge-dcgm-config to pin the union of its fields and "
            f"gpufleet's as {DCGM_CONFIGMAP}")
    return existing


def parse_collectors(config_map: Mapping[str, Any] | None, name: str, namespace: str
                     ) -> tuple[Row, ...]:
    """The rows of a collectors ConfigMap's CSV (``FIELD, TYPE, HELP``; ``#`` comments
    skipped), or one line naming what is wrong with it."""
    where = f"ConfigMap {namespace}/{name}"
    if config_map is None:
        raise InputError(f"{where}, which ClusterPolicy {CLUSTER_POLICY} names, is not there: "
                         f"nothing to merge; re-render with --dcgm-config-name {name} once it "
                         "exists, or clear the ClusterPolicy's config.name")
    text = (config_map.get("data") or {}).get(DCGM_CSV_KEY)
    if not isinstance(text, str):
        raise InputError(f"{where} has no {DCGM_CSV_KEY} key (the one the GPU Operator "
                         "mounts): nothing to merge")
    rows: dict[str, Row] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) < 2 or not _FIELD.match(parts[0]) or not parts[1]:
            raise InputError(f"{where} {DCGM_CSV_KEY} line {number} is not "
                             "'FIELD, TYPE, HELP': nothing merged")
        rows.setdefault(parts[0], (parts[0], parts[1], parts[2] if len(parts) > 2 else ""))
    return tuple(rows.values())


def merged(values: SpokeValues, name: str, rows: tuple[Row, ...]) -> SpokeValues:
    """The render pinning the union of ``name``'s rows (first, as they are) and gpufleet's."""
    return replace(values, dcgm_merged_from=name, dcgm_their_rows=rows)
