"""`capacity` counts GPU-equivalents (a MIG slice is its share of its GPU), where `sync` and
`inventory` count whole GPUs: its table says so under the figures, so a total of 1.4286
beside the sync's "2 GPUs" reads as what it is. JSON and CSV stay bare rows for scripts."""

from __future__ import annotations

import json

from hub.commands.usage import CAPACITY_FOOTER
from hub.inventory import _db as inv
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._writer import InventoryWriter
from tests.support.clirun import gpufleet


def test_capacity_table_says_its_figures_are_gpu_equivalents(tmp_path):
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    engine = inv.make_engine(url, create=True)
    migrate.ensure_schema(engine)
    h100 = dict(model="NVIDIA H100 80GB HBM3", sample_at=1.0e9)
    with engine.begin() as conn:
        writer = InventoryWriter(conn, inv.now_utc())
        writer.add([
            Observation("c1", "n1", "GPU-whole", "nvidia", memory_total_mib=81559.0, **h100),
            Observation("c1", "n1", "GPU-mig", "nvidia", memory_total_mib=81559.0, **h100),
            Observation("c1", "n1", "GPU-mig", "nvidia", mig_profile="3g.40gb",
                        mig_instance="1", **h100),
        ])
        writer.finish()
    engine.dispose()
    env = {"GPUFLEET_DB": url}

    table = gpufleet("capacity", env=env)
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[-1] == CAPACITY_FOOTER
    assert "GPU-equivalents (a MIG slice is its share of the GPU" in CAPACITY_FOOTER
    rows = json.loads(gpufleet("capacity", "-o", "json", env=env).stdout)  # no footer in it
    total = rows[0]["total"]
    assert total != int(total)  # a fraction: the slice's share, not the sync's 2 GPUs
    assert CAPACITY_FOOTER not in gpufleet("capacity", "-o", "csv", env=env).output
