"""The main job on one machine: a local multi-cluster GPU fleet, end to end.

Everything is real except the GPUs: a hub Prometheus with the remote-write receiver, one
Prometheus agent per cluster pushing with its cluster label, and gpufleet's own exporter per
node on its simulated backend (NVIDIA and AMD, one node in MIG mode). The demo then runs the
same commands a platform team runs: sync, reconcile against node lists, report. One cluster
goes silent partway so the report has something to say, and the end-to-end freshness (a
change on a GPU until the inventory shows it) is measured, not assumed.

Every process and thread it starts is stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from hub import inventory as inv
from hub import store, usage
from hub.common import (
    GpufleetError,
    InputError,
    UnavailableError,
    format_duration,
    on_sigterm,
)
from hub.devstack._acm import MetricsCollector, hub_args
from hub.devstack._prometheus import PrometheusProcess, agent_process, hub_config
from hub.inventory import run_sync
from hub.store import HubClient

MARKER = ".gpufleet-demo"
CLUSTER_NAMES = ["prod-east", "prod-west", "research", "edge-1", "edge-2", "lab"]
STALE_AFTER = 8.0  # seconds: short so the demo shows a stale cluster within its two minutes
#: --acm-profile: ACM's 300 s push and 600 s look-back at the demo's scale (the ratio to
#: STALE_AFTER kept: ACM's default --stale-after 10m is twice its push interval)
ACM_PUSH = STALE_AFTER / 2
ACM_LOOKBACK = STALE_AFTER
PROBE_TEMPERATURE = 36.5
#: The demo's push interval, said once to every command that measures coverage or
#: freshness (collect, report): the agents' 1 s scrapes reach the hub in remote-write
#: batches of up to 500 ms, so a sample lands in every 2 s slot; --acm-profile: ACM_PUSH.
DEMO_PUSH = 2.0
#: The demo's one usage grid: every collect the demo runs (its first screen and every
#: --keep-running round) and every usage command it runs or suggests use buckets of this
#: size, so no bucket of another size is ever summed beside them. A whole number of both
#: push intervals (DEMO_PUSH, ACM_PUSH), which are the coverage resolution.
DEMO_BUCKET = 12.0
#: The idle rule at the demo's scale (`gpufleet idle` defaults to 2h): under 5 % for one
#: whole bucket. The console, the HTML report and the suggested commands all use it.
DEMO_IDLE_FOR = DEMO_BUCKET
#: The demo hub's port, the same on every run, so the "try next" lines of one run name the
#: hub that `demo --keep-running` serves next (not a system Prometheus's 9090).
DEMO_HUB_PORT = 19090
#: How far back the demo's collect catches up (the demo's whole life, with room).
DEMO_BACKFILL = 3600.0
#: The report's --max-age at the demo's cadence. The demo syncs right before it reports (as
#: `serve` syncs on its interval), so a reporting cluster's newest sample is a push plus the
#: sync and the report's own start old: a few seconds, more on a loaded 2-core machine.
#: Twice --stale-after leaves that room; the silent cluster is made older than it before the
#: report runs (see :func:`wait_until_older`), so it, and only it, is past the max age.
REPORT_MAX_AGE = 2 * STALE_AFTER

Say = Callable[[str], None]


class ProbeBackend:
    """Wraps a backend; after :meth:`mark`, GPU 0 reports a temperature nothing else does.

    That marked value travelling exporter -> agent -> hub -> sync -> inventory is what the
    demo's freshness figure measures. The value is one an idle GPU may show (the simulator's
    temperatures are whole degrees, this one is not), so the report never shows an idle
    GPU at a temperature a GPU engineer would call wrong.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name, self.vendor = inner.name, inner.vendor
        self.marked = False

    def open(self) -> None:
        self.inner.open()

    def close(self) -> None:
        self.inner.close()

    def mark(self) -> None:
        self.marked = True

    def collect(self):  # -> spoke.Collection
        result = self.inner.collect()
        readings = result.readings
        if self.marked:
            readings = tuple(
                dataclasses.replace(r, temp_c=PROBE_TEMPERATURE) if r.index == 0 else r
                for r in readings
            )
        return dataclasses.replace(result, readings=readings)


PodRef = tuple[str, str, str]  # namespace, pod, container


class DemoPods:
    """A pod source like the kubelet's: the first GPUs of a node belong to simulated pods.

    On the attributed node GPU 0 is held by a notebook that does nothing (simulated idle:
    0 %, idle power), which `gpufleet idle` and the report then show; GPU 1 (where there is
    one) runs a training job. On the time-sliced node both replicas of GPU 0 are held, by
    two pods of two teams (the kubelet names them ``<uuid>::0`` and ``<uuid>::1``; the
    exporter reads the GPU before ``::``).
    """

    PODS = (("research", "notebook-idle", "jupyter"), ("ml-team", "train-0", "pytorch"))
    SHARED = (("inference-a", "chat-0", "vllm"), ("inference-b", "embed-0", "tei"))

    def __init__(self, backend: Any, by_index: dict[int, tuple[PodRef, ...]] | None = None
                 ) -> None:
        self.backend = backend
        self.by_index = (by_index if by_index is not None
                         else {i: (pod,) for i, pod in enumerate(self.PODS)})

    def devices(self) -> dict[str, list[PodRef]]:
        out: dict[str, list[PodRef]] = {}
        for r in self.backend.inner.collect().readings:
            if r.index in self.by_index and r.mig_profile is None:
                for dev in r.device_ids:
                    out[dev] = list(self.by_index[r.index])
        return out


#: the pod kube-state-metrics shows holding a GPU of the attributed node (DemoPods' GPU 1),
#: so the usage of the demo shows a metered allocation (allocation_basis `interval`)
METERED_POD = DemoPods.PODS[1]


def ksm_text(node: str, started: float) -> str:
    """kube-state-metrics' series of the metered pod (requests, start time, phase), as a
    cluster's kube-state-metrics exposes them: the allocation's own edges, exact at any
    push interval (hub/usage/_meter.py)."""
    namespace, pod, container = METERED_POD
    key = f'namespace="{namespace}",pod="{pod}",uid="demo-{pod}"'
    return (f'kube_pod_container_resource_requests{{{key},container="{container}",'
            f'node="{node}",resource="nvidia_com_gpu",unit="integer"}} 1\n'
            f"kube_pod_start_time{{{key}}} {started:.0f}\n"
            f'kube_pod_status_phase{{{key},phase="Running"}} 1\n'
            f'kube_pod_status_phase{{{key},phase="Pending"}} 0\n')


def ksm_node_replicas(node: Node) -> str:
    """kube-state-metrics' labels of a time-sliced node (with the GPU feature discovery
    label allowed through): what the meter reads as one pod's share, 1/replicas."""
    return (f'kube_node_labels{{node="{node.name}",'
            f'{store.KSM_REPLICAS_LABEL}="{node.replicas}"}} 1\n')


#: the time-sliced node's replicas per GPU
TIME_SLICES = 2


@dataclass
class Node:
    cluster: str
    name: str
    vendor: str
    gpus: int  # what the exporter reports
    advertised: int  # what the node list (Kubernetes) says
    mig: str | None = None
    target: str = ""
    #: simulated GPU faults (``--sim-fault`` specs), so the report shows an unhealthy GPU
    faults: tuple[str, ...] = ()
    #: its GPUs are published through DRA (a ResourceSlice), not the device plugin
    dra: bool = False
    #: the metric names its exporter sends: dcgm-exporter's legacy ones or 4.9's (DCGM 4.7)
    naming: str = "legacy"
    #: time-slicing replicas per GPU (the device plugin's sharing config; 1: not shared)
    replicas: int = 1


@dataclass
class Plan:
    """Who runs what: plain data, so the layout is testable without starting anything."""

    clusters: list[str]
    nodes: list[Node] = field(default_factory=list)

    @property
    def silent(self) -> str:
        return self.clusters[-1]

    @property
    def mismatch(self) -> Node:
        return self.nodes[1] if len(self.nodes) > 1 else self.nodes[0]

    @property
    def shared(self) -> Node | None:
        """The time-sliced node: its GPU 0 is held by two pods at once (DemoPods.SHARED)."""
        return next((n for n in self.nodes if n.replicas > 1), None)

    @property
    def attributed(self) -> Node | None:
        """The node whose GPUs the demo's pods hold (GPU 0: the idle notebook)."""
        return next((n for n in self.nodes if n.cluster != self.silent and not n.mig
                     and n.vendor == "nvidia"), None)


def hub_reads_dcgm_47() -> bool:
    """Whether this hub reads dcgm-exporter 4.9's names (its ACM allowlist names them): only
    then does the demo run a cluster on them, so a demo never shows GPUs it cannot read."""
    from spoke._naming import DCGM_47_RENAMES

    return DCGM_47_RENAMES["DCGM_FI_DEV_GPU_UTIL"][0] in store.allowlist_metrics()


def plan(clusters: int, nodes: int, gpus_per_node: int, dcgm_47: bool | None = None) -> Plan:
    """The demo's fleet; ``dcgm_47``: run one cluster on DCGM 4.7 names (None: when this
    hub reads them)."""
    names = [CLUSTER_NAMES[i] if i < len(CLUSTER_NAMES) else f"cluster-{i + 1}"
             for i in range(clusters)]
    p = Plan(names)
    for ci, cluster in enumerate(names):
        for ni in range(nodes):
            vendor = "amd" if (ci + ni) % 3 == 2 else "nvidia"
            p.nodes.append(Node(cluster, f"{cluster}-gpu-{ni + 1:02d}", vendor,
                                gpus_per_node, gpus_per_node,
                                mig="3g.40gb,3g.40gb" if ci == 0 and ni == 0 else None))
    # One deliberate mismatch: Kubernetes advertises a GPU the exporter no longer sees.
    if gpus_per_node > 1:
        p.mismatch.gpus = gpus_per_node - 1
    # One GPU fallen off the bus (XID 79) on a reporting NVIDIA node: health "failed".
    faulty = next((n for n in p.nodes if n.vendor == "nvidia" and not n.mig
                   and n.cluster != p.silent), None)
    if faulty is not None:
        faulty.faults = (f"{faulty.gpus - 1}:xid=79",)
    # One cluster upgraded to dcgm-exporter 4.9: its NVIDIA nodes send DCGM 4.7's names and
    # units, the others the legacy ones; the hub reads both (a mixed fleet, as mid-upgrade).
    if hub_reads_dcgm_47() if dcgm_47 is None else dcgm_47:
        from spoke._naming import DCGM_47

        modern = names[1] if len(names) > 2 else names[0]  # reporting, never the silent one
        for node in p.nodes:
            if node.cluster == modern and node.vendor == "nvidia":
                node.naming = DCGM_47
    # One node whose GPUs Kubernetes publishes through Dynamic Resource Allocation.
    first = names[0]
    p.nodes.append(Node(first, f"{first}-dra-01", "nvidia", gpus_per_node, gpus_per_node,
                        dra=True))
    # One node whose one GPU the device plugin time-slices into two replicas, both held:
    # two teams' pods share it, each charged its half (hub/usage/_meter.py).
    p.nodes.append(Node(first, f"{first}-ts-01", "nvidia", 1, 1, replicas=TIME_SLICES))
    return p


def node_list(p: Plan, cluster: str) -> dict[str, Any]:
    """What `kubectl get nodes -o json` says for one simulated cluster."""
    items = []
    for node in (n for n in p.nodes if n.cluster == cluster):
        labels = {"kubernetes.io/hostname": node.name, "node-role.kubernetes.io/worker": ""}
        capacity = {"cpu": "96", "memory": "2113645552Ki", "pods": "250"}
        if node.vendor == "amd":
            labels["amd.com/gpu.product-name"] = "AMD_Instinct_MI300X"
            capacity["amd.com/gpu"] = str(node.advertised)
        elif node.dra:  # no extended resource, no feature-discovery labels: the slice says it
            pass
        elif node.replicas > 1:  # time-slicing: each GPU advertised once per replica
            labels.update({"nvidia.com/gpu.count": str(node.advertised),
                           "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                           "nvidia.com/gpu.replicas": str(node.replicas),
                           "nvidia.com/gpu.sharing-strategy": "time-slicing"})
            capacity["nvidia.com/gpu"] = str(node.advertised * node.replicas)
        elif node.mig:
            slices = node.mig.split(",")
            labels.update({"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.count":
                           str(node.advertised), "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
            for profile in sorted(set(slices)):
                capacity[f"nvidia.com/mig-{profile}"] = str(node.advertised * slices.count(profile))
            capacity["nvidia.com/gpu"] = "0"
        else:
            labels.update({"nvidia.com/gpu.count": str(node.advertised),
                           "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
            capacity["nvidia.com/gpu"] = str(node.advertised)
        items.append({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": node.name, "labels": labels},
                      "status": {"capacity": capacity, "allocatable": dict(capacity)}})
    return {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {}}


def prepare_workdir(workdir: Path) -> None:
    """A fresh directory; only one that a previous demo made, and that no running demo
    still uses, is ever emptied."""
    if workdir.exists():
        if not (workdir / MARKER).exists() and any(workdir.iterdir()):
            raise InputError(f"--workdir {workdir} is not empty and was not made by the demo")
        owner = running_owner(workdir)
        if owner is not None:
            raise InputError(f"--workdir {workdir} is in use by a running demo (pid {owner}); "
                             "give another --workdir")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / MARKER).write_text("made by gpufleet demo; emptied on the next run\n"
                                  f"pid {os.getpid()}\n")


def running_owner(workdir: Path) -> int | None:
    """The pid of the demo running in ``workdir`` (its marker names it), None when that
    process is gone: a second demo in the same directory would empty the first's files."""
    import re

    with contextlib.suppress(OSError):
        found = re.search(r"^pid (\d+)$", (workdir / MARKER).read_text(), re.M)
        if found and int(found[1]) != os.getpid():
            try:
                os.kill(int(found[1]), 0)
            except ProcessLookupError:
                return None
            except PermissionError:  # alive, another user's
                pass
            return int(found[1])
    return None


@dataclass
class Result:
    db_url: str
    report: Path
    hub_url: str
    freshness_s: float | None
    reconcile: dict[str, int]
    report_exit: int
    clusters: list[dict[str, Any]]
    elapsed_s: float
    #: the fixed port the hub ran on; 0 when it took a free one (the default was taken)
    hub_port: int = 0
    #: the uuid of the time-sliced GPU two pods share (None: the plan has none)
    shared_gpu: str | None = None


class Fleet:
    """The running processes and threads; :meth:`close` stops every one of them."""

    def __init__(self) -> None:
        self.procs: list[PrometheusProcess] = []
        self.exporters: list[Any] = []
        self.servers: list[Any] = []
        #: per cluster: its Prometheus agent, or its ACM-like collector (--acm-profile)
        self.agents: dict[str, PrometheusProcess | MetricsCollector] = {}
        self.probes: list[ProbeBackend] = []

    def close(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.stop()
        for exporter in self.exporters:
            with contextlib.suppress(Exception):
                exporter.stop()
        for agent in self.agents.values():
            if isinstance(agent, MetricsCollector):
                agent.stop()
        for proc in reversed(self.procs):
            proc.stop()


def resource_slices(p: Plan, cluster: str) -> dict[str, Any]:
    """What `kubectl get resourceslices -o json` says for one simulated cluster: the DRA
    node's GPUs as NVIDIA's DRA driver publishes them (the simulated GPUs' own UUIDs)."""
    from spoke import SimBackend

    items = []
    for node in (n for n in p.nodes if n.cluster == cluster and n.dra):
        sim = SimBackend(vendor=node.vendor, gpus=node.gpus, node=node.name, seed=7)
        assert sim.nvml is not None
        devices = [{"name": f"gpu-{i}", "attributes": {
            "type": {"string": "gpu"}, "uuid": {"string": g.uuid},
            "productName": {"string": g.name},
            "resource.kubernetes.io/pciBusID": {"string": g.pci_bus_id.lower()[4:]},
        }, "capacity": {"memory": {"value": f"{g.memory_total // 2**20}Mi"}}}
            for i, g in enumerate(sim.nvml.gpus)]
        items.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                      "metadata": {"name": f"{node.name}-gpu.nvidia.com"},
                      "spec": {"driver": "gpu.nvidia.com", "nodeName": node.name,
                               "pool": {"name": node.name, "generation": 1,
                                        "resourceSliceCount": 1},
                               "devices": devices}})
    return {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {}}


def node_backend(node: Node, idle: bool = False,
                 clock: Callable[[], float] = time.time) -> ProbeBackend:
    """The simulated GPUs of one node; with ``idle`` its GPU 0 does nothing (the notebook
    that `gpufleet idle` finds): 0 %, idle power and temperature, no SM activity."""
    from spoke import SimBackend
    from spoke._sim import parse_fault

    faults = [parse_fault(f) for f in node.faults]
    return ProbeBackend(SimBackend(vendor=node.vendor, gpus=node.gpus, mig=node.mig,
                                   node=node.name, seed=7, faults=faults,
                                   idle=(0,) if idle else (),
                                   # two services time-share it: never idle
                                   busy=(0,) if node.replicas > 1 else (), clock=clock))


def node_exporter(node: Node, attributed: bool = False) -> Any:  # -> spoke.Exporter
    """gpufleet's exporter of one node, not yet started; the ``attributed`` node's GPUs belong
    to the demo's pods, its GPU 0 to the idle notebook; a time-sliced node's GPU 0 to the two
    pods that share it."""
    from spoke import Exporter

    backend = node_backend(node, idle=attributed)
    backend.open()
    pods = (DemoPods(backend) if attributed
            else DemoPods(backend, {0: DemoPods.SHARED}) if node.replicas > 1 else None)
    return Exporter(backend, hostname=node.name, interval=1.0, pods=pods, naming=node.naming)


def start_fleet(p: Plan, workdir: Path, fleet: Fleet, say: Say,
                acm_profile: bool = False, hub_port: int = 0,
                progress: Callable[[str, int, int], None] = lambda what, done, total: None
                ) -> PrometheusProcess:
    """Start the hub (on ``hub_port``; 0: a free one), the exporters and the agents, with
    a progress step for each (the set-up is the slow part on a small machine)."""
    from hub.devstack._prometheus import StaticServer
    from spoke import MetricsServer

    total, started = 1 + len(p.nodes) + len(p.clusters), 0

    def one_more() -> None:
        nonlocal started
        started += 1
        progress("starting the fleet (hub, exporters, agents)", started, total)

    progress("starting the fleet (hub, exporters, agents)", 0, total)

    hub = PrometheusProcess(workdir / "hub", hub_config(),
                            extra_args=hub_args(ACM_LOOKBACK) if acm_profile else None,
                            port=hub_port or None)
    fleet.procs.append(hub)
    hub.start()
    one_more()
    say(f"hub Prometheus (remote-write receiver) on {hub.url}"
        + (f", look-back {ACM_LOOKBACK:g}s like ACM's Thanos" if acm_profile else ""))
    for node in p.nodes:
        exporter = node_exporter(node, attributed=node is p.attributed)
        fleet.probes.append(exporter.backend)
        fleet.exporters.append(exporter)
        exporter.start()
        server = MetricsServer(exporter, "127.0.0.1", 0).start()
        fleet.servers.append(server)
        node.target = server.url.removeprefix("http://")
        one_more()
    texts: dict[str, list[str]] = {}  # cluster -> its kube-state-metrics' series
    if (metered := p.attributed) is not None:
        # the pod ran before the demo began
        texts.setdefault(metered.cluster, []).append(ksm_text(metered.name, time.time() - 60))
        say(f"cluster {metered.cluster}: kube-state-metrics shows {'/'.join(METERED_POD[:2])} "
            f"holding a GPU of {metered.name} (its usage is metered from the pod's own edges)")
    if (shared := p.shared) is not None:
        texts.setdefault(shared.cluster, []).append(ksm_node_replicas(shared))
        pods = " and ".join("/".join(pod[:2]) for pod in DemoPods.SHARED)
        say(f"cluster {shared.cluster}: {shared.name}'s GPU is time-sliced into "
            f"{shared.replicas} replicas, held by {pods} at once")
    ksm: dict[str, str] = {}  # cluster -> its kube-state-metrics
    for cluster, parts in texts.items():
        ksm_server = StaticServer("".join(parts)).start()
        fleet.servers.append(ksm_server)
        ksm[cluster] = ksm_server.target
    for cluster in p.clusters:
        targets = [n.target for n in p.nodes if n.cluster == cluster]
        targets += [ksm[cluster]] if cluster in ksm else []
        vendors = sorted({n.vendor for n in p.nodes if n.cluster == cluster})
        if any(n.naming != "legacy" for n in p.nodes if n.cluster == cluster):
            vendors = [v if v != "nvidia" else "nvidia on dcgm-exporter 4.9 names" for v in vendors]
        if acm_profile:
            fleet.agents[cluster] = MetricsCollector(
                hub.url, cluster, [f"http://{t}/metrics" for t in targets],
                interval=ACM_PUSH).start()
            one_more()
            say(f"cluster {cluster}: {len(targets)} nodes ({', '.join(vendors)}), ACM-like "
                f"collector pushing every {ACM_PUSH:g}s with cluster and clusterID, "
                "no staleness markers")
            continue
        agent = agent_process(workdir / f"agent-{cluster}", cluster, targets, hub.url)
        fleet.procs.append(agent)  # held before it runs: a SIGTERM meanwhile still stops it
        fleet.agents[cluster] = agent
        agent.start()
        one_more()
        say(f"cluster {cluster}: {len(targets)} nodes ({', '.join(vendors)}), agent pushing "
            f"with cluster={cluster}")
    return hub


def wait_for_data(engine, client: HubClient, p: Plan,
                  progress: Callable[[int, int], None], timeout: float = 60.0):
    """Sync until every simulated GPU is in the inventory; returns the last SyncResult."""
    want = sum(n.gpus for n in p.nodes)
    deadline = time.monotonic() + timeout
    while True:
        result = run_sync(engine, client, stale_after=STALE_AFTER)
        progress(min(result.gpus, want), want)
        if result.gpus >= want:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {result.gpus} of {want} GPUs reached the inventory "
                               f"within {timeout:.0f}s")
        time.sleep(0.5)


def measure_freshness(engine, client: HubClient, probe: ProbeBackend, node: Node,
                      timeout: float = 30.0) -> float:
    """Seconds from a change on a GPU until a sync shows it in the inventory."""
    probe.mark()
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        run_sync(engine, client, stale_after=STALE_AFTER)
        with engine.connect() as conn:
            rows = inv.list_gpus(conn, node.cluster)
        if any(r["node"] == node.name and r["index"] == 0 and r["mig_profile"] is None
               and r["temperature_c"] == PROBE_TEMPERATURE for r in rows):
            return time.monotonic() - started
        time.sleep(0.2)
    raise TimeoutError("the marked GPU value never reached the inventory")


@contextlib.contextmanager
def exporter_log(path: Path) -> Iterator[None]:
    """The simulated exporters' log lines go to ``path``, not the demo's story: a GPU's XID
    is the report's to tell (with its health and what to do), and Python's last-resort
    handler printed it mid-story as a stray ``XID 79 on GPU ...``."""
    logger = logging.getLogger("spoke")
    handler = logging.FileHandler(path, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        handler.close()


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _gpufleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hub", *args], capture_output=True, text=True)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM ends the demo like Ctrl-C does: through the same cleanup."""
    raise KeyboardInterrupt


def port_free(port: int) -> bool:
    """Whether a loopback listener could bind ``port`` now (a port in TIME_WAIT can: the
    previous demo's hub just closed it, and Prometheus binds with SO_REUSEADDR too)."""
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run(*, clusters: int, nodes: int, gpus_per_node: int, workdir: Path, say: Say,
        progress: Callable[[str, int, int], None], keep_running: bool = False,
        acm_profile: bool = False, hub_port: int = DEMO_HUB_PORT, port_chosen: bool = True,
        try_next: Callable[[str], list[str]] = lambda hub_url: []) -> Result:
    """The demo; ``port_chosen``: the user named ``hub_port`` (flag or environment), so a
    taken one is an error; the default port, when taken, gives way to a free one."""
    started = time.monotonic()
    if clusters < 2 or nodes < 1 or gpus_per_node < 1:
        raise InputError("the demo needs at least 2 clusters, 1 node and 1 GPU per node")
    p = plan(clusters, nodes, gpus_per_node)
    workdir = workdir.resolve()
    # before the workdir is touched: a second demo must not empty the first one's files
    if hub_port and not port_free(hub_port):
        if port_chosen:
            raise UnavailableError(f"demo: port {hub_port} is taken (another demo still "
                                   "running?); --hub-port 0 picks a free one")
        say(f"port {hub_port} is taken (another demo still running?); the hub takes a free "
            "one")
        hub_port = 0
    prepare_workdir(workdir)
    db_url = f"sqlite:///{workdir / 'inventory.db'}"
    report = workdir / "report.html"
    fleet = Fleet()
    with on_sigterm(_interrupt), exporter_log(workdir / "exporters.log"):
        try:
            hub = start_fleet(p, workdir, fleet, say, acm_profile, hub_port, progress)
            client = HubClient(hub.url)
            engine = inv.make_engine(db_url, create=True)
            first = wait_for_data(engine, client, p, lambda seen, want: progress(
                "GPUs in the inventory", seen, want))
            say(f"sync: {first.clusters} clusters, {first.nodes} nodes, {first.gpus} GPUs "
                f"in {first.requests} PromQL requests")
            probe_node = next(n for n in p.nodes if n.cluster != p.silent and not n.mig)
            probe = fleet.probes[p.nodes.index(probe_node)]
            freshness = measure_freshness(engine, client, probe, probe_node)
            say(f"freshness: a change on GPU 0 of {probe_node.name} was in the inventory "
                f"after {freshness:.1f}s")

            fleet.agents[p.silent].stop()
            say(f"cluster {p.silent} goes silent (its "
                + ("collector" if acm_profile else "agent") + " stopped)")
            quiet_since = time.monotonic()
            wait_until_older(p.silent, quiet_since, STALE_AFTER + 1, progress,
                             what="--stale-after")
            second = run_sync(engine, client, stale_after=STALE_AFTER)
            say(f"sync: {second.clusters} clusters reporting, {second.gpus} GPUs active")
            with engine.connect() as conn:
                cluster_rows = inv.list_clusters(conn)
            engine.dispose()

            push = ACM_PUSH if acm_profile else DEMO_PUSH
            usage_lines(db_url, client, say, push=push,
                        progress=lambda done, want: progress("usage buckets ending", done,
                                                             want))
            shared_gpu = shared_lines(db_url, p, say)
            reconcile_counts = reconcile(p, workdir, db_url, say)
            wait_until_older(p.silent, quiet_since, REPORT_MAX_AGE + STALE_AFTER, progress)
            engine = inv.make_engine(db_url)
            try:  # the report reads the inventory as of now, as serve's cadence keeps it
                run_sync(engine, client, stale_after=STALE_AFTER)
            finally:
                engine.dispose()
            report_exit = make_report(db_url, hub.url, report, say, push)
            if keep_running:
                say(f"fleet still running, syncing and collecting usage every "
                    f"{KEEP_SYNC_EVERY:g}s; hub at {hub.url}; inventory database {db_url}; "
                    f"HTML report {report}. Ctrl-C to stop. Try, in another shell:")
                for line in try_next(hub.url):
                    say("  " + line)
                keep_syncing(db_url, client, say, every=KEEP_SYNC_EVERY, push=push)
        finally:
            fleet.close()
    return Result(db_url, report, hub.url, freshness, reconcile_counts, report_exit,
                  cluster_rows, time.monotonic() - started, hub_port, shared_gpu)


def wait_until_older(cluster: str, quiet_since: float, seconds: float,
                     progress: Callable[[str, int, int], None], what: str = "the report's "
                     "--max-age", sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait (with a progress bar) until ``cluster``, silent since ``quiet_since`` (monotonic),
    has been silent ``seconds``; returns at once when it already has."""
    label = f"waiting for {cluster} to pass {what}"
    while (waited := time.monotonic() - quiet_since) < seconds:
        progress(label, int(waited), int(seconds))
        sleep(0.5)
    progress(label, int(seconds), int(seconds))


def collect_usage(engine, client: HubClient, *, push: float) -> usage.CollectResult:
    """The demo's only call of the ledger's collect, as `serve` makes it after a sync, at the
    demo's scale: the demo's grid, coverage in push-interval slots, a bucket collected once
    it ended a push interval ago."""
    return usage.collect_usage(engine, client, bucket=DEMO_BUCKET, push_interval=push,
                               max_backfill=DEMO_BACKFILL)


def demo_usage_commands(db_url: str) -> list[tuple[str, list[str]]]:
    """The usage commands the demo shows (and suggests): GPU-hours of the last hour, the
    idle list under the demo's idle rule, capacity; each with the flags it needs."""
    since = ["--since", "1h", "--db", db_url]
    idle_for = format_duration(DEMO_IDLE_FOR)
    return [("GPU-hours over the last hour, by namespace",
             ["usage", *since, "--idle-for", idle_for]),
            (f"idle (allocated, under 5% for {idle_for} or more)",
             ["idle", *since, "--for", idle_for]),
            ("capacity --by model", ["capacity", "--db", db_url])]


def usage_lines(db_url: str, client: HubClient, say: Say, *, push: float,
                progress: Callable[[int, int], None] = lambda done, want: None,
                timeout: float = 3 * DEMO_BUCKET) -> None:
    """Collect the demo's buckets (waiting, up to ``timeout``, until the ledger holds a row of
    every GPU the inventory has active), then show GPU-hours, idle and capacity as a user
    would type them."""
    engine = inv.make_engine(db_url)
    deadline = time.monotonic() + timeout
    buckets = rows = 0
    try:
        while True:
            result = collect_usage(engine, client, push=push)
            if result.failed:
                raise UnavailableError(f"demo: usage collect failed: {result.failed[0][1]}")
            buckets += len(result.collected)
            rows += result.rows
            progress(min(rows, 1), 1)
            # Not the first bucket with rows alone: on a loaded machine one spoke's samples
            # can miss it (a scrape past its timeout, a late push), and the idle notebook
            # would then be missing from the idle list the demo shows.
            if (rows and not _unmetered(engine)) or time.monotonic() > deadline:
                break
            time.sleep(push)
    finally:
        engine.dispose()
    say(f"usage collect: {buckets} buckets of {format_duration(DEMO_BUCKET)}, {rows} rows")
    for title, args in demo_usage_commands(db_url):
        out = _gpufleet(*args)
        if out.returncode != 0:
            raise UnavailableError(f"demo: {args[0]} failed: {_last_line(out.stderr)}")
        say(f"{title}:")
        for line in out.stdout.rstrip().splitlines():
            say("  " + line)


def shared_lines(db_url: str, p: Plan, say: Say) -> str | None:
    """What the ledger charged the two pods of the time-sliced GPU: each its share of the
    GPU's hours, never the whole GPU each. Returns that GPU's uuid (None: no such GPU)."""
    node = p.shared
    if node is None:
        return None
    engine = inv.make_engine(db_url)
    try:
        with engine.connect() as conn:
            uuid = next((g["uuid"] for g in inv.list_gpus(conn, node.cluster)
                         if g["node"] == node.name and g["mig_profile"] is None), None)
            if uuid is None:
                return None
            u = inv.usage.c
            rows = conn.execute(sa.select(u.namespace, u.pod, sa.func.sum(u.gpu_hours))
                                .where(u.uuid == uuid).group_by(u.namespace, u.pod)
                                .order_by(u.namespace, u.pod)).all()
    finally:
        engine.dispose()
    total = sum(hours or 0.0 for _, _, hours in rows)
    held = [f"{ns}/{pod} {hours:.4g} ({hours / total:.0%})"
            for ns, pod, hours in rows if pod and total > 0]
    say(f"time-sliced GPU {uuid} on {node.name} ({node.replicas} replicas): "
        f"{', '.join(held) or 'no pod metered yet'} of its {total:.4g} GPU-hours; each pod "
        "is charged its share, not the whole GPU")
    return uuid


def _unmetered(engine: sa.Engine) -> int:
    """Active GPUs of the inventory that no ledger row holds yet."""
    metered = sa.select(inv.usage.c.uuid)
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count(sa.distinct(inv.gpus.c.uuid))).where(
            inv.gpus.c.state == inv.ACTIVE, inv.gpus.c.uuid.not_in(metered))).scalar_one()


KEEP_SYNC_EVERY = 15.0


def keep_syncing(db_url: str, client: HubClient, say: Say, *, every: float,
                 push: float = DEMO_PUSH, rounds: int | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> int:
    """--keep-running: the inventory follows the live fleet (a stopped agent turns stale, a
    started one returns) instead of freezing at the demo's end, and, as `serve` does, every
    sync is followed by a collect of the usage buckets that ended. Returns the rounds run."""
    done = 0
    while rounds is None or done < rounds:
        sleep(every)
        engine = inv.make_engine(db_url)
        try:
            result = run_sync(engine, client, stale_after=STALE_AFTER)
            line = f"sync: {result.clusters} clusters reporting, {result.gpus} GPUs active"
            collected = collect_usage(engine, client, push=push)
            line += (f"; usage: {len(collected.collected)} buckets of "
                     f"{format_duration(DEMO_BUCKET)} collected")
            if collected.failed:
                line += f", {len(collected.failed)} failed ({collected.failed[0][1]})"
            say(line)
        except GpufleetError as exc:
            say(f"sync failed: {exc.format_message()}")
        finally:
            engine.dispose()
        done += 1
    return done


def gpufleet_command() -> str:
    """How a user types gpufleet in a new shell: `gpufleet` only when that is on PATH and is
    this installation, else the full path (make demo runs from .venv without activating)."""
    here = Path(sys.executable).parent / "gpufleet"
    found = shutil.which("gpufleet")
    if found and here.exists() and Path(found).resolve() == here.resolve():
        return "gpufleet"
    if here.exists():
        return str(here)
    return f"{sys.executable} -m hub"


def reconcile(p: Plan, workdir: Path, db_url: str, say: Say) -> dict[str, int]:
    args = []
    for cluster in p.clusters:
        path = workdir / "nodes" / f"{cluster}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(node_list(p, cluster), indent=2))
        args += ["--nodes-json", f"{cluster}={path}"]
        slices = resource_slices(p, cluster)
        if slices["items"]:
            path = workdir / "nodes" / f"{cluster}-resourceslices.json"
            path.write_text(json.dumps(slices, indent=2))
            args += ["--resourceslices-json", f"{cluster}={path}"]
    proc = _gpufleet("reconcile", "--source", "file", *args, "--db", db_url, "-o", "json")
    if proc.returncode not in (0, 1):
        raise UnavailableError(f"demo: reconcile failed: {_last_line(proc.stderr)}")
    counts: dict[str, int] = {}
    for row in json.loads(proc.stdout):
        counts[row["status"]] = counts.get(row["status"], 0) + 1
        if row.get("mode") in ("dra", "time-slicing") and row["status"] == "match":
            kind = "DRA" if row["mode"] == "dra" else "time-sliced"
            say(f"reconcile: {row['cluster']}/{row['node']}: {kind} node matched "
                f"({row['reason']})")
        if row["status"] != "match":
            where = row["cluster"] + (f"/{row['node']}" if row.get("node") else "")
            say(f"reconcile: {where}: {row['status']}"
                + (f" ({row['reason']})" if row.get("reason") else ""))
    say("reconcile: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return counts


def report_args(db_url: str, push: float = DEMO_PUSH) -> list[str]:
    """The demo's report flags: its max age, push interval and idle rule (the console's)."""
    return ["report", "--db", db_url, "--max-age", format_duration(REPORT_MAX_AGE),
            "--push-interval", format_duration(push),
            "--idle-for", format_duration(DEMO_IDLE_FOR)]


def make_report(db_url: str, hub_url: str, out: Path, say: Say,
                push: float = DEMO_PUSH) -> int:
    """One report run writes the HTML; its own count line (the page's) is what the console
    says, so the two never disagree."""
    proc = _gpufleet(*report_args(db_url, push), "--hub-url", hub_url,
                     "-o", "html", "--out", str(out))
    if proc.returncode not in (0, 1) or not out.exists():
        raise UnavailableError(f"demo: report failed: {_last_line(proc.stderr)}")
    wrote = _last_line(proc.stderr)
    say("report: " + (wrote.rsplit(": ", 1)[1] if wrote.startswith("wrote ") else wrote))
    return proc.returncode
