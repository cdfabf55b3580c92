"""Exporter output the tests feed to real agents: real scrapes, fixtures from FIELD_NOTES.

Everything lives in tests/fixtures (real scrapes under tests/fixtures/samples, with SOURCES.md
saying where each came from), so the suite runs in a clone with nothing beside it.
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SAMPLES = FIXTURES / "samples"


def sample_text(name: str) -> str:
    """Real exporter output (fixtures/samples) or a fixture written from FIELD_NOTES."""
    for base in (FIXTURES, SAMPLES):
        path = base / name
        if path.exists():
            return path.read_text()
    raise FileNotFoundError(name)

EAST = ["dcgm-h100-8gpu-aicr-eks-156a357e.prom", "dcgm-h100-8gpu-aicr-eks-19edc950.prom",
        "dcgm-rtx4000ada-lke-linode-podlabels.prom"]
WEST = ["dcgm-a100-mig-lowercase.prom", "dcgm-l40s-upcloud-uks.prom",
        "dcgm-t4-loaded-ericsson-ccd.prom"]
AMD = ["amd-mi300x.prom", "amd-prefixed-vf.prom"]


def series_count(names: list[str]) -> int:
    return sum(1 for n in names for line in sample_text(n).splitlines()
               if line.strip() and not line.startswith("#"))
