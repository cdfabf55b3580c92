"""Nothing a spoke sends breaks the hub or the bill (issue 42, points 3 and 4): a real hub
Prometheus fed by real agents, one spoke sending readings outside their physics (dcgm 4.7's
units gone wrong: utilisation 1e9 %, memory -4,768 MiB, power -1e9 W) and labels no database
can store (a NUL byte, a pod name of 300 characters), on SQLite and PostgreSQL. The rest of
the fleet syncs; the hostile spoke's readings are unknown, its unstorable series left out,
and both are counted against it and named by the report."""

from __future__ import annotations

import json
import time

import pytest

from hub import inventory as inv
from hub import store, usage
from hub.store._client import StreamedRows
from tests.support.backfill import backfilled_hub, openmetrics
from tests.support.clirun import gpufleet, gpufleet_json
from tests.support.promql import wait_for
from tests.support.samples import sample_text

H100 = 'modelName="NVIDIA H100 80GB HBM3"'
LONG_POD = "p" * 300


def _gpu(uuid: str, more: str = "") -> str:
    return f'gpu="0",UUID="{uuid}",Hostname="bad-n1",{H100}' + (f",{more}" if more else "")


def hostile_text() -> str:
    """One spoke's scrape: GPU-X0 (legacy names) and GPU-X1 (dcgm 4.7 names) send values
    no GPU gives; GPU-NUL and GPU-LONG carry labels no database stores; GPU-OK is sane."""
    lines = []

    def family(name: str, rows: list[tuple[str, float]]) -> None:
        lines.append(f"# TYPE {name} gauge")
        lines.extend(f"{name}{{{labels}}} {value:g}" for labels, value in rows)

    family("DCGM_FI_DEV_GPU_TEMP", [(_gpu("GPU-X0"), 40), (_gpu("GPU-OK"), 41),
                                    (_gpu("GPU-NUL", 'pod="a\x00b",namespace="ml"'), 42),
                                    (_gpu("GPU-LONG", f'pod="{LONG_POD}",namespace="ml"'), 43)])
    family("DCGM_FI_DEV_GPU_TEMP_CELSIUS", [(_gpu("GPU-X1"), 44)])
    family("DCGM_FI_DEV_GPU_UTIL", [(_gpu("GPU-X0"), 1e9), (_gpu("GPU-OK"), 50)])
    family("DCGM_FI_DEV_GPU_UTIL_RATIO", [(_gpu("GPU-X1"), 1e7)])
    family("DCGM_FI_DEV_FB_USED", [(_gpu("GPU-X0"), -4768), (_gpu("GPU-OK"), 1000)])
    family("DCGM_FI_DEV_FB_FREE", [(_gpu("GPU-X0"), 80000), (_gpu("GPU-OK"), 79000)])
    family("DCGM_FI_DEV_FB_USED_BYTES", [(_gpu("GPU-X1"), -4768 * 2 ** 20)])
    family("DCGM_FI_DEV_POWER_USAGE", [(_gpu("GPU-X0"), -1e9), (_gpu("GPU-OK"), 300)])
    family("DCGM_FI_DEV_BOARD_POWER_WATTS", [(_gpu("GPU-X1"), 1e9)])
    return "\n".join(lines) + "\n"


def test_a_hostile_spoke_costs_its_own_readings_and_series_only(hub, fleet, db_url):
    fleet("east", [sample_text("dcgm-h100-8gpu-aicr-eks-156a357e.prom")])
    fleet("bad", [hostile_text()])
    # every hostile series reached the hub as sent (the agent stores the NUL and the long pod)
    wait_for(hub.url, 'count(DCGM_FI_DEV_GPU_TEMP{cluster="bad"})',
             lambda r: bool(r) and int(float(r[0]["value"][1])) == 4)
    wait_for(hub.url, 'count(DCGM_FI_DEV_GPU_TEMP{cluster="east"})',
             lambda r: bool(r) and int(float(r[0]["value"][1])) == 8)
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url}
    result = gpufleet("sync", "--stale-after", "30s", env=env)
    assert result.exit_code == 0, result.output  # on PostgreSQL: a traceback before
    assert "Traceback" not in result.output

    gpus = {g["uuid"]: g for g in gpufleet_json("inventory", "gpus", env=env)}
    assert sum(g["cluster"] == "east" for g in gpus.values()) == 8  # the fleet synced
    assert {u for u, g in gpus.items() if g["cluster"] == "bad"} == {"GPU-X0", "GPU-X1",
                                                                     "GPU-OK"}
    for uuid in ("GPU-X0", "GPU-X1"):  # out of range: unknown, never stored as sent
        assert (gpus[uuid]["utilisation_pct"], gpus[uuid]["memory_used_mib"],
                gpus[uuid]["power_w"]) == (None, None, None), uuid
    assert gpus["GPU-X0"]["temperature_c"] == 40 and gpus["GPU-X1"]["temperature_c"] == 44
    ok = gpus["GPU-OK"]
    assert (ok["utilisation_pct"], ok["memory_used_mib"], ok["power_w"]) == (50, 1000, 300)

    engine = inv.make_engine(db_url)
    with engine.connect() as conn:
        refused = {(r["cluster"], r["kind"]): r["count"] for r in inv.list_refused(conn)}
    engine.dispose()
    assert refused == {("bad", "label"): 2, ("bad", store.UTILISATION): 2,
                       ("bad", store.MEMORY_USED): 2, ("bad", store.POWER): 2}

    out = gpufleet("report", "-o", "json", env=env)
    assert out.exit_code == 1, out.output  # it found problems: the hostile spoke's
    report = json.loads(out.stdout)
    findings = {(f["check"], f["cluster"]): f for f in report["findings"]}
    assert findings[("refused_series", "bad")]["severity"] == "error"
    assert "turned away 2 series" in findings[("refused_series", "bad")]["message"]
    drop = findings[("out_of_range", "bad")]
    assert drop["severity"] == "warning" and "dropped 6 readings" in drop["message"]
    assert "power_w" in drop["message"] and "utilisation_pct" in drop["message"]
    assert not any(f["cluster"] == "east" and f["check"] in ("refused_series", "out_of_range")
                   for f in report["findings"])


# -- the usage ledger ------------------------------------------------------------------------
HOUR = 3600.0


def usage_text(t0: float) -> str:
    series = []
    for uuid, util, power, fb, more in (
            ("GPU-A", 50.0, 300.0, 1000.0, 'namespace="ml",pod="train-0"'),
            ("GPU-X", 1e9, -1e9, -4768.0, 'namespace="ml",pod="train-1"'),
            ("GPU-NUL", 50.0, 300.0, 1000.0, 'namespace="ml",pod="a\\u0000b"'),
            ("GPU-LONG", 50.0, 300.0, 1000.0, f'namespace="ml",pod="{LONG_POD}"')):
        cluster = "c1" if uuid == "GPU-A" else "bad"
        labels = f'cluster="{cluster}",Hostname="n1",gpu="0",UUID="{uuid}",{H100},{more}'
        for name, v in (("DCGM_FI_DEV_GPU_UTIL", util), ("DCGM_FI_DEV_POWER_USAGE", power),
                        ("DCGM_FI_DEV_FB_USED", fb), ("DCGM_FI_DEV_GPU_TEMP", 40.0)):
            series.append((name, labels, lambda t, v=v: v))
    times = [t0 + 15 + 30 * k for k in range(int(HOUR / 30))]
    return openmetrics(series, times).replace("\\u0000", "\x00")


def test_a_hostile_spoke_bills_nothing_it_cannot_have_used(tmp_path, db_url):
    t0 = (time.time() // HOUR) * HOUR - 2 * HOUR
    hub = backfilled_hub(tmp_path / "hub", usage_text(t0)).start(timeout=120)
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url}
    try:
        collect = gpufleet_json("usage", "collect", "--from", _iso(t0), "--until",
                                _iso(t0 + HOUR), env=env)
        assert len(collect["collected"]) == 1 and collect["failed"] == []
        engine = inv.make_engine(db_url)
        with engine.connect() as conn:
            frame = usage.usage_frame(conn, _utc(t0), _utc(t0 + HOUR))
            refused = {(r["cluster"], r["kind"]): r["count"] for r in inv.list_refused(conn)}
        engine.dispose()
        rows = {r.uuid: r for r in frame.itertuples()}
        assert set(rows) == {"GPU-A", "GPU-X"}  # the fleet collected; NUL and LONG left out
        a, x = rows["GPU-A"], rows["GPU-X"]
        assert (a.avg_utilisation_pct, a.avg_power_w, a.energy_wh) == (50, 300, 300)
        assert x.gpu_hours == pytest.approx(1.0)  # the GPU was held: its time is billed
        # ... but nothing it cannot have used: no busy hours, no (negative) energy
        for column in ("avg_utilisation_pct", "max_utilisation_pct", "avg_power_w",
                       "energy_wh", "avg_memory_used_mib", "max_memory_used_mib"):
            assert getattr(x, column) != getattr(x, column), column  # NaN: null
        assert refused == {("bad", "label"): 2, ("bad", store.UTILISATION): 2,
                           ("bad", store.POWER): 1, ("bad", store.MEMORY_USED): 2}
        assert collect["refused"] == 2 + 5  # two series at the door, five readings

        summary = gpufleet_json("usage", "--from", _iso(t0), "--until", _iso(t0 + HOUR),
                                env=env)
        [ml] = summary
        assert ml["busy_gpu_hours"] == pytest.approx(0.5)  # GPU-A's half hour, X's none
        assert ml["energy_kwh"] == pytest.approx(0.3)
    finally:
        hub.stop()


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _utc(ts: float):
    from hub.usage._fold import utc

    return utc(ts)


# -- the door and the table, directly --------------------------------------------------------
def _answer(*metrics: dict[str, str]) -> tuple[str, int]:
    rows = ",".join(json.dumps({"metric": m, "value": [1.0, "1"]}, separators=(",", ":"))
                    for m in metrics)
    body = '{"status":"success","data":{"resultType":"vector","result":[' + rows + "]}}"
    return body, body.index('"result":[') + len('"result":[')


@pytest.mark.parametrize("value, reason", [
    ("a\x00b", "control character ('\\x00')"), ("a\nb", "control character ('\\n')"),
    ("a\x85b", "control character"), ("x" * 254, "254 characters long (at most 253)"),
])
def test_the_door_turns_away_a_series_it_cannot_store(value, reason):
    good = {"cluster": "c1", "pod": "p"}
    bad = {"cluster": "c2", "pod": value}
    for keyed in (False, True):
        text, start = _answer(good, bad, good | {"pod": "q"})
        rows = StreamedRows(text, start)
        got = list(rows.keyed()) if keyed else list(rows)
        assert len(got) == 2
        assert rows.refused.counts == {("c2", "label"): 1}
        assert reason in rows.refused.examples[("c2", "label")]


def test_narrow_labels_are_held_to_their_columns_and_a_bad_cluster_name_is_storable():
    for vendor, label in (("nvidia", "gpu"), ("amd", "gpu_id")):
        attributes = store.profile(vendor).attributes
        assert attributes({label: "3"})["index"] == 3
        assert attributes({label: "\u00b2"})["index"] is None  # isdigit, yet int() refuses
        assert attributes({label: "9" * 30})["index"] is None  # past PostgreSQL's integer
    assert store.label_problem({"UUID": "G" * 128}) is None
    assert "at most 128" in (store.label_problem({"UUID": "G" * 129}) or "")
    assert "at most 16" in (store.label_problem({"GPU_I_ID": "1" * 17}) or "")
    # a label's name is held to the rule too; a printable non-ASCII name is not refused
    assert store.label_problem({"UUID": "GPU-1", "bad\x1fname": "x"}) == (
        "a label name holds a control character")
    assert store.label_problem({"UUID": "GPU-1", "zone\u00e9": "x"}) is None
    refused = store.Refused()
    refused.series({"cluster": "c\x00" + "x" * 300}, "why")
    [(cluster, _)] = refused.counts
    assert "\x00" not in cluster and len(cluster) <= store.MAX_LABEL_VALUE


@pytest.mark.parametrize("field, inside, outside", [
    (store.UTILISATION, [0, 100, 42.5], [-0.1, 100.1, 1e9, float("inf"), float("nan")]),
    (store.MEMORY_USED, [0, 80000], [-4768, 2.0 ** 21]),
    (store.POWER, [0, 700], [-1e9, 1e9]),
    (store.TEMPERATURE, [-5, 95], [-273, 400]),
])
def test_readings_are_held_to_their_physics(field, inside, outside):
    assert all(store.within(field, v) for v in inside)
    assert not any(store.within(field, v) for v in outside)
    assert not store.within(store.MEMORY_USED, 81000, ceiling=80000)
