"""The pure compare and the three Kubernetes sources' parsers, with plain data.

Node objects here look like the API's (``node_object``), and the time-sliced ones carry the real
GPU feature discovery labels of four VMware vGPU nodes (shared/samples).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from hub.common._errors import InputError
from hub.validate import _reconcile as rc
from hub.validate._reconcile import ManagedCluster, NodeView, ObservedNode

SAMPLES = Path(__file__).resolve().parents[1].parent / "shared" / "samples"
T0 = dt.datetime(2026, 11, 28, 12, 0, 0)


# -- realistic node objects (shared with the end-to-end tests) -----------------------------------
def vks_label_sets() -> list[dict[str, str]]:
    """The four label sets of node-gpu-labels-vks-grid-a100-vgpu.json (concatenated objects)."""
    text = (SAMPLES / "node-gpu-labels-vks-grid-a100-vgpu.json").read_text()
    decoder, pos, out = json.JSONDecoder(), 0, []
    while pos < len(text):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            break
        obj, pos = decoder.raw_decode(text, pos)
        out.append(obj)
    return out


def node_object(name: str, gpu: dict[str, str] | None = None, labels: dict[str, str] | None = None,
                allocatable: dict[str, str] | None = None, instance: str = "p4d.24xlarge"
                ) -> dict[str, Any]:
    """A Node as the API server returns it: capacity and allocatable with cpu, memory, pods and
    extended resources; labels; conditions; node info."""
    gpu = gpu or {}
    capacity = {"cpu": "96", "ephemeral-storage": "104845292Ki", "hugepages-1Gi": "0",
                "hugepages-2Mi": "0", "memory": "1176414928Ki", "pods": "110", **gpu}
    alloc = {"cpu": "95690m", "ephemeral-storage": "95551679124", "hugepages-1Gi": "0",
             "hugepages-2Mi": "0", "memory": "1175398096Ki", "pods": "110",
             **(gpu if allocatable is None else allocatable)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
                       "kubernetes.io/os": "linux",
                       "node.kubernetes.io/instance-type": instance, **(labels or {})},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {"providerID": f"aws:///us-east-1a/i-{zlib.crc32(name.encode()):012x}"},
        "status": {
            "capacity": capacity, "allocatable": alloc,
            "conditions": [
                {"type": "MemoryPressure", "status": "False",
                 "reason": "KubeletHasSufficientMemory",
                 "lastHeartbeatTime": "2026-11-28T11:59:00Z",
                 "lastTransitionTime": "2026-11-01T08:00:00Z"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "lastHeartbeatTime": "2026-11-28T11:59:00Z",
                 "lastTransitionTime": "2026-11-01T08:00:00Z"},
            ],
            "addresses": [{"type": "InternalIP", "address": "10.0.171.111"},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"architecture": "amd64", "bootID": "5d0c9b6e-0c1e-4f9e-9a57-3c2b8e6a0f11",
                         "machineID": "ec2b5a3c1e0f4a7d9b6e2f8c0d1a3b5e",
                         "systemUUID": "ec2b5a3c-1e0f-4a7d-9b6e-2f8c0d1a3b5e",
                         "containerRuntimeVersion": "containerd://1.7.22",
                         "kernelVersion": "6.1.112-124.190.amzn2023.x86_64",
                         "kubeProxyVersion": "v1.30.4", "kubeletVersion": "v1.30.4",
                         "operatingSystem": "linux", "osImage": "Amazon Linux 2023"},
        },
    }


def nvidia_labels(product: str, count: int, **extra: str) -> dict[str, str]:
    return {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.count": str(count), "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/mig.capable": "false",
            "nvidia.com/mig.strategy": "single", "nvidia.com/gpu.memory": "81559", **extra}


def time_sliced(labels: dict[str, str], replicas: int) -> dict[str, str]:
    """A vks label set as the GPU operator relabels it when time-slicing is configured."""
    out = dict(labels)
    out["nvidia.com/gpu.replicas"] = str(replicas)
    out["nvidia.com/gpu.sharing-strategy"] = "time-slicing"
    out["nvidia.com/gpu.product"] = labels["nvidia.com/gpu.product"] + "-SHARED"
    return out


def view(obj: dict[str, Any], cluster: str = "c1") -> NodeView:
    return rc.node_from_object(cluster, obj)


def seen(node: str, gpus: int, cluster: str = "c1", state: str = "active", slices: int = 0,
         mig_gpus: int = 0) -> ObservedNode:
    return ObservedNode(cluster, node, state, gpus, slices, mig_gpus, "nvidia", T0)


def one(views: list[NodeView], observed: list[ObservedNode], **kw: Any) -> rc.NodeResult:
    [result] = rc.compare(views, observed, covered={"c1"}, **kw).nodes
    return result


# -- the real label set ------------------------------------------------------------------------
def test_the_vks_sample_is_four_label_sets():
    sets = vks_label_sets()
    assert len(sets) == 4
    assert {s["nvidia.com/gpu.product"] for s in sets} == {"GRID-A100-40C", "GRID-A100-4C"}
    assert all(s["nvidia.com/mig.strategy"] == "single" and s["nvidia.com/gpu.replicas"] == "1"
               for s in sets)


def test_vgpu_nodes_with_single_strategy_label_but_no_mig_are_whole_gpus():
    labels = vks_label_sets()[0]
    r = one([view(node_object("vks-0", {"nvidia.com/gpu": "1"}, labels))], [seen("vks-0", 1)])
    assert (r.status, r.mode, r.reason) == ("match", "whole", "k8s 1 = 1 observed")


# -- time-slicing ------------------------------------------------------------------------------
def test_time_slicing_multiplies_the_advertised_count():
    labels = time_sliced(vks_label_sets()[1], 10)
    node = node_object("gpu-ts", {"nvidia.com/gpu": "80"}, labels)
    r = one([view(node)], [seen("gpu-ts", 7)])
    assert r.status == "count_mismatch" and r.mode == "time-slicing"
    assert r.reason == "k8s 80 = 8 × 10 replicas (time-slicing) vs 7 observed"
    assert (r.k8s_gpus, r.expected_gpus, r.observed_gpus) == (80, 8, 7)
    ok = one([view(node)], [seen("gpu-ts", 8)])
    assert (ok.status, ok.reason) == ("match", "k8s 80 = 8 × 10 replicas (time-slicing)")


def test_time_slicing_renamed_resource_and_mps():
    labels = time_sliced(vks_label_sets()[2], 4)
    shared = node_object("gpu-sh", {"nvidia.com/gpu.shared": "4"}, labels)
    r = one([view(shared)], [seen("gpu-sh", 1)])
    assert r.status == "match" and "nvidia.com/gpu.shared = 1 × 4 replicas" in r.reason
    mps = dict(labels, **{"nvidia.com/gpu.sharing-strategy": "mps"})
    r = one([view(node_object("gpu-mps", {"nvidia.com/gpu": "8"}, mps))], [seen("gpu-mps", 2)])
    assert (r.status, r.mode) == ("match", "mps")


def test_time_slicing_that_cannot_be_checked_says_why():
    r = one([NodeView("c1", "n", {"nvidia.com/gpu.shared": 40})], [seen("n", 4)])
    assert r.status == "count_mismatch" and "nvidia.com/gpu.replicas not available" in r.reason
    labels = time_sliced(vks_label_sets()[1], 10)
    r = one([view(node_object("n", {"nvidia.com/gpu": "78"}, labels))], [seen("n", 8)])
    assert r.status == "count_mismatch" and "not a multiple of 10 replicas" in r.reason
    # without the label (kube-state-metrics without its allowlist) the factor is only a hint
    r = one([NodeView("c1", "n", {"nvidia.com/gpu": 80})], [seen("n", 8)])
    assert r.status == "count_mismatch" and "10 per GPU: time-slicing without" in r.reason


# -- MIG -----------------------------------------------------------------------------------------
MIXED = {"nvidia.com/gpu": "1", "nvidia.com/mig-3g.40gb": "1", "nvidia.com/mig-2g.20gb": "1",
         "nvidia.com/mig-1g.10gb": "1"}


def test_mig_mixed_strategy_compares_slices_and_whole_gpus():
    labels = nvidia_labels("NVIDIA-A100-SXM4-80GB", 2, **{"nvidia.com/mig.strategy": "mixed",
                                                          "nvidia.com/mig.capable": "true"})
    node = view(node_object("gpu-node-a1", MIXED, labels))
    r = one([node], [seen("gpu-node-a1", 2, slices=3, mig_gpus=1)])
    assert (r.status, r.mode, r.k8s_gpus, r.observed_gpus) == ("match", "mig-mixed", 4, 2)
    assert (r.k8s_slices, r.observed_slices, r.expected_gpus) == (3, 3, 2)
    assert "1× mig-1g.10gb" in r.reason and "3 slices on 1 GPU + 1 whole GPU observed" in r.reason
    r = one([node], [seen("gpu-node-a1", 2, slices=2, mig_gpus=1)])
    assert r.status == "count_mismatch" and " vs 2 slices" in r.reason


def test_mig_single_strategy_counts_mig_devices():
    labels = nvidia_labels("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", 4)
    node = view(node_object("mig-single", {"nvidia.com/gpu": "4"}, labels))
    r = one([node], [seen("mig-single", 2, slices=4, mig_gpus=2)])
    assert (r.status, r.mode, r.k8s_slices, r.observed_slices) == ("match", "mig-single", 4, 4)
    assert r.reason == "k8s 4 MIG devices (MIG single strategy) = 4 slices observed on 2 GPUs"
    r = one([node], [seen("mig-single", 2)])
    assert r.status == "count_mismatch" and "is the exporter MIG-aware?" in r.reason


# -- AMD partitions ------------------------------------------------------------------------------
def test_amd_partitions_count_per_physical_gpu():
    labels = {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM", "amd.com/gpu.vram": "192G"}
    node = view(node_object("amd-node-1", {"amd.com/cpx_nps4": "16"}, labels))
    r = one([node], [seen("amd-node-1", 2)])
    assert (r.status, r.mode, r.expected_gpus) == ("match", "amd-partition", 2)
    assert "16 amd.com/cpx_nps4 = 2 × 8 CPX partitions" in r.reason
    r = one([node], [seen("amd-node-1", 1)])
    assert r.status == "count_mismatch" and r.reason.endswith("vs 1 observed")
    r = one([view(node_object("a", {"amd.com/dpx_nps2": "3"}))], [seen("a", 1)])
    assert r.status == "count_mismatch" and "not a whole number" in r.reason
    # partitions advertised under the plain name: a hint, not a silent match
    r = one([view(node_object("b", {"amd.com/gpu": "64"}))], [seen("b", 8)])
    assert r.status == "count_mismatch" and "partitions advertised as amd.com/gpu" in r.reason


# -- presence --------------------------------------------------------------------------------------
def test_every_presence_case_gets_exactly_one_status():
    views = [
        view(node_object("both", {"nvidia.com/gpu": "8"})),
        view(node_object("k8s-only", {"nvidia.com/gpu": "8"})),
        view(node_object("stale", {"nvidia.com/gpu": "8"})),
        view(node_object("zero", {"nvidia.com/gpu": "0"})),
        view(node_object("cpu-only")),
    ]
    observed = [seen("both", 8), seen("stale", 8, state="stale"), seen("zero", 4),
                seen("hub-only", 2), seen("retired", 8, state="stale")]
    results = {r.node: r for r in rc.compare(views, observed, covered={"c1"}).nodes}
    assert {n: r.status for n, r in results.items()} == {
        "both": "match", "k8s-only": "missing_in_metrics", "stale": "node_not_reporting",
        "zero": "missing_in_kubernetes", "hub-only": "missing_in_kubernetes",
        "retired": "match"}
    assert results["hub-only"].reason == "hub sees 2 GPUs; Kubernetes does not list the node"
    assert results["zero"].reason.endswith("Kubernetes advertises no GPU resources on it")
    assert results["k8s-only"].reason == ("k8s advertises 8 nvidia.com/gpu; the hub has never "
                                          "seen the node")
    assert "no GPU sample since 2026-11-28T12:00:00Z" in results["stale"].reason
    assert results["retired"].reason.startswith("retired:")
    assert (results["k8s-only"].observed_gpus, results["hub-only"].k8s_gpus) == (None, None)


def test_allocatable_below_capacity_is_noted_not_failed():
    node = view(node_object("n", {"nvidia.com/gpu": "8"}, allocatable={"nvidia.com/gpu": "6"}))
    r = one([node], [seen("n", 8)])
    assert r.status == "match" and r.k8s_allocatable == 6
    assert "allocatable 6 < capacity 8" in r.reason


def test_names_match_case_insensitively_and_by_short_host_name():
    views = [view(node_object("ip-10-0-1-5")), view(node_object("GPU-B"))]
    views = [NodeView("c1", v.node, {"nvidia.com/gpu": 1}) for v in views]
    observed = [seen("ip-10-0-1-5.ec2.internal", 1), seen("gpu-b", 1)]
    results = rc.compare(views, observed, covered={"c1"}).nodes
    assert [(r.node, r.status, r.metrics_node) for r in results] == [
        ("GPU-B", "match", "gpu-b"), ("ip-10-0-1-5", "match", "ip-10-0-1-5.ec2.internal")]


# -- clusters --------------------------------------------------------------------------------------
def test_cluster_statuses_and_the_expected_set():
    views = [NodeView("quiet", "q1", {"nvidia.com/gpu": 8}),
             NodeView("good", "g1", {"nvidia.com/gpu": 8}),
             NodeView("dead", "d1", {"nvidia.com/gpu": 8}),
             NodeView("cpu", "c1", {})]
    observed = [seen("g1", 8, cluster="good"), seen("d1", 8, cluster="dead", state="stale"),
                seen("x1", 2, cluster="elsewhere")]
    managed = [ManagedCluster("quiet", "True"), ManagedCluster("good", "True"),
               ManagedCluster("cpu", "True"), ManagedCluster("ghost", "False")]
    rec = rc.compare(views, observed, covered={"quiet", "good", "dead", "cpu"},
                     managed=managed)
    clusters = {c.cluster: c for c in rec.clusters}
    assert {n: c.status for n, c in clusters.items()} == {
        "quiet": "no_gpu_metrics", "good": "ok", "dead": "not_reporting", "cpu": "no_gpus",
        "elsewhere": "not_checked", "ghost": "silent"}
    assert clusters["quiet"].reason == ("k8s advertises 8 GPUs on 1 node; the hub has no GPU "
                                        "metrics from this cluster (ACM ManagedCluster, "
                                        "Available=True)")
    assert clusters["ghost"].reason.startswith("ACM ManagedCluster, Available=False with no")
    assert {n for n, c in clusters.items() if c.expected} == {"quiet", "good", "ghost"}
    assert clusters["dead"].managed is False and clusters["good"].managed is True
    assert rec.failed
    rows = rec.rows()
    assert [(r["scope"], r["cluster"], r["status"]) for r in rows if r["scope"] == "cluster"] \
        == [("cluster", "dead", "not_reporting"), ("cluster", "ghost", "silent"),
            ("cluster", "quiet", "no_gpu_metrics")]
    for row in rows:
        assert {"cluster", "node", "status", "k8s_gpus", "observed_gpus", "reason"} <= set(row)
    # a fleet-wide source (the hub) lacking a cluster the hub has metrics from says so
    fleet = rc.compare([], observed, covered=set(), fleet_wide=True)
    assert {c.cluster: c.status for c in fleet.clusters}["elsewhere"] == "no_kubernetes_data"
    assert all(c.managed is None for c in fleet.clusters)


def test_a_clean_run_does_not_fail():
    rec = rc.compare([NodeView("c1", "n", {"nvidia.com/gpu": 2})], [seen("n", 2)],
                     covered={"c1"})
    assert not rec.failed and [c.status for c in rec.clusters] == ["ok"]


# -- sources ---------------------------------------------------------------------------------------
def test_node_objects_keep_gpu_resources_and_labels_only():
    labels = time_sliced(vks_label_sets()[1], 4)
    v = view(node_object("n1", {"nvidia.com/gpu": "4"}, labels))
    assert v.capacity == {"nvidia.com/gpu": 4} and v.allocatable == {"nvidia.com/gpu": 4}
    assert v.labels["nvidia.com/gpu.replicas"] == "4"
    assert "kubernetes.io/hostname" not in v.labels and "vks.vmware.com/nodepool" not in v.labels


def test_kubectl_documents_and_their_errors():
    doc = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
           "items": [node_object("a", {"nvidia.com/gpu": "2"}), node_object("b")]}
    assert [v.node for v in rc.nodes_from_document("c", doc, "f")] == ["a", "b"]
    assert [v.node for v in rc.nodes_from_document("c", node_object("a"), "f")] == ["a"]
    with pytest.raises(InputError, match="not the output of `kubectl get nodes -o json`"):
        rc.nodes_from_document("c", [1, 2], "f")
    cm = {"kind": "List", "items": [{"kind": "ConfigMap", "metadata": {"name": "x"}}]}
    with pytest.raises(InputError, match="holds a ConfigMap"):
        rc.nodes_from_document("c", cm, "f")
    bad = copy.deepcopy(node_object("a", {"nvidia.com/gpu": "lots"}))
    with pytest.raises(InputError, match=r"node a nvidia\.com/gpu: quantity 'lots'"):
        rc.nodes_from_document("c", {"items": [bad]}, "f")


@pytest.mark.parametrize("sanitised, resource", [
    ("nvidia_com_gpu", "nvidia.com/gpu"),
    ("nvidia_com_gpu_shared", "nvidia.com/gpu.shared"),
    ("nvidia_com_mig_1g_10gb", "nvidia.com/mig-1g.10gb"),
    ("nvidia_com_mig_3g_40gb", "nvidia.com/mig-3g.40gb"),
    ("nvidia_com_mig_1g_10gb_me", "nvidia.com/mig-1g.10gb+me"),
    ("amd_com_gpu", "amd.com/gpu"),
    ("amd_com_cpx_nps4", "amd.com/cpx_nps4"),
    ("cpu", None), ("memory", None),
])
def test_kube_state_metrics_resource_names(sanitised, resource):
    assert rc.resource_from_ksm(sanitised) == resource


def test_kube_state_metrics_rows_become_node_views():
    def row(kind: str, node: str, resource: str, value: str, cluster: str = "east") -> dict:
        return {"metric": {"cluster": cluster, "node": node, "resource": resource, "kind": kind},
                "value": [1.0, value]}

    resources = [row("capacity", "g1", "nvidia_com_gpu", "8"),
                 row("allocatable", "g1", "nvidia_com_gpu", "7"),
                 row("capacity", "g1", "cpu", "96"),
                 row("capacity", "m1", "nvidia_com_mig_1g_10gb", "7"),
                 row("capacity", "cpu1", "cpu", "32"),
                 row("capacity", "w1", "cpu", "16", cluster="west"),
                 {"metric": {"node": "orphan", "resource": "cpu"}, "value": [1.0, "1"]}]
    labels = [{"metric": {"cluster": "east", "node": "g1",
                          "label_nvidia_com_gpu_replicas": "4",
                          "label_nvidia_com_mig_strategy": "single"}, "value": [1.0, "1"]}]
    views, covered = rc.nodes_from_ksm(resources, labels, "cluster")
    assert covered == {"east", "west"}
    by = {(v.cluster, v.node): v for v in views}
    assert by[("east", "g1")] == NodeView("east", "g1", {"nvidia.com/gpu": 8},
                                          {"nvidia.com/gpu": 7},
                                          {"nvidia.com/gpu.replicas": "4",
                                           "nvidia.com/mig.strategy": "single"})
    assert by[("east", "m1")].capacity == {"nvidia.com/mig-1g.10gb": 7}
    assert by[("east", "cpu1")].gpus == 0 and ("west", "w1") in by


def test_kube_state_metrics_queries_are_fixed_and_grouped():
    queries = rc.ksm_queries("10m", "cluster")
    assert len(queries) == 2
    assert queries[0].count("max by (cluster, node, resource)") == 2
    assert "kube_node_status_capacity" in queries[0]
    assert "kube_node_status_allocatable" in queries[0]
    assert "label_nvidia_com_gpu_replicas" in queries[1] and "kube_node_labels" in queries[1]
    assert rc.ksm_label("nvidia.com/gpu.sharing-strategy") == \
        "label_nvidia_com_gpu_sharing_strategy"


def test_managed_cluster_objects():
    obj = {"apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
           "metadata": {"name": "east"},
           "spec": {"hubAcceptsClient": True},
           "status": {"conditions": [
               {"type": "HubAcceptedManagedCluster", "status": "True"},
               {"type": "ManagedClusterConditionAvailable", "status": "Unknown"}]}}
    assert rc.managed_cluster(obj) == ManagedCluster("east", "Unknown")
    assert rc.managed_cluster({"metadata": {"name": "new"}}) == ManagedCluster("new", None)
