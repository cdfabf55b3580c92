"""sync then inventory over a real hub Prometheus fed by real agents, on SQLite and PostgreSQL."""

from __future__ import annotations

import time

import pytest

from hub import store
from tests.support.clirun import gpufleet, gpufleet_json
from tests.support.httpstub import Request, Response, StubServer, forward
from tests.support.promql import wait_for, wait_silent
from tests.support.samples import AMD, EAST, WEST, sample_text, series_count, sync_requests


def start_fleet(hub, fleet, clusters: dict[str, list[str]]):
    started = {name: fleet(name, [sample_text(f) for f in files])
               for name, files in clusters.items()}
    expected = sum(series_count(files) for files in clusters.values())
    names = "|".join(clusters)
    wait_for(hub.url, f'count({{__name__=~"DCGM_.+|(amd_)?gpu_.+", cluster=~"{names}"}})',
             lambda r: bool(r) and int(float(r[0]["value"][1])) == expected)
    return started


def one_shard(files: list[str]) -> int:
    return sync_requests("".join(sample_text(f) for f in files))


def by(rows: list[dict], *keys: str) -> dict:
    return {tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]: r for r in rows}


def test_sync_builds_inventory_from_real_exporter_output(hub, fleet, db_url):
    start_fleet(hub, fleet, {"east": EAST, "west": WEST, "amd": AMD})
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url}
    result = gpufleet("sync", "--stale-after", "30s", env=env)
    assert result.exit_code == 0, result.output
    requests = one_shard(EAST + WEST + AMD)
    assert f"3 clusters, 8 nodes, 26 GPUs ({requests} requests, 1 shard" in result.stdout

    clusters = by(gpufleet_json("inventory", "clusters", env=env), "cluster")
    assert {c: (v["nodes"], v["gpus"], v["state"]) for c, v in clusters.items()} == {
        "east": (3, 17, "active"), "west": (3, 4, "active"), "amd": (2, 5, "active")}
    assert all(v["last_sample_at"].endswith("Z") for v in clusters.values())

    nodes = by(gpufleet_json("inventory", "nodes", "--cluster", "west", env=env), "node")
    assert {n: v["gpus"] for n, v in nodes.items()} == {
        "gpu-node-a1": 2, "gpu1-wl8sg": 1, "cp-bm14r7": 1}

    gpus = gpufleet_json("inventory", "gpus", env=env)
    assert len(gpus) == 17 + 4 + 5 + 3  # physical GPUs plus three MIG slices
    for key in ("cluster", "node", "uuid", "index", "vendor", "model", "memory_total_mib",
                "mig_profile", "mig_instance", "state", "first_seen", "last_seen",
                "last_sample_at", "utilisation_pct", "memory_used_mib", "power_w",
                "temperature_c"):
        assert key in gpus[0]
    table = by(gpus, "uuid", "mig_profile")

    h100 = table[("GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005", None)]
    assert (h100["cluster"], h100["node"], h100["model"], h100["index"]) == (
        "east", "ip-10-0-171-111.ec2.internal", "NVIDIA H100 80GB HBM3", 0)
    assert h100["power_w"] == pytest.approx(113.611) and h100["temperature_c"] == 30
    assert h100["memory_total_mib"] is None  # that scrape carries no FB_* family: null, not absent

    t4 = next(g for g in gpus if g["model"] == "Tesla T4")
    assert t4["memory_total_mib"] == 5120 + 9791 + 447 and t4["utilisation_pct"] == 91

    parent = table[("GPU-a1000000-0000-4000-8000-000000000000", None)]
    slices = [g for g in gpus if g["uuid"] == parent["uuid"] and g["mig_profile"]]
    assert sorted((s["mig_profile"], s["mig_instance"]) for s in slices) == [
        ("1g.10gb", 13), ("2g.20gb", 5), ("3g.40gb", 1)]
    assert parent["node"] == "gpu-node-a1"  # from the lower-case `hostname` label
    assert parent["memory_total_mib"] == 40624 + 19968 + 9728
    big = table[(parent["uuid"], "3g.40gb")]
    assert big["utilisation_pct"] == 62.5 and big["memory_used_mib"] == 10624
    small = table[(parent["uuid"], "1g.10gb")]
    assert small["utilisation_pct"] == 0 and small["state"] == "active"

    mi300 = table[("5f0000aa-0000-4000-8000-00000000a001", None)]
    assert (mi300["vendor"], mi300["model"], mi300["memory_total_mib"], mi300["power_w"]) == (
        "amd", "AMD Instinct MI300X OAM", 196592, 640)
    assert table[("serial:VF-SERIAL-0", None)]["model"] == "0x74b5"
    trimmed = table[("amd-vf-node/2", None)]
    assert trimmed["temperature_c"] == 33 and trimmed["utilisation_pct"] is None

    allocations = gpufleet_json("inventory", "allocations", env=env)
    assert {(a["cluster"], a["namespace"], a["pod"], a["container"]) for a in allocations} == {
        ("east", "dynamo-workload", "vllm-agg-0-vllmdecodeworker-s65j5", "main"),
        ("east", "dynamo-workload", "vllm-agg-0-vllmdecodeworker-dkb9q", "main"),
        ("east", "default", "cuda-75454ffb9f-8ljq7", "cuda"),
        ("west", "team-a", "trainer-0", "torch"),
        ("amd", "inference", "llm-serve-7d9", "vllm"),
    }
    runs = gpufleet_json("inventory", "sync-runs", env=env)
    assert runs[0]["status"] == "ok" and runs[0]["gpus"] == 26
    assert runs[0]["requests"] == one_shard(EAST + WEST + AMD)


def test_silent_cluster_turns_stale_and_comes_back(hub, fleet, db_url):
    clusters = start_fleet(hub, fleet, {"east": EAST[2:], "west": WEST[1:2]})
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url, "GPUFLEET_STALE_AFTER": "3s"}
    assert gpufleet("sync", env=env).exit_code == 0
    before = by(gpufleet_json("inventory", "gpus", env=env), "uuid")

    clusters["west"].stop_exporters()  # the agent keeps running; its target is gone
    wait_silent(hub.url, 'DCGM_FI_DEV_GPU_TEMP{cluster="west"}', "3s")
    assert gpufleet("sync", env=env).exit_code == 0
    state = by(gpufleet_json("inventory", "clusters", env=env), "cluster")
    assert state["west"]["state"] == "stale" and state["east"]["state"] == "active"
    assert state["west"]["gpus"] == 0  # counts are of active GPUs
    after = by(gpufleet_json("inventory", "gpus", env=env), "uuid")
    assert set(after) == set(before)  # nothing deleted
    l40s = next(u for u, g in after.items() if g["model"] == "NVIDIA L40S")
    assert after[l40s]["state"] == "stale"
    assert after[l40s]["last_sample_at"] == before[l40s]["last_sample_at"] or (
        after[l40s]["last_sample_at"] > before[l40s]["last_sample_at"])
    assert after[l40s]["last_seen"] == before[l40s]["last_seen"]  # the last sync that saw it
    assert state["west"]["last_sample_at"] is not None

    fleet("west", [sample_text(WEST[1])])  # the cluster reports again
    wait_for(hub.url, 'count(DCGM_FI_DEV_GPU_TEMP{cluster="west"})', lambda r: bool(r))
    assert gpufleet("sync", env=env).exit_code == 0
    back = by(gpufleet_json("inventory", "gpus", env=env), "uuid")
    assert back[l40s]["state"] == "active"
    assert back[l40s]["first_seen"] == before[l40s]["first_seen"]


def test_request_count_does_not_grow_with_the_fleet(hub, fleet, tmp_path):
    """Twenty times the GPUs, sending the same metric names: the same requests."""
    start_fleet(hub, fleet, {"one": EAST[2:]})
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": f"sqlite:///{tmp_path / 'a.db'}"}
    small = gpufleet_json("sync", env=env)
    start_fleet(hub, fleet, {"two": EAST[:2], "three": WEST})
    large = gpufleet_json("sync", env=env)
    assert large["gpus"] > small["gpus"] * 10
    assert large["requests"] == small["requests"] == one_shard(EAST[2:]) \
        == one_shard(EAST + WEST)


def test_a_sync_asks_only_for_the_names_the_store_holds(hub, fleet, tmp_path):
    """An NVIDIA-only store is asked no AMD query, and the inventory is the one a sync that
    asks every query writes (a store without the label-values API: a proxy answering 404)."""
    start_fleet(hub, fleet, {"east": EAST, "west": WEST})
    asked: list[str] = []

    def no_names(req: Request) -> Response:
        asked.append(req.path)
        if req.path.startswith("/api/v1/label/"):
            return Response(404, b"404 page not found", "text/plain")
        return forward(hub.url, req)

    front = StubServer(no_names)
    try:
        lean = gpufleet_json("sync", env={"GPUFLEET_HUB_URL": hub.url,
                                          "GPUFLEET_DB": f"sqlite:///{tmp_path / 'a.db'}"})
        every = gpufleet_json("sync", env={"GPUFLEET_HUB_URL": front.url,
                                           "GPUFLEET_DB": f"sqlite:///{tmp_path / 'b.db'}"})
    finally:
        front.stop()
    nvidia = [q for q in store.sync_queries("30s", "3s", "cluster") if q.vendor == "nvidia"]
    assert lean["requests"] == one_shard(EAST + WEST) <= 2 + len(nvidia)
    assert every["requests"] == 2 + len(store.sync_queries("30s", "3s", "cluster"))
    assert sum(p.startswith("/api/v1/label/__name__/values?") for p in asked) == 1
    assert (lean["clusters"], lean["nodes"], lean["gpus"]) == (
        every["clusters"], every["nodes"], every["gpus"]) == (2, 6, 21)
    moments = {"first_seen", "last_seen", "last_sample_at"}  # the two syncs' own times

    def gpus(db: str) -> list[tuple]:
        rows = gpufleet_json("inventory", "gpus", env={
            "GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": f"sqlite:///{tmp_path / db}"})
        return sorted(tuple(sorted((k, v) for k, v in r.items() if k not in moments))
                      for r in rows)

    got = {db: gpus(db) for db in ("a.db", "b.db")}
    assert {dict(r)["vendor"] for r in got["a.db"]} == {"nvidia"}
    assert got["a.db"] == got["b.db"]


def test_sync_every_loops_and_survives_a_failed_sync(hub, fleet, tmp_path):
    """`--every` keeps syncing; a failed sync prints one line and the loop goes on."""
    import json
    import os
    import signal
    import subprocess
    import sys

    start_fleet(hub, fleet, {"east": EAST[2:]})
    db = f"sqlite:///{tmp_path / 'loop.db'}"
    env = {**os.environ, "GPUFLEET_DB": db}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hub", "sync", "--every", "1s", "--hub-url", hub.url],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        runs: list = []
        while time.monotonic() < deadline and len(runs) < 2:
            time.sleep(0.5)
            listed = gpufleet("inventory", "sync-runs", "--db", db, "-o", "json")
            if listed.exit_code == 0:  # 3 until the first sync has created the schema
                runs = [r for r in json.loads(listed.stdout) if r["status"] == "ok"]
        assert len(runs) >= 2
        hub.stop()  # the next syncs fail; the loop must keep going
        time.sleep(2.5)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 130
    assert "sync ok: 1 clusters, 1 nodes, 1 GPUs" in out
    assert "unreachable" in err
    failed = [r for r in gpufleet_json("inventory", "sync-runs", "--db", db)
              if r["status"] == "failed"]
    assert failed and "unreachable" in failed[0]["error"]


def test_pod_change_mid_window_takes_each_field_from_the_newest_series(hub, fleet, db_url):
    """The old pod's series lingers in the window; its values must not win (nor add up)."""
    t4 = sample_text("dcgm-t4-loaded-ericsson-ccd.prom")
    old = (t4.replace('DCGM_FI_DRIVER_VERSION="590.48.01"}',
                      'DCGM_FI_DRIVER_VERSION="590.48.01",pod="train-0",namespace="a"}'))
    new = (t4.replace('DCGM_FI_DRIVER_VERSION="590.48.01"}',
                      'DCGM_FI_DRIVER_VERSION="590.48.01",pod="serve-0",namespace="b"}')
           .replace("} 91\n", "} 3\n").replace("} 5120\n", "} 100\n")
           .replace("} 9791\n", "} 14811\n"))
    text = {"now": old}
    fleet("east", [lambda: text["now"]])
    wait_for(hub.url, 'count(DCGM_FI_DEV_GPU_UTIL{pod="train-0"})', bool)
    text["now"] = new  # the scheduler moved the GPU to another pod
    wait_for(hub.url, 'count(DCGM_FI_DEV_GPU_UTIL{pod="serve-0"})', bool)
    wait_for(hub.url, 'count_over_time(DCGM_FI_DEV_GPU_UTIL{pod="serve-0"}[60s]) >= 3',
             bool)  # a few samples of the new series
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url, "GPUFLEET_STALE_AFTER": "60s"}
    lingering = wait_for(hub.url, 'last_over_time(DCGM_FI_DEV_GPU_UTIL{cluster="east"}[60s])',
                         lambda r: len(r) == 2)
    assert {r["metric"]["pod"] for r in lingering} == {"train-0", "serve-0"}
    assert gpufleet("sync", env=env).exit_code == 0
    gpu, = gpufleet_json("inventory", "gpus", env=env)
    assert gpu["utilisation_pct"] == 3  # not max(91, 3)
    assert gpu["memory_used_mib"] == 100
    assert gpu["memory_total_mib"] == 100 + 14811 + 447 == 5120 + 9791 + 447  # the card
    allocs = gpufleet_json("inventory", "allocations", env=env)
    assert {(a["namespace"], a["pod"]) for a in allocs} == {("a", "train-0"), ("b", "serve-0")}
