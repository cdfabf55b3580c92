"""Metered allocation: allocated GPU time from each allocation's own edges, through a real
hub Prometheus holding kube-state-metrics-shaped and dcgm-exporter-shaped history (promtool
backfill), collected with the ledger's real queries (the issue's examples, to the second)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from hub import inventory as inv
from hub import usage
from hub.store import HubClient, HubSettings
from tests.support.backfill import PodObject, Series, backfilled_hub, openmetrics
from tests.support.samples import names_in

H100 = "NVIDIA H100 80GB HBM3"
EXPORTER = 'namespace="gpu-operator",pod="nvidia-dcgm-exporter-7xk2p"'


def gpu_series(uuid: str, node: str, holder: tuple[str, str, float, float] | None,
               cluster: str = "c1", util: float = 50.0) -> list[Series]:
    """dcgm-exporter's GPU_UTIL and POWER_USAGE of one GPU: labelled with ``holder``'s
    namespace and pod at the pushes within [start, end), the exporter's own pod otherwise."""
    base = f'cluster="{cluster}",Hostname="{node}",gpu="0",UUID="{uuid}",modelName="{H100}"'
    ns, pod, a, b = holder or ("", "", 0.0, 0.0)

    def held(t: float) -> bool:
        return holder is not None and a <= t < b

    out: list[Series] = []
    for name, value in (("DCGM_FI_DEV_GPU_UTIL", util), ("DCGM_FI_DEV_POWER_USAGE", 200.0)):
        out.append((name, f"{base},{EXPORTER}",
                    lambda t, v=value: None if held(t) else v))
        if holder is not None:
            out.append((name, f'{base},namespace="{ns}",pod="{pod}"',
                        lambda t, v=value: v if held(t) else None))
    return out


def collect(tmp_path: Path, series: list[Series], times: list[float], starts: list[float],
            push: float, **kwargs) -> list[dict]:
    hub = backfilled_hub(tmp_path / "hub", openmetrics(series, times)).start(timeout=120)
    engine = inv.make_engine(f"sqlite:///{tmp_path / 'inv.db'}", create=True)
    inv.ensure_schema(engine)
    try:
        with HubClient.from_settings(HubSettings(url=hub.url)) as client:
            result = usage.collect_usage(engine, client, bucket=3600, push_interval=push,
                                         starts=starts, **kwargs)
        assert result.failed == []
        with engine.connect() as conn:
            return [dict(r) for r in conn.execute(sa.select(inv.usage)).mappings()]
    finally:
        hub.stop()
        engine.dispose()


def hours_of(rows: list[dict], **match: str) -> float:
    return sum(r["gpu_hours"] for r in rows
               if all(r[k] == v for k, v in match.items()))


def test_a_two_minute_job_at_300s_pushes_is_billed_two_minutes(tmp_path: Path):
    """No push carried the job's labels (it ran between two): sampled it is 0 minutes; its
    edges bill it 120 s, on its node's GPU whose exact identity no series names, and the
    node's unallocated time gives those 120 s up (the GPU's hour stays one hour)."""
    push = 300.0
    t0 = (time.time() // 3600) * 3600 - 5 * 3600
    times = [t0 + 30 + push * k for k in range(round(3 * 3600 / push))]
    job = PodObject("ml", "job-1", "n1", start=t0 + 3600 + 400, end=t0 + 3600 + 520)
    rows = collect(tmp_path, [*gpu_series("GPU-0", "n1", None), *job.series()], times,
                   [t0 + 3600], push)
    assert hours_of(rows, pod="job-1") == pytest.approx(120 / 3600)
    billed = next(r for r in rows if r["pod"] == "job-1")
    assert billed["allocation_basis"] == "interval" and billed["uuid"] == ""
    assert billed["node"] == "n1" and billed["model"] == H100
    assert hours_of(rows, pod="") == pytest.approx(1 - 120 / 3600)
    assert sum(r["gpu_hours"] for r in rows) == pytest.approx(1.0)


def test_two_gpus_taken_at_1_03_20_are_billed_3_889_gpu_hours_of_three(tmp_path: Path):
    """Pushes every 300 s label the GPUs from 1:05:00 (sampled: 3.833 GPU-hours); the pod's
    start time bills them from 1:03:20: 2 x 1 h 56 min 40 s = 3.889 GPU-hours."""
    push = 300.0
    t0 = (time.time() // 3600) * 3600 - 6 * 3600
    start = t0 + 3600 + 200
    times = [t0 + push * k for k in range(round(4 * 3600 / push))]
    pod = PodObject("ml", "train", "n1", start=start, gpus=2)
    series = [*gpu_series("GPU-0", "n1", ("ml", "train", start, t0 + 9 * 3600)),
              *gpu_series("GPU-1", "n1", ("ml", "train", start, t0 + 9 * 3600)),
              *pod.series()]
    rows = collect(tmp_path, series, times, [t0, t0 + 3600, t0 + 7200], push)
    assert hours_of(rows, pod="train") == pytest.approx(2 * (7200 - 200) / 3600)
    assert round(hours_of(rows, pod="train"), 3) == 3.889
    assert {r["allocation_basis"] for r in rows if r["pod"] == "train"} == {"interval"}
    assert {r["uuid"] for r in rows if r["pod"] == "train"} == {"GPU-0", "GPU-1"}
    # the GPUs' first 1:03:20 are unallocated: the rest of their 6 GPU-hours
    assert hours_of(rows, pod="") == pytest.approx(6 - 2 * (7200 - 200) / 3600)


def test_shared_gpus_charge_each_pod_its_share_and_never_more_than_the_gpu(tmp_path: Path):
    """Time-slicing (4 replicas, two pods: a quarter each, the other half unallocated) and
    HAMi cores (50 % + 30 %, then 40 % more for the second half hour: 120 % asked, so each
    is scaled to add up to the one GPU)."""
    push = 60.0
    t0 = (time.time() // 3600) * 3600 - 4 * 3600
    end = t0 + 9 * 3600
    times = [t0 + 20 + push * k for k in range(round(3 * 3600 / push))]
    sliced = [PodObject("ml", name, "n1", start=t0 - 600, resource="nvidia_com_gpu_shared")
              for name in ("a", "b")]
    hami = [PodObject("ml", "c", "n2", start=t0 - 600, more=(("nvidia_com_gpucores", 50),)),
            PodObject("ml", "d", "n2", start=t0 - 600, more=(("nvidia_com_gpucores", 30),)),
            PodObject("ml", "e", "n2", start=t0 + 5400, more=(("nvidia_com_gpucores", 40),))]
    series: list[Series] = [("kube_node_labels",
                             'cluster="c1",node="n1",label_nvidia_com_gpu_replicas="4"',
                             lambda t: 1.0)]
    for p in [*sliced, *hami]:
        series += p.series()
        uuid, node = ("GPU-0", "n1") if p.node == "n1" else ("GPU-1", "n2")
        series += [s for s in gpu_series(uuid, node, ("ml", p.pod, p.start, end))
                   if 'pod="nvidia-dcgm' not in s[1]]  # every sample names a pod
    rows = collect(tmp_path, series, times, [t0 + 3600], push)
    assert hours_of(rows, pod="a") == pytest.approx(0.25)
    assert hours_of(rows, pod="b") == pytest.approx(0.25)
    assert hours_of(rows, uuid="GPU-0", pod="") == pytest.approx(0.5)
    assert hours_of(rows, pod="c") == pytest.approx(0.5 * 0.5 + 0.5 * 0.5 / 1.2)
    assert hours_of(rows, pod="d") == pytest.approx(0.5 * 0.3 + 0.5 * 0.3 / 1.2)
    assert hours_of(rows, pod="e") == pytest.approx(0.5 * 0.4 / 1.2)
    assert hours_of(rows, uuid="GPU-1", pod="") == pytest.approx(0.5 * 0.2)
    assert hours_of(rows, uuid="GPU-1") == pytest.approx(1.0)


def test_without_completion_times_the_end_is_the_last_running_push_plus_one(tmp_path: Path):
    """OpenShift's kube-state-metrics: no kube_pod_completion_time. The end is bounded by
    the push after the last Running sample (estimated), and never past the start of the
    next pod on the same GPU."""
    push = 300.0
    t0 = (time.time() // 3600) * 3600 - 5 * 3600
    times = [t0 + 30 + push * k for k in range(round(3 * 3600 / push))]
    bucket = t0 + 3600
    first = PodObject("ml", "first", "n1", start=bucket - 100, end=bucket + 600,
                      completion=False)  # last Running push: +330, so estimated till +630
    alone = PodObject("ml", "alone", "n2", start=bucket - 100, end=bucket + 600,
                      completion=False)
    second = PodObject("ml", "second", "n1", start=bucket + 610, end=bucket + 5000,
                       completion=False)
    series = [*first.series(), *second.series(), *alone.series(),
              *gpu_series("GPU-0", "n1", ("ml", "first", first.start, first.end)),
              *gpu_series("GPU-1", "n2", ("ml", "alone", alone.start, alone.end))]
    series += [s for s in gpu_series("GPU-0", "n1", ("ml", "second", second.start, 1e12))
               if 'pod="second"' in s[1]]
    rows = collect(tmp_path, series, times, [bucket], push)
    basis = {r["pod"]: r["allocation_basis"] for r in rows if r["pod"]}
    assert basis == {"first": "estimated", "second": "interval", "alone": "estimated"}
    assert hours_of(rows, pod="alone") == pytest.approx(630 / 3600)
    assert hours_of(rows, pod="first") == pytest.approx(610 / 3600)  # capped by "second"
    assert hours_of(rows, pod="second") == pytest.approx((3600 - 610) / 3600)
    assert hours_of(rows, uuid="GPU-0") == pytest.approx(1.0)


def test_idle_efficiency_cost_and_every_reader_follow_the_metered_hours(tmp_path: Path):
    """`usage collect --min-charge 60s` through the CLI; `usage` (JSON, CSV, with prices),
    `idle`, the API and the live page all read the metered hours and say their basis: the
    idle 2-GPU pod wastes its 3.889 metered GPU-hours, a 10 s job is charged 60 s."""
    from hub.service import build_app, read_only_engine
    from hub.service._page import usage_section
    from tests.support.asgi import AppClient, no_metrics
    from tests.support.clirun import gpufleet, gpufleet_json

    push = 300.0
    t0 = (time.time() // 3600) * 3600 - 6 * 3600
    start = t0 + 3600 + 200
    times = [t0 + push * k for k in range(round(4 * 3600 / push))]
    train = PodObject("ml", "train", "n1", start=start, gpus=2)
    blip = PodObject("ci", "blip", "n2", start=t0 + 5400, end=t0 + 5410)
    series = [*gpu_series("GPU-0", "n1", ("ml", "train", start, t0 + 9 * 3600), util=2.0),
              *gpu_series("GPU-1", "n1", ("ml", "train", start, t0 + 9 * 3600), util=2.0),
              *gpu_series("GPU-2", "n2", None), *train.series(), *blip.series()]
    text = openmetrics(series, times)
    hub = backfilled_hub(tmp_path / "hub", text).start(timeout=120)
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db}
    period = ["--from", _iso(t0), "--until", _iso(t0 + 3 * 3600)]
    prices = tmp_path / "prices.yaml"
    prices.write_text(f'"{H100}": 2.5\n')
    try:
        collected = gpufleet_json("usage", "collect", *period, "--min-charge", "60s", env=env)
    finally:
        hub.stop()
    # a fixed request count: one probe and one list of names per collect, then the same set
    # for every bucket (the queries of the names the store holds)
    assert collected["requests"] == 2 + 3 * len(usage.bucket_queries(
        3600, push, push, "cluster", held=names_in(text)))
    metered = 2 * (7200 - 200) / 3600
    rows = {r["namespace"]: r for r in gpufleet_json("usage", *period, env=env)}
    assert rows["ml"]["gpu_hours"] == pytest.approx(metered, abs=1e-6)
    assert rows["ml"]["idle_allocated_gpu_hours"] == pytest.approx(metered, abs=1e-6)
    assert rows["ml"]["busy_gpu_hours"] == pytest.approx(metered * 0.02, abs=1e-6)
    assert rows["ml"]["energy_kwh"] == pytest.approx(metered * 0.2, abs=1e-6)
    assert rows["ml"]["allocation_basis"] == "interval"
    assert rows["ci"]["gpu_hours"] == pytest.approx(60 / 3600, abs=1e-6)
    assert rows[None]["allocation_basis"] is None  # unallocated time has no allocation
    idle = gpufleet_json("idle", *period, env=env)
    assert sum(r["wasted_gpu_hours"] for r in idle) == pytest.approx(metered, abs=1e-6)
    billed = {r["namespace"]: r for r in gpufleet_json("usage", *period, "--prices",
                                                       str(prices), env=env)}
    assert billed["ml"]["cost"] == pytest.approx(metered * 2.5, abs=1e-5)
    csv = gpufleet("usage", *period, "-o", "csv", env=env).stdout.splitlines()
    assert "allocation_basis" in csv[0].split(",")
    assert any(line.startswith("ml,") and line.endswith(",interval") for line in csv)
    engine = read_only_engine(db)
    try:
        app = AppClient(build_app(engine, health=lambda: (True, {}),
                                  findings=lambda: ([], None), metrics=no_metrics))
        code, body = app.handle("/api/v1/usage", {"from": [_iso(t0)],
                                                  "until": [_iso(t0 + 3 * 3600)]})
        assert code == 200
        assert {r["namespace"]: r["allocation_basis"] for r in body["items"]} == {
            "ml": "interval", "ci": "interval", None: None}
        with engine.connect() as conn:
            section = usage_section(conn)
        assert section is not None and ("allocation_basis", "Allocated time") in section.columns
        assert {r["namespace"]: r["allocation_basis"] for r in section.rows}["ml"] == "interval"
    finally:
        engine.dispose()


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def test_a_spoke_asking_1e9_gpus_of_a_1_gpu_node_bills_the_node_and_the_report_names_it(
        tmp_path: Path, db_url: str):
    """Issue 42 end to end, on both databases: kube-state-metrics says a pod asks 1e9 GPUs
    of node n1, which has one (two hours: 2,000,000,000 GPU-hours before), and another pod
    on n2 sends a start of +Inf (billed 0 before, its hours "unallocated"). The ledger bills
    n1's two GPU-hours and the other pod its samples; the report names both pods."""
    from hub.validate._assess import metering_findings

    push = 300.0
    t0 = (time.time() // 3600) * 3600 - 5 * 3600
    times = [t0 + 30 + push * k for k in range(round(4 * 3600 / push))]
    greedy = PodObject("ml", "greedy", "n1", start=t0 + 600, gpus=1e9)
    series = [*gpu_series("GPU-0", "n1", ("ml", "greedy", greedy.start, t0 + 9 * 3600)),
              *greedy.series(),
              *gpu_series("GPU-1", "n2", ("ml", "odd", t0 + 3600 + 1800, t0 + 9 * 3600)),
              ("kube_pod_start_time", 'cluster="c1",namespace="ml",pod="odd",uid="odd"',
               lambda t: float("inf") if t >= t0 + 3600 + 1800 else None),
              ("kube_pod_container_resource_requests",
               'cluster="c1",namespace="ml",pod="odd",uid="odd",container="main",node="n2",'
               'resource="nvidia_com_gpu",unit="integer"',
               lambda t: 1.0 if t >= t0 + 3600 + 1800 else None)]
    hub = backfilled_hub(tmp_path / "hub", openmetrics(series, times)).start(timeout=120)
    engine = inv.make_engine(db_url, create=True)
    inv.ensure_schema(engine)
    try:
        with HubClient.from_settings(HubSettings(url=hub.url)) as client:
            result = usage.collect_usage(engine, client, bucket=3600, push_interval=push,
                                         starts=[t0 + 3600, t0 + 7200])
        assert result.failed == []
        with engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(sa.select(inv.usage)).mappings()]
            findings = metering_findings(conn, dt.datetime.fromtimestamp(t0, dt.UTC)
                                          .replace(tzinfo=None))
    finally:
        hub.stop()
        engine.dispose()
    assert hours_of(rows, pod="greedy") == pytest.approx(2.0)
    assert hours_of(rows, node="n1") == pytest.approx(2.0)
    assert hours_of(rows, pod="odd") == pytest.approx(1.5)  # its samples: 1:30 to 3:00
    assert {r["allocation_basis"] for r in rows if r["pod"] == "odd"} == {"sampled"}
    assert hours_of(rows, node="n2") == pytest.approx(2.0)
    by_pod = {(f.check, f.namespace, f.node, f.message.split(":")[0]): f for f in findings}
    assert set(by_pod) == {("metering_capped", "ml", "n1", "ml/greedy"),
                           ("metering_impossible_edges", "ml", "n2", "ml/odd")}
    greedy_finding = by_pod[("metering_capped", "ml", "n1", "ml/greedy")]
    assert "1e+09 nvidia_com_gpu" in greedy_finding.message
    assert "in 2 bucket(s)" in greedy_finding.message and greedy_finding.severity == "warning"
    odd = by_pod[("metering_impossible_edges", "ml", "n2", "ml/odd")]
    assert "start time is inf" in odd.message and "from its samples" in odd.message
