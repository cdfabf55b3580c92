"""The exporter's HTTP server, scraped by real Prometheus agents, arriving in the real hub.

Each cluster's agent scrapes a StaticServer from the ``fleet`` fixture whose text is fetched,
per scrape, from the exporter's real /metrics endpoint: the exporter runs in-process on its own
free port with the simulated backend. PromQL against the hub then proves the series arrive
with the cluster label and exactly the names and labels the hub's vendor profiles read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from spoke import Exporter, MetricsServer, SimBackend
from tests.support.promql import wait_for


@pytest.fixture
def exporter_url() -> Iterator[Callable[..., str]]:
    running: list[tuple[Exporter, MetricsServer]] = []

    def start(node: str, pods=None, edges=None, **sim) -> str:
        backend = SimBackend(node=node, **sim)
        backend.open()
        exporter = Exporter(backend, hostname=node, interval=1, pods=pods,
                            edges=edges).start()
        server = MetricsServer(exporter, "127.0.0.1", 0).start()
        running.append((exporter, server))
        return server.url

    yield start
    for exporter, server in running:
        server.stop()
        exporter.stop()


def target(url: str) -> str:
    return url.removeprefix("http://")


def test_nvidia_and_amd_series_reach_the_hub_with_cluster_label(hub, fleet, exporter_url):
    nvidia = exporter_url("gpu-node-a", gpus=2, mig="3g.40gb,1g.10gb", seed=1)
    amd = exporter_url("gpu-node-b", vendor="amd", gpus=3, seed=1)
    fleet("east", targets=[target(nvidia)])
    fleet("west", targets=[target(amd)])

    temps = wait_for(hub.url, "DCGM_FI_DEV_GPU_TEMP", lambda r: len(r) == 2)
    for row in temps:
        labels = row["metric"]
        assert labels["cluster"] == "east"
        assert labels["Hostname"] == "gpu-node-a"
        assert labels["UUID"].startswith("GPU-")
        assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
        assert labels["DCGM_FI_DRIVER_VERSION"] == "580.105.08"
        assert labels["device"] == f"nvidia{labels['gpu']}"
        assert labels["pci_bus_id"]
        assert "GPU_I_ID" not in labels

    slices = wait_for(hub.url, 'DCGM_FI_DEV_FB_USED{GPU_I_PROFILE!=""}', lambda r: len(r) == 4)
    assert {(s["metric"]["GPU_I_PROFILE"], s["metric"]["GPU_I_ID"]) for s in slices} == {
        ("3g.40gb", "1"), ("1g.10gb", "2")}
    assert {s["metric"]["UUID"] for s in slices} == {t["metric"]["UUID"] for t in temps}
    wait_for(hub.url, 'count(DCGM_FI_PROF_GR_ENGINE_ACTIVE{cluster="east"} <= 1)',
             lambda r: r and r[0]["value"][1] == "4")

    gfx = wait_for(hub.url, "gpu_gfx_activity", lambda r: len(r) == 3)
    for row in gfx:
        labels = row["metric"]
        assert labels["cluster"] == "west"
        assert labels["hostname"] == "gpu-node-b"
        assert labels["card_series"] == "AMD Instinct MI300X"
        assert {"gpu_id", "gpu_uuid", "serial_number", "card_model", "driver_version"} <= set(
            labels)
    assert len({row["metric"]["gpu_uuid"] for row in gfx}) == 3
    nodes = wait_for(hub.url, "gpu_nodes_total", lambda r: len(r) == 1)
    labels = {k: v for k, v in nodes[0]["metric"].items() if k not in ("instance", "job")}
    assert labels == {"__name__": "gpu_nodes_total", "cluster": "west", "hostname": "gpu-node-b"}
    assert nodes[0]["value"][1] == "3"

    up = wait_for(hub.url, "sum by (cluster, hostname) (gpufleet_exporter_up)",
                  lambda r: len(r) == 2)
    assert {(r["metric"]["cluster"], r["metric"]["hostname"], r["value"][1]) for r in up} == {
        ("east", "gpu-node-a", "1"), ("west", "gpu-node-b", "1")}
    build = wait_for(hub.url, 'gpufleet_exporter_build_info{backend="sim"}',
                     lambda r: len(r) == 2)
    assert {r["metric"]["version"] for r in build} == {"0.1.0"}


def test_hub_sync_reads_the_exporter_into_the_same_inventory_fields(hub, fleet, exporter_url,
                                                                     tmp_path):
    """What the upstream samples give (model, memory, utilisation, power, temperature, MIG
    slices of their parent) the project's own exporter gives too, for both vendors."""
    from tests.support.clirun import gpufleet, gpufleet_json

    nvidia = exporter_url("gpu-node-a", gpus=2, mig="3g.40gb,1g.10gb", seed=1)
    whole = exporter_url("gpu-node-c", gpus=2, seed=2)
    amd = exporter_url("gpu-node-b", vendor="amd", gpus=3, seed=1)
    fleet("east", targets=[target(nvidia), target(whole)])
    fleet("west", targets=[target(amd)])
    wait_for(hub.url, 'count(DCGM_FI_DEV_GPU_UTIL{cluster="east"})',
             lambda r: bool(r) and r[0]["value"][1] == "2")
    wait_for(hub.url, 'count(DCGM_FI_PROF_GR_ENGINE_ACTIVE{cluster="east"})',
             # two slices on each of two MIG GPUs, and the two whole H100s (GPM, as on Hopper)
             lambda r: bool(r) and r[0]["value"][1] == "6")
    wait_for(hub.url, "count(gpu_gfx_activity)", lambda r: bool(r) and r[0]["value"][1] == "3")
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": f"sqlite:///{tmp_path / 'i.db'}",
           "GPUFLEET_STALE_AFTER": "30s"}
    assert gpufleet("sync", env=env).exit_code == 0
    gpus = gpufleet_json("inventory", "gpus", env=env)
    physical = [g for g in gpus if g["mig_profile"] is None]
    assert sorted((g["cluster"], g["node"], g["vendor"]) for g in physical) == [
        ("east", "gpu-node-a", "nvidia")] * 2 + [("east", "gpu-node-c", "nvidia")] * 2 + [
        ("west", "gpu-node-b", "amd")] * 3
    for gpu in physical:
        for field in ("model", "memory_total_mib", "memory_used_mib", "power_w",
                      "temperature_c", "index", "last_sample_at"):
            assert gpu[field] is not None, (gpu["vendor"], field)
        # like dcgm-exporter, a GPU in MIG mode has utilisation only on its slices
        assert (gpu["utilisation_pct"] is None) == (gpu["node"] == "gpu-node-a")
        assert gpu["state"] == "active"
    slices = [g for g in gpus if g["mig_profile"]]
    assert sorted(s["mig_profile"] for s in slices) == ["1g.10gb", "1g.10gb", "3g.40gb",
                                                        "3g.40gb"]
    for parent in (g for g in physical if g["node"] == "gpu-node-a"):
        mine = [s for s in slices if s["uuid"] == parent["uuid"]]
        assert len(mine) == 2
        assert sum(s["memory_total_mib"] for s in mine) <= parent["memory_total_mib"]
    assert all(s["utilisation_pct"] is not None for s in slices)
    clusters = {c["cluster"]: c["gpus"] for c in gpufleet_json("inventory", "clusters", env=env)}
    assert clusters == {"east": 4, "west": 3}


def test_the_hub_reads_the_exporters_allocation_edges(hub, fleet, exporter_url):
    """Edges published by the exporter for device-plugin allocations, scraped by a real
    agent into the real hub, are what the ledger's interval queries find, per GPU and pod."""
    from hub import store
    from hub.usage._meter import Meter
    from spoke._edges import Edges

    held: dict = {}

    class Kubelet:
        def devices(self) -> dict:
            return held

    backend = SimBackend(node="gpu-node-e", gpus=2, seed=4)
    backend.open()
    first, second = backend.collect().readings
    url = exporter_url("gpu-node-e", pods=Kubelet(), edges=Edges(linger=600), gpus=2, seed=4)
    time.sleep(1.5)  # a pass without pods first: allocations seen from here on are new
    held.update({first.uuid: [("ml", "train", "main")],
                 second.uuid: [("ml", "notebook", "jupyter")]})
    fleet("east", targets=[target(url)])
    rows = wait_for(hub.url, store.EDGE_START, lambda r: len(r) == 2)
    assert {r["metric"]["pod"] for r in rows} == {"train", "notebook"}
    meter = Meter(start=0.0, bucket=3600.0, push_interval=300.0, cluster_label="cluster")
    for query in store.allocation_queries("10m", "15s", "cluster"):
        if query.kind in ("edge:start", "edge:seen"):
            meter.read(query.kind, wait_for(hub.url, query.promql, lambda r: len(r) == 2))
    found = {k: (e.start is not None, e.seen is not None) for k, e in meter.edges.items()}
    assert found == {
        ("east", "ml", "train", first.uuid, ""): (True, True),
        ("east", "ml", "notebook", second.uuid, ""): (True, True)}
