"""Allocation edges: when each pod got and gave back each GPU, as the kubelet's pod-resources
show it at every collection.

The hub bills a pod's GPU time from its allocation's own start and end (metered, not
sampled: a 2-minute job between two 300 s pushes is still 2 minutes). Per held GPU (or MIG
slice) and pod this publishes ``gpufleet_allocation_start_timestamp_seconds`` (unix time of
the first collection that saw the allocation) and, once it is gone,
``gpufleet_allocation_end_timestamp_seconds`` (the first collection that no longer saw it)
beside the start, for ``linger`` seconds: at least two push intervals, so the next push
carries both edges whatever its phase. Device-plugin and DRA allocations alike (they arrive
in the same device map, spoke/_podresources.py).

Edges are to the exporter's interval, and only edges it saw: allocations already held at its
first collection (after a restart) publish nothing, so the hub reads those from
kube-state-metrics or the samples rather than from a start that is really a restart. A GPU
that cannot be read in a pass, or a kubelet that does not answer, ends nothing: that is
missing evidence, not the end of an allocation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client.metrics_core import Metric

from spoke._model import GpuReading
from spoke._naming import (
    EDGE_END,
    EDGE_START,
    NVIDIA,
    PodRef,
    Pods,
    amd_labels,
    nvidia_labels,
    pods_of,
)

Key = tuple[str, str | None, int | None, PodRef]  # uuid, MIG profile, instance, pod


class Edges:
    """The allocations seen so far and those ended within ``linger`` seconds."""

    def __init__(self, linger: float = 630.0) -> None:
        self.linger = linger
        self._held: dict[Key, tuple[dict[str, str], float]] = {}
        self._ended: dict[Key, tuple[dict[str, str], float, float]] = {}
        self._untracked: set[Key] | None = None  # held at the first pass: start unknown

    def update(self, vendor: str, readings: Sequence[GpuReading], hostname: str,
               pods: Pods | None, now: float) -> list[Metric]:
        """Record this pass (``pods`` None: the kubelet did not answer) and return the
        families to publish."""
        if pods is not None:
            self._record(vendor, readings, hostname, pods, now)
        for key in [k for k, (_, _, end) in self._ended.items() if now - end >= self.linger]:
            del self._ended[key]
        start = Metric(EDGE_START, "Unix time the GPU was first seen allocated to the pod "
                       "(kubelet pod-resources).", "gauge")
        end = Metric(EDGE_END, "Unix time the GPU was first seen no longer allocated to the "
                     "pod (published for at least two push intervals).", "gauge")
        for labels, since in self._held.values():
            start.add_sample(EDGE_START, labels, since)
        for labels, since, until in self._ended.values():
            start.add_sample(EDGE_START, labels, since)
            end.add_sample(EDGE_END, labels, until)
        return [m for m in (start, end) if m.samples]

    def _record(self, vendor: str, readings: Sequence[GpuReading], hostname: str,
                pods: Pods, now: float) -> None:
        label: Callable[..., dict[str, str]] = nvidia_labels if vendor == NVIDIA else amd_labels
        current: dict[Key, dict[str, str]] = {}
        for r in readings:
            for pod in pods_of(r, pods):
                if pod is not None:
                    current[(r.uuid, r.mig_profile, r.mig_instance, pod)] = label(
                        r, hostname, pod)
        if self._untracked is None:
            self._untracked = set(current)
            return
        read = {r.uuid for r in readings}
        # once given back, a later allocation is new (an unread GPU gives nothing back)
        self._untracked = {k for k in self._untracked if k in current or k[0] not in read}
        for key in [k for k in self._held if k not in current and k[0] in read]:
            labels, since = self._held.pop(key)
            self._ended[key] = (labels, since, now)
        for key, labels in current.items():
            if key not in self._held and key not in self._untracked:
                self._held[key] = (labels, now)
                self._ended.pop(key, None)
