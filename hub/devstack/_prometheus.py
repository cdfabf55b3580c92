"""Start real Prometheus processes (a hub with the remote-write receiver, agents per cluster)
and tiny HTTP endpoints on loopback.

Used by the tests, the demo and the benchmarks, so all three exercise the same real
remote-write and PromQL path that Thanos Receive speaks. Every process is tracked and stopped;
nothing is left running.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import requests
import yaml

from hub.common import QuietHangups, UnavailableError


def free_port() -> int:
    """A loopback port that no other process is handed before our server binds it.

    Bound, listened on, connected to and closed from the accepting side, the port sits in
    TIME_WAIT: the kernel gives it to no other ``bind(port 0)`` meanwhile (the race four test
    workers hit when a port was merely bound and closed), while the servers we start on it
    all set SO_REUSEADDR (Go's net.Listen, PostgreSQL, Python's socketserver, uvicorn) and
    bind it at once. PrometheusProcess also retries on another port if the bind still fails.
    """
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            accepted, _ = server.accept()
            accepted.close()  # the accepting side closes first: its port goes to TIME_WAIT
    return port


#: how often a server on a port of free_port() is started again on another when the bind
#: fails all the same (another program chose the port explicitly)
PORT_ATTEMPTS = 3


def require_binary(name: str) -> str:
    """Path of a binary we need; a clear error (never a skip) when it is missing."""
    path = shutil.which(name)
    if path is None:
        raise UnavailableError(
            f"{name} not found on PATH: install the Debian package 'prometheus' (make setup does)"
        )
    return path


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGTERM and SIGINT wait until the block ends, then act as they would have.

    The block is short (a fork and an exec): long enough for a signal to land between the
    child's start and ``self.proc`` naming it, which left an agent Prometheus running that
    no one could stop. Only the main thread receives signals, so elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum))
                for sig in held}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


class PrometheusProcess:
    """One ``prometheus`` process with its own data directory and port."""

    def __init__(self, workdir: Path, config: dict, *, agent: bool = False,
                 extra_args: list[str] | None = None, port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self._own_port = port is None  # ours to change if the bind fails (see start)
        self.agent = agent
        self.config_path = self.workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = self.workdir / "prometheus.log"
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.scheme = "http"
        #: (cert, key) for the readiness probe when the web config demands client certificates
        self.client_cert: tuple[str, str] | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> PrometheusProcess:
        """Start and wait until ready; on a port that turned out taken, again on another."""
        for attempt in range(PORT_ATTEMPTS):
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                return self._start_once(timeout)
            except UnavailableError:
                with self.log_path.open("rb") as log:
                    log.seek(logged)
                    taken = b"address already in use" in log.read()
                if not (taken and self._own_port and attempt + 1 < PORT_ATTEMPTS):
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> PrometheusProcess:
        binary = require_binary("prometheus")
        data = self.workdir / ("wal" if self.agent else "data")
        args = [
            binary,
            f"--config.file={self.config_path}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        if self.agent:
            # A short flush deadline: an agent whose hub is gone stops in 1 s, not 1 min.
            args += ["--enable-feature=agent", f"--storage.agent.path={data}",
                     "--storage.remote.flush-deadline=1s"]
        else:
            args += [f"--storage.tsdb.path={data}", "--web.enable-remote-write-receiver"]
        args += self.extra_args
        log = self.log_path.open("ab")
        with signals_held():  # a Ctrl-C inside Popen would orphan the child it just forked
            self.proc = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True)
        try:
            self.wait_ready(timeout)
        except BaseException:  # Ctrl-C or not ready: never leave the process behind
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        verify: bool | str = False
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise UnavailableError(
                    f"prometheus exited with {self.proc.returncode}: "
                    + self.log_path.read_text()[-500:]
                )
            with contextlib.suppress(requests.RequestException), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the probe does not verify TLS on purpose
                r = requests.get(f"{self.url}/-/ready", timeout=1, verify=verify,
                                 cert=self.client_cert)
                if r.status_code in (200, 401):
                    return
            time.sleep(0.1)
        raise UnavailableError(f"prometheus on port {self.port} not ready after {timeout:.0f}s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


def hub_config() -> dict:
    """A hub that only receives (no scraping of its own)."""
    return {"global": {"scrape_interval": "15s"}}


def agent_config(cluster: str, targets: list[str], remote_write_url: str, *,
                 scrape_interval: str = "1s", cluster_label: str = "cluster",
                 metrics_path: str = "/metrics") -> dict:
    """A spoke's Prometheus agent: scrape the exporters, push with the cluster label."""
    return {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "external_labels": {cluster_label: cluster},
        },
        "scrape_configs": [
            {
                "job_name": "gpu-exporter",
                "metrics_path": metrics_path,
                # Keep the exporter's own labels (Hostname, pod, ...), as dcgm-exporter expects.
                "honor_labels": True,
                "static_configs": [{"targets": targets}],
            }
        ],
        "remote_write": [
            {
                "url": remote_write_url,
                "queue_config": {
                    "batch_send_deadline": "500ms",
                    "min_backoff": "100ms",
                    "max_backoff": "1s",
                },
            }
        ],
    }


def agent_process(workdir: Path, cluster: str, targets: list[str], hub_url: str,
                  **kwargs) -> PrometheusProcess:
    """A spoke's agent, not started yet: a caller that must stop whatever it started holds
    it before it runs (see the demo's Fleet)."""
    config = agent_config(cluster, targets, f"{hub_url}/api/v1/write", **kwargs)
    return PrometheusProcess(workdir, config, agent=True)


def start_agent(workdir: Path, cluster: str, targets: list[str], hub_url: str,
                **kwargs) -> PrometheusProcess:
    return agent_process(workdir, cluster, targets, hub_url, **kwargs).start()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: StaticServer

    def do_GET(self) -> None:
        body = self.server.respond(self.path)
        if body is None:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        return


class StaticServer(QuietHangups, http.server.ThreadingHTTPServer):
    """Serves exporter text at /metrics from a function, so tests can change or stop it."""

    daemon_threads = True

    def __init__(self, source: Callable[[], str] | str, port: int | None = None) -> None:
        super().__init__(("127.0.0.1", port or 0), _Handler)
        self.source = source
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    def respond(self, path: str) -> str | None:
        if path.split("?")[0] != "/metrics":
            return None
        return self.source() if callable(self.source) else self.source

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def start(self) -> StaticServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


@contextlib.contextmanager
def running(*things: PrometheusProcess | StaticServer) -> Iterator[None]:
    try:
        yield
    finally:
        for thing in reversed(things):
            thing.stop()
