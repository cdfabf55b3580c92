"""A local fleet of real processes (hub Prometheus with the remote-write receiver, agents,
static exporters) for the demo, the tests and the benchmarks, and the demo itself; and a hub
profile that behaves like ACM Observability's (sparse pushes, long look-back, query proxy).
"""

from __future__ import annotations

from hub.devstack._acm import (
    MetricsCollector,
    RbacQueryProxy,
    Scope,
    hub_args,
    inject_matchers,
)
from hub.devstack._demo import (
    DEMO_BUCKET,
    DEMO_HUB_PORT,
    DEMO_IDLE_FOR,
    REPORT_MAX_AGE,
    collect_usage,
    demo_usage_commands,
    gpufleet_command,
    keep_syncing,
    report_args,
    run,
)
from hub.devstack._prometheus import (
    PrometheusProcess,
    free_port,
    hub_config,
    require_binary,
)

__all__ = [
    "DEMO_BUCKET",
    "DEMO_HUB_PORT",
    "DEMO_IDLE_FOR",
    "REPORT_MAX_AGE",
    "MetricsCollector",
    "PrometheusProcess",
    "RbacQueryProxy",
    "Scope",
    "collect_usage",
    "demo_usage_commands",
    "free_port",
    "gpufleet_command",
    "hub_args",
    "hub_config",
    "inject_matchers",
    "keep_syncing",
    "report_args",
    "require_binary",
    "run",
]
