"""inventory_frame: the inventory tables as the DataFrames docs/usage.md shows analysts."""

from __future__ import annotations

import pytest

from hub import inventory as inv
from hub.common import InputError
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations


def test_inventory_frames_hold_what_the_cli_lists(tmp_path):
    engine = inv.make_engine(f"sqlite:///{tmp_path / 'inv.db'}", create=True)
    inv.ensure_schema(engine)
    seen = [Observation("east", "n1", "GPU-a", "nvidia", index=0, model="NVIDIA H100",
                        utilisation_pct=80.0, sample_at=1.8e9,
                        allocations=frozenset({("ml", "train-0", "c")})),
            Observation("east", "n1", "GPU-b", "nvidia", index=1, model="NVIDIA H100",
                        utilisation_pct=0.0, sample_at=1.8e9),
            Observation("west", "n9", "amd-1", "amd", index=0, sample_at=1.8e9)]
    with engine.begin() as conn:
        apply_observations(conn, seen, inv.now_utc())
    with engine.connect() as conn:
        gpus = inv.inventory_frame(conn)
        assert list(gpus.columns) == inv.GPU_COLUMNS
        assert gpus.groupby("cluster").uuid.count().to_dict() == {"east": 2, "west": 1}
        assert gpus.set_index("uuid").utilisation_pct["GPU-a"] == 80.0
        east = inv.inventory_frame(conn, "nodes", cluster="east")
        assert east[["node", "gpus"]].values.tolist() == [["n1", 2]]
        alloc = inv.inventory_frame(conn, "allocations")
        assert alloc[["uuid", "namespace", "pod"]].values.tolist() == [["GPU-a", "ml", "train-0"]]
        assert sorted(inv.inventory_frame(conn, "clusters").cluster) == ["east", "west"]
        with pytest.raises(InputError, match="'racks' is not one of gpus, nodes"):
            inv.inventory_frame(conn, "racks")
