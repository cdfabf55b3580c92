"""One bucket of the usage ledger from the hub's answers (pure: no I/O, no clock).

Coverage is what people are billed from, so it has one definition, the same at every push
cadence: the bucket is cut into slots one push interval long (aligned to the bucket's start);
a slot is covered when the GPU has a sample in it; coverage is the covered slots' share of
the bucket. A GPU that pushed on time all bucket long has coverage 1 whether it pushes every
second or every 300 s (ACM); a 20-minute gap in an hour is 2/3 at both. gpu_hours = share x
coverage x bucket hours.

A GPU's series that differ only in labels the ledger does not keep (an exporter pod's
restart, ``Hostname`` renamed ``hostname``) fold into one row: their slots are added, so
they must not overlap in time (one exporter pod, one series per scrape), and coverage is
capped at 1. Averages are weighted by each series' covered slots.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hub import store
from hub.usage._meter import Meter
from hub.usage._meter import sample_value as _num

Key = tuple[str, str, str, str, str, str]  # cluster, node, uuid, slice, namespace, pod


def utc(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC).replace(tzinfo=None)


@dataclass(slots=True)
class _Acc:
    vendor: str
    model: str | None = None
    is_slice: bool = False
    profile: str | None = None
    weight: dict[str, float] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)
    maxes: dict[str, float] = field(default_factory=dict)
    slots: float = 0.0


def _series(labels: Mapping[str, str]) -> str:
    """One series' label set as a compact key (a str, not a frozenset of pairs: 100,000
    series of one bucket are held at once)."""
    return "\x1f".join(f"{k}\x1e{v}" for k, v in sorted(labels.items()))


def _key(p: store.VendorProfile, labels: Mapping[str, str],
         cluster_label: str) -> tuple[Key, store.Identity] | None:
    ident = p.identity(labels, cluster_label)
    if ident is None or not ident.cluster:
        return None  # no cluster label: never filed under cluster '' (the query drops them)
    alloc = store.allocation(labels) or ("", "", "")
    slice_key = f"{ident.mig_profile}/{ident.mig_instance or ''}" if ident.mig_profile else ""
    return (ident.cluster, ident.node, ident.uuid, slice_key, alloc[0], alloc[1]), ident


def fold_bucket(answers: Iterable[tuple[store.Query, Iterable[Mapping[str, Any]]]], *,
                start: float, bucket: float, resolution: float, cluster_label: str,
                known: Mapping[tuple[str, str], tuple[str | None, float | None]],
                push_interval: float | None = None, min_charge: float = 0.0,
                node_gpus: Mapping[tuple[str, str], int] | None = None,
                flags: list[dict[str, str]] | None = None,
                refused: store.Refused | None = None) -> list[dict[str, Any]]:
    """Ledger rows of one bucket from the answers to its queries.

    ``resolution`` is the slot length (the push interval). A vendor's coverage answer must
    come before its other answers (hub/usage/_ledger.py asks in that order): it weighs the
    averages. ``known`` gives (model, memory_total_mib) per (uuid, slice) from the
    inventory, for the share of a MIG slice whose series lack the model label.

    Allocation answers (``store.allocation_queries``: kinds ``alloc:*``, ``edge:*``) meter
    the allocated rows from the allocations' own edges (hub/usage/_meter.py); without them
    every row is ``sampled``. ``push_interval`` (default ``resolution``) bounds an end known
    only from the last sample; ``min_charge`` is the least an ended allocation is charged.
    ``node_gpus`` gives the GPUs per (cluster, node) the inventory knows (a pod's requests
    count at most its node's GPUs); the meter's corrections, one per pod, are appended to
    ``flags`` (rows of ``usage_flags``).

    A bucket's figure outside its physical range (hub.store._bounds: an average or maximum
    of samples that held one reading a GPU cannot give) is dropped as unknown, never
    averaged, billed as busy or summed into energy, and counted in ``refused`` against its
    cluster; so is a memory figure above the GPU's own memory (``known``).
    """
    refused = store.Refused(cluster_label) if refused is None else refused
    accs: dict[Key, _Acc] = {}
    cover: dict[tuple[str, str], float] = {}
    meter = Meter(start=start, bucket=bucket, cluster_label=cluster_label,
                  push_interval=push_interval or resolution, min_charge=min_charge,
                  node_gpus=node_gpus)
    for query, rows in answers:
        if query.kind.startswith(("alloc:", "edge:")):
            meter.read(query.kind, rows)
            continue
        p = store.profile(query.vendor)
        for row in rows:
            labels = row["metric"]
            value = _num(row)
            if query.kind == "coverage" and value:
                cover[(query.vendor, _series(labels))] = value
            found = _key(p, labels, cluster_label)
            if found is None or value is None:
                continue
            key, ident = found
            acc = accs.get(key)
            if acc is None:
                model = next((labels[m] for m in store.MODEL_LABELS[p.vendor]
                              if labels.get(m)), None)
                acc = accs[key] = _Acc(p.vendor, model, ident.mig_profile is not None,
                                       ident.mig_profile)
            if query.kind == "coverage":
                acc.slots += value
                continue
            weight = cover.get((query.vendor, _series(labels)), 0.0)
            value = store.usage_convert(query.vendor, query.field or "", value)
            if not store.within(query.field or "", value):
                refused.add(key[0], query.field or "",
                            store.describe_reading(query.field or "", value))
                continue
            fld = f"{query.field}:{query.kind.split(':')[1]}"
            if fld.endswith(":max"):
                acc.maxes[fld] = max(acc.maxes.get(fld, value), value)
            elif weight:
                acc.sums[fld] = acc.sums.get(fld, 0.0) + value * weight
                acc.weight[fld] = acc.weight.get(fld, 0.0) + weight
    sliced = {k[2] for k, a in accs.items() if a.is_slice}
    hours = bucket / 3600.0
    slots = round(bucket / resolution)
    out = []
    for key, acc in accs.items():
        cluster, node, uuid, slice_key, namespace, pod = key
        if not acc.is_slice and uuid in sliced:
            continue  # the parent of a MIG layout counts only through its slices
        coverage = min(1.0, acc.slots / slots) if slots else 0.0
        if coverage <= 0.0:
            continue  # values without a covered slot: samples outside this bucket
        avg = {f.split(":")[0]: acc.sums[f] / acc.weight[f] for f in acc.sums if acc.weight[f]}
        mx = {f.split(":")[0]: v for f, v in acc.maxes.items()}
        order = ((store.ENGINE_ACTIVE, store.UTILISATION) if acc.is_slice
                 else (store.UTILISATION, store.ENGINE_ACTIVE))
        util = next((avg[f] for f in order if f in avg), None)
        util_max = next((mx[f] for f in order if f in mx), None)
        model, share = _share(known, uuid, slice_key, acc.model, acc.profile)
        _cap_memory(avg, mx, known.get((uuid, slice_key), (None, None))[1], cluster, refused)
        power = avg.get(store.POWER)
        sm_active = avg.get(store.SM_ACTIVE, avg.get(store.ENGINE_ACTIVE))
        out.append({
            "bucket_start": utc(start), "bucket_end": utc(start + bucket),
            "cluster": cluster, "node": node, "uuid": uuid, "slice": slice_key,
            "namespace": namespace, "pod": pod, "vendor": acc.vendor, "model": model,
            "gpu_share": share, "gpu_hours": share * coverage * hours,
            "avg_utilisation_pct": util, "max_utilisation_pct": util_max,
            "avg_memory_used_mib": avg.get(store.MEMORY_USED),
            "max_memory_used_mib": mx.get(store.MEMORY_USED),
            "avg_power_w": power,
            "energy_wh": None if power is None else power * coverage * hours * share,
            "coverage": coverage,
            "avg_sm_active_pct": sm_active,
            "avg_tensor_active_pct": avg.get(store.TENSOR_ACTIVE),
            "avg_dram_active_pct": avg.get(store.DRAM_ACTIVE),
        })

    def empty(vendor: str, ident: store.Identity, slice_key: str, namespace: str,
              pod: str) -> dict[str, Any]:
        model, share = _share(known, ident.uuid, slice_key, None, ident.mig_profile)
        return {**dict.fromkeys(_FIGURES), "cluster": ident.cluster, "node": ident.node,
                "uuid": ident.uuid, "slice": slice_key, "namespace": namespace, "pod": pod,
                "vendor": vendor, "model": model, "gpu_share": share, "gpu_hours": 0.0,
                "coverage": 0.0}

    out = meter.apply(out, empty)
    if flags is not None:
        flags += meter.flags
    for row in out:
        row["bucket_start"], row["bucket_end"] = utc(start), utc(start + bucket)
    return out


def _cap_memory(avg: dict[str, float], mx: dict[str, float], capacity: float | None,
                cluster: str, refused: store.Refused) -> None:
    """Memory used beyond what the GPU (or slice) has, as the inventory knows it: unknown."""
    if not capacity:
        return
    for figures in (avg, mx):
        used = figures.get(store.MEMORY_USED)
        if used is not None and not store.within(store.MEMORY_USED, used, capacity):
            refused.add(cluster, store.MEMORY_USED,
                        store.describe_reading(store.MEMORY_USED, used, capacity))
            del figures[store.MEMORY_USED]


_FIGURES = ["avg_utilisation_pct", "max_utilisation_pct", "avg_memory_used_mib",
            "max_memory_used_mib", "avg_power_w", "energy_wh", "avg_sm_active_pct",
            "avg_tensor_active_pct", "avg_dram_active_pct"]


def _share(known: Mapping[tuple[str, str], tuple[str | None, float | None]], uuid: str,
           slice_key: str, model: str | None, profile: str | None) -> tuple[str | None, float]:
    """(model, GPU share) of a GPU or MIG slice (a slice's model is its GPU's)."""
    if not slice_key:
        return model, 1.0
    mine = known.get((uuid, slice_key), (None, None))
    parent = known.get((uuid, ""), (None, None))
    model = model or mine[0] or parent[0]
    return model, store.mig_share(model, profile, mine[1], parent[1])
