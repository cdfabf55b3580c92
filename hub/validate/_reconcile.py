"""Per node: the GPUs the hub sees against what Kubernetes advertises (pure).

Three sources describe the Kubernetes side: the API itself (``--source kube``), kube-state-metrics
through the hub (``--source hub``) and ``kubectl get nodes -o json`` files for air-gapped sites
(``--source file``). Each is turned into the same :class:`NodeView` here, so that one function,
:func:`compare`, decides every node's status whatever the source was. The inventory side is
:class:`ObservedNode`, read from the database by :mod:`hub.validate._reconcile_store`.

Counts legitimately differ in a few well-known ways, and the compare knows them, because a
report that cries wolf on every time-sliced node gets ignored:

* MIG, mixed strategy: Kubernetes advertises ``nvidia.com/mig-<g>g.<mem>gb`` slices and
  ``nvidia.com/gpu`` only for whole GPUs; the hub sees physical GPUs and their slices.
* MIG, single strategy (label ``nvidia.com/mig.strategy=single``): ``nvidia.com/gpu`` counts MIG
  devices. The label is set on nodes without MIG too, so MIG is assumed only when the hub sees
  slices or the product label names a MIG profile.
* Time-slicing / MPS: advertised = physical × ``nvidia.com/gpu.replicas``, as ``nvidia.com/gpu``
  or, renamed, ``nvidia.com/gpu.shared``.
* AMD partitions: ``amd.com/<cpx|dpx|qpx|spx>_<nps>`` resources count partitions while the
  exporter reports series for partition 0 only, i.e. one per physical GPU.
* Dynamic Resource Allocation: on a DRA node the GPUs are not in allocatable at all; a GPU
  driver's ResourceSlices publish them (``hub.kube.dra_nodes`` counts physical GPUs there). Such a
  node is compared GPU by GPU (NVIDIA by UUID, AMD by PCI bus id), a pool being rewritten makes
  it ``unknown`` (never a mismatch or 0), and a node that publishes GPUs both ways is flagged.
  kube-state-metrics has no ResourceSlice metric, so ``--source hub`` cannot check DRA nodes:
  a node it lists without GPU resources while the hub sees GPUs there is ``unknown``, not
  ``missing_in_kubernetes``.

Every node gets exactly one status; the reason names both numbers and the rule applied.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypedDict

from hub import store
from hub.common import InputError
from hub.kube import (
    INSTANCE_TYPE_LABELS,
    Catalog,
    ClaimAllocation,
    DraNode,
    InstanceType,
    SliceError,
    claim_allocations,
    claimed_devices,
    dra_nodes,
    instance_type_of,
)

# -- Kubernetes resource and label names --------------------------------------------------------
NVIDIA_GPU = "nvidia.com/gpu"
NVIDIA_SHARED = "nvidia.com/gpu.shared"
NVIDIA_MIG = re.compile(r"^nvidia\.com/mig-(\d+g\.\d+gb.*)$")
AMD_GPU = "amd.com/gpu"
AMD_PARTITION = re.compile(r"^amd\.com/(spx|dpx|qpx|cpx)_(nps\d+)$")
#: compute partitions per physical GPU of each AMD compute-partition mode (MI300X: 8 XCDs)
AMD_PARTITIONS_PER_GPU = {"spx": 1, "dpx": 2, "qpx": 4, "cpx": 8}
GPU_RESOURCE_PREFIXES = ("nvidia.com/", "amd.com/")

REPLICAS = "nvidia.com/gpu.replicas"
SHARING = "nvidia.com/gpu.sharing-strategy"
MIG_STRATEGY = "nvidia.com/mig.strategy"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_PRODUCT = "nvidia.com/gpu.product"
#: node labels the compare reads (kube-state-metrics exposes them as label_<sanitised>)
LABELS = (REPLICAS, SHARING, MIG_STRATEGY, GPU_COUNT, GPU_PRODUCT)

# -- statuses ----------------------------------------------------------------------------------
MATCH = "match"
MISSING_IN_METRICS = "missing_in_metrics"
MISSING_IN_KUBERNETES = "missing_in_kubernetes"
COUNT_MISMATCH = "count_mismatch"
NODE_NOT_REPORTING = "node_not_reporting"
#: the Kubernetes side cannot say how many GPUs the node has (a DRA pool being rewritten, or
#: a DRA node seen through kube-state-metrics): not a finding of a mismatch, not a match
UNKNOWN = "unknown"
#: the node publishes GPUs through a device plugin and through DRA at once
DEVICE_PLUGIN_AND_DRA = "device_plugin_and_dra"
#: the node's instance type (hub.kube's catalog) has GPUs that neither Kubernetes nor the
#: exporter shows: a device plugin or driver that never started, GPUs fallen off the bus
GPUS_MISSING_BY_INSTANCE_TYPE = "gpus_missing_by_instance_type"
#: the node shows more GPUs than its instance type has, or GPUs of another model: a wrong
#: instance-type label, a node the catalog or the inventory mistakes for another
INSTANCE_TYPE_MISMATCH = "instance_type_mismatch"
#: node statuses that do not fail `gpufleet reconcile`
NODE_PASSING = (MATCH, UNKNOWN)

#: cluster-level statuses; the first four are findings, the rest are informative
CLUSTER_NO_GPU_METRICS = "no_gpu_metrics"  # GPU nodes in Kubernetes, no GPU metrics ever
CLUSTER_NOT_REPORTING = "not_reporting"  # GPU metrics known but all stale
CLUSTER_NO_KUBERNETES_DATA = "no_kubernetes_data"  # a fleet-wide source lacks this cluster
CLUSTER_SILENT = "silent"  # an ACM ManagedCluster with neither metrics nor node data
CLUSTER_OK = "ok"
CLUSTER_MISMATCH = "mismatch"  # node rows tell which
CLUSTER_NO_GPUS = "no_gpus"  # neither side has GPUs: nothing is expected to report
CLUSTER_NOT_CHECKED = "not_checked"  # the chosen source does not speak for this cluster
CLUSTER_FINDINGS = (CLUSTER_NO_GPU_METRICS, CLUSTER_NOT_REPORTING, CLUSTER_NO_KUBERNETES_DATA,
                    CLUSTER_SILENT)
#: cluster statuses that fail `gpufleet reconcile` (exit 1), besides node statuses
CLUSTER_FAILURES = (CLUSTER_NO_GPU_METRICS, CLUSTER_SILENT)

ACTIVE = "active"


# -- plain data --------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeView:
    """What Kubernetes says about one node: GPU resources and GPU-related labels, and what
    DRA GPU drivers publish for it (``dra``; None when no GPU driver has a pool there)."""

    cluster: str
    node: str
    capacity: Mapping[str, int]
    allocatable: Mapping[str, int] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    dra: DraNode | None = None
    #: node.kubernetes.io/instance-type (or the beta label), where the source has it
    instance_type: str | None = None
    #: spec.providerID (aws:///zone/i-..., gce://project/zone/name, azure:///...): the join
    #: of a cloud bill's lines to the node (`usage --bill`)
    provider_id: str | None = None
    #: spec.unschedulable (a cordon): True or False where the source says, else None
    unschedulable: bool | None = None

    @property
    def plugin_gpus(self) -> int:
        """Every GPU resource in capacity (device plugins), summed."""
        return sum(self.capacity.values())

    @property
    def gpus(self) -> int:
        return self.plugin_gpus + (len(self.dra.gpus) if self.dra is not None else 0)


@dataclass(frozen=True)
class ObservedNode:
    """What the inventory knows about one node (from the hub's metrics)."""

    cluster: str
    node: str
    state: str  # active | stale
    gpus: int  # active physical GPUs
    slices: int = 0  # active MIG slices
    mig_gpus: int = 0  # active physical GPUs that have active slices
    vendor: str | None = None
    last_sample_at: dt.datetime | None = None
    #: UUIDs of its active GPUs (slices name their parent): the join with DRA's ``uuid``
    uuids: frozenset[str] = frozenset()
    #: normalised PCI bus ids of its active GPUs, where the exporter labels them (AMD's DRA key)
    pci_bus_ids: frozenset[str] = frozenset()
    #: the models its active GPUs report (modelName, card_series): what the instance type's
    #: catalog entry is checked against
    models: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ManagedCluster:
    """An ACM ManagedCluster: a cluster that should be reporting."""

    name: str
    available: str | None = None  # the ManagedClusterConditionAvailable status, if any


@dataclass(frozen=True)
class NodeResult:
    cluster: str
    node: str
    status: str
    mode: str  # whole | time-slicing | mps | mig-mixed | mig-single | amd-partition | dra
    #          | dra+device-plugin | none
    k8s_gpus: int | None  # every GPU resource Kubernetes advertises (capacity), summed
    observed_gpus: int | None  # active physical GPUs in the inventory
    reason: str
    k8s_allocatable: int | None = None
    expected_gpus: int | None = None  # physical GPUs the advertisement implies, when it does
    k8s_slices: int | None = None
    observed_slices: int | None = None
    resources: Mapping[str, int] = field(default_factory=dict)
    metrics_node: str | None = None  # the inventory's spelling, when it differs
    instance_type: str | None = None
    provider_id: str | None = None
    unschedulable: bool | None = None  # cordoned: its GPUs are not free (`capacity`)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["resources"] = dict(self.resources)
        return {"scope": "node", **out}


@dataclass(frozen=True)
class ClusterResult:
    cluster: str
    status: str
    reason: str
    managed: bool | None = None  # None: no ManagedCluster list was read
    available: str | None = None
    k8s_gpu_nodes: int | None = None
    k8s_gpus: int | None = None
    observed_nodes: int = 0
    observed_gpus: int = 0

    @property
    def expected(self) -> bool:
        """Should this cluster report GPU metrics? (a managed cluster that has GPUs, or may)"""
        return bool(self.managed) and self.status != CLUSTER_NO_GPUS

    def as_row(self) -> dict[str, Any]:
        """The cluster as a row of `reconcile` output (node rows carry the node columns)."""
        return {
            "scope": "cluster", "cluster": self.cluster, "node": None, "status": self.status,
            "mode": None, "k8s_gpus": self.k8s_gpus, "observed_gpus": self.observed_gpus,
            "reason": self.reason, "managed": self.managed, "available": self.available,
            "k8s_gpu_nodes": self.k8s_gpu_nodes, "observed_nodes": self.observed_nodes,
        }


@dataclass(frozen=True)
class Reconciliation:
    nodes: list[NodeResult]
    clusters: list[ClusterResult]

    @property
    def failed(self) -> bool:
        return (any(r.status not in NODE_PASSING for r in self.nodes)
                or any(c.status in CLUSTER_FAILURES for c in self.clusters))

    def rows(self) -> list[dict[str, Any]]:
        """Node rows, then the clusters that are findings on their own."""
        return ([r.as_dict() for r in self.nodes]
                + [c.as_row() for c in self.clusters if c.status in CLUSTER_FINDINGS])


NOTHING_TO_COMPARE = "nothing_to_compare"


def nothing_to_compare(views: Iterable[NodeView], source: str, where: str = "") -> str | None:
    """Why a run compared nothing, or None. "0 nodes, 0 not matching" would read as healthy
    when the Kubernetes side was simply empty (e.g. the allowlist lacks kube-state-metrics)."""
    if any(v.gpus > 0 for v in views):
        return None
    if source == "hub":
        return ("nothing to compare: no node capacity for GPU resources reached the hub "
                "(is kube_node_status_capacity in the ACM metrics allowlist, and does "
                "kube-state-metrics run on the spokes?)")
    what = f"Kubernetes API of context {where}" if source == "kube" else f"file {where}"
    return f"nothing to compare: the {what.strip()} listed no node with a GPU resource"


# -- sources: Kubernetes objects and kube-state-metrics rows -> NodeView -------------------------
def _count(value: Any, what: str) -> int:
    """A resource quantity as a count; GPU quantities are plain integers."""
    try:
        number = float(str(value))
    except ValueError:
        raise InputError(f"{what}: quantity {value!r} is not a number") from None
    if number != number or number < 0:
        raise InputError(f"{what}: quantity {value!r} is not a count")
    return int(number)


def is_gpu_resource(name: str) -> bool:
    return name.startswith(GPU_RESOURCE_PREFIXES)


def _gpu_resources(mapping: Mapping[str, Any] | None, what: str) -> dict[str, int]:
    return {k: _count(v, f"{what} {k}") for k, v in (mapping or {}).items()
            if is_gpu_resource(k)}


def _gpu_labels(labels: Mapping[str, str] | None,
               keep: Collection[str] = ()) -> dict[str, str]:
    """GPU-related labels, and the ``keep`` ones (an instance-type catalog's selectors)."""
    return {k: str(v) for k, v in (labels or {}).items()
            if k.startswith(GPU_RESOURCE_PREFIXES) or k.split("/", 1)[0].endswith(".amd.com")
            or k in keep}


def node_from_object(cluster: str, obj: Mapping[str, Any],
                     keep: Collection[str] = ()) -> NodeView:
    """A Node object (API JSON, camelCase) as a NodeView (``keep``: labels to keep besides
    the GPU ones, for an instance-type catalog's selectors)."""
    if not isinstance(obj, Mapping) or not isinstance(obj.get("metadata"), Mapping):
        raise InputError(f"cluster {cluster}: a Node without metadata")
    name = str(obj["metadata"].get("name") or "")
    if not name:
        raise InputError(f"cluster {cluster}: a Node without a name")
    status = obj.get("status") or {}
    what = f"node {name}"
    labels = obj["metadata"].get("labels") or {}
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        spec = {}
    return NodeView(cluster, name, _gpu_resources(status.get("capacity"), what),
                    _gpu_resources(status.get("allocatable"), what),
                    _gpu_labels(labels, keep), instance_type=instance_type_of(labels),
                    provider_id=str(spec.get("providerID") or "") or None,
                    unschedulable=bool(spec.get("unschedulable")))


def nodes_from_document(cluster: str, doc: Any, source: str,
                        keep: Collection[str] = ()) -> list[NodeView]:
    """``kubectl get nodes -o json`` (a List or NodeList), or a single Node, as NodeViews."""
    if isinstance(doc, Mapping) and doc.get("kind") == "Node":
        return [node_from_object(cluster, doc, keep)]
    if not isinstance(doc, Mapping) or not isinstance(doc.get("items"), list):
        raise InputError(f"{source} is not the output of `kubectl get nodes -o json` "
                         "(expected an object with 'items')")
    items = doc["items"]
    for item in items:
        if isinstance(item, Mapping) and item.get("kind") not in (None, "Node"):
            raise InputError(f"{source} holds a {item.get('kind')}, not Nodes")
    return [node_from_object(cluster, item, keep) for item in items]


def slices_from_document(doc: Any, source: str) -> list[Mapping[str, Any]]:
    """``kubectl get resourceslices -o json`` (or resourceclaims): the List's items."""
    if isinstance(doc, Mapping) and doc.get("kind") in ("ResourceSlice", "ResourceClaim"):
        return [doc]
    if not isinstance(doc, Mapping) or not isinstance(doc.get("items"), list):
        raise InputError(f"{source} is not the output of `kubectl get ... -o json` "
                         "(expected an object with 'items')")
    return list(doc["items"])


def with_dra(views: Iterable[NodeView], cluster: str,
             slices: Iterable[Mapping[str, Any]], source: str = "") -> list[NodeView]:
    """The cluster's NodeViews with what DRA GPU drivers publish attached per node.

    A node a GPU driver publishes for that the Node list lacks (deleted, slices not yet
    cleaned up) gets a view of its own, with no capacity.
    """
    try:
        published = dra_nodes(slices)
    except SliceError as exc:
        where = f"{source}: " if source else f"cluster {cluster}: "
        raise InputError(where + str(exc)) from None
    out = []
    for view in views:
        if view.cluster == cluster and view.node in published:
            view = replace(view, dra=published.pop(view.node))
        out.append(view)
    out += [NodeView(cluster, name, {}, dra=node) for name, node in sorted(published.items())]
    return out


def claim_allocations_of(views: Iterable[NodeView], cluster: str,
                         claims: Iterable[Mapping[str, Any]],
                         source: str = "") -> list[ClaimAllocation]:
    """The GPUs pods of ``cluster`` hold through ResourceClaims, joined to the devices its
    views' slices publish."""
    published = {v.node: v.dra for v in views if v.cluster == cluster and v.dra is not None}
    try:
        return claim_allocations(published, claimed_devices(claims))
    except SliceError as exc:
        where = f"{source}: " if source else f"cluster {cluster}: "
        raise InputError(where + str(exc)) from None


_MIG_SANITISED = re.compile(r"^nvidia_com_mig_(\d+)g_(\d+)gb(.*)$")


def resource_from_ksm(name: str) -> str | None:
    """kube-state-metrics sanitises resource names (non-alphanumerics -> ``_``); undo it for
    the GPU resources we know. None for anything else (cpu, memory, ...)."""
    mig = _MIG_SANITISED.match(name)
    if mig:
        g, mem, rest = mig.groups()
        return f"nvidia.com/mig-{g}g.{mem}gb" + rest.replace("_", "+")
    if name == "nvidia_com_gpu_shared":
        return NVIDIA_SHARED
    for vendor in ("nvidia", "amd"):
        prefix = f"{vendor}_com_"
        if name.startswith(prefix) and len(name) > len(prefix):
            return f"{vendor}.com/{name[len(prefix):]}"
    return None


def ksm_label(label: str) -> str:
    """The kube-state-metrics label of a node label (``kube_node_labels``)."""
    return "label_" + re.sub(r"[^A-Za-z0-9_]", "_", label)


# kube-state-metrics resources the hub source asks for: GPU ones, and cpu to list every node
# (one regex with what ACM's collection paths forward: hub.store._collection)
KSM_GPU_RESOURCES = store.KSM_GPU_RESOURCES
#: the ``kind`` of query 1's cordon rows (kube_node_spec_unschedulable)
UNSCHEDULABLE = "unschedulable"


def _ksm_wanted(keep: Collection[str]) -> list[str]:
    """Node labels asked of kube-state-metrics: the compare's, the instance type's and a
    catalog's selector labels (each only where its label allowlist exposes it)."""
    return list(dict.fromkeys([*LABELS, *INSTANCE_TYPE_LABELS, *keep]))


def ksm_queries(window: str, cluster_label: str, keep: Collection[str] = ()) -> list[str]:
    """The fixed request set of ``--source hub``: resources, then labels, of every node.

    Query 1 returns capacity (GPU resources and cpu, so that a node without GPUs is known to
    exist), allocatable (GPU resources) and the cordon (kube_node_spec_unschedulable), tagged
    by a ``kind`` label. Query 2 returns the
    labels the compare reads, where kube-state-metrics' label allowlist exposes them, and
    (from ``kube_node_info``, a row of its own) the node's provider id. Both
    group by the cluster label, node and resource: one row per node and resource, however
    many clusters there are.
    """
    capacity, allocatable = store.KUBE_STATE_METRICS
    by = f"{cluster_label}, node, resource"

    def part(metric: str, resources: str, kind: str) -> str:
        inner = f'last_over_time({metric}{{resource=~"{resources}"}}[{window}])'
        return f'label_replace(max by ({by}) ({inner}), "kind", "{kind}", "", "")'

    cordon = (f'label_replace(max by ({by}) (last_over_time('
              f'{store.KUBE_NODE_UNSCHEDULABLE}[{window}])), "kind", "{UNSCHEDULABLE}", "", "")')
    resources = (part(capacity, KSM_GPU_RESOURCES + "|cpu", "capacity") + " or "
                 + part(allocatable, KSM_GPU_RESOURCES, "allocatable") + " or " + cordon)
    label_names = ", ".join(ksm_label(label) for label in _ksm_wanted(keep))
    labels = (f"max by ({cluster_label}, node, {label_names}, {store.KUBE_PROVIDER_ID}) "
              f"(last_over_time({store.KUBE_NODE_LABELS}[{window}]) or "
              f"last_over_time({store.KUBE_NODE_INFO}[{window}]))")
    return [resources, labels]


def nodes_from_ksm(resource_rows: Iterable[Mapping[str, Any]],
                   label_rows: Iterable[Mapping[str, Any]],
                   cluster_label: str, keep: Collection[str] = ()
                   ) -> tuple[list[NodeView], set[str]]:
    """NodeViews from the two ``ksm_queries`` results, and the clusters they cover."""
    capacity: dict[tuple[str, str], dict[str, int]] = {}
    allocatable: dict[tuple[str, str], dict[str, int]] = {}
    cordoned: dict[tuple[str, str], bool] = {}
    covered: set[str] = set()
    for row in resource_rows:
        metric = row.get("metric") or {}
        cluster, node = metric.get(cluster_label, ""), metric.get("node", "")
        if not cluster or not node:
            continue
        if metric.get("kind") == UNSCHEDULABLE:  # a fact about a node, not a resource
            cordoned[(cluster, node)] = _count(row["value"][1], f"node {node} cordon") > 0
            continue
        covered.add(cluster)
        key = (cluster, node)
        target = allocatable if metric.get("kind") == "allocatable" else capacity
        target.setdefault(key, {})
        name = resource_from_ksm(metric.get("resource", ""))
        if name is None:
            continue
        target[key][name] = _count(row["value"][1], f"node {node} {name}")
    labels: dict[tuple[str, str], dict[str, str]] = {}
    providers: dict[tuple[str, str], str] = {}
    wanted = {ksm_label(label): label for label in _ksm_wanted(keep)}
    for row in label_rows:
        metric = row.get("metric") or {}
        key = (metric.get(cluster_label, ""), metric.get("node", ""))
        labels.setdefault(key, {}).update(
            {wanted[k]: v for k, v in metric.items() if k in wanted and v})
        if metric.get(store.KUBE_PROVIDER_ID):
            providers[key] = metric[store.KUBE_PROVIDER_ID]
    # A node whose capacity never reached the hub (MCOA's default set forwards allocatable,
    # not capacity) is still a node: its allocatable stands for what it advertises.
    for key, alloc in allocatable.items():
        capacity.setdefault(key, dict(alloc))
    views = []
    for (c, n), caps in sorted(capacity.items()):
        found = labels.get((c, n), {})
        views.append(NodeView(c, n, caps, allocatable.get((c, n), {}),
                              {k: v for k, v in found.items() if k not in INSTANCE_TYPE_LABELS},
                              instance_type=instance_type_of(found),
                              provider_id=providers.get((c, n)),
                              unschedulable=cordoned.get((c, n))))
    return views, covered


def managed_cluster(obj: Mapping[str, Any]) -> ManagedCluster:
    """A ManagedCluster object as plain data (its Available condition, if reported)."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    available = None
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "ManagedClusterConditionAvailable":
            available = str(cond.get("status"))
    return ManagedCluster(name, available)


# -- the compare ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Verdict:
    mode: str
    ok: bool
    reason: str
    expected_gpus: int | None = None
    k8s_slices: int | None = None
    observed_slices: int | None = None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, ValueError):
        return None


def _judge(view: NodeView, obs: ObservedNode) -> _Verdict:
    """How many GPUs the advertisement implies, under which rule, and whether the hub agrees."""
    cap, labels = view.capacity, view.labels
    seen = obs.gpus
    mig = {m.group(1): n for k, n in cap.items() if (m := NVIDIA_MIG.match(k)) and n}
    amd_parts = {k: n for k, n in cap.items() if AMD_PARTITION.match(k) and n}
    nv_gpu, shared, amd_gpu = cap.get(NVIDIA_GPU, 0), cap.get(NVIDIA_SHARED, 0), cap.get(AMD_GPU, 0)
    replicas = _int_label(labels, REPLICAS)
    product = labels.get(GPU_PRODUCT, "")

    if mig:
        slices = sum(mig.values())
        whole_seen = seen - obs.mig_gpus
        detail = ", ".join(f"{n}× mig-{p}" for p, n in sorted(mig.items()))
        ok = slices == obs.slices and nv_gpu == whole_seen
        reason = (f"k8s {_plural(slices, 'MIG slice')} ({detail}) + {_plural(nv_gpu, 'whole GPU')}"
                  f" (MIG mixed strategy) {'=' if ok else 'vs'} {_plural(obs.slices, 'slice')} "
                  f"on {_plural(obs.mig_gpus, 'GPU')} + {_plural(whole_seen, 'whole GPU')} "
                  "observed")
        return _Verdict("mig-mixed", ok, reason, _int_label(labels, GPU_COUNT), slices,
                        obs.slices)

    advertised = nv_gpu + shared
    sharing = labels.get(SHARING, "")
    if shared or (replicas or 1) > 1:
        mode = "mps" if sharing == "mps" else "time-slicing"
        name = f" {NVIDIA_SHARED}" if shared else ""
        if replicas is None:
            return _Verdict(mode, False,
                            f"k8s {advertised}{name} shared GPUs, replica count unknown (label "
                            f"{REPLICAS} not available) vs {seen} observed")
        if advertised % replicas:
            return _Verdict(mode, False,
                            f"k8s {advertised}{name} is not a multiple of {replicas} replicas "
                            f"({mode}); {seen} observed")
        physical = advertised // replicas
        ok = physical == seen
        reason = (f"k8s {advertised}{name} = {physical} × {replicas} replicas ({mode})"
                  + ("" if ok else f" vs {seen} observed"))
        return _Verdict(mode, ok, reason, physical)

    if nv_gpu and labels.get(MIG_STRATEGY) == "single" and (obs.slices or "-MIG-" in product):
        ok = nv_gpu == obs.slices
        reason = (f"k8s {_plural(nv_gpu, 'MIG device')} (MIG single strategy) "
                  f"{'=' if ok else 'vs'} {_plural(obs.slices, 'slice')} observed on "
                  f"{_plural(seen, 'GPU')}")
        if not obs.slices:
            reason += f" (product {product}: is the exporter MIG-aware?)"
        return _Verdict("mig-single", ok, reason, None, nv_gpu, obs.slices)

    if amd_parts:
        physical, parts = 0, []
        exact = True
        for name, count in sorted(amd_parts.items()):
            match = AMD_PARTITION.match(name)
            assert match is not None, "amd_parts holds only names AMD_PARTITION matched"
            mode_name = match.group(1)
            per_gpu = AMD_PARTITIONS_PER_GPU[mode_name]
            exact &= count % per_gpu == 0
            physical += count // per_gpu
            parts.append(f"{count} {name} = {count // per_gpu} × {per_gpu} "
                         f"{mode_name.upper()} partitions")
        physical += amd_gpu
        whole = f" + {amd_gpu} {AMD_GPU}" if amd_gpu else ""
        ok = exact and physical == seen
        reason = (f"k8s {'; '.join(parts)}{whole} (AMD partitions; the exporter reports "
                  f"partition 0 only) {'=' if ok else 'vs'} {seen} observed")
        if not exact:
            listed = ", ".join(f"{n} {k}" for k, n in sorted(amd_parts.items()))
            reason = f"k8s {listed} is not a whole number of GPUs' partitions; {seen} observed"
        return _Verdict("amd-partition", ok, reason, physical if exact else None)

    advertised = nv_gpu + amd_gpu
    ok = advertised == seen
    reason = f"k8s {advertised} {'=' if ok else 'vs'} {seen} observed"
    factor = advertised // seen if seen and advertised % seen == 0 else 0
    if not ok and amd_gpu and factor in AMD_PARTITIONS_PER_GPU.values():
        reason += (f" ({factor} per GPU: partitions advertised as {AMD_GPU}? the device "
                   "plugin's mixed naming tells)")
    elif not ok and nv_gpu and factor > 1 and seen > 1 and replicas is None:
        reason += f" ({factor} per GPU: time-slicing without the {REPLICAS} label?)"
    return _Verdict("whole", ok, reason, advertised)


def _iso(ts: dt.datetime | None) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%SZ") if ts else "never"


def _dra_published(view: NodeView) -> bool:
    """Does DRA speak for this node: GPUs in its slices, or a pool being rewritten?"""
    return view.dra is not None and (bool(view.dra.gpus) or not view.dra.complete)


def _dra_listing(dra: DraNode) -> str:
    """"8 GPUs through DRA (gpu.nvidia.com; NVIDIA H100 80GB HBM3, 80 GiB)", the node's model
    and memory from the slices' attributes (a DRA node may carry no feature-discovery labels)."""
    facts = [", ".join(dra.drivers)]
    models = dra.models()
    if models:
        facts.append(", ".join(models))
    memory = dra.memory_mib()
    if memory:
        facts.append(", ".join(f"{m / 1024:g} GiB" for m in memory))
    extra = f"; {_plural(dra.partitions, 'MIG/partition device')} are not GPUs" \
        if dra.partitions else ""
    return f"{_plural(len(dra.gpus), 'GPU')} through DRA ({'; '.join(facts)}{extra})"


def _few(keys: Iterable[str], limit: int = 3) -> str:
    items = sorted(keys)
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _dra_result(view: NodeView, obs: ObservedNode | None,
                base: dict[str, Any]) -> NodeResult:
    """A node DRA speaks for: flagged, unknown, or compared GPU by GPU."""
    dra = view.dra
    assert dra is not None
    by_driver: dict[str, int] = {}
    for gpu in dra.gpus:
        driver = "gpu.nvidia.com" if gpu.vendor == "nvidia" else "gpu.amd.com"
        by_driver[driver] = by_driver.get(driver, 0) + 1
    base = {**base, "k8s_gpus": view.gpus,
            "resources": dict(sorted({**view.capacity, **by_driver}.items()))}
    seen = f"{obs.gpus} observed" if obs is not None else "the hub has never seen the node"
    listing = _dra_listing(dra)
    if view.plugin_gpus:
        plugin = ", ".join(f"{n} {k}" for k, n in sorted(view.capacity.items()) if n)
        return NodeResult(status=DEVICE_PLUGIN_AND_DRA, mode="dra+device-plugin", **base,
                          reason=f"k8s advertises {plugin} (device plugin) and {listing}: a GPU "
                                 f"is published one way, so neither count can be trusted; "
                                 f"{seen}")
    if not dra.complete:
        pools = "; ".join(f"pool {p.driver}/{p.pool} generation {p.generation}: "
                          f"{p.slices_seen} of {p.slices_expected} slices"
                          for p in dra.incomplete_pools)
        return NodeResult(status=UNKNOWN, mode="dra", **base,
                          reason=f"GPU count unknown: {pools} (the driver is rewriting the "
                                 f"pool; run reconcile again); {seen}")
    expected = len(dra.gpus)
    if obs is None:
        return NodeResult(status=MISSING_IN_METRICS, mode="dra", **base, expected_gpus=expected,
                          reason=f"k8s publishes {listing}; the hub has never seen the node")
    if obs.state != ACTIVE:
        return NodeResult(status=NODE_NOT_REPORTING, mode="dra", **base,
                          expected_gpus=expected,
                          reason=f"k8s publishes {listing}; no GPU sample since "
                                 f"{_iso(obs.last_sample_at)} (stale in the inventory)")
    published = {g.key for g in dra.gpus if g.vendor == "nvidia"}
    amd = {g.key for g in dra.gpus if g.vendor == "amd"}
    k8s_only: set[str] = set()
    hub_only: set[str] = set()
    joined = []
    if published and obs.uuids:
        k8s_only |= published - obs.uuids
        hub_only |= {u for u in obs.uuids if u.startswith("GPU-")} - published
        joined.append("UUID")
    if amd and obs.pci_bus_ids:
        k8s_only |= amd - obs.pci_bus_ids
        hub_only |= obs.pci_bus_ids - amd
        joined.append("PCI bus id")
    ok = expected == obs.gpus and not k8s_only and not hub_only
    reason = f"k8s publishes {listing} {'=' if ok else 'vs'} {obs.gpus} observed"
    if ok and joined:
        reason += f" (every GPU joined by {' and '.join(joined)})"
    if k8s_only:
        reason += f"; in ResourceSlices only: {_few(k8s_only)}"
    if hub_only:
        reason += f"; in metrics only: {_few(hub_only)}"
    return NodeResult(status=MATCH if ok else COUNT_MISMATCH, mode="dra", **base,
                      expected_gpus=expected, reason=reason)


def _node_result(cluster: str, view: NodeView | None, obs: ObservedNode | None,
                 dra_visible: bool = True) -> NodeResult | None:
    either = view or obs
    assert either is not None, "_pair never pairs nothing with nothing"
    name = either.node
    metrics_node = obs.node if obs and view and obs.node != view.node else None
    resources = dict(sorted(view.capacity.items())) if view else {}
    advertised = view.gpus if view else 0
    allocatable = sum(view.allocatable.values()) if view and view.allocatable else None
    base: dict[str, Any] = {
        "cluster": cluster, "node": name, "k8s_gpus": advertised if view else None,
        "observed_gpus": obs.gpus if obs else None, "k8s_allocatable": allocatable,
        "resources": resources, "metrics_node": metrics_node}
    if view is not None and _dra_published(view):
        return _dra_result(view, obs, base)
    if not advertised:
        if obs is None:
            return None  # a node without GPUs, unknown to the hub: not a GPU node
        where = ("Kubernetes does not list the node" if view is None
                 else "Kubernetes advertises no GPU resources on it")
        if obs.state != ACTIVE or not obs.gpus:
            return NodeResult(status=MATCH, mode="none", **base,
                              reason=f"retired: {where}, and its metrics stopped "
                                     f"(last sample {_iso(obs.last_sample_at)})")
        if view is not None and not dra_visible:
            return NodeResult(status=UNKNOWN, mode="none", **base,
                              reason=f"hub sees {_plural(obs.gpus, 'GPU')}; kube-state-metrics "
                                     "shows no GPU resource on the node: a DRA node (its GPUs "
                                     "are in ResourceSlices, which kube-state-metrics does not "
                                     "export) or a device plugin that is not running; the hub "
                                     "cannot tell which: check with --source kube or "
                                     "--resourceslices-json")
        hint = ("; if it publishes its GPUs through DRA, reconcile with its ResourceSlices "
                "(--source kube, or --resourceslices-json CLUSTER=FILE), else its device "
                "plugin is not advertising them" if view is not None else "")
        return NodeResult(status=MISSING_IN_KUBERNETES, mode="none", **base,
                          reason=f"hub sees {_plural(obs.gpus, 'GPU')}; {where}{hint}")
    listing = ", ".join(f"{n} {k}" for k, n in resources.items() if n)
    if obs is None:
        return NodeResult(status=MISSING_IN_METRICS, mode="none", **base,
                          reason=f"k8s advertises {listing}; the hub has never seen the node")
    if obs.state != ACTIVE:
        return NodeResult(status=NODE_NOT_REPORTING, mode="none", **base,
                          reason=f"k8s advertises {listing}; no GPU sample since "
                                 f"{_iso(obs.last_sample_at)} (stale in the inventory)")
    assert view is not None, "advertised GPUs come from Kubernetes' view of the node"
    verdict = _judge(view, obs)
    reason = verdict.reason
    capacity = advertised
    if allocatable is not None and allocatable < capacity:
        reason += (f"; allocatable {allocatable} < capacity {capacity} (devices the device "
                   "plugin marks unhealthy)")
    return NodeResult(status=MATCH if verdict.ok else COUNT_MISMATCH, mode=verdict.mode,
                      **base, reason=reason, expected_gpus=verdict.expected_gpus,
                      k8s_slices=verdict.k8s_slices, observed_slices=verdict.observed_slices)


def _k8s_physical(view: NodeView) -> int | None:
    """Physical GPUs Kubernetes shows on the node, under the rule that applies (None: it
    advertises something whose physical count cannot be told, e.g. MIG single strategy)."""
    if _dra_published(view):
        assert view.dra is not None
        return len(view.dra.gpus) if view.dra.complete else None
    if not view.gpus:
        return 0
    return _judge(view, ObservedNode(view.cluster, view.node, ACTIVE, 0)).expected_gpus


class _TypeFields(TypedDict, total=False):
    """The NodeResult fields the instance type fills in."""

    instance_type: str | None
    provider_id: str | None
    expected_gpus: int


def _by_instance_type(result: NodeResult | None, cluster: str, view: NodeView | None,
                      obs: ObservedNode | None, catalog: Catalog | None,
                      dra_visible: bool) -> NodeResult | None:
    """The node's row with what its instance type says: ``instance_type``, ``expected_gpus``
    (the type's count) and, when GPUs of the type show neither in Kubernetes nor in the
    metrics, its own status. Unknown types and types without GPUs change nothing."""
    if view is None:
        return result
    entry = catalog.lookup(view.instance_type, view.labels) if catalog is not None else None
    by_type = catalog is None or entry is None or catalog.get(view.instance_type) is entry
    named = view.instance_type if by_type or entry is None else entry.name
    extra: _TypeFields = {"instance_type": named, "provider_id": view.provider_id}
    if entry is None or entry.gpus == 0:
        return replace(result, **extra) if result is not None else None
    extra["expected_gpus"] = entry.gpus
    metrics = obs.gpus if obs is not None and obs.state == ACTIVE else 0
    k8s = _k8s_physical(view)
    beyond = _beyond_type(entry, obs if metrics else None, k8s, metrics)
    if beyond is not None:
        where = "instance type" if by_type else "server model (label selector)"
        source = f" (per {entry.source})" if entry.source else ""
        reason = f"{where} {named} has {entry.describe()}{source}, yet {beyond}"
        reason += ": a wrong instance-type label, or a catalog entry to correct"
        if result is not None and result.status != MATCH:
            reason += f"; {result.reason}"
        if result is not None:
            return replace(result, status=INSTANCE_TYPE_MISMATCH, reason=reason, **extra)
        return NodeResult(cluster, view.node, INSTANCE_TYPE_MISMATCH, "none",
                          k8s_gpus=view.gpus, observed_gpus=obs.gpus if obs else None,
                          reason=reason,
                          resources=dict(sorted(view.capacity.items())), **extra)
    if metrics >= entry.gpus:  # the exporter shows them all: nothing to count on this side
        return replace(result, **extra) if result is not None else None
    k8s_shown = entry.gpus if k8s is None else k8s  # cannot tell: take Kubernetes' word
    lost = entry.gpus - max(k8s_shown, metrics)
    if lost <= 0:
        return replace(result, **extra) if result is not None else None
    where = "instance type" if by_type else "server model (label selector)"
    source = f"; per {entry.source}" if entry.source else ""
    shown = "none" if k8s_shown == 0 else str(k8s_shown)
    reason = (f"{where} {named} has {entry.describe()}{source}: Kubernetes shows {shown}, "
              f"the exporter {metrics or 'none'}: {_plural(lost, 'GPU')} lost (device plugin "
              "or driver not running, or GPUs fallen off the bus)")
    if k8s_shown == 0 and not dra_visible:
        reason += ("; kube-state-metrics cannot show GPUs published through DRA, yet no "
                   "exporter reports them either")
    if result is not None:
        reason += f"; {result.reason}"
        return replace(result, status=GPUS_MISSING_BY_INSTANCE_TYPE, reason=reason, **extra)
    resources = dict(sorted(view.capacity.items()))
    return NodeResult(cluster, view.node, GPUS_MISSING_BY_INSTANCE_TYPE, "none",
                      k8s_gpus=view.gpus, observed_gpus=obs.gpus if obs else None,
                      reason=reason, resources=resources,
                      metrics_node=obs.node if obs and obs.node != view.node else None,
                      **extra)


#: words of a model name that say the vendor or brand, not which GPU it is
_BRAND_WORDS = frozenset({"nvidia", "amd", "tesla", "instinct", "radeon", "geforce", "quadro"})


def model_family(model: str | None) -> str | None:
    """The word of a model name that says which GPU it is, lower-cased: "h100" of "NVIDIA
    H100 80GB HBM3", "mi300x" of "AMD Instinct MI300X OAM", "l4" (not "l40s") of "NVIDIA L4":
    the catalog and the exporter spell the rest (form factor, memory) each their own way."""
    for word in re.split(r"[^0-9a-z]+", (model or "").lower()):
        if word and word not in _BRAND_WORDS:
            return word
    return None


def _beyond_type(entry: InstanceType, obs: ObservedNode | None, k8s: int | None,
                 metrics: int) -> str | None:
    """What the node shows beyond its catalog entry (more GPUs than the type has, or GPUs of
    another model), in words; None when nothing."""
    found = []
    if metrics > entry.gpus:
        found.append(f"the exporter reports {metrics}")
    if k8s is not None and k8s > entry.gpus:
        found.append(f"Kubernetes advertises {k8s}")
    want = model_family(entry.model)
    others = sorted(m for m in (obs.models if obs is not None else ())
                    if want is not None and model_family(m) not in (None, want))
    if others:
        found.append(f"its GPUs report {', '.join(others)}")
    return "; ".join(found) if found else None


def _managed(mc: ManagedCluster | None) -> str:
    if mc is None:
        return "ACM ManagedCluster"
    return "ACM ManagedCluster" + (f", Available={mc.available}" if mc.available else "")


def _short(name: str) -> str:
    return name.lower().split(".", 1)[0]


def _pair(views: Sequence[NodeView], observed: Sequence[ObservedNode]
          ) -> list[tuple[NodeView | None, ObservedNode | None]]:
    """Match nodes by name: exact, then case-insensitive, then by unique short host name
    (an exporter's Hostname may be the FQDN of a node Kubernetes names by its short name)."""
    pairs: list[tuple[NodeView | None, ObservedNode | None]] = []
    left = {v.node: v for v in views}
    right = {o.node: o for o in observed}
    for name in sorted(set(left) & set(right)):
        pairs.append((left.pop(name), right.pop(name)))
    for key in (str.lower, _short):
        lk: dict[str, list[str]] = {}
        rk: dict[str, list[str]] = {}
        for name in left:
            lk.setdefault(key(name), []).append(name)
        for name in right:
            rk.setdefault(key(name), []).append(name)
        for k in sorted(set(lk) & set(rk)):
            if len(lk[k]) == 1 and len(rk[k]) == 1:
                pairs.append((left.pop(lk[k][0]), right.pop(rk[k][0])))
    pairs += [(v, None) for v in left.values()]
    pairs += [(None, o) for o in right.values()]
    return pairs


def compare(views: Iterable[NodeView], observed: Iterable[ObservedNode], *,
            covered: Iterable[str], fleet_wide: bool = False,
            managed: Sequence[ManagedCluster] | None = None,
            dra_visible: bool | None = None,
            catalog: Catalog | None = None) -> Reconciliation:
    """Every node's status, and every cluster's, from the two views.

    ``covered`` are the clusters the Kubernetes source speaks for (a cluster it lists with no
    GPU node is covered too). ``fleet_wide`` says the source should cover every cluster (the
    hub's kube-state-metrics): an inventory cluster it lacks is then a finding, while a
    ``--context`` or ``--nodes-json`` source simply did not look at it. ``managed`` is the ACM
    ManagedCluster list when it was read: the clusters that should be reporting.
    ``dra_visible`` says the source can see ResourceSlices (default: every source but the
    fleet-wide kube-state-metrics one). ``catalog`` says how many GPUs each instance type
    has (hub.kube's catalog; None: instance types are not read).
    """
    if dra_visible is None:
        dra_visible = not fleet_wide
    by_cluster: dict[str, list[NodeView]] = {}
    for v in views:
        by_cluster.setdefault(v.cluster, []).append(v)
    seen: dict[str, list[ObservedNode]] = {}
    for o in observed:
        seen.setdefault(o.cluster, []).append(o)
    covered = set(covered) | set(by_cluster)
    nodes: list[NodeResult] = []
    for cluster in sorted(covered):
        for view, obs in _pair(by_cluster.get(cluster, []), seen.get(cluster, [])):
            result = _by_instance_type(_node_result(cluster, view, obs, dra_visible), cluster,
                                       view, obs, catalog, dra_visible)
            if result is not None and view is not None and view.unschedulable is not None:
                result = replace(result, unschedulable=view.unschedulable)
            if result is not None:
                nodes.append(result)
    nodes.sort(key=lambda r: (r.cluster, r.node))

    managed_by = {m.name: m for m in managed or []}
    clusters: list[ClusterResult] = []
    for cluster in sorted(covered | set(seen) | set(managed_by)):
        views_here = by_cluster.get(cluster, [])
        obs_here = seen.get(cluster, [])
        active = [o for o in obs_here if o.state == ACTIVE and o.gpus]
        gpu_views = [v for v in views_here if v.gpus]
        mc = managed_by.get(cluster)
        tag = f" ({_managed(mc)})" if mc else ""
        common: dict[str, Any] = {
            "managed": (cluster in managed_by) if managed is not None else None,
            "available": mc.available if mc else None,
            "observed_nodes": len(active), "observed_gpus": sum(o.gpus for o in active)}
        if cluster in covered:
            k8s: dict[str, Any] = {"k8s_gpu_nodes": len(gpu_views),
                                   "k8s_gpus": sum(v.gpus for v in gpu_views)}
            bad = [r for r in nodes if r.cluster == cluster and r.status not in NODE_PASSING]
            if not gpu_views and not active and not bad:
                status, reason = CLUSTER_NO_GPUS, "no GPU nodes in Kubernetes, no GPU metrics"
            elif gpu_views and not obs_here:
                status = CLUSTER_NO_GPU_METRICS
                reason = (f"k8s advertises {_plural(k8s['k8s_gpus'], 'GPU')} on "
                          f"{_plural(len(gpu_views), 'node')}; the hub has no GPU metrics from "
                          f"this cluster{tag}")
            elif gpu_views and not active:
                last = max((o.last_sample_at for o in obs_here if o.last_sample_at),
                           default=None)
                status = CLUSTER_NOT_REPORTING
                reason = f"GPU metrics stopped: last sample {_iso(last)}{tag}"
            elif bad:
                status = CLUSTER_MISMATCH
                total = sum(1 for r in nodes if r.cluster == cluster)
                reason = f"{len(bad)} of {_plural(total, 'GPU node')} differ"
            else:
                unknown = sum(1 for r in nodes if r.cluster == cluster and r.status == UNKNOWN)
                status, reason = CLUSTER_OK, "every GPU node matches"
                if unknown:
                    reason = (f"every GPU node that can be checked matches; "
                              f"{_plural(unknown, 'node')} unknown")
            clusters.append(ClusterResult(cluster, status, reason, **common, **k8s))
        elif obs_here and fleet_wide:
            clusters.append(ClusterResult(
                cluster, CLUSTER_NO_KUBERNETES_DATA,
                "the hub has GPU metrics but no kube-state-metrics node data from this "
                f"cluster{tag}: its counts cannot be checked", **common))
        elif obs_here:
            clusters.append(ClusterResult(cluster, CLUSTER_NOT_CHECKED,
                                          "not among the clusters this run looked at", **common))
        else:
            clusters.append(ClusterResult(
                cluster, CLUSTER_SILENT,
                f"{_managed(mc)} with no GPU metrics in the hub and no node data from the "
                "chosen source", **common))
    return Reconciliation(nodes, clusters)


def resources_json(resources: Mapping[str, int]) -> str:
    return json.dumps(dict(sorted(resources.items())), separators=(",", ":"))
