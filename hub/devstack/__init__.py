"""A local fleet of real processes (hub Prometheus with the remote-write receiver, agents,
static exporters) for the demo, the tests and the benchmarks, and the demo itself.
"""

from __future__ import annotations

from hub.devstack._demo import (
    gpufleet_command,
    keep_syncing,
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
    "gpufleet_command",
    "hub_config",
    "keep_syncing",
    "require_binary",
    "run",
]
