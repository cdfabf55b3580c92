"""Sync benchmark: gpufleet's sync beside a raw and a naive fetch, one real Prometheus a size.

Prints one JSON line per fleet size (``--gpus 10000 100000 200000``), all measured in one run
on one store:

- raw_s / raw_hub_cpu_s: one instant selector per family the inventory reads, all labels,
  JSON-decoded, one after the other; what any client pays asking serially, and the hub CPU
  it costs.
- floor_s: the parallel floor: the same selectors in ``--floor-shards`` (10) cluster shards
  (``cluster=~"..."``), every shard's selectors asked at once (one thread a shard).
- floor_window_s: the same, each selector read over the window as the sync must
  (``last_over_time(x[window])``: ACM pushes every 300 s, so a series' newest sample may be
  older than the store's 5-minute look-back that a bare selector sees): the same answer, so
  whether reading the window is what costs the sync shows beside floor_s;
  steady_vs_window_floor the ratio against it.
- naive_s (``--naive``): what a user would write: prometheus-api-client ``custom_query`` and
  ``MetricSnapshotDataFrame`` per family, merged per vendor with pandas.
- sync_first_s / sync_steady_s: ``gpufleet sync`` as a whole process (start-up included) on a
  fresh database, then twice again on the filled one (the service's steady state: the
  faster of the two, both in sync_steady_runs_s; the floors are each the best of two), with its
  default shard size and query concurrency (``requests`` and ``shards`` of the steady one);
  first_rss_mb / steady_rss_mb their peak RSS (GNU time's %M of the child alone, never a
  fat parent's rusage), hub_cpu_s the store's CPU time during the steady one (utime + stime
  from /proc/PID/stat of the Prometheus process; ``*_hub_cpu_s`` the same for the raw
  selects and each floor's faster run); steady_vs_floor the goal's ratio. store_blocks: the
  blocks the backfill made (promtool cuts them at even UTC hours): 2 when the window's
  samples straddle one, and then every windowed select (the sync's, the window floor's)
  costs the store about 1.6x the CPU of one block, while the instant floor reads one.

The fleet: 8-GPU nodes, 50 nodes a cluster (100,000 GPUs are 250 clusters), a quarter of the
nodes AMD, GPU 0 of every 10th NVIDIA node in MIG mode with two slices, a sample every 30 s
over the 10-minute window (the density at which a ``__name__`` regex over the window passes
Prometheus's default ``--query.max-samples``), or with ``--samples 3`` ACM's shape: three
samples per series in the window. It is written as OpenMetrics, backfilled with ``promtool tsdb
create-blocks-from openmetrics`` with timestamps ending when measuring starts, and served by
a real Prometheus with default limits.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hub import store  # noqa: E402
from hub.common import format_duration  # noqa: E402
from hub.devstack import PrometheusProcess, hub_config, require_binary  # noqa: E402

GPUS_PER_NODE = 8
NODES_PER_CLUSTER = 50
STALE_AFTER = 600.0
INTERVAL = 30.0  # dcgm-exporter's collect interval
SAMPLES = int(STALE_AFTER // INTERVAL)  # 20 per series in the window
#: ACM's shape: metrics-collector pushes every 300 s, so a 10-minute window holds 2-3 samples
#: of a series; `--samples 3` writes exactly 3 (every 200 s)
ACM_SAMPLES = 3
NV_FAMILIES = [("DCGM_FI_DEV_GPU_UTIL", 37), ("DCGM_FI_DEV_FB_USED", 20480),
               ("DCGM_FI_DEV_FB_FREE", 60000), ("DCGM_FI_DEV_FB_RESERVED", 577),
               ("DCGM_FI_DEV_POWER_USAGE", 312.5), ("DCGM_FI_DEV_GPU_TEMP", 45)]
AMD_FAMILIES = [("gpu_gfx_activity", 12), ("gpu_used_vram", 2048), ("gpu_total_vram", 196592),
                ("gpu_power_usage", 420), ("gpu_edge_temperature", 40)]
MIG_ONLY = [("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.5)]


def acm_labels(cluster: str, n: int, g: int, vendor: str) -> str:
    """What a series carries after ACM's pipeline: the managed cluster's id, the platform
    Prometheus' target labels for the exporter pod (honorLabels off), and a workload's pod on
    half the GPUs as ``exported_*``."""
    exporter = ("nvidia-dcgm-exporter", "nvidia-gpu-operator") if vendor == "nvidia" else \
        ("amd-device-metrics-exporter", "kube-amd-gpu")
    out = (f',clusterID="{n // NODES_PER_CLUSTER:08d}-4a7e-4c1b-9d6f-3c2e1b0a9f8e",'
           f'endpoint="gpu-metrics",service="{exporter[0]}",namespace="{exporter[1]}",'
           f'pod="{exporter[0]}-{n:05x}",container="exporter",'
           f'prometheus="openshift-monitoring/k8s",receive="true",tenant_id="default-tenant"')
    if g % 2 == 0:
        out += (f',exported_namespace="team-{n % 40:02d}",exported_pod="train-{n:05x}-{g}",'
                f'exported_container="trainer"')
    return out


def fleet_labels(gpus: int, acm: bool = False) -> tuple[list[str], list[str], list[str], int]:
    """Label sets (NVIDIA whole GPUs, NVIDIA MIG slices, AMD) and the cluster count; with
    ``acm`` the labels ACM's pipeline adds too (see acm_labels)."""
    nodes = max(1, (gpus + GPUS_PER_NODE - 1) // GPUS_PER_NODE)
    nv: list[str] = []
    mig: list[str] = []
    amd: list[str] = []
    made = 0
    for n in range(nodes):
        cluster = f"cluster-{n // NODES_PER_CLUSTER:04d}"
        node = f"{cluster}-node-{n % NODES_PER_CLUSTER:03d}"
        for g in range(GPUS_PER_NODE):
            if made >= gpus:
                break
            made += 1
            if n % 4 == 3:  # a quarter of the nodes are AMD
                amd.append(
                    f'cluster="{cluster}",hostname="{node}",gpu_id="{g}",'
                    f'gpu_uuid="amd-{n:06d}-{g}",serial_number="SN{n:06d}{g}",'
                    f'card_series="AMD Instinct MI300X OAM",card_model="0x74a1",'
                    f'driver_version="6.8.5",instance="10.0.{n % 250}.{g}:5000",job="amd"'
                    + (acm_labels(cluster, n, g, "amd") if acm else ""))
                continue
            base = (f'cluster="{cluster}",Hostname="{node}",gpu="{g}",'
                    f'UUID="GPU-{n:08x}-0000-4000-8000-{g:012x}",device="nvidia{g}",'
                    f'modelName="NVIDIA H100 80GB HBM3",DCGM_FI_DRIVER_VERSION="580.105.08",'
                    f'pci_bus_id="00000000:{g:02X}:00.0",instance="10.1.{n % 250}.1:9400",'
                    f'job="dcgm-exporter"' + (acm_labels(cluster, n, g, "nvidia") if acm else ""))
            if g == 0 and n % 10 == 0:
                mig.append(base + ',GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"')
                mig.append(base + ',GPU_I_PROFILE="3g.40gb",GPU_I_ID="2"')
            else:
                nv.append(base)
    return nv, mig, amd, (nodes + NODES_PER_CLUSTER - 1) // NODES_PER_CLUSTER


def write_openmetrics(path: Path, gpus: int, end: float, samples: int = SAMPLES,
                     acm: bool = False, window: float = STALE_AFTER) -> int:
    """Write the fleet, ``samples`` per series evenly over the window up to ``end``; returns
    the cluster count."""
    nv, mig, amd, clusters = fleet_labels(gpus, acm)
    every = window / samples
    stamps = [f"{end - every * i:.3f}" for i in reversed(range(samples))]
    families = ([(n, nv + mig, v) for n, v in NV_FAMILIES] + [(n, mig, v) for n, v in MIG_ONLY]
                + [(n, amd, v) for n, v in AMD_FAMILIES])
    with path.open("w", buffering=1 << 20) as out:
        for name, series, value in families:
            out.write(f"# TYPE {name} gauge\n")
            for labels in series:
                head = f"{name}{{{labels}}} {value} "
                out.write("".join(f"{head}{ts}\n" for ts in stamps))
        out.write("# EOF\n")
    return clusters


def hub_cpu(pid: int) -> float:
    """CPU seconds (user + system) the hub store's process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_families() -> list[tuple[str, str]]:
    """(vendor, metric name) of every family the inventory reads, each prefix spelled out."""
    out = []
    for p in store.PROFILES:
        names = [m for ms in (*p.value_fields.values(), *p.health_fields.values()) for m in ms]
        for prefix in p.name_prefixes:
            out += [(p.vendor, prefix + m) for m in dict.fromkeys(names)]
    return out


def plain(url: str, queries: list[str], at: float) -> None:
    with requests.Session() as s:
        for q in queries:
            r = s.post(f"{url}/api/v1/query", data={"query": q, "time": f"{at:.3f}"},
                       timeout=600)
            body = json.loads(r.content)
            assert body["status"] == "success", body
            del body, r


def naive(url: str, at: float) -> int:
    """prometheus-api-client + MetricSnapshotDataFrame per family, merged with pandas."""
    import pandas as pd
    from prometheus_api_client import MetricSnapshotDataFrame, PrometheusConnect

    prom = PrometheusConnect(url, disable_ssl=True)
    frames: dict[str, pd.DataFrame] = {}
    for vendor, name in read_families():
        result = prom.custom_query(name, params={"time": f"{at:.3f}"})
        if not result:
            continue
        df = MetricSnapshotDataFrame(result).drop(columns=["__name__", "timestamp"])
        df = df.rename(columns={"value": name})
        keys = [c for c in df.columns if c != name]
        frames[vendor] = (df if vendor not in frames
                          else frames[vendor].merge(df, on=keys, how="outer"))
    return sum(len(f) for f in frames.values())


def floor(url: str, queries: list[str], shards: list[list[str]], at: float,
          label: str = "cluster", window: float | None = None) -> None:
    """Every selector once per shard of clusters, all shards at once (a thread each); with
    ``window``, each as ``last_over_time(selector[window])``, as the sync must read it."""
    jobs = [[f'{q}{{{store.shard_matcher(label, names)}}}' for q in queries]
            for names in shards]
    if window is not None:
        span = format_duration(window)
        jobs = [[f"last_over_time({q}[{span}])" for q in job] for job in jobs]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        for done in pool.map(lambda qs: plain(url, qs, at), jobs):
            del done


def run_sync(url: str, db: str, window: float = STALE_AFTER) -> tuple[dict, float, float]:
    """`gpufleet sync` in a child: its JSON result, wall seconds and peak RSS in MB (GNU
    time's %M: the child's own high-water mark; a parent's wait4 rusage would start from
    the parent's, which here decoded whole answers)."""
    with tempfile.NamedTemporaryFile() as rss:
        cmd = ["/usr/bin/time", "-f", "%M", "-o", rss.name, sys.executable, "-m", "hub",
               "sync", "--hub-url", url, "--db", db, "--stale-after",
               format_duration(window), "--timeout", "600s", "-o", "json"]
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, cwd=ROOT)
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"sync failed: {proc.stderr.decode()}")
        kb = int(Path(rss.name).read_text().split()[-1])
        return json.loads(proc.stdout), wall, kb / 1024


def timed(fn, *args) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


@contextlib.contextmanager
def fleet_store(gpus: int, work: Path, samples: int = SAMPLES, acm: bool = False,
                window: float = STALE_AFTER) -> Iterator[tuple[PrometheusProcess, int, int]]:
    """A real Prometheus holding the bench's fleet, its samples ending as it is handed over:
    (the store, its process id, the cluster count)."""
    promtool = require_binary("promtool")
    # samples end when measuring starts: generation and backfill take ~2 s per 1,000 GPUs
    lead = 30 + gpus * 0.002
    end = time.time() + lead
    om = work / "fleet.om"
    clusters = write_openmetrics(om, gpus, end, samples, acm, window)
    data = work / "hub" / "data"
    data.mkdir(parents=True)
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om),
                    str(data)], check=True, capture_output=True)
    om.unlink()
    hub = PrometheusProcess(work / "hub", hub_config()).start(timeout=600)
    try:
        time.sleep(max(0.0, end - time.time()))
        yield hub, hub.proc.pid if hub.proc else 0, clusters
    finally:
        hub.stop()


def measure(gpus: int, workdir: Path | None, samples: int = SAMPLES, acm: bool = False,
            floor_shards: int = 10, with_naive: bool = False,
            window: float = STALE_AFTER) -> dict:
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        work = Path(tmp)
        with fleet_store(gpus, work, samples, acm, window) as (hub, pid, clusters):
            raw = [name for _, name in read_families()]
            # promtool cuts blocks at even UTC hours: a window across one is read from two
            # blocks' indexes, which costs a windowed select ~1.6x the store CPU of one
            blocks = len(list((work / "hub" / "data").glob("*/meta.json")))
            names = [f"cluster-{c:04d}" for c in range(clusters)]
            shards = [names[i::floor_shards] for i in range(min(floor_shards, clusters))]
            at = time.time()
            load_before = os.getloadavg()[0]
            plain(hub.url, raw, at)  # warm the store's caches for every side
            cpu = hub_cpu(pid)
            raw_s = timed(plain, hub.url, raw, at)
            raw_cpu = hub_cpu(pid) - cpu
            # the best of two, taken in turn: on a shared machine one run can lose seconds
            floors: list[tuple[float, float]] = []  # (wall, store CPU)
            window_floors: list[tuple[float, float]] = []
            for _ in range(2):
                for runs, span in ((floors, None), (window_floors, window)):
                    cpu = hub_cpu(pid)
                    wall = timed(floor, hub.url, raw, shards, at, "cluster", span)
                    runs.append((wall, hub_cpu(pid) - cpu))
            floor_s, floor_cpu = min(floors)
            floor_window_s, floor_window_cpu = min(window_floors)
            naive_s = timed(naive, hub.url, at) if with_naive else None
            db = f"sqlite:///{work / 'inventory.db'}"
            first, first_s, rss1 = run_sync(hub.url, db, window)
            steadies = []  # two steady syncs, the faster one compared with the floors
            for _ in range(2):
                cpu = hub_cpu(pid)
                steady, wall, rss = run_sync(hub.url, db, window)
                steadies.append((wall, hub_cpu(pid) - cpu, rss, steady))
            steady_s, sync_cpu, _, steady = min(steadies, key=lambda run: run[0])
            rss2 = max(run[2] for run in steadies)
            assert first["gpus"] == steady["gpus"], (first, steady)
            load = (load_before, os.getloadavg()[0])
    return {
        "gpus": steady["gpus"], "clusters": clusters, "samples_per_series": samples,
        "window_s": window, "store_blocks": blocks,
        "shape": "acm" if acm else "dcgm",
        "requests": steady["requests"], "shards": steady["shards"],
        "raw_s": round(raw_s, 2), "floor_s": round(floor_s, 2),
        "floor_window_s": round(floor_window_s, 2),
        "naive_s": round(naive_s, 2) if naive_s else None,
        "sync_first_s": round(first_s, 2), "sync_steady_s": round(steady_s, 2),
        "sync_steady_runs_s": [round(run[0], 2) for run in steadies],
        "hub_cpu_s": round(sync_cpu, 2), "raw_hub_cpu_s": round(raw_cpu, 2),
        "floor_hub_cpu_s": round(floor_cpu, 2),
        "floor_window_hub_cpu_s": round(floor_window_cpu, 2),
        "first_rss_mb": round(rss1, 1), "steady_rss_mb": round(rss2, 1),
        "steady_vs_floor": round(steady_s / floor_s, 2),
        "steady_vs_window_floor": round(steady_s / floor_window_s, 2),
        "hub_cpu_vs_raw": round(sync_cpu / raw_cpu, 2) if raw_cpu else None,
        # the machine's 1-minute load before and after measuring: the figures are wall
        # times, so a busy shared machine shows in them
        "load_avg": [round(x, 2) for x in load],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1000],
                        help="fleet sizes, one store and one JSON line each")
    parser.add_argument("--samples", type=int, default=SAMPLES,
                        help=f"samples per series in the 10-minute window: {SAMPLES} is "
                             f"dcgm-exporter's 30 s, {ACM_SAMPLES} ACM's 300 s pushes")
    parser.add_argument("--shape", choices=["dcgm", "acm"], default="dcgm",
                        help=f"acm: series as ACM delivers them ({ACM_SAMPLES} samples in the "
                             "window, ACM's and the platform Prometheus' labels, workloads "
                             "as exported_*)")
    parser.add_argument("--floor-shards", type=int, default=10,
                        help="cluster shards the parallel floor asks at once")
    parser.add_argument("--naive", action="store_true",
                        help="also time prometheus-api-client + pandas (slow at scale)")
    parser.add_argument("--window", type=float, default=STALE_AFTER,
                        help="the sync's --stale-after in seconds, the samples spread over "
                             "it: a busy machine whose run outlasts 10 minutes needs longer "
                             "(the same samples per series, so the same work)")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    acm = args.shape == "acm"
    samples = ACM_SAMPLES if acm and args.samples == SAMPLES else args.samples
    for gpus in args.gpus:
        print(json.dumps(measure(gpus, args.workdir, samples, acm, args.floor_shards,
                                 args.naive, args.window)), flush=True)


if __name__ == "__main__":
    main()
