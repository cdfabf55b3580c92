"""The pure compare and the three Kubernetes sources' parsers, with plain data.

Node objects here look like the API's (``node_object``), and the time-sliced ones carry the real
GPU feature discovery labels of four VMware vGPU nodes (tests/fixtures/samples).
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from hub.common import InputError
from hub.validate import _reconcile as rc
from hub.validate._reconcile import ManagedCluster, NodeView, ObservedNode
from tests.support.nodes import node_object, nvidia_labels, time_sliced, vks_label_sets

T0 = dt.datetime(2026, 11, 28, 12, 0, 0)



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
    assert "Kubernetes advertises no GPU resources on it; if it publishes its GPUs through DRA" \
        in results["zero"].reason
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
    assert queries[0].count("max by (cluster, node, resource)") == 3
    assert "kube_node_spec_unschedulable" in queries[0]  # the cordon, same request
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
