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
