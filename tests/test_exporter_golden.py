"""The exposition of a fixed fake state equals the checked-in files, byte for byte.

The registry is private (no process/platform collectors) and our families are built by hand
and written by ``spoke._naming.render``, so there is no ``_created`` series: the output
depends only on the state below.
Regenerate after an intended change with
``GPUFLEET_UPDATE_GOLDEN=1 pytest tests/test_exporter_golden.py`` and review the diff like
code: these files are the contract with the hub.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from pathlib import Path

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from spoke import AmdSmiBackend, Backend, Exporter, NvmlBackend
from spoke._fakes import MIB, FakeAmdGpu, FakeAmdSmi, FakeMigSlice, FakeNvml, FakeNvmlGpu
from spoke._naming import AMD_FIELDS, DCGM_47, DCGM_47_FIELDS, DCGM_FIELDS, LEGACY

GOLDEN = Path(__file__).parent / "fixtures" / "exporter"


def nvidia_state() -> tuple[FakeNvml, Backend]:
    # GPU 0: an H100 as the real probe answered (every default field, GPM on the whole GPU).
    # GPU 1: an older part under MIG: no serial, memory temperature, encoder, row remapping or
    # ECC (NOT_SUPPORTED per field), so those series are left out for it alone.
    fake = FakeNvml([
        FakeNvmlGpu(uuid="GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005",
                    pci_bus_id="00000000:53:00.0", util=91, power_mw=113_611, temp=30,
                    sm_clock=1980, memory_used=5120 * MIB, memory_reserved=591 * MIB,
                    serial="1652823055404", mem_util=43, dec_util=3, pcie_replays=1,
                    remapped_rows=(2, 1, 0, 0), ecc_sbe=4, clocks_event_reasons=0x4,
                    gpm_metrics={pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 91.5,
                                 pynvml.NVML_GPM_METRIC_SM_UTIL: 88.4,
                                 pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 13.1,
                                 pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 62.25,
                                 pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 40.0,
                                 pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 1490.0,
                                 pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 557.0}),
        FakeNvmlGpu(uuid="GPU-bc5610b9-79c8-fedd-8899-07539c7f868a",
                    pci_bus_id="00000000:64:00.0", power_mw=68_347, temp=29, sm_clock=345,
                    memory_used=20_000 * MIB, memory_reserved=None, xid_events=False,
                    serial=None, memory_temp=None, enc_util=None, dec_util=None,
                    remapped_rows=None, ecc_dbe=None, ecc_sbe=None,
                    mig=[FakeMigSlice(gi_id=2, profile="3g.40gb", slot=0,
                                      memory_total=40_320 * MIB, memory_used=12_288 * MIB,
                                      graphics_util=37.5,
                                      gpm_metrics={pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 20.0}),
                         FakeMigSlice(gi_id=9, profile="1g.10gb", slot=4,
                                      memory_total=9_856 * MIB, memory_used=0)]),
    ], driver="580.105.08")
    return fake, NvmlBackend(nvml=fake)


def amd_state() -> tuple[FakeAmdSmi, Backend]:
    fake = FakeAmdSmi([
        FakeAmdGpu(uuid="5bff74a1-0000-1000-80f6-e4d2c51d0d02", serial="692251001124",
                   gfx_activity=87, vram_used_mb=150_000, power_w=612, edge_temp=None,
                   hotspot_temp=71),
        FakeAmdGpu(uuid="8aff74a1-0000-1000-80f6-e4d2c51d0d03", serial="692251001125",
                   bdf="0000:1d:00.0", gfx_activity="N/A", vram_used_mb=285, power_w=141,
                   edge_temp=36, hotspot_temp=41, temp_scale=1000),  # millidegrees
    ])
    return fake, AmdSmiBackend(amdsmi=fake)


def exposition(backend: Backend, naming: str = LEGACY) -> str:
    ticks = itertools.count(0.0, 0.25)  # every pass "takes" exactly 0.25 s
    exporter = Exporter(backend, hostname="ip-10-0-171-111.ec2.internal", interval=30,
                        version="0.1.0", clock=lambda: 1_763_700_000.0,
                        timer=lambda: next(ticks), naming=naming)
    exporter.collect_once()
    text = exporter.exposition().decode()
    # what /metrics sends (rendered once per collection) holds what the registry yields now
    # (the parser adds _total to the names of counter samples, dcgm's counters have none)
    sent = {(x.name.removesuffix("_total"), tuple(sorted(x.labels.items())), x.value)
            for f in text_string_to_metric_families(text) for x in f.samples}
    held = {(x.name.removesuffix("_total"), tuple(sorted(x.labels.items())), x.value)
            for f in exporter.registry.collect() for x in f.samples}
    assert sent == held
    return text


def nvidia_text(naming: str = LEGACY) -> str:
    fake, backend = nvidia_state()
    backend.open()
    backend.collect()  # registers for XID events, takes the first GPM samples of the slices
    fake.inject_xid(0, 79)
    return exposition(backend, naming)


def amd_text() -> str:
    _, backend = amd_state()
    backend.open()
    return exposition(backend)


CASES = {
    "nvidia.prom": nvidia_text,
    # the same GPUs as dcgm-exporter 4.9 (DCGM 4.7) names them: --sim-naming dcgm-4.7
    "nvidia-dcgm-4.7.prom": lambda: nvidia_text(DCGM_47),
    "amd.prom": amd_text,
}
FIELDS = {"nvidia.prom": DCGM_FIELDS, "nvidia-dcgm-4.7.prom": DCGM_47_FIELDS,
          "amd.prom": AMD_FIELDS}


@pytest.mark.parametrize("name", sorted(CASES))
def test_exposition_matches_golden(name):
    text = CASES[name]()
    path = GOLDEN / name
    if os.environ.get("GPUFLEET_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_is_valid_exposition(name):
    text = (GOLDEN / name).read_text()
    families = list(text_string_to_metric_families(text))
    assert families
    # dcgm's counters have no _total, which prometheus_client's parser files as "unknown";
    # the TYPE lines are what Prometheus reads.
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert set(types.values()) <= {"gauge", "counter"}
    expected = ({f.name for f in FIELDS[name] if f.typ == "counter"}
                | {"gpufleet_exporter_collect_errors_total"})
    assert {n for n, t in types.items() if t == "counter"} == expected
    assert "_created" not in text
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: install the Debian package 'prometheus'"
    # promtool parses the text the way Prometheus will. Its linter's only findings may be the
    # upstream names we copy on purpose: dcgm-exporter's camelCase labels (modelName, UUID)
    # and counters without _total, device-metrics-exporter's gauges ending in _total.
    result = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                            capture_output=True, timeout=30)
    upstream = ("label names should be written in 'snake_case' not 'camelCase'",
                'non-counter metrics should not have "_total" suffix',  # AMD's gauges
                'counter metrics should have "_total" suffix',  # dcgm's counters
                "metric name should not include type 'counter'")  # PCIE_REPLAY_COUNTER
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if line.strip() and not line.endswith(upstream)]
    assert problems == [], result.stdout + result.stderr
