"""gpufleet's spoke-side GPU exporter.

Speaks NVIDIA dcgm-exporter's and AMD device-metrics-exporter's metric names and labels, so
the hub cannot tell it from the upstream exporters. Backends take their GPU library as an
argument (``NvmlBackend(nvml=pynvml)``, ``AmdSmiBackend(amdsmi=amdsmi)``); ``Exporter`` reads
them on an interval in the background and ``MetricsServer`` serves the last snapshot.

It runs on every GPU node, so it stays small: of the hub it uses only ``hub.common`` (errors
and exit codes, durations, SIGTERM handling, the click base with ``--config``, the HTTP server
base) and ``hub.__version__``, never the inventory, validation, onboarding or service code, and
it loads none of SQLAlchemy, Alembic, the Kubernetes client or Jinja2 (tests/test_layout.py).
"""

from typing import TYPE_CHECKING

from hub.common import lazy_attributes
from spoke._amdsmi import AmdSmiBackend, load_amdsmi
from spoke._exporter import Exporter, Snapshot
from spoke._http import MetricsServer, parse_listen
from spoke._model import (
    DEFAULT_CADENCE,
    Backend,
    Cadence,
    Collection,
    Failure,
    GpuReading,
    LibraryNotFound,
)
from spoke._nvml import NvmlBackend, load_nvml
from spoke._select import LOADERS, NO_LIBRARY, open_backend

__all__ = [
    "DEFAULT_CADENCE",
    "LOADERS",
    "NO_LIBRARY",
    "AmdSmiBackend",
    "Backend",
    "Cadence",
    "Collection",
    "Exporter",
    "Failure",
    "GpuReading",
    "LibraryNotFound",
    "MetricsServer",
    "NvmlBackend",
    "SimBackend",
    "Snapshot",
    "load_amdsmi",
    "load_nvml",
    "open_backend",
    "parse_listen",
]


if TYPE_CHECKING:
    from spoke._sim import SimBackend

#: The simulated backend and its fakes load only under --backend sim (a GPU node runs nvml
#: or amdsmi and never needs them).
__getattr__ = lazy_attributes(__name__, {"SimBackend": "_sim"})
