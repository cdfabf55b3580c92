"""GPU health: exporter faults → hub → inventory health, report finding, and schema upgrade."""

from __future__ import annotations

import itertools
import json

import pytest
import sqlalchemy as sa
from alembic import command

from hub import store as vendors
from hub.inventory import _db as inventory
from hub.inventory import _health as health
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import FleetBuilder
from hub.validate._checks import GpuFacts, check_gpu_health
from spoke import Exporter, SimBackend
from spoke._sim import parse_fault
from tests.support.clirun import gpufleet, gpufleet_json
from tests.support.promql import wait_for

NV = vendors.profile("nvidia")
AMD = vendors.profile("amd")


# -- the verdict (pure) ---------------------------------------------------------------------
@pytest.mark.parametrize(("values", "expected"), [
    ({}, (None, None)),
    ({vendors.LAST_XID: 0, vendors.ECC_DBE: 0, vendors.ROW_REMAP_FAILURE: 0}, ("ok", None)),
    ({vendors.LAST_XID: 79}, ("failed", "xid 79")),
    ({vendors.LAST_XID: 13}, ("degraded", "xid 13")),
    ({vendors.ECC_DBE: 2}, ("failed", "ecc dbe 2")),
    ({vendors.ROW_REMAP_FAILURE: 1, vendors.LAST_XID: 13},
     ("failed", "row remap failure; xid 13")),
    ({vendors.CLOCKS_EVENT_REASONS: 0x40 | 0x4}, ("degraded", "hw thermal slowdown")),
    ({vendors.CLOCKS_EVENT_REASONS: 0x1}, ("ok", None)),  # GPU idle is no fault
    ({vendors.DEVICE_HEALTH: 0}, ("failed", "exporter reports unhealthy")),
    ({vendors.DEVICE_HEALTH: 1}, ("ok", None)),
])
def test_verdict(values, expected):
    assert health.assess(values) == expected


def row(value: float, **labels: str) -> dict:
    return {"metric": labels, "value": [1_800_000_000.0, str(value)]}


def test_normalize_maps_both_vendors_and_judges_a_slice_only_gpu_by_its_worst_slice():
    b = FleetBuilder()
    nv = {"cluster": "c", "Hostname": "n", "UUID": "GPU-1", "serial": "1652823055404"}
    b.add_values(NV, vendors.LAST_XID, [row(79, **nv)])
    b.add_values(NV, vendors.ECC_DBE, [row(0, **nv)])
    # dcgm-exporter under MIG: only slices, one of them with a row-remap failure
    for gi in ("1", "2"):
        sl = {"cluster": "c", "Hostname": "n", "UUID": "GPU-2", "GPU_I_PROFILE": "3g.40gb",
              "GPU_I_ID": gi}
        b.add_values(NV, vendors.ROW_REMAP_FAILURE, [row(1 if gi == "2" else 0, **sl)])
        b.add_values(NV, vendors.LAST_XID, [row(0, **sl)])
    amd = {"cluster": "c", "hostname": "a", "gpu_id": "0", "gpu_uuid": "A-0"}
    b.add_values(AMD, vendors.DEVICE_HEALTH, [row(1, **amd)])
    b.add_values(AMD, vendors.ECC_DBE, [row(3, **amd)])
    obs = {(o.uuid, o.mig_instance): o for o in b.observations()}
    assert (obs[("GPU-1", None)].health, obs[("GPU-1", None)].health_reasons) == (
        "failed", "xid 79")
    assert obs[("GPU-1", None)].serial == "1652823055404"  # our exporter's serial label
    assert (obs[("GPU-2", None)].health, obs[("GPU-2", None)].health_reasons) == (
        "failed", "row remap failure")
    assert obs[("GPU-2", "1")].health == "ok"
    assert (obs[("A-0", None)].health, obs[("A-0", None)].health_reasons) == (
        "failed", "ecc dbe 3")


def test_report_finding_is_an_error_for_failed_a_warning_for_degraded():
    gpus = [GpuFacts("c", "n", "GPU-1", "active", index=0, health="failed",
                     health_reasons="xid 79"),
            GpuFacts("c", "n", "GPU-2", "active", index=1, health="degraded",
                     health_reasons="xid 13"),
            GpuFacts("c", "n", "GPU-3", "active", index=2, health="ok"),
            GpuFacts("c", "n", "GPU-4", "stale", index=3, health="failed",
                     health_reasons="xid 79")]
    found = {(f.gpu, f.severity, f.check) for f in check_gpu_health(gpus)}
    assert found == {("GPU-1", "error", "gpu_unhealthy"), ("GPU-2", "warning", "gpu_unhealthy")}
    assert "xid 79" in check_gpu_health(gpus)[0].message


# -- schema -------------------------------------------------------------------------------------
def test_existing_database_upgrades_in_place(db_url):
    engine = inventory.make_engine(db_url, create=True)
    try:
        with engine.begin() as conn:
            command.upgrade(migrate._config(conn), "0002")
            conn.execute(sa.text(
                "INSERT INTO gpus (cluster, node, uuid, slice_key, vendor, state, first_seen, "
                "last_seen) VALUES ('c', 'n', 'GPU-old', '', 'nvidia', 'active', "
                "'2026-11-01 00:00:00', '2026-11-01 00:00:00')"))
        before, after = migrate.upgrade(engine)
        assert (before, after) == ("0002", migrate.head())
        with engine.connect() as conn:
            [old] = inventory.list_gpus(conn)
        assert old["uuid"] == "GPU-old" and old["health"] is None
        assert old["health_reasons"] is None
    finally:
        engine.dispose()


# -- end to end ---------------------------------------------------------------------------------
def sim_text(node: str, faults: list[str]) -> str:
    backend = SimBackend(gpus=4, node=node, seed=7, faults=[parse_fault(f) for f in faults],
                         clock=lambda: 1_800_000_000.0)
    backend.open()
    ticks = itertools.count(0.0, 0.001)
    exp = Exporter(backend, hostname=node, interval=30, timer=lambda: next(ticks))
    exp.collect_once()
    return exp.exposition().decode()


def test_sim_faults_reach_inventory_api_shape_and_report(hub, fleet, db_url, tmp_path):
    text = sim_text("gpu-node-1", ["1:xid=79", "2:ecc_dbe=2", "3:remap_failure"])
    assert 'DCGM_FI_DEV_XID_ERRORS{' in text and "serial=" in text
    fleet("east", [text])
    wait_for(hub.url, 'count(DCGM_FI_DEV_XID_ERRORS{cluster="east"})',
             lambda r: bool(r) and int(float(r[0]["value"][1])) == 4)
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url}
    result = gpufleet("sync", "--stale-after", "30s", env=env)
    assert result.exit_code == 0, result.output
    gpus = {g["index"]: g for g in gpufleet_json("inventory", "gpus", env=env)}
    assert {i: (g["health"], g["health_reasons"]) for i, g in gpus.items()} == {
        0: ("ok", None), 1: ("failed", "xid 79"), 2: ("failed", "ecc dbe 2"),
        3: ("failed", "row remap failure")}
    assert all(g["serial"] for g in gpus.values())  # NVIDIA serials from our exporter
    table = gpufleet("inventory", "gpus", env=env)
    assert "HEALTH" in table.stdout and "failed" in table.stdout
    report = gpufleet("report", "-o", "json", "--out", str(tmp_path / "r.json"), env=env)
    assert report.exit_code == 1, report.output
    findings = json.loads((tmp_path / "r.json").read_text())["findings"]
    unhealthy = sorted((f["gpu"], f["severity"]) for f in findings
                       if f["check"] == "gpu_unhealthy")
    assert unhealthy == sorted((gpus[i]["uuid"], "error") for i in (1, 2, 3))
