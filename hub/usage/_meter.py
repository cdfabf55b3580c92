"""Metered allocation: a pod's GPU time from its allocation's own edges (pure: no I/O, no clock).

Sampling attributes a GPU's time to a pod from which exporter samples carry the pod's labels:
under ACM's 300 s pushes that is a 300 s ruler (a 2-minute job is billed 0 or 5 minutes). The
edges of the allocation itself are exact at any cadence:

- kube-state-metrics: ``kube_pod_start_time`` and ``kube_pod_completion_time`` (unix
  seconds in the values), the GPU requests per pod and resource, and the phase. The requests
  series lives as long as the pod object, also after it completed: it names the GPUs a pod
  asked for, never how long it held them. Where the completion time is not exported
  (OpenShift's deny list) the end is the last Running sample plus one push interval.
- gpufleet's exporter: per GPU and pod, the start it saw in the kubelet's pod-resources while
  held, and the end for at least two push intervals after; its last start sample plus one
  push interval where the end was not pushed. It names the GPU, so where it speaks for a pod
  and GPU it is read instead of kube-state-metrics (never both).

Each ledger row says how its allocated time was measured (``allocation_basis``):
``interval`` (both edges exported, or the allocation runs past the bucket), ``estimated`` (an
edge known only to the push interval), ``sampled`` (no interval source: the pod's samples'
coverage, as before).

A GPU's time stays whole: its reported time (coverage) minus what pods were allocated is its
unallocated row. Pods sharing one GPU at once (time-slicing, HAMi cores, DRA shares, a
kubelet that labels two pods) are charged their shares (1/replicas, cores/100, else equal),
scaled so that the shares of one GPU-second never add up to more than one. A pod
kube-state-metrics shows holding GPUs that no exporter series names in the bucket is still
billed, on a row with an empty uuid, and its hours are taken from the unallocated time of its
node's GPUs (which GPU it held is unknown, that it held one is not).

What a spoke sends is held to physics, and every correction is a flag naming the pod
(``Meter.flags``, stored with the bucket and read by `gpufleet report`), never a silent 0 nor
a silent fortune:

- a pod's requests count at most the GPUs of its node (the most the exporter's rows or the
  inventory show there; :data:`MAX_NODE_GPUS` where neither knows the node), and the pods of
  a node are never allocated more GPU-seconds than its GPUs x the bucket (``capped``);
- an allocation whose edges cannot be (not finite, a start after the last push that could
  carry it, an end before its start) is not metered: its pod is billed from the samples
  that carried its labels, as without any interval source (``impossible_edges``).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from hub import store

INTERVAL, ESTIMATED, SAMPLED = "interval", "estimated", "sampled"
#: GPUs one node can hold where neither an exporter nor the inventory knows the node (the
#: largest servers, DGX-2 and HGX-2, hold 16): a request beyond it is no node's
MAX_NODE_GPUS = 16
#: the flags the meter raises (hub/usage/_meter.py's module docstring)
CAPPED, IMPOSSIBLE = "capped", "impossible_edges"
#: the bases from most to least exact; a group of rows is as exact as its least exact row
BASES = (INTERVAL, ESTIMATED, SAMPLED)
BASIS_RANK = {b: i for i, b in enumerate(BASES)}

Span = tuple[float, float]
PodKey = tuple[str, str, str]  # cluster, namespace, pod
Unit = tuple[str, str, str]  # cluster, uuid, slice: what one GPU-second is shared within


def weakest(bases: Iterable[str]) -> str | None:
    """The least exact of some bases (None for none)."""
    ranks = [BASIS_RANK[b] for b in bases]
    return BASES[max(ranks)] if ranks else None


@dataclass(slots=True)
class _PodObject:
    """One pod object (uid) as kube-state-metrics shows it."""

    node: str = ""
    start: float | None = None
    end: float | None = None
    running: float | None = None  # time of its last Running sample
    requests: dict[str, float] = field(default_factory=dict)  # sanitised resource -> count


@dataclass(slots=True)
class _Edge:
    """One GPU and pod as gpufleet's exporter saw it in pod-resources."""

    ident: store.Identity
    vendor: str
    start: float | None = None
    end: float | None = None
    seen: float | None = None


@dataclass(slots=True)
class _Alloc:
    spans: list[Span]  # inside the bucket, disjoint
    basis: str
    begin: float  # its start, before clipping


def sample_value(row: Mapping[str, Any]) -> float | None:
    """An instant answer's value; None for NaN or a malformed row."""
    v = raw_value(row)
    return None if v is None or v != v else v


def raw_value(row: Mapping[str, Any]) -> float | None:
    """An instant answer's value as sent, NaN and infinities included; None if malformed."""
    try:
        return float(row["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def flag(cluster: str, node: str, namespace: str, pod: str, kind: str,
         detail: str) -> dict[str, str]:
    """One correction the meter made, naming the pod (a row of ``usage_flags``)."""
    return {"cluster": cluster, "node": node, "namespace": namespace, "pod": pod,
            "flag": kind, "detail": detail[:255]}


def clip(spans: Iterable[Span], lo: float, hi: float) -> list[Span]:
    """The parts of spans inside [lo, hi), merged where they overlap."""
    out: list[Span] = []
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in spans):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _seconds(spans: Iterable[Span]) -> float:
    return sum(b - a for a, b in spans)


class Meter:
    """Reads the allocation answers of one bucket (``store.allocation_queries``) and meters
    the bucket's rows from them (``apply``)."""

    def __init__(self, *, start: float, bucket: float, push_interval: float,
                 cluster_label: str, min_charge: float = 0.0,
                 node_gpus: Mapping[tuple[str, str], int] | None = None) -> None:
        self.lo, self.hi = start, start + bucket
        self.bucket, self.push, self.min_charge = bucket, push_interval, min_charge
        self.label = cluster_label
        self.pods: dict[tuple[str, str, str, str], _PodObject] = {}
        self.edges: dict[tuple[str, str, str, str, str], _Edge] = {}
        self.replicas: dict[tuple[str, str], float] = {}
        #: GPUs per (cluster, node) the inventory knows (the rows may show more)
        self.node_gpus: Mapping[tuple[str, str], int] = node_gpus or {}
        #: what ``apply`` corrected, one flag per pod and kind (see :func:`flag`)
        self.flags: list[dict[str, str]] = []
        self._impossible: dict[PodKey, tuple[str, str]] = {}  # pod -> (node, why)

    # -- reading the answers ----------------------------------------------------------------
    def read(self, kind: str, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            # an edge of NaN is kept: an impossible edge is flagged, not taken for none
            labels, value = row["metric"], raw_value(row)
            cluster = labels.get(self.label) or ""
            if value is None or not cluster:
                continue
            if kind == "alloc:replicas":
                try:
                    replicas = float(labels.get(store.KSM_REPLICAS_LABEL) or "")
                except ValueError:
                    continue
                if replicas >= 1:
                    self.replicas[(cluster, labels.get("node") or "")] = replicas
            elif kind.startswith("alloc:"):
                self._pod(kind, cluster, labels, value)
            elif kind.startswith("edge:"):
                self._edge(kind, cluster, labels, value)

    def _pod(self, kind: str, cluster: str, labels: Mapping[str, str], value: float) -> None:
        key = (cluster, labels.get("namespace") or "", labels.get("pod") or "",
               labels.get("uid") or "")
        if not key[2]:
            return
        p = self.pods.setdefault(key, _PodObject())
        if kind == "alloc:start":
            p.start = value
        elif kind == "alloc:end":
            p.end = value
        elif kind == "alloc:running":
            p.running = value
        elif kind == "alloc:requests" and value > 0:  # NaN is no request
            p.node = p.node or labels.get("node") or ""
            resource = labels.get("resource") or ""
            p.requests[resource] = p.requests.get(resource, 0.0) + value

    def _edge(self, kind: str, cluster: str, labels: Mapping[str, str], value: float) -> None:
        alloc = store.allocation(labels)
        if alloc is None:
            return
        for p in store.PROFILES:
            ident = p.identity(labels, self.label)
            if ident is not None:
                break
        else:
            return
        slice_key = f"{ident.mig_profile}/{ident.mig_instance or ''}" if ident.mig_profile else ""
        e = self.edges.setdefault((cluster, alloc[0], alloc[1], ident.uuid, slice_key),
                                  _Edge(ident, p.vendor))
        setattr(e, kind.split(":")[1], value)

    # -- intervals ----------------------------------------------------------------------------
    def _unreal(self, start: float | None, end: float | None) -> str | None:
        """Why an allocation's edges cannot be (None: they can). The answers are asked a
        push interval and at most one more after the bucket's end, so no sample read can
        carry a start later than two push intervals past it."""
        for name, t in (("start", start), ("end", end)):
            if t is not None and not math.isfinite(t):
                return f"its {name} time is {t}"
        if start is not None and start > self.hi + 2 * self.push:
            return f"its start {_iso(start)} is after the last push that could carry it"
        if start is not None and end is not None and end < start:
            return f"its end {_iso(end)} is before its start {_iso(start)}"
        return None

    def _refuse(self, cluster: str, ns: str, pod: str, node: str, why: str) -> None:
        self._impossible.setdefault((cluster, ns, pod), (node, why))

    def _span(self, start: float | None, end: float | None,
              last_seen: float | None) -> tuple[Span, str] | None:
        """[start, end) of one allocation and its basis; None without a start, or without
        any sign of its end (the requests series alone is never one)."""
        if start is None:
            return None
        if end is not None and end >= start:
            stop, basis = end, INTERVAL
        elif last_seen is None:
            return None
        elif last_seen >= self.hi:
            stop, basis = math.inf, INTERVAL  # held past the bucket: its end is the bucket's
        else:
            stop, basis = max(start, last_seen + self.push), ESTIMATED
        if self.min_charge and stop != math.inf and stop - start < self.min_charge:
            stop = start + self.min_charge  # charged as the clouds do: a minimum per allocation
        return (start, stop), basis

    def _by_pod(self) -> dict[PodKey, tuple[_Alloc, _PodObject]]:
        """kube-state-metrics' allocations per pod name (a pod recreated under its name is
        several objects: their spans join) with the pod's requests."""
        out: dict[PodKey, tuple[_Alloc, _PodObject]] = {}
        for (cluster, ns, pod, _uid), p in self.pods.items():
            if not any(store.gpu_request(r) for r in p.requests):
                continue
            why = self._unreal(p.start, p.end)
            if why is not None:
                self._refuse(cluster, ns, pod, p.node, f"kube-state-metrics: {why}")
                continue
            span = self._span(p.start, p.end, p.running)
            if span is None:
                continue
            spans = clip([span[0]], self.lo, self.hi)
            have = out.get((cluster, ns, pod))
            if have is None:
                out[(cluster, ns, pod)] = (_Alloc(spans, span[1], span[0][0]), p)
            else:
                have[0].spans = clip(have[0].spans + spans, self.lo, self.hi)
                have[0].basis = weakest([have[0].basis, span[1]]) or span[1]
                have[0].begin = min(have[0].begin, span[0][0])
                for r, n in p.requests.items():
                    have[1].requests[r] = max(have[1].requests.get(r, 0.0), n)
        return out

    def _share(self, requests: Mapping[str, float], cluster: str, node: str) -> float:
        """The share of one GPU a pod's allocation stands for on a GPU it holds."""
        cores = requests.get("nvidia_com_gpucores")
        if cores:
            return min(1.0, cores / 100.0)  # HAMi: percent of one GPU's cores
        replicas = self.replicas.get((cluster, node), 1.0)
        if requests.get("nvidia_com_gpu_shared") or replicas > 1:
            return 1.0 / replicas  # time-slicing: one replica of the GPU
        return 1.0

    # -- metering -----------------------------------------------------------------------------
    def apply(self, rows: list[dict[str, Any]],
              new_row: Callable[[str, store.Identity, str, str, str], dict[str, Any]]
              ) -> list[dict[str, Any]]:
        """The bucket's rows with allocated hours from intervals where known.

        ``new_row(vendor, identity, slice_key, namespace, pod)`` makes an empty row (no
        samples) for an allocation the exporter's edges name on a GPU no sample labelled."""
        for r in rows:
            r["allocation_basis"] = SAMPLED
        pods = self._by_pod()
        if not pods and not self.edges:
            self._flag_impossible(rows)
            return rows
        index = {(r["cluster"], r["uuid"], r["slice"], r["namespace"], r["pod"]): r
                 for r in rows}
        edge_allocs: dict[tuple[str, str, str, str, str], _Alloc] = {}
        for (cluster, ns, pod, uuid, slice_key), e in self.edges.items():
            why = self._unreal(e.start, e.end)
            if why is not None:
                self._refuse(cluster, ns, pod, e.ident.node, f"gpufleet's exporter: {why}")
                continue
            span = self._span(e.start, e.end, e.seen)
            if span is None:
                continue
            edge_allocs[(cluster, uuid, slice_key, ns, pod)] = _Alloc(
                clip([span[0]], self.lo, self.hi), span[1], span[0][0])
            if (cluster, uuid, slice_key, ns, pod) not in index:
                row = new_row(e.vendor, e.ident, slice_key, ns, pod)
                row["allocation_basis"] = span[1]
                rows.append(row)
                index[(cluster, uuid, slice_key, ns, pod)] = row
        units: dict[Unit, list[dict[str, Any]]] = {}
        for r in rows:
            units.setdefault((r["cluster"], r["uuid"], r["slice"]), []).append(r)
        named: dict[PodKey, list[dict[str, Any]]] = {}
        out: list[dict[str, Any]] = []
        for unit, members in units.items():
            out += self._meter_unit(unit, members, pods, edge_allocs, named)
        edged = {(cluster, ns, pod) for cluster, ns, pod, _, _ in self.edges}
        out += self._unknown(out, {k: v for k, v in pods.items() if k not in edged}, named)
        self._flag_impossible(out)
        return out

    def _flag_impossible(self, rows: list[dict[str, Any]]) -> None:
        """One flag per pod whose edges could not be, saying what it was billed from."""
        for (cluster, ns, pod), (node, why) in sorted(self._impossible.items()):
            mine = [r for r in rows if (r["cluster"], r["namespace"], r["pod"])
                    == (cluster, ns, pod)]
            hours = sum(r["gpu_hours"] for r in mine)
            node = node or next((r["node"] for r in mine), "")
            billed = (f"billed {hours:.6g} GPU-hours from its samples" if hours > 0 else
                      "no sample carried its labels in the bucket, so nothing was billed")
            self.flags.append(flag(cluster, node, ns, pod, IMPOSSIBLE, f"{why}: {billed}"))

    def _meter_unit(self, unit: Unit, members: list[dict[str, Any]],
                    pods: Mapping[PodKey, tuple[_Alloc, _PodObject]],
                    edge_allocs: Mapping[tuple[str, str, str, str, str], _Alloc],
                    named: dict[PodKey, list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """One GPU or slice: its pods' metered share-seconds, the rest unallocated."""
        cluster, uuid, slice_key = unit
        metered: list[tuple[dict[str, Any], _Alloc, float]] = []
        sampled_s = 0.0
        free: dict[str, Any] | None = None
        for r in members:
            if not r["pod"]:
                free = r
                continue
            pk = (cluster, r["namespace"], r["pod"])
            alloc = edge_allocs.get((cluster, uuid, slice_key, r["namespace"], r["pod"]))
            requests: Mapping[str, float] = {}
            if pk in pods:
                alloc = alloc or pods[pk][0]
                requests = pods[pk][1].requests
            if alloc is None:
                sampled_s += r["coverage"] * self.bucket
                named.setdefault(pk, []).append(r)
                continue
            metered.append((r, alloc, self._share(requests, cluster, r["node"])))
        if not metered:
            return members
        _cap_estimates(metered)
        covered = min(self.bucket, sum(r["coverage"] for r in members) * self.bucket)
        charged = _shared_seconds([(a.spans, share) for _, a, share in metered])
        self._fit_unit(unit, metered, charged, sampled_s)
        out = [r for r in members if r is free or not any(r is m[0] for m in metered)]
        allocated = sampled_s
        for (r, alloc, _), seconds in zip(metered, charged, strict=True):
            allocated += seconds
            if seconds <= 0:
                continue  # labelled outside its allocation (the kubelet lingers): free time
            _set_hours(r, r["gpu_share"] * seconds / 3600.0)
            r["allocation_basis"] = alloc.basis
            named.setdefault((cluster, r["namespace"], r["pod"]), []).append(r)
            out.append(r)
        rest = max(0.0, covered - allocated)
        if free is None and rest > 0:
            # samples labelled past the allocation's end (the kubelet lingers): the GPU's
            # memory and power stand, its activity then is not the pod's, so unknown
            template = max((m[0] for m in metered), key=lambda r: r["coverage"])
            free = {**template, **dict.fromkeys(_ACTIVITY), "namespace": "", "pod": "",
                    "coverage": 0.0}
            out.append(free)
        if free is not None:
            _set_hours(free, free["gpu_share"] * rest / 3600.0)
            free["allocation_basis"] = weakest(m[1].basis for m in metered) or SAMPLED
            if rest <= 0:
                out.remove(free)
        return out

    def _fit_unit(self, unit: Unit, metered: list[tuple[dict[str, Any], _Alloc, float]],
                  charged: list[float], sampled_s: float) -> None:
        """A GPU (or slice) holds at most the bucket: where pods billed from their samples
        and pods billed from their edges add up to more (edges that contradict the samples,
        which saw who held it), the metered ones are scaled to the rest, and flagged."""
        total = sum(charged)
        left = max(0.0, self.bucket - sampled_s)
        if total <= left * (1 + 1e-12):
            return
        for i, (r, _, _) in enumerate(metered):
            if charged[i] <= 0:
                continue
            was = charged[i]
            charged[i] = was * left / total
            self.flags.append(flag(
                unit[0], r["node"], r["namespace"], r["pod"], CAPPED,
                f"GPU {unit[1]}{' ' + unit[2] if unit[2] else ''} was allocated "
                f"{(total + sampled_s) / 3600:.6g} hours of a {self.bucket / 3600:.6g}-hour "
                f"bucket: billed {charged[i] / 3600:.6g} instead of {was / 3600:.6g}"))

    def _unknown(self, rows: list[dict[str, Any]],
                 pods: Mapping[PodKey, tuple[_Alloc, _PodObject]],
                 named: Mapping[PodKey, list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """Rows of GPUs pods held that no exporter series names in the bucket (uuid ''),
        their hours taken from the unallocated time of the node's GPUs."""
        out: list[dict[str, Any]] = []
        # the named GPUs' rows by node, read once: a scan of every row per pod made this
        # quadratic (340 s of a 100,000-GPU collect went to finding nodes' models)
        of_node: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in rows:
            if r["uuid"]:
                of_node.setdefault((r["cluster"], r["node"]), []).append(r)
        gpus = self._gpus_of_nodes(of_node)
        for (cluster, ns, pod), (alloc, p) in pods.items():
            seconds = _seconds(alloc.spans)
            if seconds <= 0:
                continue
            mine = named.get((cluster, ns, pod), [])
            here = of_node.get((cluster, p.node), [])
            share, vendor, profile = self._missing(p, cluster, mine, _node_model(here))
            held = sum(r["gpu_share"] for r in mine if r["uuid"])
            room = max(0.0, gpus.get((cluster, p.node), MAX_NODE_GPUS) - held)
            if share > room:
                self.flags.append(flag(
                    cluster, p.node, ns, pod, CAPPED,
                    f"requests {_requested(p.requests)} on node {p.node or '(none)'}, which "
                    f"has {gpus.get((cluster, p.node), MAX_NODE_GPUS)} GPU(s): billed as "
                    f"{held + room:g} GPU(s)"))
                share = room
            if share <= 0:
                continue
            hours = share * seconds / 3600.0
            out.append({
                "bucket_start": None, "bucket_end": None, "cluster": cluster, "node": p.node,
                "uuid": "", "slice": f"{profile}/" if profile else "", "namespace": ns,
                "pod": pod, "vendor": vendor, "model": _node_model(here, vendor),
                "gpu_share": share,
                "gpu_hours": hours, "avg_utilisation_pct": None, "max_utilisation_pct": None,
                "avg_memory_used_mib": None, "max_memory_used_mib": None,
                "avg_power_w": None, "energy_wh": None, "coverage": 0.0,
                "avg_sm_active_pct": None, "avg_tensor_active_pct": None,
                "avg_dram_active_pct": None, "allocation_basis": alloc.basis})
        self._fit_nodes(of_node, out, gpus)
        for r in out:
            _take_free(of_node.get((r["cluster"], r["node"]), []), r["vendor"], r["gpu_hours"])
        return out

    def _gpus_of_nodes(self, of_node: Mapping[tuple[str, str], list[dict[str, Any]]]
                       ) -> dict[tuple[str, str], int]:
        """GPUs per (cluster, node): the most the bucket's rows or the inventory show."""
        out = dict(self.node_gpus)
        for key, mine in of_node.items():
            out[key] = max(out.get(key, 0), len({r["uuid"] for r in mine}))
        return out

    def _fit_nodes(self, of_node: Mapping[tuple[str, str], list[dict[str, Any]]],
                   unknown: list[dict[str, Any]],
                   gpus: Mapping[tuple[str, str], int]) -> None:
        """Scale the unnamed rows of a node down to what its GPUs had left in the bucket
        (GPUs x the bucket, less the allocated hours the exporter's rows name there)."""
        by_node: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in unknown:
            by_node.setdefault((r["cluster"], r["node"]), []).append(r)
        for (cluster, node), mine in by_node.items():
            asked = sum(r["gpu_hours"] for r in mine)
            named = sum(r["gpu_hours"] for r in of_node.get((cluster, node), []) if r["pod"])
            have = gpus.get((cluster, node), MAX_NODE_GPUS) * self.bucket / 3600.0
            left = max(0.0, have - named)
            if asked <= left * (1 + 1e-12):
                continue
            for r in mine:
                was = r["gpu_hours"]
                _set_hours(r, was * left / asked)
                r["gpu_share"] = r["gpu_share"] * left / asked
                self.flags.append(flag(
                    cluster, node, r["namespace"], r["pod"], CAPPED,
                    f"the pods of node {node or '(none)'} asked {asked:.6g} GPU-hours of its "
                    f"{have:.6g}, {named:.6g} of them named by its GPUs' series: billed "
                    f"{r['gpu_hours']:.6g} instead of {was:.6g} GPU-hours"))

    def _missing(self, p: _PodObject, cluster: str, mine: list[dict[str, Any]],
                 model: str | None) -> tuple[float, str, str | None]:
        """GPU-equivalents of a pod's requests that no row names: (share, vendor, profile)."""
        whole = [r for r in mine if not r["slice"] and r["uuid"]]
        slices = [r for r in mine if r["slice"] and r["uuid"]]
        share, vendor, profile = 0.0, "nvidia", None
        per_gpu = self._share(p.requests, cluster, p.node)
        for resource, count in p.requests.items():
            req = store.gpu_request(resource)
            if req is None or req.kind == "cores":
                continue
            vendor = req.vendor
            if req.kind == "mig":
                have = sum(1 for r in slices if r["slice"].split("/")[0] == req.profile)
                missing = max(0.0, count - have)
                if missing:
                    profile = req.profile
                    share += missing * store.mig_share(model, req.profile)
            elif req.kind == "shared":
                share += 0.0 if whole else min(count * per_gpu, 1.0)
            else:
                share += max(0.0, count - len({r["uuid"] for r in whole})) * per_gpu
        return share, vendor, profile


def _iso(ts: float) -> str:
    """A unix time for a message; a spoke's 1e300 is shown as sent."""
    try:
        return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{ts:g}"


def _requested(requests: Mapping[str, float]) -> str:
    return ", ".join(f"{n:g} {r}" for r, n in sorted(requests.items())
                     if store.gpu_request(r) is not None)


_ACTIVITY = ("avg_utilisation_pct", "max_utilisation_pct", "avg_sm_active_pct",
             "avg_tensor_active_pct", "avg_dram_active_pct")


def _set_hours(row: dict[str, Any], hours: float) -> None:
    row["gpu_hours"] = hours
    power = row.get("avg_power_w")
    row["energy_wh"] = None if power is None else power * hours


def _node_model(node_rows: list[dict[str, Any]], vendor: str | None = None) -> str | None:
    """The model of a node's GPUs (its named rows) when they are all one (the price, and a
    MIG profile's share, of a GPU whose uuid is unknown)."""
    models = {r["model"] for r in node_rows if vendor is None or r["vendor"] == vendor}
    return models.pop() if len(models) == 1 else None


def _take_free(node_rows: list[dict[str, Any]], vendor: str, hours: float) -> None:
    """Move ``hours`` out of the unallocated rows of a node's GPUs (its named rows), in
    proportion."""
    free = [r for r in node_rows
            if r["vendor"] == vendor and not r["pod"] and r["gpu_hours"] > 0]
    total = sum(r["gpu_hours"] for r in free)
    if total > 0:
        keep = max(0.0, 1.0 - hours / total)
        for r in free:
            _set_hours(r, r["gpu_hours"] * keep)


def _cap_estimates(metered: list[tuple[dict[str, Any], _Alloc, float]]) -> None:
    """An end known only to the push interval ends no later than the next whole-GPU
    allocation of the same GPU starts (one GPU, one holder): the estimate is an upper bound
    the next pod's start improves on, never a time both are charged half."""
    for i, (row, alloc, share) in enumerate(metered):
        if alloc.basis != ESTIMATED or share < 1.0:
            continue
        later = [a.begin for _, a, s in metered if s >= 1.0 and a.begin > alloc.begin]
        if later:
            metered[i] = (row, _Alloc(clip(alloc.spans, -math.inf, min(later)), alloc.basis,
                                      alloc.begin), share)


def _shared_seconds(allocs: list[tuple[list[Span], float]]) -> list[float]:
    """Share-seconds of each allocation of one GPU: its share while it holds it, scaled down
    where the shares of the holders at that moment add up to more than one GPU."""
    cuts = sorted({t for spans, _ in allocs for span in spans for t in span})
    out = [0.0] * len(allocs)
    for a, b in pairwise(cuts):
        holders = [i for i, (spans, _) in enumerate(allocs)
                   if any(x <= a and b <= y for x, y in spans)]
        total = sum(allocs[i][1] for i in holders)
        scale = 1.0 / total if total > 1.0 else 1.0
        for i in holders:
            out[i] += (b - a) * allocs[i][1] * scale
    return out
