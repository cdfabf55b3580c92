"""`gpufleet serve`: the scheduler that syncs and checks on a schedule, its health and
metrics, and the read-only JSON API over the inventory.
"""

from __future__ import annotations

from hub.service._api import (
    read_only_engine,
)
from hub.service._page import USAGE_SECTIONS
from hub.service._scheduler import (
    Jobs,
    Service,
    build_service,
    describe_error,
)

__all__ = [
    "USAGE_SECTIONS",
    "Jobs",
    "Service",
    "build_service",
    "describe_error",
    "read_only_engine",
]
