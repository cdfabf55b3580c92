"""`gpufleet reconcile` and `capacity` on a mixed DRA / device-plugin cluster, end to end: a real
hub Prometheus fed by a real agent (dcgm-exporter and AMD exporter output whose UUIDs are the
ResourceSlices' ones), the local Kubernetes API serving resource.k8s.io/v1 through the official
client, the same objects as kubectl files, and kube-state-metrics through the hub; on SQLite and
PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import dra as fx
from tests.support.asgi import page_client
from tests.support.clirun import gpufleet, gpufleet_json
from tests.support.kubeapi import KubeAPI
from tests.support.kubeapi import kube_api as kube_api
from tests.support.nodes import ksm_text, node_object, nvidia_labels
from tests.support.promql import wait_for

CLUSTER = "mixed"


def dcgm(node: str, gpus: int, model: str = fx.H100, mig: dict[int, list[str]] | None = None,
         pods: dict[int, tuple[str, str]] | None = None) -> list[str]:
    """dcgm-exporter lines of one node with the UUIDs its DRA slices publish."""
    lines = []
    for g in range(gpus):
        base = (f'gpu="{g}",UUID="{fx.gpu_uuid(node, g)}",device="nvidia{g}",'
                f'modelName="{model}",Hostname="{node}",DCGM_FI_DRIVER_VERSION="550.54.15"')
        if pods and g in pods:
            ns, pod = pods[g]
            base += f',namespace="{ns}",pod="{pod}",container="main"'
        profiles = (mig or {}).get(g)
        if not profiles:
            lines.append(f"DCGM_FI_DEV_GPU_TEMP{{{base}}} 35")
            lines.append(f"DCGM_FI_DEV_FB_FREE{{{base}}} 81000")
            lines.append(f"DCGM_FI_DEV_FB_USED{{{base}}} 0")
        for i, profile in enumerate(profiles or []):
            lines.append(f'DCGM_FI_DEV_GPU_TEMP{{{base},GPU_I_PROFILE="{profile}",'
                         f'GPU_I_ID="{i + 1}"}} 35')
    return lines


def amd(node: str, serials: list[str]) -> list[str]:
    return [f'gpu_total_vram{{gpu_id="{i}",serial_number="{s}",gpu_partition_id="0",'
            f'card_series="AMD Instinct MI300X OAM",card_model="0x74a1",'
            f'driver_version="6.8.5",hostname="{node}"}} 196592' for i, s in enumerate(serials)]


def exporter_text() -> str:
    lines = ["# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    # one GPU with pod labels (an exporter that reads dynamic_resources), the others without
    lines += dcgm(fx.DRA_H100, 8, pods={5: ("team-y", "serve-0")})
    lines += dcgm(fx.DRA_MIG, 2, fx.A100, mig={1: ["1g.10gb", "1g.10gb", "3g.40gb"]})
    lines += dcgm(fx.DRA_PARTIAL, 4)
    lines += dcgm(fx.BOTH, 8)
    lines += dcgm(fx.PLUGIN, 8, pods={0: ("team-z", "batch-0")})
    lines += ["# TYPE gpu_total_vram gauge", *amd(fx.DRA_AMD, ["692251001123", "692251001124"])]
    return "\n".join(lines) + "\n"


def node_objects() -> list[dict]:
    nodes = [node_object(n) for n in (fx.DRA_H100, fx.DRA_MIG, fx.DRA_SILENT, fx.DRA_PARTIAL,
                                      fx.DRA_AMD, "cpu-0", "cpu-1")]
    for name in (fx.BOTH, fx.PLUGIN):
        nodes.append(node_object(name, {"nvidia.com/gpu": "8"},
                                 nvidia_labels("NVIDIA-H100-80GB-HBM3", 8)))
    return nodes


def ksm() -> str:
    capacity = {n: {} for n in (fx.DRA_H100, fx.DRA_MIG, fx.DRA_SILENT, fx.DRA_PARTIAL,
                                fx.DRA_AMD)}
    capacity.update({fx.BOTH: {"nvidia_com_gpu": 8}, fx.PLUGIN: {"nvidia_com_gpu": 8}})
    return ksm_text(capacity, {})


EXACT = {
    fx.DRA_H100: "match", fx.DRA_MIG: "match", fx.DRA_SILENT: "missing_in_metrics",
    fx.DRA_PARTIAL: "unknown", fx.DRA_AMD: "match", fx.BOTH: "device_plugin_and_dra",
    fx.PLUGIN: "match",
}


def statuses(rows: list[dict]) -> dict[str | None, str]:
    return {r["node"]: r["status"] for r in rows if r["cluster"] == CLUSTER}


def capacity_by_node(env: dict[str, str]) -> dict[str, tuple[float, float]]:
    result = gpufleet("capacity", "--by", "node", "-o", "json", env=env)
    assert result.exit_code == 0, result.output
    return {r["node"]: (r["allocated"], r["free"]) for r in json.loads(result.stdout)}


def test_a_mixed_dra_cluster_reconciles_exactly_from_every_source(hub, fleet, kube_api,
                                                                   db_url, tmp_path: Path):
    fleet(CLUSTER, [exporter_text(), ksm()])
    wait_for(hub.url, f'count(kube_node_status_capacity{{cluster="{CLUSTER}"}})',
             lambda r: bool(r) and r[0]["value"][1] == "9")
    wait_for(hub.url, f'count(DCGM_FI_DEV_GPU_TEMP{{cluster="{CLUSTER}"}})',
             lambda r: bool(r) and r[0]["value"][1] == str(
                 exporter_text().count("DCGM_FI_DEV_GPU_TEMP{")))
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url}
    sync = gpufleet("sync", "--stale-after", "30s", env=env)
    assert sync.exit_code == 0, sync.output
    before = capacity_by_node(env)
    assert before[fx.DRA_H100] == (1.0, 7.0)  # pod labels ingested as on any node

    # -- the Kubernetes API serving resource.k8s.io/v1 -----------------------------------------
    for obj in node_objects():
        kube_api.put_object(obj)
    kube_api.serve_dra("v1")
    for obj in fx.dra_slices():
        kube_api.put_object(obj, plural="resourceslices")
    for obj in fx.dra_claims():
        kube_api.put_object(obj, plural="resourceclaims", namespaced=True)
    config = kube_api.kubeconfig_path("ctx")
    result = gpufleet("reconcile", "--kubeconfig", str(config), "--context", f"ctx={CLUSTER}",
                      "-o", "json", env=env)
    assert result.exit_code == 1, result.output  # the silent node and the node with both
    rows = json.loads(result.stdout)
    assert statuses(rows) == EXACT
    by = {r["node"]: r for r in rows}
    assert by[fx.DRA_H100]["reason"].endswith("= 8 observed (every GPU joined by UUID)")
    assert by[fx.DRA_AMD]["reason"].endswith("= 2 observed")  # no PCI label: by count
    assert by[fx.DRA_SILENT]["resources"] == {"gpu.nvidia.com": 4}
    assert kube_api.requests_to("GET", "/apis/resource.k8s.io/v1/resourceslices")
    assert kube_api.requests_to("GET", "/apis/resource.k8s.io/v1/resourceclaims")
    # a DRA node is visible as one: `inventory nodes` and the node page say so
    via = {n["node"]: n["gpus_via"] for n in gpufleet_json("inventory", "nodes", env=env)}
    assert via[fx.DRA_H100] == "dra" and via[fx.PLUGIN] == "device-plugin"
    assert via[fx.BOTH] == "dra+device-plugin"
    page = page_client(db_url).get(f"/nodes/{CLUSTER}/{fx.DRA_H100}").text
    assert "<td data-col=\"value\">dra</td>" in page.replace("\n", "")

    # capacity now counts the claims' GPUs as allocated where the exporter labelled no pod
    after = capacity_by_node(env)
    # trainer-0 holds 2, legacy-0 1 (claims), serve-0 1 (labels); admin access holds nothing
    assert after[fx.DRA_H100] == (4.0, 4.0)
    allocated, free = after[fx.DRA_MIG]
    assert round(allocated * 7) == 1  # notebook's 1g.10gb slice, a seventh of an A100
    assert round(free * 7) == 11  # GPU 0 whole, one 1g.10gb and one 3g.40gb slice
    assert after[fx.PLUGIN] == (1.0, 7.0)  # pod labels, as before

    # -- the same objects as kubectl files ----------------------------------------------------
    files = {}
    for name, items in (("nodes", node_objects()), ("slices", fx.dra_slices()),
                        ("claims", [])):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                           "items": items}))
    result = gpufleet("reconcile", "--nodes-json", f"{CLUSTER}={files['nodes']}",
                      "--resourceslices-json", f"{CLUSTER}={files['slices']}",
                      "--resourceclaims-json", f"{CLUSTER}={files['claims']}",
                      "-o", "json", env=env)
    assert result.exit_code == 1, result.output
    assert statuses(json.loads(result.stdout)) == EXACT
    assert capacity_by_node(env)[fx.DRA_H100] == (1.0, 7.0)  # the newest claims read: none

    # -- kube-state-metrics through the hub: DRA cannot be seen -------------------------------
    result = gpufleet("reconcile", "-o", "table", env=env)
    assert result.exit_code == 0, result.output
    assert "kube-state-metrics has no ResourceSlice metric" in result.stderr
    result = gpufleet("reconcile", "-o", "json", env=env)
    assert statuses(json.loads(result.stdout)) == {
        fx.DRA_H100: "unknown", fx.DRA_MIG: "unknown", fx.DRA_PARTIAL: "unknown",
        fx.DRA_AMD: "unknown", fx.BOTH: "match", fx.PLUGIN: "match"}

    # -- the report carries the findings of the latest run from the API ------------------------
    gpufleet("reconcile", "--kubeconfig", str(config), "--context", f"ctx={CLUSTER}", env=env)
    report = gpufleet("report", "-o", "json", env={"GPUFLEET_DB": env["GPUFLEET_DB"]})
    kinds = {(f["check"], f.get("node")) for f in json.loads(report.stdout)["findings"]}
    assert ("missing_in_metrics", fx.DRA_SILENT) in kinds
    assert ("device_plugin_and_dra", fx.BOTH) in kinds


def test_file_source_errors_name_the_flag(tmp_path: Path):
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    assert gpufleet("db", "upgrade", "--db", db).exit_code == 0
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"kind": "List", "items": node_objects()}))
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"kind": "List", "items": []}))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "List", "items": [{"metadata": {"name": "s"}}]}))
    cases = [
        (["--resourceslices-json", f"other={bad}", "--nodes-json", f"c={nodes}"], 2,
         "cluster 'other' has no --nodes-json"),
        (["--resourceslices-json", f"c={bad}", "--nodes-json", f"c={nodes}"], 2,
         "--resourceslices-json c: ResourceSlice s has no spec"),
        (["--resourceslices-json", f"c={tmp_path / 'absent.json'}", "--nodes-json",
          f"c={nodes}"], 2, "No such file"),
        (["--resourceclaims-json", "c", "--nodes-json", f"c={nodes}"], 2,
         "expected CLUSTER=FILE"),
        (["--resourceclaims-json", f"c={empty}", "--nodes-json", f"c={nodes}"], 2,
         "--resourceclaims-json c: the cluster has no --resourceslices-json"),
        (["--source", "hub", "--hub-url", "http://127.0.0.1:9", "--resourceslices-json",
          f"c={bad}"], 2, "apply to --source file"),
    ]
    for args, code, message in cases:
        result = gpufleet("reconcile", "--db", db, *args)
        assert result.exit_code == code, (args, result.output)
        assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_a_cluster_without_dra_is_read_as_before(kube_api: KubeAPI, tmp_path: Path):
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    assert gpufleet("db", "upgrade", "--db", db).exit_code == 0
    kube_api.put_object(node_object(fx.PLUGIN, {"nvidia.com/gpu": "8"}))
    config = kube_api.kubeconfig_path("old")
    result = gpufleet("reconcile", "--db", db, "--kubeconfig", str(config), "--context", "old",
                      "-o", "json")
    assert result.exit_code == 1  # the hub never saw the node
    assert statuses_any(json.loads(result.stdout)) == {fx.PLUGIN: "missing_in_metrics"}
    assert not kube_api.requests_to("GET", "/apis/resource.k8s.io/")


def statuses_any(rows: list[dict]) -> dict[str | None, str]:
    return {r["node"]: r["status"] for r in rows if r["scope"] == "node"}


def test_a_nul_from_the_kubernetes_api_is_refused_before_the_database(kube_api: KubeAPI,
                                                                      db_url: str):
    """The probe: on PostgreSQL a NUL in a ResourceSlice's nodeName (or a ResourceClaim's
    namespace) ended in a DataError printing the SQL. What a cluster's API serves is now
    checked like a file: one line, exit 2, nothing written, on either database."""
    assert gpufleet("db", "upgrade", "--db", db_url).exit_code == 0
    kube_api.put_object(node_object(fx.DRA_H100))
    kube_api.serve_dra("v1")
    bad = next(s for s in fx.dra_slices() if s["spec"].get("nodeName") == fx.DRA_H100)
    bad = {**bad, "spec": {**bad["spec"], "nodeName": fx.DRA_H100 + "\x00x"}}
    kube_api.put_object(bad, plural="resourceslices")
    config = kube_api.kubeconfig_path("ctx")
    result = gpufleet("reconcile", "--kubeconfig", str(config), "--context", "ctx=c",
                      "--db", db_url)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: context ctx: a string holds a NUL character")
    assert "SELECT" not in result.output and "INSERT" not in result.output
