"""Shared fixtures: a real hub Prometheus and real agents per cluster, on loopback.

A missing ``prometheus`` binary fails these tests loudly (UnavailableError), never skips them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from hub.localstack import PrometheusProcess, StaticServer, hub_config, start_agent

SAMPLES = Path(__file__).resolve().parents[1].parent / "shared" / "samples"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def sample_text(name: str) -> str:
    """Real exporter output from shared/samples, or a fixture written from FIELD_NOTES."""
    for base in (FIXTURES, SAMPLES):
        path = base / name
        if path.exists():
            return path.read_text()
    raise FileNotFoundError(name)


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

    def make(name: str, texts: list[str | Callable[[], str]], **agent_kwargs) -> Cluster:
        servers = [StaticServer(t).start() for t in texts]
        agent = start_agent(tmp_path / f"agent-{name}", name, [s.target for s in servers],
                            hub.url, **agent_kwargs)
        cluster = Cluster(name, agent, servers)
        started.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in started:
            cluster.agent.stop()
            cluster.stop_exporters()


def wait_for(hub_url: str, query: str, predicate: Callable[[list], bool],
             timeout: float = 30.0) -> list:
    """Poll an instant query until the result satisfies the predicate."""
    deadline = time.monotonic() + timeout
    result: list = []
    while time.monotonic() < deadline:
        r = requests.post(f"{hub_url}/api/v1/query", data={"query": query}, timeout=5)
        result = r.json()["data"]["result"]
        if predicate(result):
            return result
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {query!r}; last result: {result}")
