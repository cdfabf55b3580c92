"""`gpufleet reconcile` end to end: a real hub Prometheus fed by real agents (exporter output and
kube-state-metrics), the local Kubernetes API server for the kube source and ACM's cluster
list, a kubectl file for the file source; on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hub.store import HubClient
from hub.validate import _reconcile as rc
from tests.support.clirun import gpufleet
from tests.support.kubeapi import KubeAPI
from tests.support.kubeapi import kube_api as kube_api
from tests.support.nodes import ksm_text, node_object, nvidia_labels, time_sliced, vks_label_sets
from tests.support.promql import wait_for
from tests.support.samples import FIXTURES, sample_text

EAST = ["dcgm-h100-8gpu-aicr-eks-156a357e.prom", "dcgm-h100-8gpu-aicr-eks-19edc950.prom",
        "dcgm-rtx4000ada-lke-linode-podlabels.prom"]
H100_A, H100_B = "ip-10-0-171-111.ec2.internal", "ip-100-64-147-149.ec2.internal"
RTX = "lke529760-766837-0a634ab30000"
VKS_NODES = ["vks-40c-0", "vks-4c-0", "vks-4c-1", "vks-4c-2"]


def dcgm_text(node: str, gpus: int, slices: list[str] = (), model: str = "NVIDIA A100-SXM4-80GB",
              prefix: str = "GPU-e2e") -> str:
    """dcgm-exporter output of one node; with ``slices`` every GPU is in MIG mode."""
    lines = ["# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    for g in range(gpus):
        base = (f'gpu="{g}",UUID="{prefix}-{node}-{g}",device="nvidia{g}",modelName="{model}",'
                f'Hostname="{node}",DCGM_FI_DRIVER_VERSION="550.54.15"')
        if not slices:
            lines.append(f"DCGM_FI_DEV_GPU_TEMP{{{base}}} 35")
        for i, profile in enumerate(slices):
            lines.append(f'DCGM_FI_DEV_GPU_TEMP{{{base},GPU_I_PROFILE="{profile}",'
                         f'GPU_I_ID="{i + 1}"}} 35')
    return "\n".join(lines) + "\n"



def lines_of(texts: list[str]) -> int:
    return sum(1 for t in texts for line in t.splitlines() if line and not line.startswith("#"))


MIG_SINGLE = "mig-single-1"
FLEET = {
    "east": [*(sample_text(f) for f in EAST), ksm_text(
        {H100_A: {"nvidia_com_gpu": 8}, H100_B: {"nvidia_com_gpu": 16},
         RTX: {"nvidia_com_gpu": 1}, "ip-10-0-9-9.ec2.internal": {"nvidia_com_gpu": 4},
         "ip-10-0-1-1.ec2.internal": {}},
        {H100_B: {"nvidia.com/gpu.replicas": "2",
                  "nvidia.com/gpu.sharing-strategy": "time-slicing"}})],
    "west": [sample_text("dcgm-a100-mig-lowercase.prom"), sample_text("dcgm-l40s-upcloud-uks.prom"),
             dcgm_text(MIG_SINGLE, 2, ["3g.40gb", "3g.40gb"]), ksm_text(
        {"gpu-node-a1": {"nvidia_com_gpu": 1, "nvidia_com_mig_3g_40gb": 1,
                         "nvidia_com_mig_2g_20gb": 1, "nvidia_com_mig_1g_10gb": 1},
         "gpu1-wl8sg": {"nvidia_com_gpu": 2}, MIG_SINGLE: {"nvidia_com_gpu": 4}},
        {"gpu-node-a1": {"nvidia.com/mig.strategy": "mixed"},
         MIG_SINGLE: {"nvidia.com/mig.strategy": "single",
                      "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"}})],
    "amd": [sample_text("amd-mi300x.prom"), sample_text("amd-prefixed-vf.prom"),
            ksm_text({"amd-node-1": {"amd_com_cpx_nps4": 16}}, {})],
    "vks": [dcgm_text(n, 1, model="GRID A100-4C") for n in VKS_NODES],
}


def _kube_fleet(east: KubeAPI, workdir: Path) -> tuple[Path, list[KubeAPI]]:
    """East (260 nodes: paging), a vGPU cluster with time-slicing, and an ACM hub."""
    east.put_object(node_object(H100_A, {"nvidia.com/gpu": "8"},
                                nvidia_labels("NVIDIA-H100-80GB-HBM3", 8)))
    east.put_object(node_object(H100_B, {"nvidia.com/gpu": "8"},
                                nvidia_labels("NVIDIA-H100-80GB-HBM3", 8)))
    east.put_object(node_object(RTX, {"nvidia.com/gpu": "1"},
                                nvidia_labels("NVIDIA-RTX-4000-Ada-Generation", 1),
                                instance="g2-gpu-rtx4000a1-m"))
    for i in range(257):
        east.put_object(node_object(f"cpu-{i:03d}.ec2.internal", instance="m7i.4xlarge"))
    vks = KubeAPI(workdir=workdir).start()
    sets = vks_label_sets()
    vks.put_object(node_object(VKS_NODES[0], {"nvidia.com/gpu": "1"}, sets[0],
                               instance="best-effort-large"))
    for name, labels, count in zip(VKS_NODES[1:], sets[1:], ["4", "4", "8"], strict=True):
        vks.put_object(node_object(name, {"nvidia.com/gpu": count}, time_sliced(labels, 4),
                                   instance="best-effort-large"))
    hub = KubeAPI(workdir=workdir).start()
    for name, available in (("east", "True"), ("west", "True"), ("amd", "True"),
                            ("vks", "True"), ("ghost", "False")):
        hub.put_object({
            "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
            "metadata": {"name": name, "labels": {"cloud": "Amazon", "vendor": "OpenShift"}},
            "spec": {"hubAcceptsClient": True, "leaseDurationSeconds": 60},
            "status": {"conditions": [{"type": "ManagedClusterConditionAvailable",
                                       "status": available, "reason": "ManagedClusterAvailable",
                                       "lastTransitionTime": "2026-11-01T08:00:00Z"}]},
        })
    config = east.kubeconfig_path("east")
    vks.kubeconfig_path("vks-admin@vks", path=config)
    hub.kubeconfig_path("acm-hub", path=config)
    return config, [vks, hub]


def statuses(rows: list[dict]) -> dict[tuple[str, str | None], str]:
    return {(r["cluster"], r["node"]): r["status"] for r in rows}


def test_reconcile_from_the_hub_kubernetes_and_files(hub, fleet, kube_api, pg_url, tmp_path):
    for name, texts in FLEET.items():
        fleet(name, texts)
    expected = lines_of([t for texts in FLEET.values() for t in texts])
    wait_for(hub.url, 'count({__name__=~"DCGM_.+|(amd_)?gpu_.+|kube_.+", cluster!=""})',
             lambda r: bool(r) and int(float(r[0]["value"][1])) == expected)
    config, servers = _kube_fleet(kube_api, tmp_path)
    try:
        for db in (f"sqlite:///{tmp_path / 'inventory.db'}", pg_url):
            env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db}
            sync = gpufleet("sync", "--stale-after", "30s", env=env)
            assert sync.exit_code == 0, sync.output

            # -- kube-state-metrics through the hub --------------------------------------
            result = gpufleet("reconcile", "-o", "json", env=env)
            assert result.exit_code == 1, result.output
            rows = json.loads(result.stdout)
            assert statuses(rows) == {
                ("amd", "amd-node-1"): "match",
                ("amd", "amd-vf-node"): "missing_in_kubernetes",
                ("east", H100_A): "match",
                ("east", H100_B): "match",
                ("east", RTX): "match",
                ("east", "ip-10-0-9-9.ec2.internal"): "missing_in_metrics",
                ("west", "gpu-node-a1"): "match",
                ("west", "gpu1-wl8sg"): "count_mismatch",
                ("west", MIG_SINGLE): "match",
                ("vks", None): "no_kubernetes_data",
            }
            by = {(r["cluster"], r["node"]): r for r in rows}
            assert by[("east", H100_B)]["reason"] == "k8s 16 = 8 × 2 replicas (time-slicing)"
            assert by[("west", MIG_SINGLE)]["mode"] == "mig-single"
            assert by[("west", "gpu-node-a1")]["mode"] == "mig-mixed"
            assert by[("west", "gpu1-wl8sg")]["reason"] == "k8s 2 vs 1 observed"
            assert by[("amd", "amd-node-1")]["mode"] == "amd-partition"
            assert by[("amd", "amd-vf-node")]["observed_gpus"] == 3

            # -- the Kubernetes API of two clusters, and ACM's cluster list ---------------
            kube_api.requests.clear()
            result = gpufleet("reconcile", "--kubeconfig", str(config), "--context", "east",
                              "--context", "vks-admin@vks=vks", "--managed-clusters",
                              "acm-hub", "-o", "json", env=env)
            assert result.exit_code == 1, result.output
            rows = json.loads(result.stdout)
            assert statuses(rows) == {
                ("east", H100_A): "match", ("east", H100_B): "match",
                ("east", RTX): "match",
                ("vks", "vks-40c-0"): "match", ("vks", "vks-4c-0"): "match",
                ("vks", "vks-4c-1"): "match", ("vks", "vks-4c-2"): "count_mismatch",
                ("ghost", None): "silent",
            }
            by = {(r["cluster"], r["node"]): r for r in rows}
            assert by[("vks", "vks-4c-2")]["reason"] == \
                "k8s 8 = 2 × 4 replicas (time-slicing) vs 1 observed"
            assert by[("vks", "vks-4c-0")]["mode"] == "time-slicing"
            assert by[("east", H100_B)]["reason"] == "k8s 8 = 8 observed"
            pages = [r.query for r in kube_api.requests_to("GET", "/api/v1/nodes")]
            assert len(pages) == 2 and pages[0] == {"limit": "250"}
            assert pages[1]["limit"] == "250" and pages[1]["continue"]

            # -- an air-gapped cluster's kubectl output ------------------------------------
            nodes_json = FIXTURES / "nodes" / "amd-partitions.json"
            result = gpufleet("reconcile", "--nodes-json", f"amd={nodes_json}", env=env)
            assert result.exit_code == 0, result.output
            assert "amd-node-1" in result.stdout and "amd-partition" in result.stdout
            assert "reconcile run 3 (file): 2 GPU nodes, 0 not matching" in result.stderr
    finally:
        for server in servers:
            server.stop()


def test_the_hub_source_asks_two_queries_whatever_the_fleet(hub, fleet):
    for name in ("east", "west"):
        fleet(name, [FLEET[name][-1]])
    wait_for(hub.url, "count(count by (cluster) (kube_node_status_capacity))",
             lambda r: bool(r) and r[0]["value"][1] == "2")
    with HubClient(hub.url) as client:
        results = [client.query(q).result for q in rc.ksm_queries("5m", "cluster")]
        assert client.requests == 2
    views, covered = rc.nodes_from_ksm(results[0], results[1], "cluster")
    assert covered == {"east", "west"}
    assert {v.node for v in views if v.gpus} == {
        H100_A, H100_B, RTX, "ip-10-0-9-9.ec2.internal", "gpu-node-a1", "gpu1-wl8sg", MIG_SINGLE}
    assert {v.node: v.labels for v in views if v.labels}[MIG_SINGLE] == {
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"}


@pytest.fixture
def empty_db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    assert gpufleet("db", "upgrade", "--db", url).exit_code == 0
    return url


def test_reconcile_input_and_dependency_errors(kube_api, empty_db, tmp_path):
    missing = gpufleet("reconcile", "--db", f"sqlite:///{tmp_path / 'nope.db'}",
                       "--nodes-json", f"c={FIXTURES / 'nodes' / 'amd-partitions.json'}")
    assert missing.exit_code == 3 and missing.stderr.count("\n") == 1
    assert "does not exist yet" in missing.stderr
    config = str(kube_api.kubeconfig_path("east"))
    cases = [
        (["--nodes-json", "just-a-file.json"], 2, "expected CLUSTER=FILE"),
        (["--nodes-json", f"c={tmp_path / 'absent.json'}"], 2, "No such file"),
        (["--source", "file"], 2, "--source file needs --nodes-json"),
        (["--source", "kube"], 2, "--source kube needs --context"),
        (["--nodes-json", "c=x", "--managed-cluster-selector", "a=b"], 2,
         "--managed-cluster-selector needs --managed-clusters"),
        ([], 2, "needs --hub-url"),
        (["--context", "east", "--nodes-json", "c=x"], 2, "exclude each other"),
        (["--source", "hub", "--nodes-json", "c=x"], 2, "--nodes-json applies to --source file"),
        (["--kubeconfig", config, "--context", "west"], 2, "context 'west' not found"),
        (["--kubeconfig", config, "--context", "east", "--context", "east"], 2,
         "two contexts to cluster 'east'"),
    ]
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "List", "items": [}')
    cases.append((["--nodes-json", f"c={bad}"], 2, "not valid JSON"))
    for args, code, message in cases:
        result = gpufleet("reconcile", "--db", empty_db, *args)
        assert result.exit_code == code, (args, result.output)
        assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
        assert "Traceback" not in result.output
    kube_api.stop()
    down = gpufleet("reconcile", "--db", empty_db, "--kubeconfig", config, "--context", "east")
    assert down.exit_code == 3 and "unreachable" in down.stderr
    assert "test-token" not in down.output


def test_managed_clusters_are_listed_page_by_page_and_by_label(kube_api):
    from hub.kube import _client as kube

    for i in range(5):
        kube_api.put_object({
            "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
            "metadata": {"name": f"c{i}",
                         "labels": {"gpufleet.io/onboard": "true"} if i % 2 else {}}})
    with kube.api_client(str(kube_api.kubeconfig_path("hub")), "hub") as api:
        names = [o["metadata"]["name"] for o in kube.list_managed_clusters(api, page_size=2)]
        picked = [o["metadata"]["name"] for o in kube.list_managed_clusters(
            api, page_size=2, label_selector="gpufleet.io/onboard=true")]
    assert names == ["c0", "c1", "c2", "c3", "c4"] and picked == ["c1", "c3"]
    pages = [r.query for r in kube_api.requests_to(
        "GET", "/apis/cluster.open-cluster-management.io/v1/managedclusters")]
    assert [p.get("limit") for p in pages] == ["2"] * 4
    assert [bool(p.get("continue")) for p in pages] == [False, True, True, False]
    assert pages[-1]["labelSelector"] == "gpufleet.io/onboard=true"
