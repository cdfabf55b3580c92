"""Figures for the spoke exporter (printed, not asserted).

* CPU time per collection: ``time.process_time`` over many ``Exporter.collect_once`` passes
  (NVML backend over the fake NVML library, plus building the metric families).
* Scrape latency p50/p99: real HTTP scrapes (kept-alive connection, like Prometheus) of an
  exporter running in a child process, its collection thread ticking every second meanwhile.
* Memory: peak RSS (VmHWM) of that child process, i.e. of an exporter alone.

Targets (issue 3): <= 5 ms CPU per collection at 8 GPUs, scrape p99 <= 10 ms, RSS <= 80 MB.
Run: ``.venv/bin/python bench/exporter_bench.py [--gpus 8,64] [--scrapes 1000]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

from hub.devstack import free_port
from spoke import Exporter, MetricsServer, NvmlBackend
from spoke._fakes import MIB, FakeNvml, FakeNvmlGpu


def fake_node(gpus: int) -> FakeNvml:
    return FakeNvml([
        FakeNvmlGpu(uuid=f"GPU-{i:08x}-69c4-b61d-e0bc-7b2460096005",
                    pci_bus_id=f"{i // 14:08X}:{0x18 + 0x11 * (i % 14):02X}:00.0",
                    util=37 + i % 50, power_mw=250_000 + i, temp=40 + i % 20,
                    memory_used=(10_000 + i) * MIB, memory_reserved=591 * MIB)
        for i in range(gpus)
    ])


def exporter_for(gpus: int, interval: float = 30.0) -> Exporter:
    backend = NvmlBackend(nvml=fake_node(gpus))
    backend.open()
    return Exporter(backend, hostname="bench-node", interval=interval)


def cpu_per_collection(gpus: int, passes: int) -> float:
    exporter = exporter_for(gpus)
    for _ in range(20):
        exporter.collect_once()
    start = time.process_time()
    for _ in range(passes):
        exporter.collect_once()
    return (time.process_time() - start) / passes


def vm_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM in kB from /proc (Linux)."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def serve(gpus: int, port: int) -> None:
    """Child mode: one exporter, collecting every second, until SIGTERM."""
    exporter = exporter_for(gpus, interval=1.0).start()
    server = MetricsServer(exporter, "127.0.0.1", port)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    finally:
        exporter.stop()
        server.server_close()


def scrape_figures(gpus: int, scrapes: int) -> tuple[float, float, int, dict[str, int]]:
    port = free_port()
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(gpus), "--port",
                              str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(f"{url}/healthz", timeout=1).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.05)
            if time.monotonic() > deadline:
                raise SystemExit("exporter child did not start")
        session = requests.Session()
        size = len(session.get(f"{url}/metrics", timeout=5).content)
        for _ in range(50):
            session.get(f"{url}/metrics", timeout=5)
        latencies = []
        for _ in range(scrapes):
            start = time.perf_counter()
            response = session.get(f"{url}/metrics", timeout=5)
            latencies.append(time.perf_counter() - start)
            response.raise_for_status()
        latencies.sort()
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        return p50, p99, size, vm_status(child.pid)
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="8,64")
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return

    print(f"python {sys.version.split()[0]}, pid {os.getpid()}, {os.cpu_count()} CPUs")
    print(f"{'GPUs':>5} {'CPU/collection':>15} {'scrape p50':>11} {'scrape p99':>11} "
          f"{'payload':>9} {'child VmHWM':>12} {'child VmRSS':>12}")
    for gpus in (int(g) for g in args.gpus.split(",")):
        cpu = cpu_per_collection(gpus, passes=max(50, 4000 // gpus))
        p50, p99, size, vm = scrape_figures(gpus, args.scrapes)
        print(f"{gpus:>5} {cpu * 1000:>12.3f} ms {p50 * 1000:>8.2f} ms {p99 * 1000:>8.2f} ms "
              f"{size / 1024:>6.1f} kB {vm.get('VmHWM', 0) / 1024:>9.1f} MB "
              f"{vm.get('VmRSS', 0) / 1024:>9.1f} MB")
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"bench process (client + in-process collections) peak RSS: {own:.1f} MB")
    print("targets: <= 5 ms CPU/collection at 8 GPUs, scrape p99 <= 10 ms, RSS <= 80 MB")


if __name__ == "__main__":
    main()
