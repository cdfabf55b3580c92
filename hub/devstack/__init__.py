"""A local fleet of real processes (hub Prometheus with the remote-write receiver, agents,
static exporters) for the demo, the tests and the benchmarks, and the demo itself.
"""

from __future__ import annotations

from hub.devstack._demo import (
    run,
)
from hub.devstack._prometheus import (
    PrometheusProcess,
    free_port,
    hub_config,
    require_binary,
)

__all__ = [
    "PrometheusProcess",
    "free_port",
    "hub_config",
    "require_binary",
    "run",
]
