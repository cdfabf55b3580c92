"""The usage ledger end to end: a real hub Prometheus backfilled with three past hours of
known samples, `usage collect`, then `usage`, `idle` and `capacity` give hand-computed
figures, on SQLite and PostgreSQL.

The fleet (samples every 30 s, at :15 and :45 of each minute, buckets of 1 h):
- GPU-A  H100 c1/n1, pod ml/train-0 (plain pod labels), util 50 %, 300 W
- GPU-B  H100 c1/n1, research/nb-1 in exported_* (the exporter pod in the target labels),
         util 2 %: allocated and idle
- GPU-C  H100 c1/n1, only the exporter pod's labels (unallocated), 60 W, no samples for
         20 minutes of the second hour (coverage 2/3)
- GPU-MV H100 c1, pod ml/train-1, util 100 %, 400 W, moves from n1 to n2 half-way through
         the second hour
- GPU-M  A100 MIG c2/n3: 3g.40gb -> ml/a (60 %), 2g.20gb -> vision/b (10 %), 1g.10gb
         unallocated; 250 W device power on every slice
- amd-1  MI300X c2/n4, hpc/sim-0, 80 %, 500 W; amd-2 (amd_ prefix) exporter pod only, 200 W
- amd-3  (``dark``) MI300X c2/n4, dark/sim-9, 30 %, no power series at all (as an MI350X
         whose power the exporter suppresses): its energy is unknown (null), never 0
"""

from __future__ import annotations

import time

import pytest

from hub import inventory as inv
from hub import usage
from hub.usage._fold import utc
from tests.support.backfill import backfilled_hub, openmetrics
from tests.support.browser import Dom, chromium_dom
from tests.support.clirun import gpufleet, gpufleet_json
from tests.support.httpstub import StubServer
from tests.support.samples import names_in
from tests.test_sync_failures import with_warnings

HOUR = 3600.0
H100 = 'modelName="NVIDIA H100 80GB HBM3"'
A100 = 'modelName="NVIDIA A100-SXM4-80GB"'
OP = 'namespace="gpu-operator",pod="nvidia-dcgm-exporter-7xk2p"'


def fleet_text(t0: float, dark: bool = False) -> str:
    def const(v: float):
        return lambda t: v

    def gap(v: float):  # nothing in [t0+1h+20m, t0+1h+40m)
        return lambda t: None if t0 + HOUR + 1200 <= t < t0 + HOUR + 2400 else v

    moved = t0 + HOUR + 1800
    series = []

    def nv(labels: str, util: float, power: float, fb: float = 1000, when=None) -> None:
        for name, v in (("DCGM_FI_DEV_GPU_UTIL", util), ("DCGM_FI_DEV_POWER_USAGE", power),
                        ("DCGM_FI_DEV_FB_USED", fb), ("DCGM_FI_DEV_FB_FREE", 80000 - fb)):
            series.append((name, labels, (when or const)(v)))

    nv(f'cluster="c1",Hostname="n1",gpu="0",UUID="GPU-A",{H100},namespace="ml",'
       'pod="train-0"', 50, 300)
    nv(f'cluster="c1",Hostname="n1",gpu="1",UUID="GPU-B",{H100},{OP},'
       'exported_namespace="research",exported_pod="nb-1"', 2, 100, fb=500)
    nv(f'cluster="c1",Hostname="n1",gpu="2",UUID="GPU-C",{H100},{OP}', 0, 60, fb=0,
       when=gap)
    for node, before in (("n1", True), ("n2", False)):
        nv(f'cluster="c1",Hostname="{node}",gpu="3",UUID="GPU-MV",{H100},namespace="ml",'
           'pod="train-1"', 100, 400, fb=2000,
           when=lambda v, b=before: (lambda t: v if (t < moved) == b else None))
    for profile, gid, who, engine in (("3g.40gb", 1, 'exported_namespace="ml",'
                                       'exported_pod="a"', 0.6),
                                      ("2g.20gb", 5, 'exported_namespace="vision",'
                                       'exported_pod="b"', 0.1),
                                      ("1g.10gb", 13, "", 0.0)):
        labels = (f'cluster="c2",hostname="n3",gpu="0",UUID="GPU-M",{A100},'
                  f'GPU_I_PROFILE="{profile}",GPU_I_ID="{gid}",{OP}'
                  + (f",{who}" if who else ""))
        nv(labels, 0, 250, fb=100)
        series.append(("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, const(engine)))
    amd = 'card_series="AMD Instinct MI300X OAM",cluster="c2",hostname="n4"'
    for prefix, gid, who, act, power in (
            ("", 0, 'namespace="hpc",pod="sim-0"', 80, 500),
            ("amd_", 1, 'namespace="kube-amd-gpu",pod="amd-device-metrics-exporter-q8v2n"',
             0, 200), *([("", 2, 'namespace="dark",pod="sim-9"', 30, None)] if dark else [])):
        labels = f'{amd},gpu_id="{gid}",gpu_uuid="amd-{gid + 1}",{who}'
        for name, v in (("gpu_gfx_activity", act), ("gpu_power_usage", power),
                        ("gpu_used_vram", 4096), ("gpu_total_vram", 196592)):
            if v is not None:
                series.append((prefix + name, labels, const(v)))
    times = [t0 + 15 + 30 * k for k in range(int(3 * HOUR / 30))]
    return openmetrics(series, times)


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def by_ns(rows: list[dict]) -> dict:
    return {r["namespace"]: r for r in rows}


def expected_by_namespace() -> dict:
    """Hand-computed over the three hours (GPU-equivalent hours, kWh)."""
    s3, s2, s1 = 3 / 7, 2 / 7, 1 / 7
    return {
        "ml": dict(gpu_hours=3 + 3 + 3 * s3, allocated_gpu_hours=3 + 3 + 3 * s3,
                   busy_gpu_hours=1.5 + 3 + 3 * s3 * 0.6, idle_allocated_gpu_hours=0,
                   energy_kwh=(900 + 1200 + 250 * 3 * s3) / 1000),
        "research": dict(gpu_hours=3, allocated_gpu_hours=3, busy_gpu_hours=0.06,
                         idle_allocated_gpu_hours=3, energy_kwh=0.3),
        "vision": dict(gpu_hours=3 * s2, allocated_gpu_hours=3 * s2,
                       busy_gpu_hours=3 * s2 * 0.1, idle_allocated_gpu_hours=0,
                       energy_kwh=250 * 3 * s2 / 1000),
        "hpc": dict(gpu_hours=3, allocated_gpu_hours=3, busy_gpu_hours=2.4,
                    idle_allocated_gpu_hours=0, energy_kwh=1.5),
        None: dict(gpu_hours=(1 + 2 / 3 + 1) + 3 * s1 + 3, allocated_gpu_hours=0,
                   busy_gpu_hours=0, idle_allocated_gpu_hours=0,
                   energy_kwh=(60 * (8 / 3) + 250 * 3 * s1 + 600) / 1000),
        # amd-3 sent no power: unknown energy, not 0 kWh
        "dark": dict(gpu_hours=3, allocated_gpu_hours=3, busy_gpu_hours=0.9,
                     idle_allocated_gpu_hours=0, energy_kwh=None),
    }


def test_usage_collect_usage_idle_capacity_on_a_backfilled_hub(tmp_path, db_url):
    t0 = (time.time() // HOUR) * HOUR - 4 * HOUR
    hub = backfilled_hub(tmp_path / "hub", fleet_text(t0, dark=True)).start(timeout=120)
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url}
    period = ["--from", iso(t0), "--until", iso(t0 + 3 * HOUR)]
    try:
        assert gpufleet("sync", "--stale-after", "4h", env=env).exit_code == 0
        first = gpufleet_json("usage", "collect", "--from", iso(t0), "--until",
                              iso(t0 + 2 * HOUR), env=env)
        assert len(first["collected"]) == 2 and first["failed"] == []
        # no allocation series in this hub: one probe and one list of names per collect,
        # then the samples' queries of the names it holds (every allocated row sampled)
        assert first["requests"] == 2 + 2 * len(usage.bucket_queries(
            3600, 300, 300, "cluster", allocations=False,
            held=names_in(fleet_text(t0, dark=True))))
        two_hours = gpufleet_json("usage", *period, env=env)

        hub.stop()  # outage: the next collect fails, and leaves the collected hours alone
        down = gpufleet("usage", "collect", "--max-backfill", "5h", "--push-interval", "30s",
                        env=env)
        assert down.exit_code == 3, down.output
        assert "bucket(s) not collected" in down.stderr and "retries" in down.stderr
        assert gpufleet_json("usage", *period, env=env) == two_hours

        hub.start(timeout=120)
        # a store answering in part (warnings after the streamed rows): nothing written
        partial = StubServer(with_warnings(hub.url))
        try:
            half = gpufleet("usage", "collect", "--max-backfill", "5h", "--push-interval", "30s",
                            "--hub-url", partial.url, env=env)
        finally:
            partial.stop()
        assert half.exit_code == 3, half.output
        assert "partial response (receive-2: store unavailable)" in half.stderr
        assert gpufleet_json("usage", *period, env=env) == two_hours

        # back in full: the missed hour is caught up
        caught = gpufleet_json("usage", "collect", "--max-backfill", "5h", "--push-interval", "30s",
                               env=env)
        assert caught["failed"] == [] and f"{iso(t0 + 2 * HOUR)[:-1]}" in " ".join(
            str(c) for c in caught["collected"])

        rows = by_ns(gpufleet_json("usage", *period, env=env))
        expected = expected_by_namespace()
        assert set(rows) == set(expected)
        for ns, figures in expected.items():
            for name, value in figures.items():
                assert rows[ns][name] == (value if value is None else
                                          pytest.approx(value, abs=1e-6)), (ns, name)
        assert rows["ml"]["avg_utilisation_pct"] == pytest.approx(
            100 * expected["ml"]["busy_gpu_hours"] / expected["ml"]["gpu_hours"], abs=1e-3)

        # coverage and the move, row by row in the ledger
        engine = inv.make_engine(db_url)
        with engine.connect() as conn:
            frame = usage.usage_frame(conn, *(utc(t) for t in (t0, t0 + 3 * HOUR)))
        engine.dispose()
        gap = frame[(frame.uuid == "GPU-C")].sort_values("bucket_start")
        assert list(gap.coverage.round(6)) == [1.0, round(2 / 3, 6), 1.0]
        assert list(gap.energy_wh.round(6)) == [60.0, 40.0, 60.0]
        mv = frame[frame.uuid == "GPU-MV"].sort_values(["bucket_start", "node"])
        assert [(r.node, round(r.coverage, 6)) for r in mv.itertuples()] == [
            ("n1", 1.0), ("n1", 0.5), ("n2", 0.5), ("n2", 1.0)]
        assert set(frame[frame.uuid == "GPU-M"].slice) == {"3g.40gb/1", "2g.20gb/5",
                                                           "1g.10gb/13"}  # no parent row
        assert frame[frame.uuid == "amd-3"].energy_wh.isna().all()
        assert len(frame) == 3 * 10 + 1  # 10 GPUs/slices per hour, plus GPU-MV's second node

        # re-collecting changes nothing
        again = gpufleet_json("usage", "collect", *period, env=env)
        assert len(again["collected"]) == 3
        assert by_ns(gpufleet_json("usage", *period, env=env)) == rows

        by_model = {r["model"]: r for r in gpufleet_json("usage", *period, "--by", "model",
                                                         env=env)}
        mi300x = by_model["AMD Instinct MI300X OAM"]
        # amd-1 and amd-2 measured, amd-3 not: the group keeps the energy that was measured
        assert mi300x["gpu_hours"] == pytest.approx(9)
        assert mi300x["energy_kwh"] == pytest.approx((500 + 200) * 3 / 1000)

        idle = gpufleet_json("idle", *period, "--for", "2h", env=env)
        assert [(i["uuid"], i["namespace"], i["pod"], i["wasted_gpu_hours"], i["idle_hours"])
                for i in idle] == [("GPU-B", "research", "nb-1", 3.0, 3.0)]
        assert gpufleet_json("idle", *period, "--for", "4h", env=env) == []

        cap = {r["model"]: r for r in gpufleet_json("capacity", env=env)}
        assert cap["NVIDIA H100 80GB HBM3"] == {
            "model": "NVIDIA H100 80GB HBM3", "total": 4.0, "active": 4.0, "stale": 0.0,
            "failed": 0.0, "allocated": 3.0, "cordoned": 0.0, "free": 1.0,
            "reclaimable": 1.0}  # GPU-B: research's notebook, idle up to the newest bucket
        a100 = cap["NVIDIA A100-SXM4-80GB"]
        assert (a100["total"], a100["allocated"], a100["free"]) == pytest.approx(
            (6 / 7, 5 / 7, 1 / 7))  # 3g + 2g + 1g of 7 compute slices
        assert cap["AMD Instinct MI300X OAM"]["free"] == 1.0
        table = gpufleet("capacity", "--by", "cluster", env=env)
        assert table.exit_code == 0 and "c2" in table.stdout
        csv_out = gpufleet("usage", *period, "-o", "csv", env=env).stdout.splitlines()
        assert csv_out[0] == ("namespace,gpu_hours,allocated_gpu_hours,busy_gpu_hours,"
                              "idle_allocated_gpu_hours,avg_utilisation_pct,sm_active_gpu_hours,"
                              "avg_sm_active_pct,energy_kwh,allocation_basis")
        # no kube-state-metrics in this hub: every allocated hour is sampled, and says so
        assert {line.rsplit(",", 1)[1] for line in csv_out[1:]} <= {"sampled", ""}
        [dark_line] = [line for line in csv_out if line.startswith("dark,")]
        assert dark_line.split(",")[8] == ""  # energy_kwh: empty, not 0
        history = gpufleet_json("inventory", "gpu", "GPU-MV", env=env)
        assert {u["node"] for u in history["usage"]} == {"n1", "n2"}
        check_api(db_url, t0, rows)
    finally:
        hub.stop()


def test_serve_collects_completed_buckets_and_report_warns_of_idle_allocated_gpus(tmp_path):
    from hub.service import ServeSettings, service_jobs
    from hub.store import HubClient, HubSettings

    t0 = (time.time() // HOUR) * HOUR - 4 * HOUR
    hub = backfilled_hub(tmp_path / "hub", fleet_text(t0)).start(timeout=120)
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db}
    try:
        assert gpufleet("sync", "--stale-after", "4h", env=env).exit_code == 0
        engine = inv.make_engine(db)
        with HubClient.from_settings(HubSettings(url=hub.url)) as client:
            jobs = service_jobs(engine, client, ServeSettings(stale_after=4 * HOUR))
            jobs.after_sync[-1]()  # the usage job serve runs after each sync
            with engine.connect() as conn:
                done = {r.bucket_start for r in conn.execute(inv.usage_buckets.select())}
            # every completed bucket of the last 48 h, the three with data among them
            assert {utc(t0 + i * HOUR) for i in range(3)} <= done
            assert len(done) >= 46  # 48 h back, less the one or two not complete yet
            jobs.after_sync[-1]()  # nothing pending: nothing asked again
            findings = jobs.findings()
        engine.dispose()
        idle = [f for f in findings if f["check"] == "idle_allocated_gpu"]
        assert [(f["severity"], f["cluster"], f["node"], f["gpu"]) for f in idle] == [
            ("warning", "c1", "n1", "GPU-B")]
        assert "research/nb-1" in idle[0]["message"] and "3 GPU-hours" in idle[0]["message"]
        report = gpufleet("report", "-o", "json", env=env)
        assert "idle_allocated_gpu" in report.stdout
        page = tmp_path / "report.html"
        gpufleet("report", "-o", "html", "--out", str(page), env=env)
        dom = chromium_dom(page)
        html = page.read_text()
        start = html.index('<figure class="chart" id="gpu-hours-by-day">')
        by_day = Dom(html[start:html.index("</figure>", start)])
        hours: dict[str, float] = {}
        for rect in by_day.find("rect"):
            if "data-key" in rect["attrs"]:
                key = rect["attrs"]["data-key"]
                hours[key] = hours.get(key, 0.0) + float(rect["attrs"]["data-value"])
        assert {"ml", "research", "vision", "hpc", "(unallocated)"} == set(hours)
        assert round(hours["research"], 1) == 3.0 and round(hours["ml"], 1) == 7.3
        idle_bars = {e["attrs"]["data-namespace"]: e["text"] for e in dom.find("g")
                     if "data-namespace" in e["attrs"]}
        assert set(idle_bars) == {"research"} and "3 GPU-hours" in idle_bars["research"]
        [idle_row] = [e for e in dom.find("tr") if "data-uuid" in e["attrs"]]
        assert idle_row["attrs"]["data-uuid"] == "GPU-B" and "research/nb-1" in idle_row["text"]
        [h100] = [i for i, e in enumerate(dom.elements)
                  if e["tag"] == "tr" and e["attrs"].get("data-model") == "NVIDIA H100 80GB HBM3"]
        cells = [e["text"] for e in dom.elements[h100 + 1:h100 + 10]]
        # model, total, active, stale, failed, allocated, (reclaimable), cordoned, free
        assert cells[:6] + cells[7:] == ["NVIDIA H100 80GB HBM3", "4", "4", "0", "0", "3",
                                         "0", "1"]
    finally:
        hub.stop()


def check_api(db_url: str, t0: float, by_namespace: dict) -> None:
    """The read API answers the same figures, with the same filters and paging rules."""
    from hub.service import build_app, read_only_engine
    from tests.support.asgi import AppClient, no_metrics

    engine = read_only_engine(db_url)
    router = AppClient(build_app(engine, health=lambda: (True, {}),
                                 findings=lambda: ([], None), metrics=no_metrics))

    def get(path: str, status: int = 200, **query: str):
        code, body = router.handle(path, {k: [v] for k, v in query.items()})
        assert code == status, body
        return body

    try:
        period = {"from": iso(t0), "until": iso(t0 + 3 * HOUR)}
        items = get("/api/v1/usage", **period)["items"]
        assert {r["namespace"]: r for r in items} == by_namespace
        by_two = get("/api/v1/usage", **period, by="cluster,model")["items"]
        assert {(r["cluster"], r["model"]) for r in by_two} >= {
            ("c1", "NVIDIA H100 80GB HBM3"), ("c2", "NVIDIA A100-SXM4-80GB")}
        assert [i["uuid"] for i in get("/api/v1/idle", **period)["items"]] == ["GPU-B"]
        cap = get("/api/v1/capacity", by="cluster")["items"]
        assert {c["cluster"]: c["allocated"] for c in cap}["c1"] == 3.0
        page = get("/api/v1/events", limit="3")
        assert len(page["items"]) == 3 and page["continue"]
        rest = get("/api/v1/events", limit="5000", **{"continue": page["continue"]})
        everything = get("/api/v1/events", limit="5000")["items"]
        assert page["items"] + rest["items"] == everything and rest["continue"] is None
        assert {e["type"] for e in everything} == {"appeared"}
        hist = get("/api/v1/gpus/GPU-MV/history")
        assert hist["gpu"]["node"] == "n2" and hist["events"][0]["type"] == "appeared"
        assert get("/api/v1/gpus/GPU-MV")["gpu"]["uuid"] == "GPU-MV"
        assert get("/api/v1/gpus/nope/history", 404) == {"error": "unknown GPU 'nope'"}
        assert "unknown by" in get("/api/v1/usage", 400, by="team")["error"]
        assert "since and from" in get("/api/v1/usage", 400, since="1h",
                                       **{"from": iso(t0)})["error"]
        assert "unknown type" in get("/api/v1/events", 400, type="exploded")["error"]
        doc = get("/api/v1/openapi.json")
        for path in ("/api/v1/usage", "/api/v1/idle", "/api/v1/capacity", "/api/v1/events",
                     "/api/v1/gpus/{uuid}/history"):
            assert path in doc["paths"]
    finally:
        engine.dispose()
