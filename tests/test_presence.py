"""Nothing silently dropped: a GPU whose exporter sends only fields outside the sync's value
set is still in the inventory (fields null), and one spoke pushing without the cluster label
is left out and named while every other cluster is synced.

Held-out exporter output: a dcgm-exporter with a trimmed counter set (only
``DCGM_FI_DEV_SM_CLOCK``, cut from the real L40S scrape) and an AMD device-metrics-exporter
sending only ``gpu_ecc_uncorrect_mpio`` (the MI300X fixture's labels), pushed by real agents
into the real hub Prometheus.
"""

from __future__ import annotations

import json
import re

import pytest

from hub import store
from hub.devstack._prometheus import StaticServer, start_agent
from tests.support.clirun import gpufleet, gpufleet_json
from tests.support.promql import wait_for
from tests.support.samples import sample_text

L40S = "dcgm-l40s-upcloud-uks.prom"
T4 = "dcgm-t4-loaded-ericsson-ccd.prom"
T4_UUID = "GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a"
L40S_UUID = "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43"
MI300X_UUID = "5f0000aa-0000-4000-8000-00000000a000"


def only(text: str, name: str) -> str:
    """The lines of one metric family of a real scrape (a trimmed counter set)."""
    return "".join(line + "\n" for line in text.splitlines()
                   if re.match(rf"(# (HELP|TYPE) )?{name}[{{ ]", line))


def amd_mpio_only() -> str:
    """device-metrics-exporter with its field list cut to one ECC block counter."""
    labels = next(line for line in sample_text("amd-mi300x.prom").splitlines()
                  if line.startswith("gpu_edge_temperature{"))
    labels = labels[labels.index("{"):labels.index("}") + 1]
    return ("# HELP gpu_ecc_uncorrect_mpio Uncorrectable error count in MPIO block\n"
            "# TYPE gpu_ecc_uncorrect_mpio gauge\n"
            f"gpu_ecc_uncorrect_mpio{labels} 0\n")


def env_for(hub_url: str, tmp_path) -> dict[str, str]:
    return {"GPUFLEET_DB": f"sqlite:///{tmp_path / 'inv.db'}", "GPUFLEET_STALE_AFTER": "30s",
            "GPUFLEET_HUB_URL": hub_url}


def test_presence_queries_name_every_metric_exactly_and_cost_one_request_a_vendor():
    queries = store.sync_queries("10m", "1m", "cluster")
    presence = [q for q in queries if q.kind == "presence"]
    assert [q.vendor for q in presence] == [p.vendor for p in store.PROFILES]
    for q in presence:
        assert "__name__" not in q.promql and "=~" not in q.promql
        assert q.promql.count("timestamp(") >= 20  # the exporters' whole field lists
    nvidia, amd = presence
    assert "timestamp(DCGM_FI_DEV_SM_CLOCK)" in nvidia.promql
    assert "timestamp(gpu_ecc_uncorrect_mpio)" in amd.promql
    assert "timestamp(amd_gpu_ecc_uncorrect_mpio)" in amd.promql
    # the same count whatever the window (and so whatever the fleet)
    assert len(store.sync_queries("1h", "1m", "cluster")) == len(queries)


def test_a_store_holding_none_of_a_query_s_names_is_not_asked_it():
    held = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK_HERTZ", "up"}
    queries = store.sync_queries("10m", "1m", "cluster", held=held)
    assert [(q.vendor, q.kind, q.field) for q in queries] == [
        ("nvidia", "values", "utilisation_pct"), ("nvidia", "timestamp", "temperature_c"),
        ("nvidia", "presence", None)]
    util, stamps, presence = (q.promql for q in queries)
    assert util == "last_over_time(DCGM_FI_DEV_GPU_UTIL[10m])"
    assert stamps == "DCGM_FI_DEV_GPU_TEMP[10m]"
    assert presence.count("timestamp(") == 1 and "timestamp(DCGM_FI_DEV_SM_CLOCK_HERTZ)" in presence
    assert presence.endswith("unless on (cluster, Hostname, hostname, UUID, GPU_I_PROFILE, "
                             "GPU_I_ID) (last_over_time(DCGM_FI_DEV_GPU_TEMP[10m]))")
    # no clock name held: no sample-time query, and nothing for the presence query to leave out
    (alone,) = store.sync_queries("10m", "1m", "cluster", held={"gpu_clock"})
    assert alone.vendor == "amd" and alone.kind == "presence" and "unless" not in alone.promql
    assert store.sync_queries("10m", "1m", "cluster", held=set()) == []


def test_a_gpu_sending_only_fields_outside_the_value_set_is_in_the_inventory(
        hub, fleet, tmp_path):
    # the T4 sends SM_CLOCK too: 2 + 1 + 1
    fleet("east", [sample_text(T4), only(sample_text(L40S), "DCGM_FI_DEV_SM_CLOCK"),
                   amd_mpio_only()])
    wait_for(hub.url, 'count(DCGM_FI_DEV_SM_CLOCK) + count(gpu_ecc_uncorrect_mpio)'
             ' + count(DCGM_FI_DEV_GPU_TEMP)', lambda r: bool(r) and r[0]["value"][1] == "4")
    env = env_for(hub.url, tmp_path)
    result = gpufleet("sync", env=env)
    assert result.exit_code == 0, result.output
    gpus = {g["uuid"]: g for g in gpufleet_json("inventory", "gpus", env=env)}
    assert set(gpus) == {T4_UUID, L40S_UUID, MI300X_UUID}
    l40s, mi300x = gpus[L40S_UUID], gpus[MI300X_UUID]
    assert (l40s["vendor"], l40s["model"], l40s["node"]) == ("nvidia", "NVIDIA L40S",
                                                             "gpu1-wl8sg")
    assert (mi300x["vendor"], mi300x["model"], mi300x["node"]) == (
        "amd", "AMD Instinct MI300X OAM", "amd-node-1")
    for gpu in (l40s, mi300x):
        assert gpu["state"] == "active" and gpu["cluster"] == "east"
        assert gpu["last_sample_at"] is not None  # the data's own time, from the presence query
        assert gpu["utilisation_pct"] is None and gpu["memory_total_mib"] is None
    assert gpus[T4_UUID]["utilisation_pct"] == pytest.approx(91)


def test_one_spoke_without_the_cluster_label_is_left_out_named_and_the_rest_synced(
        hub, fleet, tmp_path):
    fleet("east", [sample_text(T4)])
    # the misconfigured spoke: its agent's external label is `team`, not `cluster`
    bad = fleet("west", [sample_text(L40S)], cluster_label="team")
    assert "team: west" in bad.agent.config_path.read_text()
    wait_for(hub.url, "count(DCGM_FI_DEV_GPU_TEMP)",
             lambda r: bool(r) and r[0]["value"][1] == "2")
    env = env_for(hub.url, tmp_path)
    result = gpufleet("sync", env=env)
    assert result.exit_code == 0, result.output
    gpus = gpufleet_json("inventory", "gpus", env=env)
    assert [(g["cluster"], g["uuid"]) for g in gpus] == [("east", T4_UUID)]
    assert "unlabelled_series: 1 GPU series lack label 'cluster'" in result.stdout
    run = gpufleet_json("inventory", "sync-runs", env=env)[0]
    assert run["status"] == "ok" and run["gpus"] == 1
    assert "hosts: gpu1-wl8sg" in run["error"] and "team" in run["error"]
    report = gpufleet("report", "--max-age", "1h", "-o", "json", env=env)
    assert report.exit_code == 1, report.output
    findings = [f for f in json.loads(report.stdout)["findings"]
                if f["check"] == "unlabelled_series"]
    assert len(findings) == 1 and findings[0]["severity"] == "error"
    message = findings[0]["message"]
    assert "1 GPU series lack label 'cluster'" in message and "hosts: gpu1-wl8sg" in message
    assert "they carry: " in message and "team" in message.split("they carry: ")[1]


def test_when_no_series_carries_the_label_it_is_still_a_typo_exit_2(hub, tmp_path):
    server = StaticServer(sample_text(L40S)).start()
    agent = start_agent(tmp_path / "agent", "west", [server.target], hub.url,
                        cluster_label="team")
    try:
        wait_for(hub.url, "count(DCGM_FI_DEV_GPU_TEMP)", lambda r: bool(r))
        env = env_for(hub.url, tmp_path)
        result = gpufleet("sync", env=env)
        assert result.exit_code == 2
        assert "no GPU series carries label 'cluster'; they carry: " in result.stderr
        assert gpufleet_json("inventory", "gpus", env=env) == []
    finally:
        agent.stop()
        server.stop()
