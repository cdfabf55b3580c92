"""The simulated exporter speaks dcgm-exporter 4.9's names (DCGM 4.7): ``--sim-naming``.

The conversions below are written out again from shared/FIELD_NOTES.md's table (not read
from spoke._naming), so a wrong factor or name in the exporter fails here.
"""

from __future__ import annotations

import pytest

from spoke import Exporter, SimBackend
from spoke._naming import DCGM_47, LEGACY, select_fields

MIB = 2**20
#: new name -> (legacy name, new value per legacy unit)
TABLE = {
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": ("DCGM_FI_DEV_SM_CLOCK", 1e6),
    "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": ("DCGM_FI_DEV_MEM_CLOCK", 1e6),
    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),
    "DCGM_FI_DEV_GPU_UTIL_RATIO": ("DCGM_FI_DEV_GPU_UTIL", 0.01),
    "DCGM_FI_DEV_MEMORY_UTIL_RATIO": ("DCGM_FI_DEV_MEM_COPY_UTIL", 0.01),
    "DCGM_FI_DEV_ENC_UTIL_RATIO": ("DCGM_FI_DEV_ENC_UTIL", 0.01),
    "DCGM_FI_DEV_DEC_UTIL_RATIO": ("DCGM_FI_DEV_DEC_UTIL", 0.01),
    "DCGM_FI_DEV_FB_FREE_BYTES": ("DCGM_FI_DEV_FB_FREE", MIB),
    "DCGM_FI_DEV_FB_USED_BYTES": ("DCGM_FI_DEV_FB_USED", MIB),
    "DCGM_FI_DEV_FB_RESERVED_BYTES": ("DCGM_FI_DEV_FB_RESERVED", MIB),
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": ("DCGM_FI_DEV_GPU_TEMP", 1),
    "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS": ("DCGM_FI_DEV_MEMORY_TEMP", 1),
    "DCGM_FI_DEV_BOARD_POWER_WATTS": ("DCGM_FI_DEV_POWER_USAGE", 1),
    "DCGM_FI_DEV_PCIE_REPLAY_TOTAL": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1),
    "DCGM_FI_DEV_XID_ERROR": ("DCGM_FI_DEV_XID_ERRORS", 1),
    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1),
    "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL": ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 1),
    "DCGM_FI_DEV_ROW_REMAP_FAILED": ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1),
    "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO": ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1),
    "DCGM_FI_PROF_TENSOR_UTIL_RATIO": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1),
    "DCGM_FI_PROF_DRAM_UTIL_RATIO": ("DCGM_FI_PROF_DRAM_ACTIVE", 1),
    "DCGM_FI_PROF_SM_UTIL_RATIO": ("DCGM_FI_PROF_SM_ACTIVE", 1),
    "DCGM_FI_PROF_SM_OCCUPANCY_RATIO": ("DCGM_FI_PROF_SM_OCCUPANCY", 1),
}
UNRENAMED = {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
             "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_PROF_PCIE_TX_BYTES",
             "DCGM_FI_PROF_PCIE_RX_BYTES"}
OLD_DRIVER, NEW_DRIVER = "DCGM_FI_DRIVER_VERSION", "DCGM_FI_SYSTEM_DRIVER_VERSION"

Key = tuple[str, frozenset[tuple[str, str]]]


def served(naming: str, t: float, **sim) -> dict[Key, float]:
    """Series of one collection of a simulated node at time ``t`` (two passes: GPM needs
    two samples), keyed by name and labels with the driver label spelt the legacy way."""
    backend = SimBackend(clock=lambda: t, node="node-a", seed=3, **sim)
    backend.open()
    exporter = Exporter(backend, hostname="node-a", interval=30, naming=naming)
    exporter.collect_once()
    snapshot = exporter.collect_once()
    out: dict[Key, float] = {}
    for family in snapshot.families:
        for s in family.samples:
            if s.name.startswith("DCGM_FI_"):
                labels = {(OLD_DRIVER if k == NEW_DRIVER else k): v for k, v in s.labels.items()}
                out[(s.name, frozenset(labels.items()))] = s.value
    return out


@pytest.mark.parametrize("t", [1000.0, 1130.0, 4321.5])
@pytest.mark.parametrize("sim", [{"gpus": 3}, {"gpus": 2, "mig": "3g.40gb,2g.20gb"}])
def test_every_dcgm_47_value_is_the_legacy_value_converted(t, sim):
    legacy, new = served(LEGACY, t, **sim), served(DCGM_47, t, **sim)
    renamed = {(TABLE[n][0] if n in TABLE else n, labels): v
               for (n, labels), v in new.items() if n != "DCGM_FI_DEV_FB_CAPACITY_BYTES"}
    assert renamed.keys() == legacy.keys()  # one new series for every legacy one, same labels
    for (name, labels), value in new.items():
        if name in TABLE:
            old, factor = TABLE[name]
            assert value == pytest.approx(legacy[(old, labels)] * factor, rel=1e-12), name
        elif name != "DCGM_FI_DEV_FB_CAPACITY_BYTES":
            assert name in UNRENAMED and value == legacy[(name, labels)]
    assert any(n == "DCGM_FI_PROF_SM_UTIL_RATIO" for n, _ in new)
    assert not {n for n, _ in new} & {old for old, _ in TABLE.values()}


def test_capacity_is_total_memory_in_bytes_where_used_plus_free_plus_reserved_was():
    legacy, new = served(LEGACY, 2000.0, gpus=2), served(DCGM_47, 2000.0, gpus=2)
    capacity = {labels: v for (n, labels), v in new.items()
                if n == "DCGM_FI_DEV_FB_CAPACITY_BYTES"}
    assert len(capacity) == 2
    for labels, value in capacity.items():
        total_mib = sum(legacy[(n, labels)] for n in (
            "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"))
        assert value == total_mib * MIB


def test_driver_label_is_renamed_and_nothing_else():
    backend = SimBackend(clock=lambda: 1000.0, gpus=1)
    backend.open()
    snapshot = Exporter(backend, hostname="n", interval=30, naming=DCGM_47).collect_once()
    labels = next(s.labels for f in snapshot.families for s in f.samples
                  if s.name == "DCGM_FI_DEV_GPU_UTIL_RATIO")
    assert labels[NEW_DRIVER] == "580.105.08" and OLD_DRIVER not in labels
    assert {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"} <= set(labels)


def test_fields_may_be_named_either_way_under_the_new_naming():
    chosen = select_fields("nvidia", ["DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED_BYTES"], DCGM_47)
    assert [f.name for f in chosen] == ["DCGM_FI_DEV_GPU_UTIL_RATIO",
                                        "DCGM_FI_DEV_FB_USED_BYTES"]
    with pytest.raises(ValueError, match="only for NVIDIA"):
        select_fields("amd", None, DCGM_47)
