"""Reconcile of a mixed DRA / device-plugin cluster with plain data: exact per-node statuses,
identity joins (NVIDIA UUID, AMD PCI bus id), model and memory from slice attributes, the hub
source's unknown, and the file source's parsers."""

from __future__ import annotations

import datetime as dt

import pytest

from hub.common import InputError
from hub.validate import _reconcile as rc
from hub.validate._reconcile import ObservedNode
from tests.support import dra as fx
from tests.support.nodes import node_object, nvidia_labels

T0 = dt.datetime(2026, 11, 24, 12, 0, 0)
C = "mixed"


def uuids(node: str, n: int) -> frozenset[str]:
    return frozenset(fx.gpu_uuid(node, i) for i in range(n))


def seen(node: str, gpus: int, ids: frozenset[str] = frozenset(), *, slices: int = 0,
         mig_gpus: int = 0, pci: frozenset[str] = frozenset(), vendor: str = "nvidia",
         state: str = "active") -> ObservedNode:
    return ObservedNode(C, node, state, gpus, slices, mig_gpus, vendor, T0, ids, pci)


def views() -> list[rc.NodeView]:
    """Nodes as the API lists them (DRA nodes: no GPU resource, no GFD labels), slices beside."""
    nodes = [node_object(n) for n in (fx.DRA_H100, fx.DRA_MIG, fx.DRA_SILENT, fx.DRA_PARTIAL,
                                      fx.DRA_AMD, "cpu-0")]
    nodes.append(node_object(fx.BOTH, {"nvidia.com/gpu": "8"},
                             nvidia_labels("NVIDIA-H100-80GB-HBM3", 8)))
    nodes.append(node_object(fx.PLUGIN, {"nvidia.com/gpu": "8"},
                             nvidia_labels("NVIDIA-H100-80GB-HBM3", 8)))
    plain = [rc.node_from_object(C, n) for n in nodes]
    return rc.with_dra(plain, C, fx.dra_slices())


def observed() -> list[ObservedNode]:
    return [
        seen(fx.DRA_H100, 8, uuids(fx.DRA_H100, 8)),
        seen(fx.DRA_MIG, 2, uuids(fx.DRA_MIG, 2), slices=3, mig_gpus=2),
        seen(fx.DRA_PARTIAL, 4, uuids(fx.DRA_PARTIAL, 4)),
        seen(fx.DRA_AMD, 2, frozenset({"serial:A1", "serial:A2"}), pci=frozenset(fx.AMD_BUS),
             vendor="amd"),
        seen(fx.BOTH, 8, uuids(fx.BOTH, 8)),
        seen(fx.PLUGIN, 8, uuids(fx.PLUGIN, 8)),
    ]  # DRA_SILENT sends nothing


def by_node(result: rc.Reconciliation) -> dict[str, rc.NodeResult]:
    return {r.node: r for r in result.nodes}


def test_the_mixed_cluster_reconciles_exactly():
    result = rc.compare(views(), observed(), covered={C})
    rows = by_node(result)
    assert {n: (r.status, r.mode, r.k8s_gpus, r.expected_gpus, r.observed_gpus)
            for n, r in rows.items()} == {
        fx.DRA_H100: ("match", "dra", 8, 8, 8),
        fx.DRA_MIG: ("match", "dra", 2, 2, 2),
        fx.DRA_SILENT: ("missing_in_metrics", "dra", 4, 4, None),
        fx.DRA_PARTIAL: ("unknown", "dra", 4, None, 4),
        fx.DRA_AMD: ("match", "dra", 2, 2, 2),
        fx.BOTH: ("device_plugin_and_dra", "dra+device-plugin", 16, None, 8),
        fx.PLUGIN: ("match", "whole", 8, 8, 8),
    }
    assert rows[fx.DRA_H100].reason == (
        "k8s publishes 8 GPUs through DRA (gpu.nvidia.com; NVIDIA H100 80GB HBM3; 80 GiB) = 8 "
        "observed (every GPU joined by UUID)")
    assert rows[fx.DRA_H100].resources == {"gpu.nvidia.com": 8}
    assert "26 MIG/partition devices are not GPUs" in rows[fx.DRA_MIG].reason
    assert rows[fx.DRA_SILENT].reason == (
        "k8s publishes 4 GPUs through DRA (gpu.nvidia.com; NVIDIA H100 80GB HBM3; 80 GiB); "
        "the hub has never seen the node")
    assert rows[fx.DRA_PARTIAL].reason.startswith(
        f"GPU count unknown: pool gpu.nvidia.com/{fx.DRA_PARTIAL} generation 5: 1 of 2 slices")
    assert "(every GPU joined by PCI bus id)" in rows[fx.DRA_AMD].reason
    assert "AMD Instinct MI300X; 192 GiB" in rows[fx.DRA_AMD].reason
    assert rows[fx.BOTH].reason.startswith(
        "k8s advertises 8 nvidia.com/gpu (device plugin) and 8 GPUs through DRA")
    assert rows[fx.BOTH].resources == {"gpu.nvidia.com": 8, "nvidia.com/gpu": 8}
    [cluster] = result.clusters
    assert (cluster.status, cluster.k8s_gpu_nodes, cluster.k8s_gpus) == ("mismatch", 7, 44)
    assert cluster.reason == "2 of 7 GPU nodes differ"  # silent + both; unknown is not a fault
    assert result.failed


def test_unknown_alone_does_not_fail_the_run():
    vs = [v for v in views() if v.node in (fx.DRA_H100, fx.DRA_PARTIAL)]
    obs = [o for o in observed() if o.node in (fx.DRA_H100, fx.DRA_PARTIAL)]
    result = rc.compare(vs, obs, covered={C})
    assert not result.failed
    assert result.clusters[0].reason == \
        "every GPU node that can be checked matches; 1 node unknown"


def test_the_same_count_of_other_gpus_is_a_mismatch_naming_them():
    stranger = "GPU-00000000-0000-0000-0000-00000000beef"
    ids = (uuids(fx.DRA_H100, 8) - {fx.gpu_uuid(fx.DRA_H100, 7)}) | {stranger}
    [row] = [r for r in rc.compare(views(), [seen(fx.DRA_H100, 8, ids)], covered={C}).nodes
             if r.node == fx.DRA_H100]
    assert row.status == "count_mismatch"
    assert row.reason.endswith(f"in ResourceSlices only: {fx.gpu_uuid(fx.DRA_H100, 7)}; "
                               f"in metrics only: {stranger}")


def test_a_gpu_gone_from_the_metrics_is_a_count_mismatch():
    ids = uuids(fx.DRA_H100, 7)
    [row] = [r for r in rc.compare(views(), [seen(fx.DRA_H100, 7, ids)], covered={C}).nodes
             if r.node == fx.DRA_H100]
    assert row.status == "count_mismatch" and " vs 7 observed" in row.reason


def test_a_stale_dra_node_is_not_reporting():
    obs = [seen(fx.DRA_H100, 8, uuids(fx.DRA_H100, 8), state="stale")]
    rows = by_node(rc.compare(views(), obs, covered={C}))
    assert rows[fx.DRA_H100].status == "node_not_reporting"


def test_without_slices_a_dra_node_was_a_false_missing_in_kubernetes():
    """The issue's report: before, every DRA node of a fleet was a false alarm."""
    plain = [v for v in views() if v.node == fx.DRA_H100]
    bare = [rc.NodeView(v.cluster, v.node, v.capacity, v.allocatable, v.labels) for v in plain]
    obs = [seen(fx.DRA_H100, 8, uuids(fx.DRA_H100, 8))]
    missing = by_node(rc.compare(bare, obs, covered={C}))[fx.DRA_H100]
    assert missing.status == "missing_in_kubernetes"
    # and now it says where to look: the node may publish its GPUs through DRA
    assert "if it publishes its GPUs through DRA, reconcile with its ResourceSlices" in \
        missing.reason and "--resourceslices-json" in missing.reason
    assert by_node(rc.compare(plain, obs, covered={C}))[fx.DRA_H100].status == "match"


def test_the_hub_source_marks_dra_nodes_unknown_not_missing():
    ksm_rows = [{"metric": {"cluster": C, "node": fx.DRA_H100, "resource": "cpu",
                            "kind": "capacity"}, "value": [0, "96"]},
                {"metric": {"cluster": C, "node": fx.PLUGIN, "resource": "nvidia_com_gpu",
                            "kind": "capacity"}, "value": [0, "8"]}]
    vs, covered = rc.nodes_from_ksm(ksm_rows, [], "cluster")
    obs = [seen(fx.DRA_H100, 8, uuids(fx.DRA_H100, 8)), seen(fx.PLUGIN, 8),
           seen("gone-node", 2)]
    result = rc.compare(vs, obs, covered=covered, fleet_wide=True)
    rows = by_node(result)
    assert rows[fx.DRA_H100].status == "unknown"
    assert "kube-state-metrics does not export" in rows[fx.DRA_H100].reason
    assert rows[fx.PLUGIN].status == "match"
    assert rows["gone-node"].status == "missing_in_kubernetes"  # not listed at all


def test_a_dra_node_missing_from_the_node_list_still_has_a_row():
    vs = rc.with_dra([], C, fx.dra_slices())
    assert {v.node for v in vs} == {fx.DRA_H100, fx.DRA_MIG, fx.DRA_SILENT, fx.DRA_PARTIAL,
                                    fx.DRA_AMD, fx.BOTH}
    assert all(v.capacity == {} for v in vs)


def test_a_dra_only_cluster_is_something_to_compare():
    assert rc.nothing_to_compare(views(), "kube", "ctx") is None


def test_slices_from_a_kubectl_document():
    items = fx.dra_slices()
    assert rc.slices_from_document({"kind": "List", "items": items}, "f") == items
    assert rc.slices_from_document(items[0], "f") == [items[0]]
    with pytest.raises(InputError, match="f is not the output of `kubectl get"):
        rc.slices_from_document([1, 2], "f")
    with pytest.raises(InputError, match="--resourceslices-json c: ResourceSlice x has no spec"):
        rc.with_dra([], C, [{"metadata": {"name": "x"}}], "--resourceslices-json c")


def test_claims_are_joined_through_the_views_slices():
    got = rc.claim_allocations_of(views(), C, fx.dra_claims())
    assert sorted({(a.node, a.pod) for a in got}) == [
        (fx.DRA_MIG, "notebook"), (fx.DRA_H100, "legacy-0"), (fx.DRA_H100, "trainer-0")]
    with pytest.raises(InputError, match="cluster mixed: a ResourceClaim that is not an object"):
        rc.claim_allocations_of(views(), C, ["nope"])
