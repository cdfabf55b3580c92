"""Sync benchmark: one full sync of a synthetic fleet of N GPUs held by a real Prometheus.

Prints one JSON line: gpus, clusters, requests, sync_s, fetch_s, ratio, peak_rss_mb.

- The fleet (8-GPU nodes, 50 nodes a cluster, NVIDIA and AMD mixed, every 10th NVIDIA GPU in
  MIG mode with two slices) is written as OpenMetrics and backfilled with
  ``promtool tsdb create-blocks-from openmetrics``, then served by a real Prometheus.
- sync_s is the time of the sync itself (``gpufleet sync -o json``: started_at..finished_at),
  run in a child process whose peak RSS is read with wait4 (so the generator's memory does
  not count).
- fetch_s is the same PromQL requests fetched with plain HTTP and JSON-decoded, nothing else:
  the floor any client pays. ratio = sync_s / fetch_s is the client's own overhead.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hub import store  # noqa: E402
from hub.common import format_duration  # noqa: E402
from hub.devstack import PrometheusProcess, hub_config, require_binary  # noqa: E402
from hub.inventory import subquery_step  # noqa: E402

GPUS_PER_NODE = 8
NODES_PER_CLUSTER = 50
STALE_AFTER = 600.0


def write_openmetrics(path: Path, gpus: int, now: float) -> int:
    """Write the fleet; returns the number of clusters."""
    nodes = max(1, gpus // GPUS_PER_NODE)
    clusters = max(1, (nodes + NODES_PER_CLUSTER - 1) // NODES_PER_CLUSTER)
    times = [now - 240, now - 120, now - 30]
    nv_series: list[str] = []  # label sets, NVIDIA
    nv_mig: list[str] = []
    amd_series: list[str] = []
    made = 0
    for n in range(nodes):
        cluster = f"cluster-{n // NODES_PER_CLUSTER:04d}"
        node = f"{cluster}-node-{n % NODES_PER_CLUSTER:03d}"
        amd = n % 4 == 3  # a quarter of the nodes are AMD
        for g in range(GPUS_PER_NODE):
            if made >= gpus:
                break
            made += 1
            if amd:
                amd_series.append(
                    f'cluster="{cluster}",hostname="{node}",gpu_id="{g}",'
                    f'gpu_uuid="amd-{n:06d}-{g}",serial_number="SN{n:06d}{g}",'
                    f'card_series="AMD Instinct MI300X OAM",card_model="0x74a1",'
                    f'driver_version="6.8.5"')
                continue
            base = (f'cluster="{cluster}",Hostname="{node}",gpu="{g}",'
                    f'UUID="GPU-{n:08x}-0000-4000-8000-{g:012x}",device="nvidia{g}",'
                    f'modelName="NVIDIA H100 80GB HBM3",DCGM_FI_DRIVER_VERSION="580.105.08",'
                    f'pci_bus_id="00000000:{g:02X}:00.0"')
            if g == 0 and n % 10 == 0:
                nv_mig.append(base + ',GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"')
                nv_mig.append(base + ',GPU_I_PROFILE="3g.40gb",GPU_I_ID="2"')
            else:
                nv_series.append(base)
    families: list[tuple[str, list[str], float]] = [
        ("DCGM_FI_DEV_GPU_UTIL", nv_series + nv_mig, 37),
        ("DCGM_FI_DEV_FB_USED", nv_series + nv_mig, 20480),
        ("DCGM_FI_DEV_FB_FREE", nv_series + nv_mig, 60000),
        ("DCGM_FI_DEV_POWER_USAGE", nv_series + nv_mig, 312.5),
        ("DCGM_FI_DEV_GPU_TEMP", nv_series + nv_mig, 45),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", nv_mig, 0.5),
        ("gpu_gfx_activity", amd_series, 12),
        ("gpu_used_vram", amd_series, 2048),
        ("gpu_total_vram", amd_series, 196592),
        ("gpu_power_usage", amd_series, 420),
        ("gpu_edge_temperature", amd_series, 40),
    ]
    with path.open("w") as out:
        for name, series, value in families:
            out.write(f"# TYPE {name} gauge\n")
            for labels in series:
                for ts in times:
                    out.write(f"{name}{{{labels}}} {value} {ts:.3f}\n")
        out.write("# EOF\n")
    return clusters


def plain_fetch(url: str, queries: list[str], at: float) -> float:
    """The floor: the same requests, decoded, and nothing else."""
    started = time.perf_counter()
    with requests.Session() as s:
        for q in queries:
            r = s.post(f"{url}/api/v1/query", data={"query": q, "time": f"{at:.3f}"}, timeout=600)
            body = json.loads(r.content)
            assert body["status"] == "success", body
            del body, r
    return time.perf_counter() - started


def run_sync(url: str, db: str) -> tuple[dict, float]:
    """`gpufleet sync` in a child; returns its JSON result and its peak RSS in MB."""
    cmd = [sys.executable, "-m", "hub", "sync", "--hub-url", url, "--db", db,
           "--stale-after", format_duration(STALE_AFTER), "--timeout", "600s", "-o", "json"]
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise SystemExit(f"sync failed ({proc.returncode}): {err}")
        out.seek(0)
        return json.loads(out.read()), usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    promtool = require_binary("promtool")
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        now = time.time()
        om = work / "fleet.om"
        clusters = write_openmetrics(om, args.gpus, now)
        data = work / "hub" / "data"
        data.mkdir(parents=True)
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om),
                        str(data)], check=True, capture_output=True)
        om.unlink()
        hub = PrometheusProcess(work / "hub", hub_config()).start(timeout=300)
        try:
            window = format_duration(STALE_AFTER)
            step = format_duration(subquery_step(STALE_AFTER))
            queries = [q.promql for q in store.sync_queries(window, step, "cluster")]
            at = time.time()
            plain_fetch(hub.url, queries, at)  # warm Prometheus's caches for both sides
            result, rss = run_sync(hub.url, f"sqlite:///{work / 'inventory.db'}")
            fetch_s = plain_fetch(hub.url, queries, at)
        finally:
            hub.stop()
    started = dt.datetime.fromisoformat(result["started_at"])
    finished = dt.datetime.fromisoformat(result["finished_at"])
    sync_s = (finished - started).total_seconds()
    print(json.dumps({
        "gpus": result["gpus"], "clusters": clusters, "requests": result["requests"],
        "sync_s": round(sync_s, 3), "fetch_s": round(fetch_s, 3),
        "ratio": round(sync_s / fetch_s, 2), "peak_rss_mb": round(rss, 1),
    }))


if __name__ == "__main__":
    main()
