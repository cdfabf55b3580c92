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
@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A throwaway PostgreSQL 15 on a free loopback port (tests/support/pg.py); a missing
    binary or a failed start fails the test loudly."""
    from tests.support.pg import throwaway_server

    with throwaway_server(fail=pytest.fail) as url:
        yield url


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
