"""Metered allocation's PromQL: the allocations' own edges (kube-state-metrics' pod series,
gpufleet's exporter's edge series), and how a spoke forwards only the GPU pods' series.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from hub.store._fields import KUBE_NODE_LABELS, Query
from hub.store._profiles import PROFILES, _by, labelled_matcher

# -- metered allocation: intervals from the allocations' own edges (issue 27) ----------------
#: kube-state-metrics' pod series (STABLE): start and completion in unix seconds, the
#: container requests (the series lives as long as the pod object, also after it completed:
#: never an end), and the phase (where OpenShift deny-lists the completion time, the last
#: Running sample bounds the end to one push interval).
KSM_POD_START = "kube_pod_start_time"
KSM_POD_COMPLETION = "kube_pod_completion_time"
KSM_POD_REQUESTS = "kube_pod_container_resource_requests"
KSM_POD_PHASE = "kube_pod_status_phase"
#: kube-state-metrics' spelling of the time-slicing replicas node label (nvidia.com/gpu.replicas)
KSM_REPLICAS_LABEL = "label_nvidia_com_gpu_replicas"
#: gpufleet's exporter: the edges it saw in the kubelet's pod-resources (spoke/_naming.py
#: publishes the same names): start while held, end for at least two push intervals after.
EDGE_START = "gpufleet_allocation_start_timestamp_seconds"
EDGE_END = "gpufleet_allocation_end_timestamp_seconds"
ALLOCATION_METRICS = [KSM_POD_START, KSM_POD_COMPLETION, KSM_POD_REQUESTS, KSM_POD_PHASE,
                      EDGE_START, EDGE_END]
#: GPU resources as kube-state-metrics sanitises them (non-alphanumerics -> ``_``): whole
#: GPUs, time-sliced replicas (renamed), MIG devices (mixed strategy), HAMi's cores share,
#: AMD partitions. A label regex (never a ``__name__`` one).
GPU_RESOURCE_REGEX = ("nvidia_com_gpu|nvidia_com_gpu_shared|nvidia_com_gpucores"
                      "|nvidia_com_mig_.+|amd_com_gpu|amd_com_.+_nps.+")
#: the per-pod labels of kube-state-metrics' pod series and the pod labels of the edges
KSM_POD_KEY = ["namespace", "pod", "uid"]
EDGE_POD_LABELS = ["namespace", "pod", "exported_namespace", "exported_pod"]


@dataclass(frozen=True)
class GpuRequest:
    """What one sanitised resource request means for a GPU's time."""

    vendor: str
    kind: str  # "whole" | "shared" | "mig" | "cores"
    profile: str | None = None  # MIG profile (``1g.10gb``)


def gpu_request(resource: str) -> GpuRequest | None:
    """kube-state-metrics' resource label -> its meaning; None for a resource that is no
    count of GPUs (HAMi's gpumem, anything else)."""
    if resource in ("nvidia_com_gpu", "amd_com_gpu"):
        return GpuRequest(resource.split("_", 1)[0], "whole")
    if resource == "nvidia_com_gpu_shared":
        return GpuRequest("nvidia", "shared")
    if resource == "nvidia_com_gpucores":
        return GpuRequest("nvidia", "cores")
    if resource.startswith("nvidia_com_mig_"):
        return GpuRequest("nvidia", "mig", resource.removeprefix("nvidia_com_mig_")
                          .replace("_", "."))
    if resource.startswith("amd_com_") and "_nps" in resource:
        return GpuRequest("amd", "whole")  # a partition holds its GPU (see hub/usage/_dra.py)
    return None


def allocation_queries(window: str, step: str, cluster_label: str,
                       shard: str = "", held: Container[str] | None = None) -> list[Query]:
    """The fixed request set of a bucket's allocation intervals, whatever the fleet size.

    Evaluated a push interval and one ``step`` after the bucket's end over ``window`` (the
    bucket, a push interval each side and the step): a pod that lived in the bucket has
    samples there, also one shorter than a push (the push after it carries its edges), and
    one held past the bucket's end has a sample after it. Intervals are read from the
    values (the edges' own times), so a wider window never lengthens one.

    Kinds: ``alloc:start`` / ``alloc:end`` (kube-state-metrics' start and completion),
    ``alloc:requests`` (GPU requests per pod, resource and node), ``alloc:running`` (the time
    of the pod's last Running sample: ``timestamp`` inside a subquery whose ``step`` is at
    most the push interval and the store's look-back), ``alloc:replicas`` (time-slicing
    replicas per node), ``edge:start`` / ``edge:end`` / ``edge:seen`` (gpufleet's exporter:
    per GPU and pod; seen = its start gauge's last sample, the end where the end gauge was
    not pushed). ``shard`` (a shard_matcher) is added to every selector, as in
    usage_queries. ``held`` (the metric names the store holds; None: any) leaves out a
    query one of whose names it lacks: its answer would be empty.
    """
    labelled = labelled_matcher(cluster_label) + (f", {shard}" if shard else "")
    pod = _by([cluster_label, *KSM_POD_KEY])
    edge_ids = list(dict.fromkeys(label for p in PROFILES for label in p.id_labels))
    edge = _by([cluster_label, *edge_ids, *EDGE_POD_LABELS])

    def last(agg: str, by: str, name: str, match: str = "") -> str:
        return f"{agg} by ({by}) (last_over_time({name}{{{labelled}{match}}}[{window}]))"

    def seen(by: str, selector: str, only: str = "") -> str:
        # timestamp() gives a sample's own time only around a plain selector; ``and`` keeps
        # those where the condition holds (around ``== 1`` it would give the step's time)
        stamps = f"timestamp({selector})" + (f" and {only}" if only else "")
        return f"max by ({by}) (max_over_time(({stamps})[{window}:{step}]))"

    gpu = f', resource=~"{GPU_RESOURCE_REGEX}"'
    # only pods that request GPUs: a hub that holds every pod's series answers with these
    gpu_pods = f" and on ({pod}) {last('sum', pod, KSM_POD_REQUESTS, gpu)}"
    running = f'{KSM_POD_PHASE}{{{labelled}, phase="Running"}}'
    # each query with the names it reads: every one of them (an ``and`` side too) must be
    # held, or the answer is empty
    asked = (
        (Query("kube", "alloc:start", last("max", pod, KSM_POD_START) + gpu_pods),
         (KSM_POD_START, KSM_POD_REQUESTS)),
        (Query("kube", "alloc:end", last("max", pod, KSM_POD_COMPLETION) + gpu_pods),
         (KSM_POD_COMPLETION, KSM_POD_REQUESTS)),
        (Query("kube", "alloc:requests", last(
            "sum", _by([cluster_label, *KSM_POD_KEY, "node", "resource"]), KSM_POD_REQUESTS,
            gpu)), (KSM_POD_REQUESTS,)),
        (Query("kube", "alloc:running", seen(
            pod, running, f"{running} == 1") + gpu_pods), (KSM_POD_PHASE, KSM_POD_REQUESTS)),
        (Query("kube", "alloc:replicas", last(
            "max", _by([cluster_label, "node", KSM_REPLICAS_LABEL]), KUBE_NODE_LABELS,
            f', {KSM_REPLICAS_LABEL}!=""')), (KUBE_NODE_LABELS,)),
        (Query("gpufleet", "edge:start", last("max", edge, EDGE_START)), (EDGE_START,)),
        (Query("gpufleet", "edge:end", last("max", edge, EDGE_END)), (EDGE_END,)),
        (Query("gpufleet", "edge:seen", seen(edge, f"{EDGE_START}{{{labelled}}}")),
         (EDGE_START,)),
    )
    return [query for query, names in asked
            if held is None or all(name in held for name in names)]


def allocation_probe(window: str, cluster_label: str) -> str:
    """How many allocation series (GPU requests of kube-state-metrics, the exporter's start
    edges) the store holds in the window: asked once per collect, so a hub without any
    (a new one, one whose spokes forward neither) is not asked the interval queries for
    every bucket of a backfill."""
    labelled = labelled_matcher(cluster_label)
    return (f'count(last_over_time({KSM_POD_REQUESTS}{{{labelled}, '
            f'resource=~"{GPU_RESOURCE_REGEX}"}}[{window}])) or '
            f"count(last_over_time({EDGE_START}{{{labelled}}}[{window}]))")


# -- forwarding kube-state-metrics' allocation series (spoke render, issue 27) ----------------
#: kube-state-metrics' pod series the ledger's intervals read; forwarded only for pods that
#: request GPUs (their requests series by its resource label, the others joined to it where
#: the forwarder can join: ACM's recording rules)
_GPU_REQUESTS = f'{KSM_POD_REQUESTS}{{resource=~"{GPU_RESOURCE_REGEX}"}}'


def allocation_matches() -> list[str]:
    """ACM allowlist ``matches``: the requests series of GPU resources only."""
    return [f'__name__="{KSM_POD_REQUESTS}",resource=~"{GPU_RESOURCE_REGEX}"']


def allocation_recording_rules() -> list[dict[str, str]]:
    """ACM allowlist ``recording_rules`` (platform monitoring only): the start, completion
    and Running phase of pods that request GPUs, under their own names (the metrics-
    collector pushes the rule's result, so the hub reads them as kube-state-metrics'), so a
    cluster's thousands of other pods are never forwarded."""
    gpu_pods = f"on ({', '.join(KSM_POD_KEY)}) ({_GPU_REQUESTS} > 0)"
    return [{"record": name, "expr": f"{name}{match} and {gpu_pods}"}
            for name, match in ((KSM_POD_START, ""), (KSM_POD_COMPLETION, ""),
                                (KSM_POD_PHASE, '{phase="Running"}'))]


def allocation_agent_keep() -> tuple[list[str], str]:
    """(source_labels, regex) of the Prometheus agent's keep rule on kube-state-metrics:
    GPU requests by their resource label, the pods' start and completion, the Running phase
    only, and the node labels (time-slicing replicas). An agent cannot join series, so the
    pod series are one to three per pod of the cluster, not per GPU pod."""
    pods = "|".join((KSM_POD_START, KSM_POD_COMPLETION, KUBE_NODE_LABELS))
    return (["__name__", "resource", "phase"],
            f"{KSM_POD_REQUESTS};(?:{GPU_RESOURCE_REGEX});.*|(?:{pods});.*|"
            f"{KSM_POD_PHASE};.*;Running")
