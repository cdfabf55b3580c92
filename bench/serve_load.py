"""Load on `gpufleet serve`: 50 concurrent keep-alive clients for 60 s against an inventory of
10,000 GPUs, on SQLite and on PostgreSQL.

The service runs as its own process (`python -m hub serve`, a static token required), so
its memory is its own: RSS is read from /proc before the load and after it. Its hub is a
closed port (no sync runs; the API reads the inventory this script wrote), so the figures
are the API's alone. Each client is a thread with one keep-alive connection (http.client)
asking, in turn, what a dashboard and a person would: a page of 100 GPUs (keyset-paged on),
one GPU, the clusters, one cluster's nodes, capacity by model, the findings, /healthz and,
every tenth request, the live page. A client waits for each answer before it asks again,
so the figures are a closed loop: latency and throughput trade against each other.

Prints one JSON line per database: requests, requests/s, errors (non-2xx or a failed
connection), p50/p99/max latency overall and p99 per endpoint, the service's CPU time per
request (the figure a shared machine disturbs least), its RSS before and after, and the
1-minute load average before and after (the machine may be shared).

With ``--workers N`` the service runs N worker processes (`serve --workers`); CPU time and
RSS are then the sum over the parent and its workers.

    python bench/serve_load.py [--gpus 10000] [--clients 50] [--seconds 60] [--pg auto|URL]
                               [--workers N] [--warmup S]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hub import inventory as inv  # noqa: E402
from hub.devstack import free_port  # noqa: E402
from hub.inventory._normalize import Observation  # noqa: E402
from hub.inventory._writer import apply_observations  # noqa: E402
from hub.service import token_entry  # noqa: E402

TOKEN = "gpf_serve-load-bench-token"
GPUS_PER_NODE = 8
NODES_PER_CLUSTER = 50


def fill(url: str, gpus: int) -> list[str]:
    """An inventory of ``gpus`` GPUs (8 a node, 50 nodes a cluster), every other GPU
    allocated to a pod; returns the uuids."""
    engine = inv.make_engine(url, create=True)
    inv.ensure_schema(engine)
    observations = []
    for i in range(gpus):
        node = i // GPUS_PER_NODE
        cluster = f"cluster-{node // NODES_PER_CLUSTER:03d}"
        allocations = ({(f"team-{i % 17}", f"pod-{i}", "main")} if i % 2 else set())
        observations.append(Observation(
            cluster, f"{cluster}-node-{node:05d}", f"GPU-{i:08d}-0000-4000-8000-000000000000",
            "nvidia", index=i % GPUS_PER_NODE, model="NVIDIA H100 80GB HBM3",
            memory_total_mib=81559.0, utilisation_pct=float(i % 100),
            sample_at=time.time(), allocations=allocations))
    with engine.begin() as conn:
        apply_observations(conn, observations, inv.now_utc())
    engine.dispose()
    return [o.uuid for o in observations]


def cluster_names(gpus: int) -> list[str]:
    """The clusters ``fill`` makes of ``gpus`` GPUs."""
    return sorted({f"cluster-{(i // GPUS_PER_NODE) // NODES_PER_CLUSTER:03d}"
                   for i in range(gpus)})


def tree(pid: int) -> list[int]:
    """The process and its children (the workers of `serve --workers`)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            children += [int(c) for c in (task / "children").read_text().split()]
    return [pid, *children]


def cpu_s(pid: int) -> float:
    """The service's CPU time (user + system), all threads and workers: its own work,
    which a shared machine's other load slows down but does not add to."""
    total = 0.0
    for one in tree(pid):
        fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def rss_mb(pid: int) -> float:
    total = 0.0
    for one in tree(pid):
        for line in Path(f"/proc/{one}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024
    return total


@contextlib.contextmanager
def service(db_url: str, workdir: Path, workers: int = 1) -> Iterator[tuple[int, int]]:
    tokens = workdir / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"tokens": [token_entry("bench", TOKEN)]}))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hub", "serve", "--hub-url", f"http://127.0.0.1:{free_port()}",
         "--db", db_url, "--listen", f"127.0.0.1:{port}", "--tokens-file", str(tokens),
         "--every", "1h", "--workers", str(workers)], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                break
            time.sleep(0.2)
        time.sleep(2)  # every worker up, not only the first to answer
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def rounds(n: int, uuids: list[str], clusters: list[str], token: str | None
           ) -> list[tuple[str, str]]:
    """One round of a client's asks, as (endpoint name, path); ``token`` pages the GPUs on."""
    uuid = uuids[(n * 7919) % len(uuids)]
    cluster = clusters[n % len(clusters)]
    asks = [("gpus", "/api/v1/gpus?limit=100" + (f"&continue={token}" if token else "")),
            ("gpu", f"/api/v1/gpus/{uuid}"), ("clusters", "/api/v1/clusters"),
            ("nodes", f"/api/v1/nodes?cluster={cluster}"),
            ("capacity", "/api/v1/capacity?by=model"), ("findings", "/api/v1/findings"),
            ("healthz", "/healthz")]
    return [*asks, ("page", "/")] if n % 10 == 0 else asks


def client(port: int, uuids: list[str], clusters: list[str], stop: float,
           out: list[tuple[str, float, bool]], offset: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {TOKEN}", "Connection": "keep-alive"}
    token: str | None = None
    n = offset
    while time.monotonic() < stop:
        n += 1
        for name, path in rounds(n, uuids, clusters, token):
            if time.monotonic() >= stop:
                break
            started = time.monotonic()
            ok = False
            try:
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                body = response.read()
                ok = 200 <= response.status < 300 or (name == "healthz"
                                                      and response.status == 503)
                if name == "gpus" and ok:
                    token = None if n % 20 == 0 else json.loads(body).get("continue")
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            out.append((name, time.monotonic() - started, ok))
    conn.close()


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run_clients(port: int, uuids: list[str], clusters: list[str], clients: int,
                seconds: float) -> list[tuple[str, float, bool]]:
    """``clients`` keep-alive clients asking the mix for ``seconds``: (endpoint, s, ok)."""
    results: list[tuple[str, float, bool]] = []
    stop = time.monotonic() + seconds
    threads = [threading.Thread(target=client,
                                args=(port, uuids, clusters, stop, results, 1000 * k))
               for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def measure(db_url: str, gpus: int, clients: int, seconds: float,
            workers: int = 1, warmup: float = 0.0) -> dict[str, Any]:
    started = time.monotonic()
    uuids = fill(db_url, gpus)
    filled = time.monotonic() - started
    clusters = cluster_names(gpus)
    with tempfile.TemporaryDirectory() as tmp, \
            service(db_url, Path(tmp), workers) as (port, pid):
        if warmup > 0:  # every worker's kept answers computed before the measured part
            run_clients(port, uuids, clusters, clients, warmup)
        rss_before = rss_mb(pid)
        cpu_before = cpu_s(pid)
        load_before = os.getloadavg()[0]
        results = run_clients(port, uuids, clusters, clients, seconds)
        rss_after = rss_mb(pid)
        cpu = cpu_s(pid) - cpu_before
        load_after = os.getloadavg()[0]
    latencies = [s for _, s, _ in results]
    by_endpoint: dict[str, list[float]] = {}
    for name, s, _ in results:
        by_endpoint.setdefault(name, []).append(s)
    return {
        "database": db_url.split(":")[0].split("+")[0], "gpus": gpus, "clients": clients,
        "workers": workers, "warmup_s": warmup,
        "seconds": seconds, "fill_s": round(filled, 1), "requests": len(results),
        "requests_per_s": round(len(results) / seconds, 1),
        "errors": sum(1 for *_, ok in results if not ok),
        "p50_ms": round(p(latencies, 0.50) * 1000, 1),
        "p99_ms": round(p(latencies, 0.99) * 1000, 1),
        "max_ms": round(max(latencies, default=0) * 1000, 1),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 1) if latencies else 0,
        "p99_ms_by_endpoint": {k: round(p(v, 0.99) * 1000, 1)
                               for k, v in sorted(by_endpoint.items())},
        "service_cpu_ms_per_request": round(cpu * 1000 / max(1, len(results)), 2),
        "service_rss_mb_before": round(rss_before, 1),
        "service_rss_mb_after": round(rss_after, 1),
        "load_1m_before": round(load_before, 2), "load_1m_after": round(load_after, 2),
        "cpus": os.cpu_count(), "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=1, help="serve --workers")
    parser.add_argument("--warmup", type=float, default=0.0,
                        help="seconds of the same load before the measured part (each "
                             "worker's kept answers computed first: the steady cost)")
    parser.add_argument("--pg", default="auto",
                        help="PostgreSQL server URL (no database), 'auto' for a throwaway "
                             "PostgreSQL 15 as the tests start, or 'none'")
    args = parser.parse_args()

    def run(url: str) -> None:
        print(json.dumps(measure(url, args.gpus, args.clients, args.seconds, args.workers,
                                 args.warmup)), flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        run(f"sqlite:///{tmp}/bench.db")
    if args.pg == "none":
        return
    from tests.support.pg import create_database, throwaway_server

    if args.pg == "auto":
        with throwaway_server() as server:
            run(create_database(server, "bench_"))
    else:
        run(create_database(args.pg, "bench_"))


if __name__ == "__main__":
    main()
