"""dcgm-exporter 4.9 (DCGM 4.7) renames 23 fields, eleven with a new unit, and the driver
label (FIELD_NOTES, fourth round). A hub that reads only the legacy names finds none of a
4.9 cluster's GPUs and keeps a third of an upgraded GPU's hours. These tests push both
namings into a real hub Prometheus (real agents for the sync, promtool backfill for the
ledger) and check the figures people read: the same GPUs, the same units, every hour.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub import inventory as inv
from hub import usage
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations
from hub.store import DCGM_RENAMES, HubClient, HubSettings, profile
from tests.support.backfill import backfilled_hub, openmetrics
from tests.support.clirun import gpufleet, gpufleet_json
from tests.support.promql import wait_for
from tests.support.samples import EAST, WEST, dcgm47, sample_text


def _series(texts: list[str]) -> int:
    return sum(1 for t in texts for line in t.splitlines() if line.strip()
               and not line.startswith("#"))


def test_sync_finds_a_dcgm47_cluster_and_counts_a_gpu_sending_both_once(hub, fleet, db_url):
    """west sends only 4.9's names; 'both' runs two exporters during a rolling update (one
    per naming) for the same eight GPUs; east stays legacy."""
    clusters = {"east": [sample_text(EAST[2])],
                "both": [sample_text(EAST[0]), dcgm47(sample_text(EAST[0]))],
                "west": [dcgm47(sample_text(name)) for name in WEST]}
    for name, texts in clusters.items():
        fleet(name, texts)
    expected = sum(_series(texts) for texts in clusters.values())
    wait_for(hub.url, 'count({__name__=~"DCGM_.+", cluster=~"east|both|west"})',
             lambda r: bool(r) and int(float(r[0]["value"][1])) == expected)
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url}
    result = gpufleet("sync", "--stale-after", "30s", env=env)
    assert result.exit_code == 0, result.output

    rows = {c["cluster"]: c for c in gpufleet_json("inventory", "clusters", env=env)}
    assert {c: (r["gpus"], r["naming"]) for c, r in rows.items()} == {
        "east": (1, "legacy"), "both": (8, "both"), "west": (4, "dcgm-4.7")}
    table = gpufleet("inventory", "clusters", env=env).stdout
    assert "dcgm-4.7" in table and "NAMING" in table

    gpus = {(g["uuid"], g["mig_profile"]): g for g in gpufleet_json("inventory", "gpus", env=env)}
    t4 = next(g for g in gpus.values() if g["model"] == "Tesla T4")
    # bytes -> MiB, ratio -> %, the driver from DCGM_FI_SYSTEM_DRIVER_VERSION
    assert t4["memory_total_mib"] == 5120 + 9791 + 447
    assert t4["utilisation_pct"] == pytest.approx(91)
    assert t4["memory_used_mib"] == 5120 and t4["temperature_c"] == 74
    assert t4["power_w"] == pytest.approx(68.244)
    parent = gpus[("GPU-a1000000-0000-4000-8000-000000000000", None)]
    assert parent["memory_total_mib"] == 40624 + 19968 + 9728
    assert parent["node"] == "gpu-node-a1"
    big = gpus[(parent["uuid"], "3g.40gb")]
    assert big["utilisation_pct"] == pytest.approx(62.5) and big["memory_used_mib"] == 10624
    h100 = gpus[("GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005", None)]
    assert (h100["cluster"], h100["power_w"]) == ("both", pytest.approx(113.611))
    assert sum(g["cluster"] == "both" for g in gpus.values()) == 8  # once, not twice
    # the report's hub questions (visibility, zero usage, stuck collectors) answer for every
    # naming, both at once included (no "vector cannot contain metrics with the same labelset")
    report = gpufleet("report", "--max-age", "1h", "-o", "json", env=env)
    assert report.exit_code in (0, 1), report.output
    found = json.loads(report.stdout)["findings"]
    assert [f for f in found if f["check"] in ("hub", "hub_visibility")] == []
    assert t4["driver_version"] == "590.48.01"


H100 = 'modelName="NVIDIA H100 80GB HBM3"'


def _gpu(uuid: str, extra: str = "") -> str:
    return (f'cluster="c1",Hostname="n1",gpu="0",UUID="{uuid}",{H100},namespace="ml",'
            f'pod="train-{uuid.lower()}"{extra}')


def test_ledger_keeps_every_hour_and_all_energy_across_the_rename(tmp_path: Path):
    """Three hours at 60 s pushes, 50 % and 300 W throughout: a legacy GPU, one upgraded
    after the first hour, one sent by two exporters at once (one per naming), one on 4.9's
    names only, and one whose GPU_UTIL_RATIO carries percent (a DCGM 4.6 custom CSV). Each
    is 3 GPU-hours, 900 Wh, 50 %, 1,024 MiB used, never more, never less."""
    t0 = (time.time() // 3600) * 3600 - 5 * 3600
    times = [t0 + 30 + 60 * k for k in range(180)]

    def during(first: float, last: float, v: float):
        return lambda t: v if first <= t < last else None

    always = (t0, t0 + 3 * 3600)
    legacy = [("DCGM_FI_DEV_GPU_UTIL", 50.0), ("DCGM_FI_DEV_POWER_USAGE", 300.0),
              ("DCGM_FI_DEV_FB_USED", 1024.0), ("DCGM_FI_DEV_GPU_TEMP", 60.0)]
    new = [("DCGM_FI_DEV_GPU_UTIL_RATIO", 0.5), ("DCGM_FI_DEV_BOARD_POWER_WATTS", 300.0),
           ("DCGM_FI_DEV_FB_USED_BYTES", 1024.0 * 2**20), ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 60.0),
           ("DCGM_FI_PROF_SM_UTIL_RATIO", 0.8)]
    percent = [("DCGM_FI_DEV_GPU_UTIL_RATIO", 50.0), ("DCGM_FI_DEV_BOARD_POWER_WATTS", 300.0),
               ("DCGM_FI_DEV_FB_USED_BYTES", 1024.0 * 2**20),
               ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 60.0)]
    plan = {
        "GPU-LEGACY": [(legacy, always, "")],
        "GPU-UPGRADED": [(legacy, (t0, t0 + 3600), ""), (new, (t0 + 3600, t0 + 3 * 3600), "")],
        "GPU-BOTH": [(legacy, always, ',instance="dcgm-a"'), (new, always, ',instance="dcgm-b"')],
        "GPU-NEW": [(new, always, "")],
        "GPU-PERCENT": [(percent, always, "")],
    }
    series = [(name, _gpu(uuid, extra), during(*span, value))
              for uuid, parts in plan.items() for fields, span, extra in parts
              for name, value in fields]
    hub = backfilled_hub(tmp_path / "hub", openmetrics(series, times)).start(timeout=120)
    engine = inv.make_engine(f"sqlite:///{tmp_path / 'inv.db'}", create=True)
    inv.ensure_schema(engine)
    try:
        with HubClient.from_settings(HubSettings(url=hub.url)) as client:
            result = usage.collect_usage(engine, client, bucket=3600, push_interval=60,
                                         starts=[t0, t0 + 3600, t0 + 7200])
        assert result.failed == [] and len(result.collected) == 3
        with engine.connect() as conn:
            rows = conn.execute(sa.select(inv.usage)).mappings().all()
    finally:
        hub.stop()
        engine.dispose()
    per_gpu: dict[str, dict[str, float]] = {}
    for r in rows:
        acc = per_gpu.setdefault(r["uuid"], {"gpu_hours": 0.0, "energy_wh": 0.0, "rows": 0})
        acc["gpu_hours"] += r["gpu_hours"]
        acc["energy_wh"] += r["energy_wh"]
        acc["rows"] += 1
        assert r["avg_utilisation_pct"] == pytest.approx(50.0), r["uuid"]
        assert r["max_utilisation_pct"] == pytest.approx(50.0), r["uuid"]
        assert r["avg_memory_used_mib"] == pytest.approx(1024.0), r["uuid"]
        assert r["avg_power_w"] == pytest.approx(300.0), r["uuid"]
    assert set(per_gpu) == set(plan)
    for uuid, acc in per_gpu.items():
        assert acc["rows"] == 3, uuid  # one row a bucket: the two spellings are one GPU
        assert acc["gpu_hours"] == pytest.approx(3.0), uuid
        assert acc["energy_wh"] == pytest.approx(900.0), uuid
    sm = {r["uuid"]: r["avg_sm_active_pct"] for r in rows if r["bucket_start"].hour ==
          time.gmtime(t0 + 7200).tm_hour}
    assert sm["GPU-NEW"] == pytest.approx(80.0) and sm["GPU-UPGRADED"] == pytest.approx(80.0)


def test_repeated_syncs_with_jittering_used_and_free_write_no_changed_events(
        hub, fleet, db_url):
    """used + free of the newest samples jitters by ~1 % from sync to sync (issue 30): the
    GPU's size stays what it was, with no `changed` event; a GPU that says its size
    (FB_CAPACITY_BYTES) has exactly that size."""
    state = {"k": 0}

    def text() -> str:
        state["k"] += 1
        jitter = (-700, 400, -200, 650)[state["k"] % 4]
        old = ('gpu="0",UUID="GPU-JIT",device="nvidia0",modelName="NVIDIA A100",'
               'Hostname="n1",DCGM_FI_DRIVER_VERSION="550.54.15"')
        new = ('gpu="1",UUID="GPU-CAP",device="nvidia1",modelName="NVIDIA H100",'
               'Hostname="n1",DCGM_FI_SYSTEM_DRIVER_VERSION="580.1"')
        return (f"DCGM_FI_DEV_GPU_TEMP{{{old}}} 40\n"
                f"DCGM_FI_DEV_FB_USED{{{old}}} {20000 + jitter}\n"
                f"DCGM_FI_DEV_FB_FREE{{{old}}} {41559 + jitter // 2}\n"
                f"DCGM_FI_DEV_GPU_TEMP_CELSIUS{{{new}}} 40\n"
                f"DCGM_FI_DEV_FB_USED_BYTES{{{new}}} {(1000 + jitter) * 2**20}\n"
                f"DCGM_FI_DEV_FB_FREE_BYTES{{{new}}} {(80000 + jitter) * 2**20}\n"
                f"DCGM_FI_DEV_FB_CAPACITY_BYTES{{{new}}} {81559 * 2**20}\n")

    fleet("c1", [text])
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url, "GPUFLEET_STALE_AFTER": "3s"}
    wait_for(hub.url, 'count(DCGM_FI_DEV_GPU_TEMP{cluster="c1"})', bool)
    totals = set()
    for _ in range(4):
        scraped = state["k"] + 2  # a new scrape has reached the hub
        wait_for(hub.url, "vector(1)", lambda r, n=scraped: state["k"] > n)
        assert gpufleet("sync", env=env).exit_code == 0
        gpus = {g["uuid"]: g for g in gpufleet_json("inventory", "gpus", env=env)}
        totals.add(gpus["GPU-JIT"]["memory_total_mib"])
        assert gpus["GPU-CAP"]["memory_total_mib"] == 81559
    assert len(totals) == 1
    events = gpufleet_json("inventory", "events", env=env)
    assert [e for e in events if e["type"] == "changed"] == []
    assert sorted(e["uuid"] for e in events) == ["GPU-CAP", "GPU-JIT"]  # appeared, once


def test_a_real_change_of_memory_size_is_still_an_event(tmp_path: Path):
    engine = inv.make_engine(f"sqlite:///{tmp_path / 'inv.db'}", create=True)
    inv.ensure_schema(engine)
    now = inv.now_utc()

    def sync(total: float) -> None:
        obs = Observation(cluster="c", node="n", uuid="GPU-M", vendor="nvidia",
                          memory_total_mib=total, sample_at=time.time())
        with engine.begin() as conn:
            apply_observations(conn, [obs], now)

    for total in (81559.0, 80821.0, 82021.0, 143771.0):
        sync(total)
    with engine.connect() as conn:
        changed = conn.execute(sa.select(inv.events.c.details)
                               .where(inv.events.c.type == "changed")).scalars().all()
        stored = conn.execute(sa.select(inv.gpus.c.memory_total_mib)).scalar_one()
    engine.dispose()
    assert len(changed) == 1 and '"new": 143771.0' in changed[0] and stored == 143771.0


#: a plausible legacy value per legacy unit (what dcgm-exporter <= 4.8 sends)
_LEGACY_VALUES = {
    "%": st.integers(0, 100).map(float), "MiB": st.integers(0, 200_000).map(float),
    "MHz": st.integers(0, 3_500).map(float), "mJ": st.integers(0, 10**13).map(float),
    "MB/s": st.integers(0, 10**6).map(float), "°C": st.integers(0, 120).map(float),
    "W": st.floats(0, 1500, allow_nan=False).map(lambda w: round(w, 3)),
    "count": st.integers(0, 10**6).map(float), "XID": st.integers(0, 200).map(float),
    "rows": st.integers(0, 1000).map(float), "0/1": st.sampled_from([0.0, 1.0]),
    "0-1": st.floats(0, 1, allow_nan=False).map(lambda r: round(r, 6)),
}


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(values=st.fixed_dictionaries({r.legacy: _LEGACY_VALUES[r.legacy_unit]
                                     for r in DCGM_RENAMES}),
       percent_csv=st.booleans())
def test_every_new_name_reads_as_its_legacy_value_on_a_real_hub(tmp_path_factory, values,
                                                                 percent_csv):
    """Each renamed field sent in its new unit reads, through the hub's own PromQL arms, as
    the legacy name's value. GPU_UTIL_RATIO sent as percent (a DCGM 4.6 custom CSV) reads as
    percent once a value above 1 proves it; 0 or 1 % cannot be told from a ratio and read as
    0 or 100 % (the documented limit of the rule)."""
    from tests.support.samples import _NEW_PER_LEGACY

    nvidia = profile("nvidia")
    t_end = (time.time() // 60) * 60 - 7200
    series = []
    for r in DCGM_RENAMES:
        legacy = values[r.legacy]
        new = legacy * _NEW_PER_LEGACY.get((r.legacy_unit, r.dcgm47_unit), 1.0)
        if percent_csv and r.dcgm47 == "DCGM_FI_DEV_GPU_UTIL_RATIO":
            new = legacy
        series += [(r.legacy, 'cluster="c",UUID="GPU-L"', lambda t, v=legacy: v),
                   (r.dcgm47, 'cluster="c",UUID="GPU-N"', lambda t, v=new: v)]
    workdir = tmp_path_factory.mktemp("units")
    hub = backfilled_hub(workdir / "hub", openmetrics(
        series, [t_end - 60 * k for k in range(5, -1, -1)])).start(timeout=120)
    try:
        for r in DCGM_RENAMES:
            promql = " or ".join(nvidia.arms(
                r.legacy, 'last_over_time({}{{UUID!=""}}[10m])', "10m"))
            res = requests.get(f"{hub.url}/api/v1/query", params={"query": promql,
                                                                   "time": t_end}, timeout=30)
            got = {row["metric"]["UUID"]: float(row["value"][1])
                   for row in res.json()["data"]["result"]}
            want = values[r.legacy]
            if percent_csv and r.dcgm47 == "DCGM_FI_DEV_GPU_UTIL_RATIO" and want <= 1:
                want *= 100  # what the rule cannot tell: 0 or 1 % looks like a ratio
            assert got["GPU-L"] == values[r.legacy], r.legacy
            assert got["GPU-N"] == pytest.approx(want, rel=1e-9, abs=1e-9), (r.dcgm47, got)
    finally:
        hub.stop()


def _csv_names(files: dict[str, str]) -> list[str]:
    import yaml

    cm = yaml.safe_load(files["dcgm-metrics-configmap.yaml"])
    rows = cm["data"]["dcgm-metrics.csv"].splitlines()
    return [r.split(",")[0].strip() for r in rows if r.strip() and not r.startswith("#")]


@pytest.mark.parametrize("naming", ["legacy", "dcgm-4.7"])
def test_spoke_render_pins_dcgm_exporters_fields_in_the_chosen_naming(tmp_path, naming):
    """The collectors CSV names every field the hub reads in one naming only, the agent keeps
    each of them, and the GPU Operator's ClusterPolicy mounts it (config.name)."""
    import yaml

    from hub.onboard import metrics_keep_regex
    from hub.store import dcgm_collectors, dcgm_names

    out = tmp_path / "spoke"
    args = ["spoke", "render", "--cluster", "c1", "--vendor", "nvidia,amd",
            "--remote-write-url", "https://hub.example.com/api/v1/receive", "--out", str(out)]
    result = gpufleet(*args, *(["--dcgm-names", naming] if naming != "legacy" else []))
    assert result.exit_code == 0, result.output
    files = {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()}
    names = _csv_names(files)
    renamed = dcgm_names("dcgm-4.7")
    other = set(renamed.values()) if naming == "legacy" else set(renamed)
    assert not other & set(names)  # one naming, never a mix
    wanted = {"legacy": ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP",
                         "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_PROF_SM_ACTIVE"],
              "dcgm-4.7": ["DCGM_FI_DEV_GPU_UTIL_RATIO", "DCGM_FI_DEV_FB_USED_BYTES",
                           "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "DCGM_FI_DEV_XID_ERROR",
                           "DCGM_FI_PROF_SM_UTIL_RATIO", "DCGM_FI_DEV_FB_CAPACITY_BYTES"]}
    assert set(wanted[naming]) <= set(names)
    keep = re.compile(metrics_keep_regex())
    # the agent drops none of what gpufleet reads (dcgm-exporter's other default fields stay
    # for the cluster's own consumers, not forwarded)
    assert [n for n in wanted[naming] if not keep.fullmatch(n)] == []
    ours = [r[0] for r in dcgm_collectors(naming) if r[2].startswith("read by gpufleet")]
    assert ours and [n for n in ours if not keep.fullmatch(n)] == []
    policy = yaml.safe_load(files["patches/clusterpolicy-dcgm-exporter.yaml"])
    cm = yaml.safe_load(files["dcgm-metrics-configmap.yaml"])
    assert policy["spec"] == {"dcgmExporter": {"config": {"name": cm["metadata"]["name"]}}}
    assert cm["metadata"]["namespace"] == "nvidia-gpu-operator"
    kustomization = yaml.safe_load(files["kustomization.yaml"])
    assert "dcgm-metrics-configmap.yaml" in kustomization["resources"]
    # the GPU Operator's ClusterPolicy is patched, never listed: delete -k cannot delete it
    assert not [r for r in kustomization["resources"] if "clusterpolicy" in r]
    bad = gpufleet(*args[:-1], str(tmp_path / "bad"), "--dcgm-names", "dcgm-5")
    assert bad.exit_code == 2 and "unknown dcgm naming (--dcgm-names) 'dcgm-5'" in bad.output
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_dcgm_naming_is_refused_not_taken_as_legacy(tmp_path, empty):
    """`--dcgm-names ''` rendered the legacy naming as if the flag were not given: a script
    whose variable came out empty would pin the wrong series without a word."""
    out = tmp_path / "spoke"
    result = gpufleet("spoke", "render", "--cluster", "c1", "--vendor", "nvidia",
                      "--remote-write-url", "https://hub.example.com/api/v1/receive",
                      "--out", str(out), "--dcgm-names", empty)
    assert result.exit_code == 2, result.output
    assert result.stderr == ("error: dcgm naming (--dcgm-names) is required: choose one of "
                             "legacy, dcgm-4.7\n")
    assert not out.exists()


def _synced(engine, now, observations, namings=None):
    with engine.begin() as conn:
        apply_observations(conn, observations, now, namings)


def test_report_says_which_naming_each_cluster_sends_and_when_it_is_a_problem(db_url):
    """mixed: both namings for 25 h (over the default 24 h); upgrading: both for 1 h;
    broken: its GPU's driver changed, then the GPU stopped reporting 10 minutes later."""
    engine = inv.make_engine(db_url, create=True)
    inv.ensure_schema(engine)
    now = inv.now_utc()
    hour = dt.timedelta(hours=1)

    def gpu(cluster: str, uuid: str, driver: str = "550.54.15") -> Observation:
        return Observation(cluster=cluster, node="n1", uuid=uuid, vendor="nvidia",
                           driver_version=driver, sample_at=time.time())

    try:
        _synced(engine, now - 26 * hour, [gpu("mixed", "GPU-M")], {"mixed": "legacy"})
        _synced(engine, now - 25 * hour, [gpu("mixed", "GPU-M")], {"mixed": "both"})
        _synced(engine, now - 2 * hour, [gpu("upgrading", "GPU-U"), gpu("broken", "GPU-B"),
                                         gpu("broken", "GPU-K")],
                {"upgrading": "legacy", "broken": "legacy"})
        _synced(engine, now - hour, [gpu("upgrading", "GPU-U"), gpu("broken", "GPU-K"),
                                     gpu("broken", "GPU-B", "580.95.05")],
                {"upgrading": "both", "broken": "legacy"})
        _synced(engine, now - hour + dt.timedelta(minutes=10), [
            gpu("upgrading", "GPU-U"), gpu("broken", "GPU-K"), gpu("mixed", "GPU-M")],
            {"upgrading": "both", "broken": "legacy", "mixed": "both"})
    finally:
        engine.dispose()
    env = {"GPUFLEET_DB": db_url}
    args = ["report", "--max-age", "30d", "--push-interval", "30d", "-o", "json"]
    data = json.loads(gpufleet(*args, env=env).stdout)
    assert {r["cluster"]: r["naming"] for r in data["summary"]} == {
        "mixed": "both", "upgrading": "both", "broken": "legacy"}
    found = {(f["check"], f["cluster"]): f["message"] for f in data["findings"]}
    assert ("naming_mixed", "mixed") in found and ("naming_mixed", "upgrading") not in found
    assert "1 GPU(s)" in found[("vanished_after_driver_change", "broken")]
    assert "550.54.15 to 580.95.05" in found[("vanished_after_driver_change", "broken")]
    relaxed = json.loads(gpufleet(*args, "--naming-mix-for", "2d", env=env).stdout)
    assert "naming_mixed" not in {f["check"] for f in relaxed["findings"]}
    table = gpufleet("inventory", "clusters", "-o", "json", env=env)
    assert {c["cluster"]: c["naming"] for c in json.loads(table.stdout)} == {
        "mixed": "both", "upgrading": "both", "broken": "legacy"}
    # the live page's clusters table says the same
    from hub.service import build_app, read_only_engine
    from tests.support.asgi import AppClient, no_metrics
    from tests.support.browser import Dom

    router = AppClient(build_app(read_only_engine(db_url), health=lambda: (True, {}),
                                 findings=lambda: ([], None), metrics=no_metrics))
    status, page = router.handle("/", {})
    assert status == 200
    assert {r["cluster"]: r["naming"] for r in Dom(page.text).table("clusters")} == {
        "mixed": "both", "upgrading": "both", "broken": "legacy"}


def test_missing_is_unknown_never_zero(hub, fleet, tmp_path):
    """dcgm-exporter leaves the XID series out when there was no XID; an MI350X whose first
    power reading was 0 has no power series until its exporter restarts. Both GPUs are
    there, with those fields unknown (null): health not "ok", power not 0 W, energy not 0."""
    nv = 'gpu="0",UUID="GPU-NOXID",modelName="NVIDIA H200",hostname="n1"'
    amd = 'hostname="a1",gpu_id="0",gpu_uuid="amd-nopower",card_series="AMD Instinct MI350X"'
    fleet("c1", [f"DCGM_FI_DEV_GPU_TEMP_CELSIUS{{{nv}}} 41\n"
                 f"DCGM_FI_DEV_GPU_UTIL_RATIO{{{nv}}} 0.25\n"
                 f"amd_gpu_edge_temperature{{{amd}}} 38\namd_gpu_gfx_activity{{{amd}}} 7\n"])
    wait_for(hub.url, 'count({__name__=~"DCGM_.+|amd_gpu_.+", cluster="c1"})',
             lambda r: bool(r) and r[0]["value"][1] == "4")
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db}
    assert gpufleet("sync", "--stale-after", "30s", env=env).exit_code == 0
    gpus = {g["uuid"]: g for g in gpufleet_json("inventory", "gpus", env=env)}
    assert gpus["GPU-NOXID"]["health"] is None  # nothing said: unknown, not "ok"
    assert gpus["GPU-NOXID"]["utilisation_pct"] == pytest.approx(25.0)
    assert gpus["amd-nopower"]["power_w"] is None and gpus["amd-nopower"]["state"] == "active"

    t0 = (time.time() // 3600) * 3600 - 4 * 3600
    text = openmetrics([("amd_gpu_gfx_activity", f'cluster="c1",{amd},pod="p",namespace="ml"',
                         lambda t: 50.0)], [t0 + 30 + 60 * k for k in range(60)])
    old = backfilled_hub(tmp_path / "past", text).start(timeout=120)
    engine = inv.make_engine(db)
    try:
        with HubClient.from_settings(HubSettings(url=old.url)) as client:
            usage.collect_usage(engine, client, bucket=3600, push_interval=60, starts=[t0])
        with engine.connect() as conn:
            [row] = conn.execute(sa.select(inv.usage)).mappings().all()
    finally:
        old.stop()
        engine.dispose()
    assert row["gpu_hours"] == pytest.approx(1.0) and row["avg_utilisation_pct"] == 50.0
    assert row["avg_power_w"] is None and row["energy_wh"] is None  # unknown, not 0 Wh
