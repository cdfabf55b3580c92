"""Figures for the spoke exporter (printed, not asserted).

* CPU time per collection: ``time.process_time`` over many ``Exporter.collect_once`` passes
  (NVML backend over the fake NVML library, plus building the metric families).
* CPU per collection at a real H200's NVML call costs (issue 26), 8 GPUs at ``--interval
  1s``: the fake library charges each call what it cost on the H200
  (``spoke._fakes.H200_CALL_COSTS``: energy 4.1 ms, GpmMetricsGet 1.9 ms, PCIe replays
  0.15 ms, GpmSampleGet 0.05 ms, anything else 0.01 ms), accounted on a simulated clock, plus
  our own Python measured here. "before" reads every field on every pass; "after" uses the
  exporter's default cadence (``--slow-interval 30s``, ``--prof-interval 10s``). Target:
  <= 8 ms per collection after.
* Scrape latency p50/p99: real HTTP scrapes (kept-alive connection, like Prometheus) of an
  exporter running in a child process, its collection thread ticking every second meanwhile.
* Memory: peak RSS (VmHWM) of that child process, i.e. of an exporter alone.

Conditions (issue 9): dcgm-exporter's full default field set with every field answering
(GPM profiling metrics included) and pod attribution on: each collection calls the
pod-resources ``List`` of a real gRPC server on a unix socket (spoke._fakekubelet) that
allocates every GPU to a pod. ``--no-pods`` measures without it.

Targets: <= 5 ms CPU per collection at 8 GPUs, scrape p99 <= 10 ms, RSS <= 80 MB.
Run: ``.venv/bin/python bench/exporter_bench.py [--gpus 8,64] [--scrapes 1000] [--no-pods]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from spoke import Exporter, MetricsServer, NvmlBackend
from spoke._fakes import HOPPER_BF16_GPM, MIB, CostedNvml, FakeNvml, FakeNvmlGpu
from spoke._model import DEFAULT_CADENCE, EVERY_PASS, Cadence
from spoke._podresources import KubeletPods, ListPodResourcesResponse


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-69c4-b61d-e0bc-7b2460096005"


def fake_node(gpus: int) -> FakeNvml:
    gpm = HOPPER_BF16_GPM  # every PROF metric answering, SM activity and occupancy included
    return FakeNvml([
        FakeNvmlGpu(uuid=uuid(i),
                    pci_bus_id=f"{i // 14:08X}:{0x18 + 0x11 * (i % 14):02X}:00.0",
                    util=37 + i % 50, power_mw=250_000 + i, temp=40 + i % 20,
                    memory_used=(10_000 + i) * MIB, memory_reserved=591 * MIB,
                    gpm_metrics=dict(gpm))
        for i in range(gpus)
    ])


def kubelet_answer(gpus: int) -> bytes:
    """Every GPU allocated to one pod's container, plus a pod holding no devices."""
    response = ListPodResourcesResponse()
    for i in range(gpus):
        pod = response.pod_resources.add(name=f"trainer-{i}", namespace="team-a")
        devices = pod.containers.add(name="main").devices.add(resource_name="nvidia.com/gpu")
        devices.device_ids.append(uuid(i))
    response.pod_resources.add(name="web", namespace="team-b").containers.add(name="nginx")
    return response.SerializeToString()


def exporter_for(gpus: int, interval: float = 30.0, socket: str | None = None) -> Exporter:
    backend = NvmlBackend(nvml=fake_node(gpus))
    backend.open()
    pods = KubeletPods(socket, timeout=1.0) if socket else None
    return Exporter(backend, hostname="bench-node", interval=interval, pods=pods)


def cpu_per_collection(gpus: int, passes: int, socket: str | None) -> float:
    """Process CPU (all threads, the gRPC server's included: an upper bound) per pass."""
    exporter = exporter_for(gpus, socket=socket)
    for _ in range(20):
        exporter.collect_once()
    start = time.process_time()
    for _ in range(passes):
        exporter.collect_once()
    return (time.process_time() - start) / passes


def h200_cost_per_collection(gpus: int, cadence: Cadence, interval: float = 1.0,
                             passes: int = 600) -> tuple[float, float, dict[str, float]]:
    """(NVML CPU charged at H200 costs, our Python's CPU, calls per pass) per collection.

    The backend's clock advances ``interval`` per pass (no sleeping), so the cadence plays
    out exactly; ``passes`` is a whole number of slow periods, so the average is exact.
    """
    now = [0.0]
    nvml = CostedNvml(fake_node(gpus))
    backend = NvmlBackend(nvml=nvml, cadence=cadence.within(interval), clock=lambda: now[0])
    backend.open()
    exporter = Exporter(backend, hostname="bench-node", interval=interval)
    for _ in range(int(max(cadence.slow, cadence.prof) / interval) + 1):  # into steady state
        exporter.collect_once()
        now[0] += interval
    nvml.charged, nvml.calls = 0.0, {}
    start = time.process_time()
    for _ in range(passes):
        exporter.collect_once()
        now[0] += interval
    python = time.process_time() - start
    calls = {name: count / passes for name, count in nvml.calls.items()}
    return nvml.charged / passes, python / passes, calls


def print_h200_figures(gpus: int = 8) -> None:
    print(f"CPU per collection at a real H200's NVML call costs, {gpus} GPUs, --interval 1s "
          "(NVML charged + our Python measured here):")
    for label, cadence in (("before: every field every pass", EVERY_PASS),
                           (f"after: --slow-interval {DEFAULT_CADENCE.slow:g}s "
                            f"--prof-interval {DEFAULT_CADENCE.prof:g}s", DEFAULT_CADENCE)):
        nvml, python, calls = h200_cost_per_collection(gpus, cadence)
        slow = ", ".join(f"{name.removeprefix('nvml')} {calls.get(name, 0.0):.2f}"
                         for name in ("nvmlDeviceGetTotalEnergyConsumption",
                                      "nvmlGpmMetricsGet"))
        print(f"  {label:<52} {(nvml + python) * 1000:6.2f} ms  (NVML {nvml * 1000:5.2f} ms, "
              f"Python {python * 1000:4.2f} ms; calls/pass: {slow})")
    print("  target: <= 8 ms per collection after")


def vm_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM in kB from /proc (Linux)."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def serve(gpus: int, port: int, socket: str | None) -> None:
    """Child mode: one exporter, collecting every second, until SIGTERM."""
    exporter = exporter_for(gpus, interval=1.0, socket=socket).start()
    server = MetricsServer(exporter, "127.0.0.1", port)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    finally:
        exporter.stop()
        server.server_close()


def scrape_figures(gpus: int, scrapes: int,
                   socket: str | None) -> tuple[float, float, int, dict[str, int]]:
    from hub.devstack import free_port  # the parent's only: the child measures an exporter

    port = free_port()
    extra = ["--socket", socket] if socket else []
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(gpus), "--port",
                              str(port), *extra])
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
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    parser.add_argument("--no-pods", action="store_true", help="pod attribution off")
    parser.add_argument("--h200-only", action="store_true",
                        help="only the CPU per collection at H200 call costs")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.socket)
        return
    print_h200_figures()
    if args.h200_only:
        return

    from spoke._fakekubelet import FakeKubelet  # the parent serves the kubelet, not the child

    print(f"python {sys.version.split()[0]}, pid {os.getpid()}, {os.cpu_count()} CPUs")
    print(f"full default field set; pod attribution {'off' if args.no_pods else 'on'}")
    print(f"{'GPUs':>5} {'CPU/collection':>15} {'scrape p50':>11} {'scrape p99':>11} "
          f"{'payload':>9} {'child VmHWM':>12} {'child VmRSS':>12}")
    for gpus in (int(g) for g in args.gpus.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            kubelet = None
            socket = None
            if not args.no_pods:
                socket = f"{tmp}/kubelet.sock"
                answer = kubelet_answer(gpus)
                kubelet = FakeKubelet(socket, lambda a=answer: a).start()
            try:
                cpu = cpu_per_collection(gpus, max(50, 4000 // gpus), socket)
                p50, p99, size, vm = scrape_figures(gpus, args.scrapes, socket)
            finally:
                if kubelet is not None:
                    kubelet.stop()
        print(f"{gpus:>5} {cpu * 1000:>12.3f} ms {p50 * 1000:>8.2f} ms {p99 * 1000:>8.2f} ms "
              f"{size / 1024:>6.1f} kB {vm.get('VmHWM', 0) / 1024:>9.1f} MB "
              f"{vm.get('VmRSS', 0) / 1024:>9.1f} MB")
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"bench process (client + in-process collections) peak RSS: {own:.1f} MB")
    print("targets: <= 5 ms CPU/collection at 8 GPUs, scrape p99 <= 10 ms, RSS <= 80 MB")


if __name__ == "__main__":
    main()
