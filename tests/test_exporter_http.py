"""The real HTTP server: /metrics and /healthz, and scrapes that never reach the backend."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import requests

from spoke import Collection, Exporter, GpuReading, MetricsServer, SimBackend, parse_listen


@pytest.fixture
def serve():
    """Factory: start an exporter and its HTTP server on a free loopback port."""
    started: list[tuple[Exporter, MetricsServer]] = []

    def make(exporter: Exporter, *, start: bool = True) -> MetricsServer:
        if start:
            exporter.start()
        server = MetricsServer(exporter, "127.0.0.1", 0).start()
        started.append((exporter, server))
        return server

    yield make
    for exporter, server in started:
        server.stop()
        exporter.stop()


def test_sim_backend_served_over_http(serve):
    backend = SimBackend(gpus=4, node="node-a")
    backend.open()
    server = serve(Exporter(backend, hostname="node-a", interval=1))
    r = requests.get(f"{server.url}/metrics", timeout=5)
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert r.text.count("DCGM_FI_DEV_GPU_TEMP{") == 4
    assert 'Hostname="node-a"' in r.text
    assert "gpufleet_exporter_up{" in r.text
    health = requests.get(f"{server.url}/healthz", timeout=5)
    assert (health.status_code, health.text) == (200, "ok\n")
    assert requests.get(f"{server.url}/nope", timeout=5).status_code == 404


class BlockingBackend:
    """Counts calls; every call after the first blocks until released (a hung NVML)."""

    name = "fake"
    vendor = "nvidia"

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()
        self.second_call = threading.Event()

    def open(self) -> None: ...

    def close(self) -> None: ...

    def collect(self) -> Collection:
        self.calls += 1
        if self.calls > 1:
            self.second_call.set()
            self.release.wait(30)
        return Collection((GpuReading(index=0, uuid=f"GPU-{self.calls}", model="m",
                                      temp_c=40.0),), (), 1)


def test_scrape_never_calls_the_backend_even_when_it_hangs(serve):
    backend = BlockingBackend()
    exporter = Exporter(backend, hostname="n", interval=0.05, stall_after=60)
    server = serve(exporter)
    assert backend.second_call.wait(5)  # the collector thread is now stuck in the library
    session = requests.Session()
    try:
        for _ in range(20):
            started = time.perf_counter()
            r = session.get(f"{server.url}/metrics", timeout=2)
            assert time.perf_counter() - started < 1.0
            assert 'UUID="GPU-1"' in r.text  # the last finished snapshot
        assert backend.calls == 2
        assert session.get(f"{server.url}/healthz", timeout=2).status_code == 200
    finally:
        backend.release.set()


def test_healthz_fails_when_collection_stalls(serve):
    backend = BlockingBackend()
    server = serve(Exporter(backend, hostname="n", interval=0.05, stall_after=0.3))
    try:
        assert backend.second_call.wait(5)
        time.sleep(0.5)
        r = requests.get(f"{server.url}/healthz", timeout=2)
        assert r.status_code == 503
        assert r.text.startswith("collection stalled")
        assert "DCGM_FI_DEV_GPU_TEMP" in requests.get(f"{server.url}/metrics", timeout=2).text
    finally:
        backend.release.set()


def test_healthz_before_first_collection(serve):
    server = serve(Exporter(BlockingBackend(), hostname="n", interval=30), start=False)
    r = requests.get(f"{server.url}/healthz", timeout=2)
    assert r.status_code == 503
    metrics = requests.get(f"{server.url}/metrics", timeout=2).text
    assert "gpufleet_exporter_up{" in metrics and "DCGM_" not in metrics


def test_port_in_use_raises_at_bind(serve):
    server = serve(Exporter(BlockingBackend(), hostname="n"), start=False)
    with pytest.raises(OSError):
        MetricsServer(Exporter(BlockingBackend(), hostname="n"), "127.0.0.1", server.port)


@pytest.mark.parametrize(("text", "expected"), [
    ("0.0.0.0:9400", ("0.0.0.0", 9400)),
    (":9500", ("0.0.0.0", 9500)),
    ("[::1]:9400", ("::1", 9400)),
    ("localhost:0", ("localhost", 0)),
])
def test_parse_listen(text, expected):
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["nonsense", "host:", "host:99999", "::1:9400", "a:b"])
def test_parse_listen_rejects(text):
    with pytest.raises(ValueError, match="invalid"):
        parse_listen(text)


def test_a_scraper_that_hangs_up_leaves_no_traceback(capsys):
    """The demo's agents stop while they scrape: the exporter's server says nothing of the
    broken pipe (any other error still prints its traceback)."""
    import http.server

    import requests

    from hub.common import BackgroundHTTPServer

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/gone":
                raise BrokenPipeError(32, "Broken pipe")
            raise ValueError("a bug of ours")

        def log_message(self, format: str, *args: object) -> None:
            return

    server = BackgroundHTTPServer("127.0.0.1", 0, Failing).start()
    try:
        for path in ("/gone", "/bug"):
            with contextlib.suppress(requests.RequestException):
                requests.get(server.url + path, timeout=5)
    finally:
        server.stop()
    err = capsys.readouterr().err
    assert "BrokenPipeError" not in err
    assert "ValueError: a bug of ours" in err
