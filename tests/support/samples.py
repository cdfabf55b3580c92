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


#: legacy unit -> dcgm-4.7 unit: what one legacy unit is in the new one (FIELD_NOTES, fourth
#: round), written here from the units, not from the hub's factors, so a wrong factor in
#: hub/store/_profiles.py shows as a wrong figure
_NEW_PER_LEGACY = {("%", "0-1"): 0.01, ("MiB", "bytes"): 2.0 ** 20, ("MHz", "Hz"): 1e6,
                   ("mJ", "J"): 1e-3, ("MB/s", "B/s"): 1e6}


def dcgm47(text: str, only_renamed: bool = False) -> str:
    """A dcgm-exporter scrape (or OpenMetrics backfill text) as dcgm-exporter 4.9 (DCGM 4.7)
    would send it: every renamed family under its new name and in its new unit, the driver
    label renamed. ``only_renamed`` keeps only the renamed families (to add to the legacy
    text: a GPU sending both namings)."""
    from hub.store import DCGM_RENAMES

    renames = {r.legacy: (r.dcgm47, _NEW_PER_LEGACY.get((r.legacy_unit, r.dcgm47_unit), 1.0))
               for r in DCGM_RENAMES}
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) > 2 and parts[2] in renames:
                parts[2] = renames[parts[2]][0]
            elif only_renamed or line == "# EOF":
                continue
            out.append(" ".join(parts))
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in renames:
            if not only_renamed and line.strip():
                out.append(line.replace("DCGM_FI_DRIVER_VERSION=",
                                        "DCGM_FI_SYSTEM_DRIVER_VERSION="))
            continue
        new, scale = renames[name]
        cut = line.rindex("}") + 1 if "{" in line else len(name)
        labels = line[len(name):cut].replace("DCGM_FI_DRIVER_VERSION=",
                                             "DCGM_FI_SYSTEM_DRIVER_VERSION=")
        value, *stamp = line[cut:].split()
        out.append(" ".join([new + labels, repr(float(value) * scale), *stamp]))
    if "# EOF" in text and not only_renamed:
        out.append("# EOF")
    return "\n".join(out) + "\n"


def names_in(text: str) -> set[str]:
    """The metric names of exposition text, read off the text itself (not through a hub):
    what a store fed it holds, for the requests a sync asks of it (hub.store.sync_queries'
    ``held``)."""
    return {line.split("{")[0].split()[0] for line in text.splitlines()
            if line.strip() and not line.startswith("#")}


def sync_requests(text: str, shards: int = 1) -> int:
    """The requests of a sync of ``shards`` shards on a store holding ``text``'s series: the
    one that plans the shards, the one that lists the store's metric names, then the queries
    of the fields whose names it holds, once a shard."""
    from hub import store

    return 2 + shards * len(store.sync_queries("10m", "1m", "cluster", held=names_in(text)))

