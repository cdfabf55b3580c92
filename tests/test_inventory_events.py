"""GPU identity and inventory events: real agents push into a real hub across syncs, on
SQLite and PostgreSQL; and migration 0005 upgrades a database made at 0002 (the last
release) in place, through 0004."""

from __future__ import annotations

import datetime as dt
import time

import sqlalchemy as sa
from alembic import command

from hub import inventory as inv
from hub.inventory import _migrate as migrate
from hub.inventory._migrate import _config
from spoke import Exporter, SimBackend
from tests.support.clirun import gpufleet, gpufleet_json
from tests.support.promql import wait_for, wait_silent


def gpu_text(uuid: str, node: str, driver: str = "550.54.15", index: int = 0,
             used: int = 1000) -> str:
    labels = (f'gpu="{index}",UUID="{uuid}",device="nvidia{index}",modelName="NVIDIA A100",'
              f'Hostname="{node}",DCGM_FI_DRIVER_VERSION="{driver}"')
    return (f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 40\n"
            f"DCGM_FI_DEV_FB_USED{{{labels}}} {used}\n"
            f"DCGM_FI_DEV_FB_FREE{{{labels}}} {40000 - used}\n")


def by_type(events: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for e in events:
        out.setdefault(e["type"], []).append(e)
    return out


def test_events_from_real_agents_across_syncs(hub, fleet, db_url):
    state = {"text": gpu_text("GPU-X", "n1") + gpu_text("GPU-Y", "n1", index=1)}
    fleet("c1", [lambda: state["text"]])
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url, "GPUFLEET_STALE_AFTER": "3s"}
    wait_for(hub.url, 'count(DCGM_FI_DEV_GPU_TEMP{cluster="c1"})',
             lambda r: bool(r) and r[0]["value"][1] == "2")
    assert gpufleet("sync", env=env).exit_code == 0
    first = gpufleet_json("inventory", "events", env=env)
    assert sorted((e["type"], e["uuid"], e["node"]) for e in first) == [
        ("appeared", "GPU-X", "n1"), ("appeared", "GPU-Y", "n1")]

    # GPU-X moves to n2 with a new driver; GPU-Y stops reporting.
    state["text"] = gpu_text("GPU-X", "n2", driver="560.35.03")
    wait_for(hub.url, 'DCGM_FI_DEV_GPU_TEMP{cluster="c1", Hostname="n2"}', bool)
    wait_silent(hub.url, 'DCGM_FI_DEV_GPU_TEMP{cluster="c1", Hostname="n1"}', "3s")
    assert gpufleet("sync", env=env).exit_code == 0
    gpus = {g["uuid"]: g for g in gpufleet_json("inventory", "gpus", env=env)}
    assert set(gpus) == {"GPU-X", "GPU-Y"}  # one row per GPU: the move is not a new GPU
    assert (gpus["GPU-X"]["node"], gpus["GPU-X"]["state"]) == ("n2", "active")
    assert gpus["GPU-Y"]["state"] == "stale"
    second = by_type(gpufleet_json("inventory", "events", "--since", "1h", env=env))
    moved = second["moved"][0]
    assert (moved["uuid"], moved["node"]) == ("GPU-X", "n2")
    assert moved["details"] == {"from": {"cluster": "c1", "node": "n1"},
                                "to": {"cluster": "c1", "node": "n2"}}
    changed = second["changed"][0]
    assert changed["details"] == {"field": "driver_version", "old": "550.54.15",
                                  "new": "560.35.03"}
    assert [(e["uuid"], e["node"]) for e in second["stale"]] == [("GPU-Y", "n1")]

    # GPU-Y reports again, and GPU-X's memory changes (a different board in the slot).
    state["text"] = (gpu_text("GPU-X", "n2", driver="560.35.03", used=2000).replace(
        "38000", "78000") + gpu_text("GPU-Y", "n1", index=1))
    wait_for(hub.url, 'DCGM_FI_DEV_GPU_TEMP{cluster="c1", UUID="GPU-Y"}', bool)
    wait_for(hub.url, 'DCGM_FI_DEV_FB_FREE{cluster="c1", UUID="GPU-X"} == 78000', bool)
    time.sleep(3.5)
    assert gpufleet("sync", env=env).exit_code == 0
    returned = gpufleet_json("inventory", "events", "--type", "returned", env=env)
    assert [(e["uuid"], e["node"]) for e in returned] == [("GPU-Y", "n1")]
    mem = gpufleet_json("inventory", "events", "--uuid", "GPU-X", "--type", "changed", env=env)
    assert mem[0]["details"] == {"field": "memory_total_mib", "old": 40000.0, "new": 80000.0}

    newest_first = gpufleet_json("inventory", "events", env=env)
    assert [e["at"] for e in newest_first] == sorted((e["at"] for e in newest_first),
                                                     reverse=True)
    csv_out = gpufleet("inventory", "events", "--cluster", "c1", "-o", "csv", env=env).stdout
    assert csv_out.splitlines()[0] == "at,type,cluster,node,uuid,slice,details"
    assert gpufleet_json("inventory", "events", "--cluster", "nope", env=env) == []

    detail = gpufleet_json("inventory", "gpu", "GPU-X", env=env)
    assert detail["gpu"]["node"] == "n2"
    assert {e["type"] for e in detail["events"]} == {"appeared", "moved", "changed"}
    unknown = gpufleet("inventory", "gpu", "GPU-NOPE", env=env)
    assert unknown.exit_code == 1
    assert unknown.stderr.strip() == "error: no GPU with uuid GPU-NOPE in the inventory"
    table = gpufleet("inventory", "gpu", "GPU-X", env=env)
    assert table.exit_code == 0 and "events:" in table.stdout and "moved" in table.stdout


def test_migration_0005_folds_a_moved_gpu_and_keeps_rows(db_url):
    engine = inv.make_engine(db_url, create=True)
    with engine.begin() as conn:
        command.upgrade(_config(conn), "0002")
    t0 = dt.datetime(2026, 11, 1)
    old = sa.table("gpus", *[sa.column(c) for c in (
        "cluster", "node", "uuid", "slice_key", "vendor", "model", "state", "first_seen",
        "last_seen", "last_sample_at", "memory_total_mib", "mig_profile")])
    rows = [
        # GPU-M moved from n1 to n2: the stale copy on n1 and the active row on n2
        ("c1", "n1", "GPU-M", "", "nvidia", "A100", "stale", t0, t0 + dt.timedelta(days=1)),
        ("c1", "n2", "GPU-M", "", "nvidia", "A100", "active", t0 + dt.timedelta(days=2),
         t0 + dt.timedelta(days=5)),
        ("c1", "n1", "GPU-S", "", "nvidia", "A100", "active", t0, t0 + dt.timedelta(days=5)),
        ("c1", "n1", "GPU-S", "3g.40gb/1", "nvidia", "A100", "active", t0,
         t0 + dt.timedelta(days=5)),
    ]
    with engine.begin() as conn:
        names = ["cluster", "node", "uuid", "slice_key", "vendor", "model", "state",
                 "first_seen", "last_seen"]
        conn.execute(old.insert(), [
            dict(zip(names, r, strict=True)) | {
                "last_sample_at": r[-1], "memory_total_mib": 40960.0,
                "mig_profile": r[3].split("/")[0] or None}
            for r in rows])
        conn.execute(sa.text(
            "INSERT INTO allocations VALUES ('c1','n1','GPU-S','3g.40gb/1','ml','p','c',"
            ":t, :t, :t)"), {"t": t0})
    before, after = inv.upgrade(engine)
    assert (before, after) == ("0002", migrate.head())
    with engine.connect() as conn:
        gpus = {(g["uuid"], g["mig_profile"]): g for g in inv.list_gpus(conn)}
        assert len(gpus) == 3
        moved = gpus[("GPU-M", None)]
        assert (moved["node"], moved["state"]) == ("n2", "active")
        assert moved["first_seen"] == t0  # the GPU's own first sighting, not the move's
        assert gpus[("GPU-S", "3g.40gb")]["memory_total_mib"] == 40960.0
        assert len(inv.list_allocations(conn)) == 1
        assert inv.list_events(conn) == []
    engine.dispose()



def test_a_mig_gpu_whose_slices_arrive_a_sync_later_has_no_changed_layout(hub, fleet, db_url):
    """The demo's first syncs run as series arrive: a MIG GPU's own series were in the hub
    before its slices', and every MIG GPU had a `changed mig_layout` ("" to its slices) one
    second after `appeared`. The first slices a GPU shows record its layout (their own
    `appeared` events say so); a later change of them is a `changed` event."""
    backend = SimBackend(gpus=1, mig="3g.40gb,3g.40gb", node="n1")
    backend.open()
    exporter = Exporter(backend, hostname="n1", interval=30)
    phase = {"slices": False}

    def text() -> str:
        lines = exporter.collect_once().text.decode().splitlines()
        return "\n".join(ln for ln in lines if phase["slices"] or "GPU_I_ID" not in ln) + "\n"

    fleet("c1", [text])
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url, "GPUFLEET_STALE_AFTER": "3s"}
    wait_for(hub.url, 'count(DCGM_FI_DEV_FB_FREE{cluster="c1"})',
             lambda r: bool(r) and r[0]["value"][1] == "1")
    assert gpufleet("sync", env=env).exit_code == 0
    phase["slices"] = True
    wait_for(hub.url, 'count(DCGM_FI_DEV_FB_FREE{cluster="c1", GPU_I_ID!=""})',
             lambda r: bool(r) and r[0]["value"][1] == "2")
    assert gpufleet("sync", env=env).exit_code == 0
    events = gpufleet_json("inventory", "events", "--since", "1h", env=env)
    assert sorted((e["type"], e["slice"] or "") for e in events) == [
        ("appeared", ""), ("appeared", "3g.40gb/1"), ("appeared", "3g.40gb/2")]

    # the layout it recorded changes: one slice goes (MIG reconfigured), one `changed`
    phase["slices"] = False
    wait_silent(hub.url, 'DCGM_FI_DEV_FB_FREE{cluster="c1", GPU_I_ID!=""}', "3s")
    assert gpufleet("sync", env=env).exit_code == 0
    changed = gpufleet_json("inventory", "events", "--type", "changed", env=env)
    assert [e["details"] for e in changed] == [
        {"field": "mig_layout", "old": "3g.40gb/1 3g.40gb/2", "new": ""}]
