"""A real hub Prometheus holding past hours of known samples (promtool backfill)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from hub.devstack import PrometheusProcess, require_binary
from hub.devstack._prometheus import hub_config

Series = tuple[str, str, Callable[[float], float | None]]  # name, labels, value at t (None=gap)


def openmetrics(series: Iterable[Series], times: list[float]) -> str:
    """OpenMetrics text: one family per name, samples in time order within each series."""
    families: dict[str, list[tuple[str, Callable[[float], float | None]]]] = {}
    for name, labels, value in series:
        families.setdefault(name, []).append((labels, value))
    out = []
    for name, members in families.items():
        out.append(f"# TYPE {name} gauge")
        for labels, value in members:
            for t in times:
                v = value(t)
                if v is not None:
                    out.append(f"{name}{{{labels}}} {v} {t:.3f}")
    out.append("# EOF")
    return "\n".join(out) + "\n"


def backfilled_hub(workdir: Path, text: str) -> PrometheusProcess:
    """Write the blocks with promtool, then start (not yet started) a hub on them."""
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    om = workdir / "backfill.om"
    om.write_text(text)
    subprocess.run([require_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics",
                    str(om), str(data)], check=True, capture_output=True)
    return PrometheusProcess(workdir, hub_config())


@dataclass(frozen=True)
class PodObject:
    """A pod holding GPUs, as kube-state-metrics shows it at each push: its start and
    completion times (values), its requests (for as long as the object exists, also after it
    completed) and its Running phase. ``completion=False`` is OpenShift's kube-state-metrics
    (kube_pod_completion_time deny-listed); ``deleted`` ends the object's series."""

    namespace: str
    pod: str
    node: str
    start: float
    end: float | None = None  # None: still running
    gpus: float = 1.0
    resource: str = "nvidia_com_gpu"
    cluster: str = "c1"
    uid: str = ""
    deleted: float | None = None
    completion: bool = True
    #: more requests of the pod (HAMi's ("nvidia_com_gpucores", 25.0) beside its GPU)
    more: tuple[tuple[str, float], ...] = ()

    def _alive(self, t: float) -> bool:
        return self.start <= t and (self.deleted is None or t < self.deleted)

    def series(self) -> list[Series]:
        pod = (f'cluster="{self.cluster}",namespace="{self.namespace}",pod="{self.pod}",'
               f'uid="{self.uid or self.pod}"')
        ended = self.end

        def when(value: Callable[[float], float | None]) -> Callable[[float], float | None]:
            return lambda t: value(t) if self._alive(t) else None

        out: list[Series] = [
            ("kube_pod_start_time", pod, when(lambda t: self.start)),
            ("kube_pod_container_resource_requests",
             f'{pod},container="main",node="{self.node}",resource="{self.resource}",'
             'unit="integer"', when(lambda t: self.gpus)),
            *[("kube_pod_container_resource_requests",
               f'{pod},container="main",node="{self.node}",resource="{resource}",'
               'unit="integer"', when(lambda t, v=value: v)) for resource, value in self.more],
            ("kube_pod_status_phase", f'{pod},phase="Running"',
             when(lambda t: 1.0 if ended is None or t < ended else 0.0)),
        ]
        if self.completion and ended is not None:
            out.append(("kube_pod_completion_time", pod,
                        when(lambda t: ended if t >= ended else None)))
        return out
