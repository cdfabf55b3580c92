"""Shared fixtures: a real hub Prometheus and real agents per cluster, on loopback.

A missing ``prometheus`` binary fails these tests loudly (UnavailableError), never skips them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hub.devstack._acm import MetricsCollector, RbacQueryProxy, hub_args
from hub.devstack._prometheus import PrometheusProcess, StaticServer, hub_config, start_agent


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[PrometheusProcess]:
    proc = PrometheusProcess(tmp_path / "hub", hub_config()).start()
    try:
        yield proc
    finally:
        proc.stop()


@dataclass
class Cluster:
    name: str
    agent: PrometheusProcess
    exporters: list[StaticServer] = field(default_factory=list)

    def stop_exporters(self) -> None:
        for exporter in self.exporters:
            exporter.stop()
        self.exporters = []


@pytest.fixture
def fleet(hub: PrometheusProcess, tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Factory: ``fleet("c1", [text, ...])`` starts exporters and an agent pushing to the hub."""
    started: list[Cluster] = []

    def make(name: str, texts: list[str | Callable[[], str]] = (), *,  # type: ignore[assignment]
             targets: list[str] = (), **agent_kwargs) -> Cluster:  # type: ignore[assignment]
        """Texts are served by static endpoints; targets are real exporters (host:port)."""
        servers = [StaticServer(t).start() for t in texts]
        agent = start_agent(tmp_path / f"agent-{name}", name,
                            [s.target for s in servers] + list(targets), hub.url, **agent_kwargs)
        cluster = Cluster(name, agent, servers)
        started.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in started:
            cluster.agent.stop()
            cluster.stop_exporters()



# -- a hub that behaves like ACM's --------------------------------------------------------------
#: ACM pushes every 300 s and looks back 600 s; the tests keep the ratio at a 100th of the time.
ACM_TEST_PUSH = 3.0
ACM_TEST_LOOKBACK = 6.0


@dataclass
class AcmHub:
    """A hub Prometheus with ACM's look-back, ACM-like pushers and an rbac-query-proxy."""

    hub: PrometheusProcess
    push_interval: float
    collectors: dict[str, MetricsCollector] = field(default_factory=dict)
    proxies: list[RbacQueryProxy] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.hub.url

    def cluster(self, name: str, sources: list, **labels: str) -> MetricsCollector:
        """A cluster's metrics-collector pushing ``sources`` (text, callables or URLs)."""
        collector = MetricsCollector(self.hub.url, name, list(sources),
                                     interval=self.push_interval, extra_labels=labels).start()
        self.collectors[name] = collector
        return collector

    def proxy(self, tokens: dict) -> RbacQueryProxy:
        proxy = RbacQueryProxy(self.hub.url, tokens).start()
        self.proxies.append(proxy)
        return proxy


@pytest.fixture
def acm_hub(tmp_path: Path) -> Iterator[AcmHub]:
    """The ACM hub profile, scaled down: push every 3 s, no staleness markers, look back 6 s,
    ``clusterID`` on every series, and a matcher-injecting query proxy on request."""
    proc = PrometheusProcess(tmp_path / "acm-hub", hub_config(),
                             extra_args=hub_args(ACM_TEST_LOOKBACK)).start()
    acm = AcmHub(proc, ACM_TEST_PUSH)
    try:
        yield acm
    finally:
        for collector in acm.collectors.values():
            collector.stop()
        for proxy in acm.proxies:
            proxy.stop()
        proc.stop()


# -- databases ------------------------------------------------------------------------------
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _pg_tool(name: str) -> str:
    import shutil

    path = shutil.which(name) or (str(PG_BIN / name) if (PG_BIN / name).exists() else None)
    if path is None:
        pytest.fail(f"{name} not found: install PostgreSQL 15 (Debian postgresql-15)")
    return path


def _run(args: list[str]) -> None:
    import subprocess

    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A throwaway PostgreSQL 15 on a free loopback port; as root it runs as 'postgres'.

    It lives in its own /tmp directory because pytest's temp tree is private to root and
    PostgreSQL refuses to run as root.
    """
    import os
    import shutil
    import tempfile

    from hub.devstack import free_port

    base = Path(tempfile.mkdtemp(prefix="gpufleet-pg-"))
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:
        for path in (base, sock):
            shutil.chown(path, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    _run([*as_user, _pg_tool("initdb"), "-D", str(data), "-U", "gpufleet", "--auth=trust",
          "-E", "UTF8"])
    _run([*as_user, _pg_tool("pg_ctl"), "-D", str(data), "-l", str(base / "pg.log"), "-w",
          "start", "-o", f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off"])
    try:
        yield f"postgresql+psycopg://gpufleet@127.0.0.1:{port}"
    finally:
        import subprocess

        subprocess.run([*as_user, _pg_tool("pg_ctl"), "-D", str(data), "-m", "immediate",
                        "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_url(postgres_server: str) -> str:
    """A fresh, empty database on the session's PostgreSQL."""
    from tests.support.pg import create_database

    return create_database(postgres_server)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every sync test runs on both databases the inventory supports."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'inventory.db'}"
    return request.getfixturevalue("pg_url")
