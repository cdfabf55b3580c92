"""The hub through ACM's new collection path gives what the legacy path gives.

Two identical spokes, each a Prometheus (OpenShift's platform monitoring) scraping a
dcgm-exporter and a kube-state-metrics; a real Prometheus agent per spoke federates its
``/federate`` into a real hub Prometheus: cluster ``mcoa`` as MCOA's PrometheusAgent runs
gpufleet's rendered ScrapeConfigs (their match[] and metricRelabelings, the rendered
PrometheusRule evaluated in the spoke's Prometheus), cluster ``legacy`` as the legacy
metrics-collector forwards the rendered allowlist. Then `sync`, `reconcile --source hub`
and `usage collect` run against the hub: both clusters must come out the same. Before
MCOA's render existed, such a spoke synced 0 GPUs and reconcile called every node
missing_in_kubernetes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from hub import inventory as inv
from hub import usage
from hub.devstack._prometheus import PrometheusProcess, StaticServer, hub_config
from hub.store import HubClient, HubSettings
from tests.support import mcoa
from tests.support.clirun import gpufleet
from tests.support.promql import wait_for

H100 = 'modelName="NVIDIA H100 80GB HBM3"'
OP = 'namespace="nvidia-gpu-operator",pod="nvidia-dcgm-exporter-x1"'
NODES = {"gpu-a": 2, "gpu-b": 2}
BUCKET = 6.0


def dcgm_text(cluster: str) -> str:
    """Two H100s per node, legacy names; GPU 0 of gpu-a runs ml/train-0. Each cluster's
    GPUs are its own (a GPU is its UUID wherever it reports)."""
    lines = []
    for node, count in NODES.items():
        for i in range(count):
            held = 'namespace="ml",pod="train-0"' if (node, i) == ("gpu-a", 0) else OP
            labels = (f'gpu="{i}",UUID="GPU-{cluster}-{node}-{i}",Hostname="{node}",{H100},'
                      f"{held}")
            for name, value in (("DCGM_FI_DEV_GPU_TEMP", 40), ("DCGM_FI_DEV_GPU_UTIL", 50),
                                ("DCGM_FI_DEV_POWER_USAGE", 300), ("DCGM_FI_DEV_FB_USED", 1000),
                                ("DCGM_FI_DEV_FB_FREE", 80000)):
                lines.append(f"{name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def ksm_text(started: float) -> str:
    """kube-state-metrics: the two nodes (GPU capacity, labels, provider id), a GPU pod and
    a CPU-only pod (whose series no path may forward)."""
    lines = []
    for node, count in NODES.items():
        for metric in ("kube_node_status_capacity", "kube_node_status_allocatable"):
            lines.append(f'{metric}{{node="{node}",resource="nvidia_com_gpu",unit="integer"}} '
                         f"{count}")
            lines.append(f'{metric}{{node="{node}",resource="cpu",unit="core"}} 64')
        lines.append(f'kube_node_labels{{node="{node}",label_nvidia_com_gpu_product='
                     '"NVIDIA-H100-80GB-HBM3"} 1')
        lines.append(f'kube_node_info{{node="{node}",provider_id="aws:///us-east-1a/i-{node}"}} 1')
    for pod, uid, resource, amount in (("train-0", "u-1", "nvidia_com_gpu", 1),
                                       ("web-0", "u-2", "cpu", 2)):
        ns = "ml" if pod == "train-0" else "shop"
        key = f'namespace="{ns}",pod="{pod}",uid="{uid}"'
        lines.append(f'kube_pod_container_resource_requests{{{key},container="main",'
                     f'node="gpu-a",resource="{resource}",unit="integer"}} {amount}')
        lines.append(f"kube_pod_start_time{{{key}}} {started:.0f}")
        lines.append(f'kube_pod_status_phase{{{key},phase="Running"}} 1')
        lines.append(f'kube_pod_status_phase{{{key},phase="Pending"}} 0')
    return "\n".join(lines) + "\n"


@pytest.fixture
def two_paths(tmp_path: Path):
    """The hub, the spoke's Prometheus and both federating agents; stopped at the end."""
    started = time.time() - 60
    servers: list[StaticServer] = []
    procs: list[PrometheusProcess] = []
    try:
        hub = PrometheusProcess(tmp_path / "hub", hub_config()).start()
        procs.append(hub)
        rules = tmp_path / "rules.yml"
        rules.write_text(yaml.safe_dump({"groups": [*mcoa.mcoa_rules(), *mcoa.legacy_rules()]}))
        for cluster, jobs in (("mcoa", mcoa.mcoa_jobs), ("legacy", mcoa.legacy_jobs)):
            exporters = [StaticServer(dcgm_text(cluster)).start(),
                         StaticServer(ksm_text(started)).start()]
            servers += exporters
            spoke = PrometheusProcess(tmp_path / f"spoke-{cluster}", mcoa.spoke_config(
                {"dcgm-exporter": exporters[0].target,
                 "kube-state-metrics": exporters[1].target}, str(rules))).start()
            procs.append(spoke)
            procs.append(PrometheusProcess(
                tmp_path / cluster,
                mcoa.agent_config(cluster, jobs(f"127.0.0.1:{spoke.port}"), hub.url),
                agent=True).start())
        yield hub
    finally:
        for proc in reversed(procs):
            proc.stop()
        for server in servers:
            server.stop()


def by_cluster(rows: list[dict], key: str) -> dict[str, object]:
    return {r["cluster"]: r[key] for r in rows}


def test_sync_reconcile_and_usage_agree_on_both_collection_paths(two_paths, tmp_path):
    hub = two_paths
    # every series either path forwards has arrived: the recorded pod phase last
    wait_for(hub.url, 'count by (cluster) (kube_pod_status_phase{phase="Running"})',
             lambda r: len(r) == 2, timeout=60)
    wait_for(hub.url, "count by (cluster) (DCGM_FI_DEV_GPU_TEMP)",
             lambda r: len(r) == 2 and all(x["value"][1] == "4" for x in r), timeout=60)
    flowing = time.time()
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db}

    # what each path forwarded of kube-state-metrics: GPU pods only, never the CPU-only pod
    with HubClient.from_settings(HubSettings(url=hub.url)) as client:
        pods = client.query("count by (cluster, pod) (kube_pod_start_time)").result
    assert sorted((r["metric"]["cluster"], r["metric"]["pod"]) for r in pods) == [
        ("legacy", "train-0"), ("mcoa", "train-0")]

    synced = gpufleet("sync", "--once", "--stale-after", "30s", env=env)
    assert synced.exit_code == 0, synced.output
    clusters = json.loads(gpufleet("inventory", "clusters", "-o", "json", env=env).stdout)
    assert by_cluster(clusters, "gpus") == {"legacy": 4, "mcoa": 4}
    assert by_cluster(clusters, "nodes") == {"legacy": 2, "mcoa": 2}
    assert by_cluster(clusters, "seen_through") == {"legacy": "dcgm legacy",
                                                    "mcoa": "dcgm legacy"}

    reconciled = gpufleet("reconcile", "--source", "hub", "-o", "json", env=env)
    assert reconciled.exit_code == 0, reconciled.output
    nodes = [r for r in json.loads(reconciled.stdout) if r["scope"] == "node"]
    assert sorted((r["cluster"], r["node"], r["status"]) for r in nodes) == [
        (c, n, "match") for c in ("legacy", "mcoa") for n in sorted(NODES)]
    provider = {(r["cluster"], r["node"]): r["provider_id"] for r in nodes}
    assert provider[("mcoa", "gpu-a")] == provider[("legacy", "gpu-a")] == \
        "aws:///us-east-1a/i-gpu-a"

    # two whole buckets that began once both paths were flowing, ended (and a push past)
    first = (flowing // BUCKET + 1) * BUCKET
    starts = [first, first + BUCKET]
    time.sleep(max(0.0, first + 2 * BUCKET + 2 - time.time()))
    now = time.time()
    engine = inv.make_engine(db)
    try:
        with HubClient.from_settings(HubSettings(url=hub.url)) as client:
            result = usage.collect_usage(engine, client, bucket=BUCKET, push_interval=1.0,
                                         starts=starts, now=now)
        assert result.failed == []
        with engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(sa.select(inv.usage)).mappings()]
    finally:
        engine.dispose()
    hours = {c: sum(r["gpu_hours"] for r in rows if r["cluster"] == c)
             for c in ("legacy", "mcoa")}
    train = {c: sum(r["gpu_hours"] for r in rows if r["cluster"] == c and r["pod"] == "train-0")
             for c in ("legacy", "mcoa")}
    assert hours["mcoa"] == pytest.approx(hours["legacy"], rel=0.05)
    assert hours["mcoa"] == pytest.approx(4 * 2 * BUCKET / 3600, rel=0.05)
    assert train["mcoa"] == pytest.approx(train["legacy"], rel=0.05)
    assert train["mcoa"] == pytest.approx(2 * BUCKET / 3600, rel=0.05)
    print(f"\nfigures: legacy {hours['legacy'] * 3600:.1f} GPU-s ({train['legacy'] * 3600:.1f} "
          f"ml/train-0), mcoa {hours['mcoa'] * 3600:.1f} GPU-s ({train['mcoa'] * 3600:.1f}); "
          f"selectors legacy {mcoa.selectors_of('legacy')}, mcoa {mcoa.selectors_of('mcoa')}")


def test_a_dark_spoke_is_named_with_its_cards_never_zero_gpus(hub, fleet, tmp_path):
    """MCOA's default set forwards node_accelerator_card_info and no exporter series: the
    cluster is a row of its own, seen through "card info only", and the report's error names
    the missing exporter with the card count. ACM's managed-cluster list (a hub-side series)
    marks another cluster in maintenance: its silence is info, not error."""
    cards = "\n".join(
        f'node_accelerator_card_info{{cluster="dark",instance="gpu-{i // 4}",'
        f'id="0000:{i:02x}:00.0",model="H100",vendor="NVIDIA"}} 1' for i in range(8))
    labels = ('acm_managed_cluster_labels{cluster="local-cluster",name="dark",'
              'maintenance_mode="false"} 1\n'
              'acm_managed_cluster_labels{cluster="local-cluster",name="resting",'
              'maintenance_mode="true"} 1\n')
    # the hub's own series (cluster local-cluster) and the dark spoke's card info (its
    # cluster label kept as sent: the agent's external label only fills a missing one)
    fleet("local-cluster", [cards + "\n" + labels])
    wait_for(hub.url, "count(node_accelerator_card_info)", lambda r: bool(r))
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db}
    assert gpufleet("sync", "--once", env=env).exit_code == 0
    clusters = json.loads(gpufleet("inventory", "clusters", "-o", "json", env=env).stdout)
    [dark] = [c for c in clusters if c["cluster"] == "dark"]
    assert (dark["seen_through"], dark["cards"], dark["gpus"], dark["acm"]) == (
        "card info only", 8, 0, "managed")
    report = gpufleet("report", "-o", "json", env=env)
    data = json.loads(report.stdout)
    [finding] = [f for f in data["findings"] if f["check"] == "exporter_missing"]
    assert finding["cluster"] == "dark" and finding["severity"] == "error"
    assert finding["message"].startswith("8 GPU card(s)")
    table = gpufleet("inventory", "clusters", env=env)
    assert "card info only" in table.stdout
    # the service says the same: the API's clusters and the page's clusters table
    from hub.service import build_app, read_only_engine
    from tests.support.asgi import AppClient, no_metrics
    from tests.support.browser import Dom

    router = AppClient(build_app(read_only_engine(db), health=lambda: (True, {}),
                                 findings=lambda: ([], None), metrics=no_metrics))
    status, body = router.handle("/api/v1/clusters")
    assert status == 200
    [item] = [c for c in body["items"] if c["cluster"] == "dark"]
    assert (item["seen_through"], item["cards"], item["gpus"]) == ("card info only", 8, 0)
    status, page = router.handle("/")
    assert status == 200
    row = {r["cluster"]: r for r in Dom(page.text).table("clusters")}["dark"]
    assert (row["seen_through"], row["cards"]) == ("card info only", "8")
