"""A real hub Prometheus holding past hours of known samples (promtool backfill)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from hub.devstack import PrometheusProcess, require_binary
from hub.devstack._prometheus import hub_config

Series = tuple[str, str, Callable[[float], float | None]]  # name, labels, value at t (None=gap)


def openmetrics(series: Iterable[Series], times: list[float]) -> str:
    """OpenMetrics text: one family per name, samples in time order within each series."""
    families: dict[str, list[tuple[str, Callable[[float], float | None]]]] = {}
    for name, labels, value in series:
        families.setdefault(name, []).append((labels, value))
    out = []
    for name, members in families.items():
        out.append(f"# TYPE {name} gauge")
        for labels, value in members:
            for t in times:
                v = value(t)
                if v is not None:
                    out.append(f"{name}{{{labels}}} {v} {t:.3f}")
    out.append("# EOF")
    return "\n".join(out) + "\n"


def backfilled_hub(workdir: Path, text: str) -> PrometheusProcess:
    """Write the blocks with promtool, then start (not yet started) a hub on them."""
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    om = workdir / "backfill.om"
    om.write_text(text)
    subprocess.run([require_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics",
                    str(om), str(data)], check=True, capture_output=True)
    return PrometheusProcess(workdir, hub_config())
