"""The vendor-neutral record, from plain PromQL rows (no network, no database)."""

from __future__ import annotations

import re

from hub import store as vendors
from hub.inventory._normalize import FleetBuilder

NV = vendors.profile("nvidia")
AMD = vendors.profile("amd")


def row(value: float, **labels: str) -> dict:
    return {"metric": labels, "value": [1_800_000_000.0, str(value)]}


def stamp(ts: float, **labels: str) -> dict:
    """A row of the sample-times query: the newest sample's own time and its value."""
    return {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", **labels}, "value": [ts, "40"]}


def field_of(profile, name: str) -> str:
    """The neutral field a metric fills (what the sync's per-field query would return)."""
    bare = name.removeprefix("amd_")
    return next(f for f, names in profile.value_fields.items() if bare in names)


def build(nvidia: dict | None = None, amd: dict | None = None, label: str = "cluster"):
    b = FleetBuilder(label)
    for profile, parts in ((NV, nvidia or {}), (AMD, amd or {})):
        b.add_timestamps(profile, parts.get("timestamp", []))
        for r in parts.get("values", []):
            labels = dict(r["metric"])
            name = labels.pop("__name__")
            b.add_values(profile, field_of(profile, name), [{**r, "metric": labels}])
    return {(o.uuid, o.mig_profile, o.mig_instance): o for o in b.observations()}


def test_dcgm_gpu_with_both_hostname_spellings_and_memory_sum():
    ids = dict(cluster="c", UUID="GPU-1", gpu="3", modelName="NVIDIA H100 80GB HBM3")
    one = dict(Hostname="n1", **ids)
    obs = build(nvidia={
        "timestamp": [stamp(1_800_000_000.5, **one)],
        "values": [
            row(40, **one, __name__="DCGM_FI_DEV_FB_USED"),
            row(60, **one, __name__="DCGM_FI_DEV_FB_FREE"),
            row(2, **one, __name__="DCGM_FI_DEV_FB_RESERVED"),
            row(250.5, **one, __name__="DCGM_FI_DEV_POWER_USAGE"),
            row(31, hostname="n2", **{**ids, "UUID": "GPU-2"}, __name__="DCGM_FI_DEV_GPU_TEMP"),
        ],
    })
    gpu = obs[("GPU-1", None, None)]
    assert (gpu.cluster, gpu.node, gpu.vendor, gpu.index) == ("c", "n1", "nvidia", 3)
    assert gpu.model == "NVIDIA H100 80GB HBM3"
    assert gpu.memory_total_mib == 102 and gpu.memory_used_mib == 40
    assert gpu.power_w == 250.5 and gpu.sample_at == 1_800_000_000.5
    # a GPU that reports one field still exists, with the others null
    other = obs[("GPU-2", None, None)]
    assert other.node == "n2" and other.memory_total_mib is None and other.utilisation_pct is None
    assert other.temperature_c == 31 and other.sample_at is None  # no sample time known


def test_mig_slices_keep_parent_uuid_and_parent_is_synthesised():
    base = dict(cluster="c", hostname="n", UUID="GPU-M", gpu="0", modelName="A100",
                exported_pod="trainer-0", exported_namespace="team-a", exported_container="torch")
    slices = [("3g.40gb", "1", 10000, 30000, 0.5), ("1g.10gb", "13", 0, 9728, 0.0)]
    obs = build(nvidia={
        "values": [
            r for p, i, used, free, active in slices for r in (
                row(used, **base, GPU_I_PROFILE=p, GPU_I_ID=i, __name__="DCGM_FI_DEV_FB_USED"),
                row(free, **base, GPU_I_PROFILE=p, GPU_I_ID=i, __name__="DCGM_FI_DEV_FB_FREE"),
                row(0, **base, GPU_I_PROFILE=p, GPU_I_ID=i, __name__="DCGM_FI_DEV_GPU_UTIL"),
                row(active, **base, GPU_I_PROFILE=p, GPU_I_ID=i,
                    __name__="DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
                row(200, **base, GPU_I_PROFILE=p, GPU_I_ID=i, __name__="DCGM_FI_DEV_POWER_USAGE"),
            )
        ],
    })
    big = obs[("GPU-M", "3g.40gb", "1")]
    assert big.utilisation_pct == 50.0  # the profiling ratio, not GPU_UTIL's 0
    assert big.memory_total_mib == 40000
    assert big.allocations == {("team-a", "trainer-0", "torch")}
    parent = obs[("GPU-M", None, None)]
    assert parent.memory_total_mib == 40000 + 9728
    assert parent.power_w == 200 and parent.utilisation_pct is None
    assert parent.model == "A100" and parent.index == 0


def test_amd_uuid_fallbacks_prefix_and_units():
    common = dict(cluster="c", hostname="amd1")
    mi300 = dict(common, gpu_id="0", gpu_uuid="u-0", card_series="MI300X", card_model="x")
    obs = build(amd={
        "values": [
            row(196592, **mi300, __name__="gpu_total_vram"),
            row(1000, **mi300, __name__="gpu_used_vram"),
            row(71, **mi300, __name__="gpu_gfx_activity"),
            row(90, **common, gpu_id="1", serial_number="S1", card_model="0x74b5",
                __name__="amd_gpu_package_power"),
            row(33, **common, gpu_id="2", __name__="amd_gpu_junction_temperature"),
        ],
    })
    mi300 = obs[("u-0", None, None)]
    assert (mi300.vendor, mi300.model, mi300.memory_total_mib, mi300.memory_used_mib) == (
        "amd", "MI300X", 196592, 1000)
    assert mi300.utilisation_pct == 71
    vf = obs[("serial:S1", None, None)]
    assert vf.model == "0x74b5" and vf.power_w == 90  # card_model when card_series is empty
    bare = obs[("amd1/2", None, None)]
    assert bare.temperature_c == 33 and bare.index == 2


def test_series_without_gpu_identity_are_ignored():
    obs = build(  # e.g. node-level series such as gpu_nodes_total
        nvidia={"values": [row(1, cluster="c", Hostname="n", __name__="DCGM_FI_DEV_GPU_TEMP")]},
        amd={"values": [row(2, cluster="c", hostname="n", __name__="gpu_edge_temperature")]},
    )
    assert obs == {}


def test_cluster_label_is_configurable():
    obs = build(nvidia={"values": [row(1, acm_cluster="prod-1", Hostname="n", UUID="G",
                                       __name__="DCGM_FI_DEV_GPU_TEMP")]},
                label="acm_cluster")
    assert obs[("G", None, None)].cluster == "prod-1"


def test_request_set_is_fixed_and_names_every_vendor():
    queries = vendors.sync_queries("10m", "1m", "cluster")
    # NVIDIA 7 values + 4 health + sample times + presence; AMD 6 + 2 + 1 + 1 (the dcgm
    # naming is read off the sample-time answer, which has both spellings: no request)
    assert len(queries) == 23
    assert {(q.vendor, q.kind) for q in queries} == {
        (v, k) for v in ("nvidia", "amd") for k in ("timestamp", "values", "presence")
    }
    power = next(q for q in queries if q.vendor == "amd" and q.field == "power_w")
    assert power.promql.index("gpu_power_usage") < power.promql.index("gpu_package_power")


def test_sync_names_metrics_exactly_so_thanos_can_prune():
    """No `__name__` regex: the store would match it against every metric name it holds."""
    for q in vendors.sync_queries("10m", "1m", "cluster"):
        assert ".+" not in q.promql and ".*" not in q.promql, q.promql
        for names in re.findall(r'__name__=~"([^"]*)"', q.promql):  # explicit a|b lists only
            assert re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*(\|[A-Za-z_:][A-Za-z0-9_:]*)*", names)
        assert "[10m" in q.promql  # every query looks back the whole window


def test_each_field_comes_from_the_gpus_newest_series():
    """A pod change mid-window: the old series lingers; its values must not win a `max`."""
    gpu = dict(cluster="c", Hostname="n", UUID="GPU-P", gpu="0", modelName="H100")
    old = dict(gpu, pod="old-0", namespace="a", DCGM_FI_DRIVER_VERSION="550")
    new = dict(gpu, pod="new-0", namespace="b", DCGM_FI_DRIVER_VERSION="580")
    obs = build(nvidia={
        "timestamp": [stamp(1_800_000_100, **new), stamp(1_800_000_000, **old)],
        "values": [  # the old pod used more memory and more compute than the new one
            row(90, **old, __name__="DCGM_FI_DEV_GPU_UTIL"),
            row(70000, **old, __name__="DCGM_FI_DEV_FB_USED"),
            row(11000, **old, __name__="DCGM_FI_DEV_FB_FREE"),
            row(5, **new, __name__="DCGM_FI_DEV_GPU_UTIL"),
            row(1000, **new, __name__="DCGM_FI_DEV_FB_USED"),
            row(80000, **new, __name__="DCGM_FI_DEV_FB_FREE"),
        ],
    })[("GPU-P", None, None)]
    assert obs.utilisation_pct == 5 and obs.memory_used_mib == 1000
    assert obs.memory_total_mib == 81000  # not 70000 + 80000: no sum across series
    assert obs.driver_version == "580" and obs.sample_at == 1_800_000_100
    assert obs.allocations == {("a", "old-0", ""), ("b", "new-0", "")}  # both used it


def test_allowlist_covers_what_the_sync_reads():
    names = vendors.allowlist_metrics()
    for needed in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "gpu_gfx_activity",
                   "amd_gpu_used_vram", "gpufleet_exporter_up"):
        assert needed in names
    assert names == sorted(set(names))


def test_range_answer_is_cut_to_each_series_newest_sample():
    """The sample-times query decodes one sample per series, whatever the density."""
    import json

    from hub.store._client import _newest_sample

    body = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "x", "pod": 'odd "values":[[1,"2"]] ]'},
         "values": [[1.5, "1"], [2.5, "NaN"], [3.25, "7"]]},
        {"metric": {"UUID": "b"}, "values": [[9, "+Inf"]]},
    ]}}
    compact = json.dumps(body, separators=(",", ":"))  # as Prometheus writes it
    cut = json.loads(_newest_sample(compact))["data"]["result"]
    assert [r["value"] for r in cut] == [[3.25, "7"], [9, "+Inf"]]
    assert cut[0]["metric"]["pod"] == 'odd "values":[[1,"2"]] ]'


def test_streamed_rows_decode_one_by_one_and_read_warnings_at_the_end():
    from hub.store import StreamedRows

    text = ('{"status":"success","data":{"resultType":"vector","result":['
            '{"metric":{"a":"]"},"value":[1,"2"]}, {"metric":{},"value":[3,"4"]}]},'
            '"warnings":["receive-2: store unavailable"]}')
    start = text.index('"result":[') + len('"result":[')
    rows = StreamedRows(text, start)
    assert [r["value"] for r in rows] == [[1, "2"], [3, "4"]]
    assert rows.warnings == ["receive-2: store unavailable"]
    empty = StreamedRows('{"data":{"result":[]}}', len('{"data":{"result":['))
    assert list(empty) == [] and empty.warnings == []


def test_a_streamed_answer_split_anywhere_decodes_the_same():
    """The body arrives in chunks that cut rows (and a series' samples) at any byte: every
    split gives the same rows, each range series cut to its newest sample, and the warnings."""
    import json

    import pytest

    from hub.store import StreamedRows
    from hub.store._client import HubUnavailable, _newest_sample

    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"pod": 'odd "values":[[1,"2"]] ]', "UUID": "a"},
         "values": [[1.5, "1"], [2.5, "NaN"], [3.25, "7"]]},
        {"metric": {"UUID": "b"}, "values": [[9, "+Inf"]]},
    ]}, "warnings": ["w"]}, separators=(",", ":"))
    start = body.index('"result":[') + len('"result":[')
    for split in range(start, len(body)):
        rows = StreamedRows(body[:split], start, iter([body[split:]]), _newest_sample)
        got = [(r["metric"]["UUID"], r["value"]) for r in rows]
        assert got == [("a", [3.25, "7"]), ("b", [9, "+Inf"])], split
        assert rows.warnings == ["w"]
    with pytest.raises(HubUnavailable, match="incomplete"):
        list(StreamedRows(body[:start + 30], start, iter(["{"])))


def test_keyed_rows_join_a_series_across_answers_whatever_its_labels_hold():
    """The label text is the series key: a field's answer (no name) and the sample times
    (a range answer, with the name) give one key, also for values holding } " or a name."""
    import json

    from hub.store import StreamedRows
    from hub.store._client import _newest_sample

    odd = {"UUID": "GPU-1", "pod": 'p} "__name__":"x",', "z": "{}"}

    def answer(rows: list[dict]) -> str:
        return json.dumps({"status": "success", "data": {"result": rows}}, separators=(",", ":"))

    for labels in ({"UUID": "GPU-2"}, odd):
        value = answer([{"metric": labels, "value": [5.5, "37"]}])
        stamps = answer([{"metric": {**labels, "__name__": "DCGM_FI_DEV_GPU_TEMP"},
                          "values": [[1.5, "40"], [4.5, "41"]]}])
        got = []
        for body, cut in ((value, None), (stamps, _newest_sample)):
            start = body.index('"result":[') + len('"result":[')
            got += list(StreamedRows(body, start, cut=cut).keyed())
        assert got[0][0] == got[1][0] and json.loads(got[0][0]) == labels
        assert got[0][1:] == ("5.5", "37") and got[1][1:] == ("4.5", "41")


def test_keyed_rows_hand_on_each_new_series_labels_as_the_door_read_them():
    """A series met for the first time is decoded once, by the door, and its labels handed
    on (StreamedRows.labels); a known series' text is decoded where asked. Between known
    and new rows, each text gets its own labels, never the previous new series'."""
    import json

    from hub.store import StreamedRows

    series = [{"UUID": f"GPU-{i}", "Hostname": f"n{i}", "cluster": "c"} for i in range(4)]
    body = json.dumps({"status": "success", "data": {"result": [
        {"metric": {**s, "__name__": "DCGM_FI_DEV_GPU_UTIL"}, "value": [1.5, str(i)]}
        for i, s in enumerate(series)]}}, separators=(",", ":"))
    start = body.index('"result":[') + len('"result":[')
    texts = [text for text, _, _ in StreamedRows(body, start).keyed()]
    # GPU-1 and GPU-3 are known (no door, nothing decoded), GPU-0 and GPU-2 new
    known = {hash(texts[1]), hash(texts[3])}
    rows = StreamedRows(body, start)
    seen, handed = [], 0
    for text, _, value in rows.keyed(known):
        handed += rows._met is not None and rows._met[0] is text
        seen.append((rows.labels(text), value))
    assert seen == [(s, str(i)) for i, s in enumerate(series)]
    assert handed == 2  # the two new series' labels came from the door
