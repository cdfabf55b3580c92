"""``gpufleet exporter``: the click layer over ``spoke``; parsing and exit codes only."""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING, Any

import click

from hub.common import DURATION, ConfiguredCommand, InputError, UnavailableError, env, on_sigterm
from spoke._edges import Edges
from spoke._exporter import Exporter
from spoke._http import DEFAULT_PORT, MetricsServer, parse_listen
from spoke._model import DEFAULT_CADENCE, KUBELET_SOCKET, Backend, Cadence, LibraryNotFound
from spoke._naming import LEGACY, NAMINGS, select_fields
from spoke._select import LOADERS, open_backend

if TYPE_CHECKING:
    from spoke._podresources import KubeletPods


class _Terminated(BaseException):
    """SIGTERM arrived: Kubernetes is stopping the pod; shut down cleanly, exit 0."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated


def _pod_source(path: str, timeout: float) -> KubeletPods | None:
    """The kubelet client, imported only when its socket is there (grpcio stays unloaded)."""
    if not path:
        logging.getLogger("spoke.exporter").info("pod attribution off (--kubelet-socket '')")
        return None
    if not os.path.exists(path):
        logging.getLogger("spoke.exporter").info(
            "pod attribution off: kubelet pod-resources socket %s not found", path)
        return None
    from spoke._podresources import KubeletPods

    return KubeletPods(path, timeout)


def _listen_address(listen: str | None, port: int | None) -> tuple[str, int]:
    if listen and port is not None:
        raise InputError("give --listen HOST:PORT or --port PORT, not both")
    if port is not None:
        return "0.0.0.0", port
    try:
        return parse_listen(listen or f"0.0.0.0:{DEFAULT_PORT}")
    except ValueError as exc:
        raise InputError(str(exc)) from None


@click.command(cls=ConfiguredCommand)
@click.option("--backend", type=click.Choice(["auto", "nvml", "amdsmi", "sim"]),
              default="auto", show_default=True, envvar=env("backend"),
              help="GPU library: auto tries NVML, then AMD SMI; sim serves a simulated node.")
@click.option("--listen", envvar=env("listen"), metavar="HOST:PORT",
              help=f"Address to serve /metrics and /healthz on [default: 0.0.0.0:{DEFAULT_PORT}].")
@click.option("--port", type=click.IntRange(0, 65535), envvar=env("port"),
              help="Short for --listen 0.0.0.0:PORT.")
@click.option("--interval", type=DURATION, default="30s", show_default=True,
              envvar=env("interval"), metavar="DURATION",
              help="How often to read the GPUs (scrapes return the last reading).")
@click.option("--slow-interval", type=DURATION, default=f"{DEFAULT_CADENCE.slow:g}s",
              show_default=True, envvar=env("slow-interval"), metavar="DURATION",
              help="How often to read the costly counters (NVML energy, PCIe replays); "
                   "between reads the last value is served. Counters lose nothing.")
@click.option("--prof-interval", type=DURATION, default=f"{DEFAULT_CADENCE.prof:g}s",
              show_default=True, envvar=env("prof-interval"), metavar="DURATION",
              help="How often to take a GPM sample for the DCGM_FI_PROF_* ratios (each the "
                   "average since the previous sample).")
@click.option("--node-name", "--sim-node", "node_name", envvar=[env("node-name"), "NODE_NAME"],
              help="Hostname label of every series [default: $NODE_NAME, else the host name]; "
                   "with --backend sim it also seeds the simulated UUIDs.")
@click.option("--sim-gpus", type=click.IntRange(1, 4096), default=8, show_default=True,
              envvar=env("sim-gpus"), help="Simulated GPUs on the node.")
@click.option("--sim-vendor", type=click.Choice(["nvidia", "amd"]), default="nvidia",
              show_default=True, envvar=env("sim-vendor"),
              help="Simulate dcgm-exporter (nvidia) or device-metrics-exporter (amd) output.")
@click.option("--sim-model", envvar=env("sim-model"),
              help="Simulated model name [default: NVIDIA H100 80GB HBM3 / AMD Instinct MI300X].")
@click.option("--sim-mig", envvar=env("sim-mig"), metavar="PROFILES",
              help="Split every simulated NVIDIA GPU into MIG slices, "
                   "e.g. 3g.40gb,2g.20gb,1g.10gb.")
@click.option("--sim-seed", type=int, default=0, show_default=True, envvar=env("sim-seed"),
              help="Seed of the simulated UUIDs, serials and load curves.")
@click.option("--sim-fault", "sim_faults", multiple=True, metavar="INDEX:FAULT",
              help="Inject a fault into simulated GPU INDEX: xid=N, ecc_dbe=N or "
                   "remap_failure (repeatable), e.g. --sim-fault 3:xid=79.")
@click.option("--sim-idle", envvar=env("sim-idle"), metavar="INDEX,...",
              help="Simulated GPUs that do nothing (0 %, idle power and temperature), "
                   "e.g. an allocated notebook nobody uses: --sim-idle 0,3.")
@click.option("--sim-naming", type=click.Choice(NAMINGS), default=LEGACY, show_default=True,
              envvar=env("sim-naming"),
              help="Name the simulated NVIDIA series as dcgm-exporter up to 4.8 does (legacy) "
                   "or as 4.9 does (dcgm-4.7: new names and units, "
                   "DCGM_FI_SYSTEM_DRIVER_VERSION).")
@click.option("--fields", envvar=env("fields"), metavar="NAME,...",
              help="Publish only these fields (dcgm names with or without DCGM_FI_, AMD names) "
                   "[default: dcgm-exporter's / device-metrics-exporter's default set plus "
                   "the health fields the hub reads].")
@click.option("--kubelet-socket", envvar=env("kubelet-socket"), default=KUBELET_SOCKET,
              show_default=True, metavar="PATH",
              help="Kubelet pod-resources socket for pod/namespace/container labels; off "
                   "when absent (logged once) or set to ''.")
@click.option("--kubelet-timeout", type=DURATION, default="1s", show_default=True,
              envvar=env("kubelet-timeout"), metavar="DURATION",
              help="Longest wait for the kubelet per collection (then no pod labels that pass).")
@click.option("--push-interval", type=DURATION, default="300s", show_default=True,
              envvar=env("push-interval"), metavar="DURATION",
              help="How often the spoke's samples reach the hub (ACM: 300s): an ended "
                   "allocation's edges stay published for twice this plus one --interval, so "
                   "a push carries them.")
@click.pass_context
def exporter(ctx: click.Context, backend: str, listen: str | None, port: int | None,
             interval: float, slow_interval: float, prof_interval: float,
             node_name: str | None, sim_gpus: int, sim_vendor: str,
             sim_model: str | None, sim_mig: str | None, sim_seed: int,
             sim_faults: tuple[str, ...], sim_idle: str | None, sim_naming: str,
             fields: str | None,
             kubelet_socket: str, kubelet_timeout: float, push_interval: float,
             **_: Any) -> None:
    """Serve GPU metrics with dcgm-exporter's or AMD device-metrics-exporter's names.

    For nodes that cannot run the vendor exporters: the hub reads this output exactly like
    theirs. GPUs are read every --interval in the background; a scrape returns the last
    reading and never waits on the GPU library or the kubelet. With the kubelet's
    pod-resources socket mounted, each allocated GPU's series carry pod, namespace and
    container, and each allocation's start and end are published
    (gpufleet_allocation_start/end_timestamp_seconds) so the hub bills it from its edges.
    Exit 3 when no GPU library is found.
    """
    host, bind_port = _listen_address(listen, port)
    if interval <= 0:
        raise InputError("--interval must be greater than 0")
    if kubelet_timeout <= 0:
        raise InputError("--kubelet-timeout must be greater than 0")
    if push_interval <= 0:
        raise InputError("--push-interval must be greater than 0")
    for option, value in (("--slow-interval", slow_interval), ("--prof-interval", prof_interval)):
        if value <= 0:
            raise InputError(f"{option} must be greater than 0")
    if sim_naming != LEGACY and (backend != "sim" or sim_vendor != "nvidia"):
        raise InputError("--sim-naming applies to --backend sim --sim-vendor nvidia only")
    cadence = Cadence(slow=slow_interval, prof=prof_interval).within(interval)
    hostname = node_name or socket.gethostname()
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    gpu: Backend
    if backend == "sim":
        from spoke._sim import SimBackend, parse_fault, parse_indices  # the fakes: sim only

        try:
            faults = [parse_fault(f) for f in sim_faults]
            idle = parse_indices(sim_idle)
            gpu = SimBackend(vendor=sim_vendor, gpus=sim_gpus, model=sim_model, mig=sim_mig,
                             seed=sim_seed, node=hostname, faults=faults, idle=idle,
                             cadence=cadence)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        gpu.open()
    else:
        obj = ctx.obj if isinstance(ctx.obj, dict) else {}
        try:
            gpu = open_backend(backend, obj.get("loaders", LOADERS), cadence)
        except LibraryNotFound as exc:
            raise UnavailableError(str(exc)) from None

    pods: KubeletPods | None = None
    try:
        try:
            chosen = select_fields(gpu.vendor, fields.split(",") if fields else None,
                                   sim_naming)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        pods = _pod_source(kubelet_socket, kubelet_timeout)
        edges = Edges(linger=2 * push_interval + interval) if pods is not None else None
        exp = Exporter(gpu, hostname=hostname, interval=interval, fields=chosen, pods=pods,
                       naming=sim_naming, edges=edges)
        try:
            server = MetricsServer(exp, host, bind_port)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise InputError(f"cannot listen on {host}:{bind_port}: {reason}") from None
        try:
            exp.start()
            click.echo(f"gpufleet exporter: serving http://{host}:{server.port}/metrics "
                       f"(backend {gpu.name}, {exp.snapshot.gpus} GPUs, Hostname {hostname}, "
                       f"every {interval:g}s)", err=True)
            with on_sigterm(_raise_terminated):
                try:
                    server.serve_forever()
                except _Terminated:
                    click.echo("gpufleet exporter: terminated, shutting down", err=True)
        finally:
            exp.stop()
            server.server_close()
    finally:
        if pods is not None:
            pods.close()
        gpu.close()
