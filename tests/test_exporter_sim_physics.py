"""The simulator's numbers hang together (issue 30, point 8): what a GPU engineer would
check of any reading. Power and temperature follow utilisation, profiling activity never
exceeds what utilisation allows, the energy counter grows by the power drawn, and a MIG
node's slices carry energy by their share into the usage ledger (it said 0 kWh).
"""

from __future__ import annotations

import itertools
import time

import pytest

from hub import inventory as inv
from hub import store, usage
from hub.usage._fold import utc
from spoke import Exporter, SimBackend
from spoke._model import GpuReading
from spoke._sim import _NVIDIA_MODELS
from tests.support.backfill import backfilled_hub, openmetrics
from tests.support.clirun import gpufleet, gpufleet_json

H100 = _NVIDIA_MODELS["NVIDIA H100 80GB HBM3"]
HOUR = 3600.0


def readings_over(backend_kwargs: dict, times: list[float]) -> list[list[GpuReading]]:
    now = [times[0]]
    backend = SimBackend(clock=lambda: now[0], **backend_kwargs)
    backend.open()
    out = []
    for t in times:
        now[0] = t
        out.append(list(backend.collect().readings))
    return out


@pytest.mark.parametrize("kwargs", [{"gpus": 5, "seed": 1}, {"gpus": 3, "seed": 9,
                                                             "idle": (1,)}])
def test_power_temperature_and_sm_activity_follow_utilisation(kwargs):
    times = [1_000.0 + 3.0 * k for k in range(1200)]  # an hour: every GPU's load cycles
    seen_idle = seen_busy = 0
    for readings in readings_over(kwargs, times)[1:]:  # GPM answers from the second pass on
        for r in readings:
            util = r.util_pct
            assert util is not None and r.power_w is not None and r.temp_c is not None
            # an idle H100 draws ~70 W at ~32 °C, a busy one up to 700 W, never above
            assert r.power_w == pytest.approx(H100.idle_w + (H100.max_w - H100.idle_w)
                                              * util / 100, abs=0.001)
            assert 30 <= r.temp_c <= 70 and r.memory_temp_c == r.temp_c + 5
            if util == 0:
                seen_idle += 1
                assert 60 <= r.power_w <= 90 and r.temp_c <= 40
                assert r.sm_clock_mhz is not None and r.sm_clock_mhz < 500
            if util >= 90:
                seen_busy += 1
                assert r.power_w >= 600 and r.temp_c >= 60
            # SMs are active only while a kernel runs: never above the utilisation
            for ratio in (r.sm_active_ratio, r.engine_active_ratio, r.tensor_active_ratio):
                assert ratio is not None and ratio * 100 <= util + 1e-9
            assert r.sm_active_ratio is not None and r.engine_active_ratio is not None
            assert r.sm_active_ratio <= r.engine_active_ratio
    assert seen_idle and seen_busy


def test_an_idle_gpu_stays_idle():
    for readings in readings_over({"gpus": 2, "idle": (0,)}, [0.0, 150.0, 300.0]):
        idle = readings[0]
        assert (idle.util_pct, idle.power_w, idle.temp_c) == (0, H100.idle_w, 32)
        assert idle.sm_active_ratio in (None, 0.0)  # GPM needs a second sample first
    with pytest.raises(ValueError, match="--sim-idle names GPU 2"):
        SimBackend(gpus=2, idle=(2,))


def test_energy_counter_grows_by_the_power_drawn():
    times = [500.0 + 10.0 * k for k in range(100)]
    readings = [r[0] for r in readings_over({"gpus": 1}, times)]
    for before, after in itertools.pairwise(readings):
        assert before.energy_mj is not None and after.energy_mj is not None
        assert before.power_w is not None
        # mJ = mW x s: the power read at the start of each 10 s step, held over it
        assert after.energy_mj - before.energy_mj == pytest.approx(before.power_w * 10_000,
                                                                   abs=1)


def test_mig_slices_draw_by_their_loads_and_carry_their_gpus_power():
    for readings in readings_over({"gpus": 1, "mig": "3g.40gb,2g.20gb"},
                                  [1_000.0 + 7.0 * k for k in range(200)])[1:]:
        gpu, *slices = readings
        assert gpu.util_pct is None  # NVML has no utilisation in MIG mode
        busy = sum((s.engine_active_ratio or 0) * int(s.mig_profile[0]) / 7  # type: ignore
                   for s in slices)
        assert gpu.power_w == pytest.approx(H100.idle_w + (H100.max_w - H100.idle_w) * busy,
                                            abs=1.0)
        assert [s.power_w for s in slices] == [gpu.power_w] * 2  # as dcgm-exporter's slices
        assert gpu.mem_used_mib == sum(s.mem_used_mib or 0 for s in slices)
        for s in slices:  # a slice's utilisation is its engine activity
            assert s.sm_active_ratio is not None and s.engine_active_ratio is not None
            assert s.sm_active_ratio <= s.engine_active_ratio


def sim_history(t0: float, node: str = "mig-node") -> tuple[str, dict[str, float]]:
    """OpenMetrics of a simulated MIG node over one hour (a sample every 30 s, as pushed to
    a hub with cluster="c1"), and the GPU's mean power over those samples."""
    times = [t0 + 15 + 30 * k for k in range(int(HOUR / 30))]
    now = [times[0]]
    backend = SimBackend(clock=lambda: now[0], gpus=1, mig="3g.40gb,2g.20gb", node=node)
    backend.open()
    exporter = Exporter(backend, hostname=node, interval=30)
    values: dict[tuple[str, str], dict[float, float]] = {}
    power: list[float] = []
    prof: dict[str, list[float]] = {}
    for t in times:
        now[0] = t
        for family in exporter.collect_once().families:
            for s in family.samples:
                if not s.name.startswith("DCGM_FI_"):
                    continue
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(
                    {**s.labels, "cluster": "c1"}.items()))
                values.setdefault((s.name, labels), {})[t] = s.value
                if s.name == "DCGM_FI_DEV_POWER_USAGE" and "GPU_I_ID" not in s.labels:
                    power.append(s.value)
                if s.name.startswith("DCGM_FI_PROF_") and "GPU_I_PROFILE" in s.labels:
                    prof.setdefault(f"{s.name}/{s.labels['GPU_I_PROFILE']}", []).append(s.value)
    series = [(name, labels, lambda t, v=v: v.get(t)) for (name, labels), v in values.items()]
    means = {k: sum(v) / len(v) for k, v in prof.items()}
    return openmetrics(series, times), {"mean_power_w": sum(power) / len(power), **means}


def test_a_mig_node_bills_energy_by_slice_share(tmp_path):
    """`usage collect` over an hour of a simulated MIG node: each slice's energy is the
    GPU's power times its share of the GPU (3/7, 2/7), not 0 kWh; its SM-active figure is
    the exporter's DCGM_FI_PROF_SM_ACTIVE, not the graphics engine's activity."""
    t0 = (time.time() // HOUR) * HOUR - 2 * HOUR
    text, figures = sim_history(t0)
    hub = backfilled_hub(tmp_path / "hub", text).start(timeout=120)
    db_url = f"sqlite:///{tmp_path / 'i.db'}"
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url}
    try:
        assert gpufleet("sync", "--stale-after", "4h", env=env).exit_code == 0
        iso = [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) for t in (t0, t0 + HOUR)]
        collected = gpufleet_json("usage", "collect", "--from", iso[0], "--until", iso[1],
                                  env=env)
        assert collected["failed"] == [] and len(collected["collected"]) == 1
        engine = inv.make_engine(db_url)
        with engine.connect() as conn:
            frame = usage.usage_frame(conn, utc(t0), utc(t0 + HOUR))
        engine.dispose()
    finally:
        hub.stop()
    energy = {row.slice.split("/")[0]: row.energy_wh for row in frame.itertuples()}
    sm_active = {row.slice.split("/")[0]: row.avg_sm_active_pct for row in frame.itertuples()}
    assert set(energy) == {"3g.40gb", "2g.20gb"}  # the parent counts through its slices
    model = "NVIDIA H100 80GB HBM3"
    for profile, wh in energy.items():
        share = store.mig_share(model, profile)
        assert wh == pytest.approx(figures["mean_power_w"] * share, rel=0.02), profile
        sm = 100 * figures[f"DCGM_FI_PROF_SM_ACTIVE/{profile}"]
        engine = 100 * figures[f"DCGM_FI_PROF_GR_ENGINE_ACTIVE/{profile}"]
        assert sm_active[profile] == pytest.approx(sm, rel=0.01) and sm < 0.97 * engine
