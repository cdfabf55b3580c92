"""Vendor facts the usage ledger relies on: who uses a GPU, and how much of a GPU a slice is."""

from __future__ import annotations

import pytest

from hub import store
from tests.test_normalize import build, row


@pytest.mark.parametrize(("labels", "expected"), [
    # honorLabels false: target labels are the exporter's, the workload's are exported_*
    ({"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-7xk2p",
      "exported_namespace": "ml", "exported_pod": "train-0", "exported_container": "torch"},
     ("ml", "train-0", "torch")),
    # the same, on an idle GPU: only the exporter's target labels -> unallocated
    ({"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-7xk2p",
      "container": "nvidia-dcgm-exporter"}, None),
    ({"namespace": "kube-amd-gpu", "pod": "amd-device-metrics-exporter-q8v2n"}, None),
    ({"namespace": "gpufleet", "pod": "gpufleet-exporter-abcde"}, None),
    ({"namespace": "monitoring", "pod": "dcgm-exporter-5d9f8"}, None),
    # honorLabels true or a direct scrape: pod labels are the workload's
    ({"namespace": "ml", "pod": "train-0", "container": "torch"}, ("ml", "train-0", "torch")),
    # a workload merely named like an exporter is still a user when exported_pod says so
    ({"pod": "nvidia-dcgm-exporter-x", "exported_pod": "dcgm-exporter-tests",
      "exported_namespace": "qa"}, ("qa", "dcgm-exporter-tests", "")),
    ({}, None),
])
def test_the_exporter_pod_is_never_a_gpu_user(labels, expected):
    assert store.allocation(labels) == expected


def test_idle_gpu_seen_through_a_service_monitor_is_unallocated_for_both_vendors():
    nv = dict(cluster="c", Hostname="n1", UUID="GPU-1", gpu="0", namespace="gpu-operator",
              pod="nvidia-dcgm-exporter-7xk2p")
    amd = dict(cluster="c", hostname="n2", gpu_id="0", gpu_uuid="amd-1",
               namespace="kube-amd-gpu", pod="amd-device-metrics-exporter-q8v2n")
    obs = build(nvidia={"values": [row(40, **nv, __name__="DCGM_FI_DEV_GPU_TEMP")]},
                amd={"values": [row(40, **amd, __name__="gpu_edge_temperature")]})
    assert obs[("GPU-1", None, None)].allocations == set()
    assert obs[("amd-1", None, None)].allocations == set()


@pytest.mark.parametrize(("model", "profile", "mem", "expected"), [
    ("NVIDIA A100-SXM4-80GB", "3g.40gb", None, 3 / 7),
    ("NVIDIA H100 80GB HBM3", "1g.10gb", None, 1 / 7),
    ("NVIDIA H100 80GB HBM3", "7g.80gb", None, 1.0),
    ("NVIDIA A30", "2g.12gb", None, 2 / 4),
    ("NVIDIA A100-SXM4-40GB", "1c.3g.20gb", None, 1 / 7),  # compute instance in a GPU instance
    ("Some Future GPU", "2g.30gb", (30000, 120000), 0.25),  # unknown model: memory share
    ("NVIDIA A100", "unknown", (10000, 80000), 0.125),  # unreadable profile: memory share
    ("NVIDIA A100", "unknown", None, 1 / 7),
    ("NVIDIA A100", None, None, 1.0),  # a whole GPU
])
def test_mig_slice_counts_as_its_share_of_compute_slices(model, profile, mem, expected):
    assert store.mig_share(model, profile, *(mem or ())) == pytest.approx(expected)


def test_a_bucket_asks_only_for_the_names_the_store_holds():
    """The ledger's queries of names the store lacks would answer nothing: not asked."""
    held = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "kube_pod_container_resource_requests",
            "kube_pod_start_time"}
    usage = store.usage_queries("1h", "5m", "cluster", held=held)
    assert [(q.vendor, q.kind, q.field) for q in usage] == [
        ("nvidia", "usage:avg", "utilisation_pct"), ("nvidia", "usage:max", "utilisation_pct"),
        ("nvidia", "coverage", None)]
    assert "DCGM_FI_DEV_GPU_UTIL_RATIO" not in usage[0].promql
    assert usage[2].promql.count("last_over_time(") == sum(
        f"last_over_time({name}{{" in usage[2].promql for name in held)
    # an allocation's query needs every name it reads: the start joins the requests
    alloc = store.allocation_queries("2h", "1m", "cluster", held=held)
    assert [q.kind for q in alloc] == ["alloc:start", "alloc:requests"]
    assert [q.kind for q in store.allocation_queries(
        "2h", "1m", "cluster", held={"kube_pod_start_time"})] == []
    assert len(store.usage_queries("1h", "5m", "cluster", held=None)) > 2 * len(usage)
