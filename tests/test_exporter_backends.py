"""NVML and AMD SMI backends, driven through fake libraries passed in (no patching)."""

from __future__ import annotations

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from spoke import AmdSmiBackend, Exporter, LibraryNotFound, NvmlBackend, SimBackend
from spoke._amdsmi import _celsius
from spoke._fakes import (
    MIB,
    FakeAmdGpu,
    FakeAmdSmi,
    FakeMigSlice,
    FakeNvml,
    FakeNvmlGpu,
)

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(exporter: Exporter) -> Series:
    text = exporter.exposition().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def values(series: Series, name: str, **match: str) -> list[float]:
    return [v for (n, labels), v in series.items()
            if n == name and all((k, val) in labels for k, val in match.items())]


def labels_of(series: Series, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels), _ in series.items() if n == name]


def nvml_exporter(gpus: list[FakeNvmlGpu], **kwargs) -> tuple[FakeNvml, Exporter]:
    fake = FakeNvml(gpus, **kwargs)
    backend = NvmlBackend(nvml=fake)
    backend.open()
    return fake, Exporter(backend, hostname="node-1", interval=30)


def gpu(n: int, **kwargs) -> FakeNvmlGpu:
    return FakeNvmlGpu(uuid=f"GPU-{n:08d}-0000-0000-0000-000000000000",
                       pci_bus_id=f"00000000:{0x18 + n:02X}:00.0", **kwargs)


# ------------------------------------------------------------------------- NVML ------------
def test_nvml_names_units_and_labels():
    _, exp = nvml_exporter([
        gpu(0, util=91, power_mw=68_347, temp=41, sm_clock=1755, memory_used=5120 * MIB,
            memory_reserved=512 * MIB, memory_total=81559 * MIB),
        gpu(1),
    ])
    exp.collect_once()
    s = scrape(exp)
    assert values(s, "DCGM_FI_DEV_GPU_UTIL", gpu="0") == [91]
    assert values(s, "DCGM_FI_DEV_POWER_USAGE", gpu="0") == [68.347]  # mW -> W
    assert values(s, "DCGM_FI_DEV_FB_USED", gpu="0") == [5120]  # bytes -> MiB
    assert values(s, "DCGM_FI_DEV_FB_RESERVED", gpu="0") == [512]
    assert values(s, "DCGM_FI_DEV_FB_FREE", gpu="0") == [81559 - 5120 - 512]
    assert values(s, "DCGM_FI_DEV_GPU_TEMP", gpu="0") == [41]
    assert values(s, "DCGM_FI_DEV_SM_CLOCK", gpu="0") == [1755]
    assert values(s, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == [0]
    assert labels_of(s, "DCGM_FI_DEV_GPU_TEMP")[0] == {
        "gpu": "0", "UUID": "GPU-00000000-0000-0000-0000-000000000000",
        "pci_bus_id": "00000000:18:00.0", "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "node-1",
        "DCGM_FI_DRIVER_VERSION": "580.105.08", "serial": "1652823055404",
    }
    assert values(s, "gpufleet_exporter_up") == [1]
    assert values(s, "gpufleet_exporter_collect_errors_total") == [0]
    assert values(s, "gpufleet_exporter_build_info", backend="nvml", version="0.1.0") == [1]
    assert not [name for name, _ in s if name.endswith("_created")]


def test_nvml_missing_optional_fields_are_absent_not_zero():
    _, exp = nvml_exporter([
        gpu(0, util=None, power_mw=None, temp=None, sm_clock=None, memory_reserved=None,
            xid_events=False, memory_used=1024 * MIB),
        gpu(1),
    ])
    exp.collect_once()
    s = scrape(exp)
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP",
                 "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_XID_ERRORS"):
        assert values(s, name, gpu="0") == [], name
        assert len(values(s, name, gpu="1")) == 1, name
    assert values(s, "DCGM_FI_DEV_FB_USED", gpu="0") == [1024]  # v1 memory info still works
    assert values(s, "gpufleet_exporter_collect_errors_total") == [0]


def test_nvml_gpu_lost_mid_run_is_counted_withdrawn_and_recovers():
    fake, exp = nvml_exporter([gpu(0), gpu(1), gpu(2)])
    exp.collect_once()
    assert sorted(labels["gpu"] for labels in labels_of(scrape(exp), "DCGM_FI_DEV_GPU_TEMP")) \
        == ["0", "1", "2"]

    fake.gpus[1].lost = True  # pynvml raises NVMLError_GpuIsLost for it from now on
    exp.collect_once()
    s = scrape(exp)
    assert sorted(lbl["gpu"] for lbl in labels_of(s, "DCGM_FI_DEV_GPU_TEMP")) == ["0", "2"]
    assert not [k for k in s if ("gpu", "1") in k[1]]  # every series of GPU 1 is gone
    assert values(s, "gpufleet_exporter_collect_errors_total") == [1]
    assert values(s, "gpufleet_exporter_up") == [1]  # the others are still served
    assert exp.snapshot.failures[0].message == "GPU 1: GPU is lost"

    exp.collect_once()
    assert values(scrape(exp), "gpufleet_exporter_collect_errors_total") == [2]

    fake.gpus[1].lost = False
    exp.collect_once()
    s = scrape(exp)
    assert sorted(lbl["gpu"] for lbl in labels_of(s, "DCGM_FI_DEV_GPU_TEMP")) == ["0", "1", "2"]
    assert values(s, "gpufleet_exporter_collect_errors_total") == [2]


def test_nvml_whole_library_failure_sets_up_0_and_recovers():
    fake, exp = nvml_exporter([gpu(0)])
    exp.collect_once()
    fake.count_error = pynvml.NVML_ERROR_UNKNOWN
    exp.collect_once()
    s = scrape(exp)
    assert values(s, "gpufleet_exporter_up") == [0]
    assert values(s, "gpufleet_exporter_collect_errors_total") == [1]
    assert not [name for name, _ in s if name.startswith("DCGM_")]
    assert values(s, "gpufleet_exporter_last_collect_timestamp_seconds")  # last success kept
    fake.count_error = None
    exp.collect_once()
    s = scrape(exp)
    assert values(s, "gpufleet_exporter_up") == [1]
    assert values(s, "DCGM_FI_DEV_GPU_TEMP", gpu="0")


def mig_gpu(n: int, **kwargs) -> FakeNvmlGpu:
    return gpu(n, memory_used=20_000 * MIB, mig=[
        FakeMigSlice(gi_id=1, profile="3g.40gb", slot=0, memory_total=40_192 * MIB,
                     memory_used=10_000 * MIB, graphics_util=62.5),
        FakeMigSlice(gi_id=9, profile="1g.10gb", slot=3, memory_total=9_856 * MIB,
                     memory_used=0, graphics_util=0.0),
    ], **kwargs)


def test_nvml_mig_slices_carry_parent_identity_and_profile():
    fake, exp = nvml_exporter([mig_gpu(0), gpu(1, util=40)])
    exp.collect_once()
    s = scrape(exp)
    slices = [lbl for lbl in labels_of(s, "DCGM_FI_DEV_FB_USED") if "GPU_I_ID" in lbl]
    assert sorted((lbl["GPU_I_PROFILE"], lbl["GPU_I_ID"]) for lbl in slices) == [
        ("1g.10gb", "9"), ("3g.40gb", "1")]
    for lbl in slices:  # the PARENT's UUID and index, as dcgm-exporter does
        assert lbl["UUID"] == "GPU-00000000-0000-0000-0000-000000000000"
        assert lbl["gpu"] == "0" and lbl["device"] == "nvidia0"
    assert values(s, "DCGM_FI_DEV_FB_USED", GPU_I_ID="1") == [10_000]
    assert values(s, "DCGM_FI_DEV_FB_FREE", GPU_I_ID="1") == [40_192 - 10_000]
    # GPU_UTIL: absent on slices and on the MIG parent (NVML does not report it there)
    assert [lbl["gpu"] for lbl in labels_of(s, "DCGM_FI_DEV_GPU_UTIL")] == ["1"]
    # parent-level series have no MIG labels
    assert [lbl for lbl in labels_of(s, "DCGM_FI_DEV_GPU_TEMP") if "GPU_I_ID" in lbl] == []
    # GR engine activity is a rate between two GPM samples: absent on the first pass
    assert values(s, "DCGM_FI_PROF_GR_ENGINE_ACTIVE") == []
    exp.collect_once()
    s = scrape(exp)
    assert values(s, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", GPU_I_ID="1") == [0.625]
    assert values(s, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", GPU_I_ID="9") == [0.0]
    assert fake.gpm_live == 4  # one kept sample per GPU and per slice, older ones freed


def test_nvml_mig_profile_derived_when_instance_lookup_is_not_permitted():
    class NoPermission(FakeNvml):
        def nvmlDeviceGetGpuInstanceById(self, device, gpuInstanceId):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

    fake = NoPermission([mig_gpu(0, gpm=False)])
    backend = NvmlBackend(nvml=fake)
    backend.open()
    readings = backend.collect().readings
    assert [(r.mig_profile, r.mig_instance) for r in readings if r.is_slice] == [
        ("3g.40gb", 1), ("1g.10gb", 9)]  # from slice count and memory (NVML attributes)
    assert all(r.engine_active_ratio is None for r in readings)  # no GPM: series absent


def test_nvml_slice_freed_when_mig_layout_changes():
    fake, exp = nvml_exporter([mig_gpu(0)])
    exp.collect_once()
    exp.collect_once()
    assert fake.gpm_live == 3  # the GPU and its two slices
    fake.gpus[0].mig = fake.gpus[0].mig[:1]
    exp.collect_once()
    assert fake.gpm_live == 2
    exp.backend.close()
    assert fake.gpm_live == 0 and fake.initialised == 0


def test_nvml_last_xid_per_gpu():
    fake, exp = nvml_exporter([gpu(0), gpu(1)])
    exp.collect_once()
    fake.inject_xid(1, 79)
    exp.collect_once()
    s = scrape(exp)
    assert values(s, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == [0]
    assert values(s, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == [79]


@pytest.mark.parametrize(("code", "words"), [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML library not found"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVML library not usable: Driver Not Loaded"),
])
def test_nvml_init_failure_is_library_not_found(code, words):
    with pytest.raises(LibraryNotFound, match=words):
        NvmlBackend(nvml=FakeNvml([gpu(0)], init_error=code)).open()


# ---------------------------------------------------------------------- AMD SMI ------------
def amd_exporter(gpus: list[FakeAmdGpu]) -> tuple[FakeAmdSmi, Exporter]:
    fake = FakeAmdSmi(gpus)
    backend = AmdSmiBackend(amdsmi=fake)
    backend.open()
    return fake, Exporter(backend, hostname="node-2", interval=30)


def amd(n: int, **kwargs) -> FakeAmdGpu:
    kwargs.setdefault("serial", f"69225100112{n}")
    return FakeAmdGpu(uuid=f"{n:08d}-0000-1000-80f6-e4d2c51d0d02", **kwargs)


def test_amd_names_units_and_labels():
    _, exp = amd_exporter([
        amd(0, gfx_activity=87, vram_used_mb=1000, power_w=512, edge_temp=51, hotspot_temp=66),
        amd(1),
    ])
    exp.collect_once()
    s = scrape(exp)
    assert values(s, "gpu_gfx_activity", gpu_id="0") == [87]
    assert values(s, "gpu_used_vram", gpu_id="0") == [1000]
    assert values(s, "gpu_total_vram", gpu_id="0") == [196592]
    assert values(s, "gpu_free_vram", gpu_id="0") == [195592]
    assert values(s, "gpu_power_usage", gpu_id="0") == [512]
    assert values(s, "gpu_edge_temperature", gpu_id="0") == [51]
    assert values(s, "gpu_junction_temperature", gpu_id="0") == [66]
    assert labels_of(s, "gpu_gfx_activity")[0] == {
        "gpu_id": "0", "gpu_uuid": "00000000-0000-1000-80f6-e4d2c51d0d02",
        "serial_number": "692251001120", "card_series": "AMD Instinct MI300X",
        "card_model": "102-G30211-00", "driver_version": "6.10.5", "hostname": "node-2",
    }
    assert s[("gpu_nodes_total", frozenset({("hostname", "node-2")}))] == 2
    assert values(s, "gpufleet_exporter_build_info", backend="amdsmi") == [1]


def test_amd_millidegrees_are_converted_once():
    _, exp = amd_exporter([amd(0, edge_temp=35, hotspot_temp=41, temp_scale=1000)])
    exp.collect_once()
    s = scrape(exp)
    assert values(s, "gpu_edge_temperature") == [35]
    assert values(s, "gpu_junction_temperature") == [41]
    assert _celsius(35_000) == 35.0 and _celsius(99) == 99.0


def test_amd_missing_fields_are_absent():
    _, exp = amd_exporter([amd(0, gfx_activity=None, power_w=None, edge_temp=None,
                               model_number="", serial=""), amd(1)])
    exp.collect_once()
    s = scrape(exp)
    for name in ("gpu_gfx_activity", "gpu_power_usage", "gpu_edge_temperature"):
        assert values(s, name, gpu_id="0") == [], name
        assert len(values(s, name, gpu_id="1")) == 1, name
    assert values(s, "gpu_junction_temperature", gpu_id="0")
    junction = [lbl for lbl in labels_of(s, "gpu_junction_temperature") if lbl["gpu_id"] == "0"]
    assert junction[0]["card_model"] == "" and junction[0]["serial_number"] == ""  # "N/A"


def test_amd_gpu_lost_mid_run():
    fake, exp = amd_exporter([amd(0), amd(1)])
    exp.collect_once()
    fake.gpus[0].lost = True
    exp.collect_once()
    s = scrape(exp)
    assert [lbl["gpu_id"] for lbl in labels_of(s, "gpu_used_vram")] == ["1"]
    assert values(s, "gpufleet_exporter_collect_errors_total") == [1]
    assert s[("gpu_nodes_total", frozenset({("hostname", "node-2")}))] == 2  # still enumerated
    fake.gpus[0].lost = False
    exp.collect_once()
    assert sorted(lbl["gpu_id"] for lbl in labels_of(scrape(exp), "gpu_used_vram")) == ["0", "1"]


def test_amd_init_failure_is_library_not_found():
    fake = FakeAmdSmi([amd(0)], init_error=34)  # AMDSMI_STATUS_DRIVER_NOT_LOADED
    with pytest.raises(LibraryNotFound, match="AMD SMI"):
        AmdSmiBackend(amdsmi=fake).open()


# -------------------------------------------------------------------------- sim ------------
def sim_text(**kwargs) -> str:
    backend = SimBackend(clock=lambda: 1000.0, **kwargs)
    backend.open()
    exp = Exporter(backend, hostname=kwargs.get("node", "sim-node"), interval=30,
                   clock=lambda: 0.0, timer=lambda: 0.0)
    exp.collect_once()
    return exp.exposition().decode()


def test_sim_is_deterministic_and_distinct_per_node():
    a = sim_text(gpus=2, seed=7, node="node-a")
    assert a == sim_text(gpus=2, seed=7, node="node-a")
    b = sim_text(gpus=2, seed=7, node="node-b")
    uuids = {line.split('UUID="')[1][:40] for text in (a, b)
             for line in text.splitlines() if 'UUID="' in line}
    assert len(uuids) == 4


def test_sim_values_move_over_time():
    t = [0.0]
    backend = SimBackend(gpus=1, clock=lambda: t[0])
    backend.open()
    first = backend.collect().readings[0]
    t[0] = 75.0
    later = backend.collect().readings[0]
    assert first.util_pct != later.util_pct
    assert first.power_w != later.power_w
    assert first.mem_used_mib != later.mem_used_mib


def test_sim_amd_and_mig():
    assert "gpu_gfx_activity{" in sim_text(vendor="amd", gpus=2)
    text = sim_text(gpus=1, mig="3g.40gb,2g.20gb,1g.10gb")
    assert 'GPU_I_PROFILE="2g.20gb"' in text and 'GPU_I_ID="3"' in text


@pytest.mark.parametrize("kwargs", [
    {"mig": "9g.1gb"}, {"mig": "4g.40gb,4g.40gb"}, {"vendor": "amd", "mig": "1g.10gb"},
    {"vendor": "intel"}, {"gpus": 0},
])
def test_sim_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        SimBackend(**kwargs)
