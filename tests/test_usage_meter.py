"""The meter's rules on plain answers (hub/usage/_meter.py): the cases the oracle test does not
draw, each with the answer rows a hub would send."""

from __future__ import annotations

import pytest

from hub.usage._meter import Meter

S, B, P = 7200.0, 3600.0, 300.0
POD = {"cluster": "c1", "namespace": "ml", "pod": "p", "uid": "u1"}
EDGE = {"cluster": "c1", "Hostname": "n1", "UUID": "GPU-0", "namespace": "ml", "pod": "p"}


def rows(*pairs: tuple[dict, float]) -> list[dict]:
    return [{"metric": m, "value": [0, str(v)]} for m, v in pairs]


def gpu_row(pod: str = "", coverage: float = 1.0, uuid: str = "GPU-0", slice_: str = "") -> dict:
    return {"cluster": "c1", "node": "n1", "uuid": uuid, "slice": slice_,
            "namespace": "ml" if pod else "", "pod": pod, "vendor": "nvidia", "model": "H100",
            "gpu_share": 1.0, "gpu_hours": coverage, "coverage": coverage,
            "avg_power_w": 100.0, "energy_wh": 100.0 * coverage, "avg_utilisation_pct": 50.0}


def new_row(vendor, ident, slice_key, namespace, pod) -> dict:
    return {**gpu_row(pod, 0.0, ident.uuid, slice_key), "namespace": namespace}


def hours(out: list[dict], **match) -> float:
    return sum(r["gpu_hours"] for r in out if all(r[k] == v for k, v in match.items()))


def test_an_exporter_that_stopped_ends_its_allocation_one_push_after_its_last_sample():
    m = Meter(start=S, bucket=B, push_interval=P, cluster_label="cluster")
    m.read("edge:start", rows((EDGE, S + 100)))
    m.read("edge:seen", rows((EDGE, S + 1000)))  # no end gauge ever came
    out = m.apply([gpu_row("p", 0.25), gpu_row("", 0.75)], new_row)
    assert hours(out, pod="p") == pytest.approx((1000 + P - 100) / 3600)
    assert {r["allocation_basis"] for r in out if r["pod"]} == {"estimated"}


def test_both_sources_at_once_read_the_exporters_edges_only():
    m = Meter(start=S, bucket=B, push_interval=P, cluster_label="cluster")
    m.read("alloc:start", rows((POD, S - 500)))
    m.read("alloc:end", rows((POD, S + 1800)))
    m.read("alloc:requests", rows(({**POD, "node": "n1", "resource": "nvidia_com_gpu"}, 1)))
    m.read("edge:start", rows((EDGE, S + 10)))
    m.read("edge:end", rows((EDGE, S + 1805)))
    out = m.apply([gpu_row("p", 0.5), gpu_row("", 0.5)], new_row)
    assert hours(out, pod="p") == pytest.approx(1795 / 3600)
    assert hours(out) == pytest.approx(1.0)  # never the pod's time twice


def test_a_pod_recreated_under_its_name_is_billed_for_both_objects_and_no_more():
    m = Meter(start=S, bucket=B, push_interval=P, cluster_label="cluster")
    again = {**POD, "uid": "u2"}
    m.read("alloc:start", rows((POD, S + 0), (again, S + 1200)))
    m.read("alloc:end", rows((POD, S + 600)))
    m.read("alloc:running", rows((again, S + B + 100)))
    m.read("alloc:requests", rows(({**POD, "node": "n1", "resource": "nvidia_com_gpu"}, 1),
                                  ({**again, "node": "n1", "resource": "nvidia_com_gpu"}, 1)))
    out = m.apply([gpu_row("p", 1.0)], new_row)
    assert hours(out, pod="p") == pytest.approx((600 + 2400) / 3600)
    assert hours(out, pod="") == pytest.approx(600 / 3600)


def test_requests_alone_are_no_interval_and_a_pod_without_gpus_is_not_billed():
    m = Meter(start=S, bucket=B, push_interval=P, cluster_label="cluster")
    cpu = {**POD, "pod": "web", "uid": "w"}
    m.read("alloc:start", rows((POD, S - 100), (cpu, S)))
    m.read("alloc:requests", rows(({**POD, "node": "n1", "resource": "nvidia_com_gpu"}, 1),
                                  ({**cpu, "node": "n1", "resource": "cpu"}, 2)))
    m.read("alloc:end", rows((cpu, S + 60)))
    out = m.apply([gpu_row("p", 0.5), gpu_row("", 0.5)], new_row)
    assert {r["allocation_basis"] for r in out} == {"sampled"}  # no end, no Running: samples
    assert hours(out, pod="p") == pytest.approx(0.5) and not hours(out, pod="web")


def test_an_unnamed_mig_slice_is_billed_at_its_profiles_share():
    m = Meter(start=S, bucket=B, push_interval=P, cluster_label="cluster")
    m.read("alloc:start", rows((POD, S)))
    m.read("alloc:end", rows((POD, S + 1800)))
    m.read("alloc:requests", rows(({**POD, "node": "n1",
                                    "resource": "nvidia_com_mig_3g_40gb"}, 1)))
    out = m.apply([gpu_row("", 1.0)], new_row)
    [billed] = [r for r in out if r["pod"]]
    assert billed["uuid"] == "" and billed["slice"] == "3g.40gb/"
    assert billed["gpu_hours"] == pytest.approx(3 / 7 * 0.5)
    assert hours(out) == pytest.approx(1.0)


# -- what a spoke sends is held to physics (issue 42) -------------------------------------------
def ksm(m: Meter, pod: dict, start: float, end: float | None, gpus: float,
        node: str = "n1") -> None:
    m.read("alloc:start", rows((pod, start)))
    if end is not None:
        m.read("alloc:end", rows((pod, end)))
    m.read("alloc:requests", rows(({**pod, "node": node, "resource": "nvidia_com_gpu"}, gpus)))


def test_a_pod_asking_1e9_gpus_of_a_1_gpu_node_is_billed_the_node_and_flagged():
    """Today: 999,999,999 GPU-hours for one hour. The node has one GPU: one GPU-hour."""
    m = Meter(start=S, bucket=B, push_interval=P, cluster_label="cluster")
    ksm(m, POD, S - 100, None, 1e9)
    m.read("alloc:running", rows((POD, S + B + 100)))
    out = m.apply([gpu_row("p", 1.0)], new_row)
    assert hours(out, pod="p") == pytest.approx(1.0)
    assert hours(out) == pytest.approx(1.0)
    [f] = m.flags
    assert (f["flag"], f["namespace"], f["pod"], f["node"]) == ("capped", "ml", "p", "n1")
    assert "1e+09 nvidia_com_gpu" in f["detail"] and "has 1 GPU(s)" in f["detail"]


def test_an_8_gpu_pod_only_kube_state_metrics_sees_gets_the_1_gpu_nodes_20_minutes():
    """Today: 8 x 20 min = 2.67 GPU-hours on a node of one GPU; now 20 minutes, taken from
    the GPU's unallocated time (the node's hour stays one hour)."""
    m = Meter(start=S, bucket=B, push_interval=P, cluster_label="cluster")
    ksm(m, POD, S + 600, S + 1800, 8)
    out = m.apply([gpu_row("", 1.0)], new_row)
    assert hours(out, pod="p") == pytest.approx(1200 / 3600)
    assert hours(out) == pytest.approx(1.0)
    assert [f["flag"] for f in m.flags] == ["capped"]


def test_the_inventorys_gpus_bound_a_node_no_series_names_and_an_unknown_node_holds_16():
    m = Meter(start=S, bucket=B, push_interval=P, cluster_label="cluster",
              node_gpus={("c1", "n2"): 2})
    other = {**POD, "pod": "q", "uid": "u2"}
    ksm(m, POD, S, S + 1800, 1e9, node="n2")
    ksm(m, other, S, S + 1800, 1e9, node="n9")
    out = m.apply([gpu_row("", 1.0)], new_row)
    assert hours(out, pod="p") == pytest.approx(2 * 0.5)
    assert hours(out, pod="q") == pytest.approx(16 * 0.5)
    assert {(f["pod"], f["flag"]) for f in m.flags} == {("p", "capped"), ("q", "capped")}


def test_pods_of_one_node_together_never_exceed_its_gpus_times_the_bucket():
    """Two pods that kube-state-metrics alone shows each holding the one GPU all hour: the
    node had one GPU-hour, so each is billed half of it, and both are flagged."""
    m = Meter(start=S, bucket=B, push_interval=P, cluster_label="cluster")
    other = {**POD, "pod": "q", "uid": "u2"}
    ksm(m, POD, S - 10, S + B + 10, 1)
    ksm(m, other, S - 10, S + B + 10, 1)
    out = m.apply([gpu_row("", 1.0)], new_row)
    assert hours(out, pod="p") == pytest.approx(0.5) and hours(out, pod="q") == pytest.approx(0.5)
    assert hours(out) == pytest.approx(1.0)
    assert sorted(f["pod"] for f in m.flags) == ["p", "q"]


@pytest.mark.parametrize(("kind", "start", "end", "why"), [
    ("alloc", float("inf"), None, "start time is inf"),
    ("alloc", float("nan"), S + 900, "start time is nan"),
    ("alloc", S + 30 * 86400, None, "after the last push that could carry it"),
    ("alloc", S + 1800, S + 600, "before its start"),
    ("edge", S + 1800, S + 600, "before its start"),
    ("edge", float("-inf"), S + 600, "start time is -inf"),
])
def test_impossible_edges_bill_the_pod_from_its_samples_and_say_so(kind, start, end, why):
    """Today such a pod is billed 0 and its time goes to "unallocated"; now its samples
    (a quarter of the bucket) bill it, as without any interval source."""
    m = Meter(start=S, bucket=B, push_interval=P, cluster_label="cluster")
    if kind == "alloc":
        ksm(m, POD, start, end, 1)
        m.read("alloc:running", rows((POD, S + 900)))
    else:
        m.read("edge:start", rows((EDGE, start)))
        m.read("edge:end", rows((EDGE, end)))
    out = m.apply([gpu_row("p", 0.25), gpu_row("", 0.75)], new_row)
    assert hours(out, pod="p") == pytest.approx(0.25)
    assert {r["allocation_basis"] for r in out if r["pod"]} == {"sampled"}
    assert hours(out) == pytest.approx(1.0)
    [f] = m.flags
    assert (f["flag"], f["pod"], f["node"]) == ("impossible_edges", "p", "n1")
    assert why in f["detail"] and "billed 0.25 GPU-hours from its samples" in f["detail"]


def test_impossible_edges_without_a_sample_are_flagged_not_billed():
    m = Meter(start=S, bucket=B, push_interval=P, cluster_label="cluster")
    ksm(m, POD, float("inf"), None, 1)
    out = m.apply([gpu_row("", 1.0)], new_row)
    assert hours(out, pod="p") == 0 and hours(out) == pytest.approx(1.0)
    [f] = m.flags
    assert "nothing was billed" in f["detail"]


def test_edges_that_contradict_the_samples_never_fill_a_gpu_past_its_bucket():
    """One pod's samples saw it hold the GPU a quarter of the hour; another's edges claim the
    whole hour: the GPU holds one hour, the edges' pod gets what the samples leave."""
    m = Meter(start=S, bucket=B, push_interval=P, cluster_label="cluster")
    m.read("edge:start", rows((EDGE, S - 100)))
    m.read("edge:seen", rows((EDGE, S + B + 100)))
    out = m.apply([gpu_row("p", 0.75), gpu_row("q", 0.25)], new_row)
    assert hours(out, pod="q") == pytest.approx(0.25)
    assert hours(out, pod="p") == pytest.approx(0.75)
    assert hours(out) == pytest.approx(1.0)
    assert [(f["pod"], f["flag"]) for f in m.flags] == [("p", "capped")]
