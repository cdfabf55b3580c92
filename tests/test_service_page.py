"""The live page of `gpufleet serve` (/) in headless Chromium, against the real service.

The service syncs from a real hub (Prometheus fed by a spoke agent with real DCGM samples)
into an inventory that also remembers a decommissioned cluster; the findings are the report's
own checks. The page must render offline (no script, no external asset), and every number on
it must be the one the JSON API gives for the same thing.
"""

from __future__ import annotations

import datetime as dt
import time
from urllib.parse import quote

import requests

from hub.inventory import _db
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations
from hub.service import ServeSettings, build_service, read_only_engine, service_jobs
from hub.store import HubClient
from tests.support.browser import Dom, chromium_dom
from tests.support.promql import wait_for
from tests.support.samples import sample_text

HOSTILE_NS = '<script>alert("ns")</script>'


def _cells(dom: Dom, table_id: str) -> list[dict[str, str]]:
    return dom.table(table_id)


def _count(dom: Dom, section: str) -> int:
    [el] = [e for e in dom.elements if e["attrs"].get("data-count") == section]
    return int(el["text"].strip("() "))


def test_the_live_page_matches_the_api(hub, fleet, tmp_path):
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    engine = _db.make_engine(url, create=True)
    migrate.ensure_schema(engine)
    long_ago = _db.now_utc() - dt.timedelta(days=2)
    with engine.begin() as conn:  # a cluster that has since been switched off
        apply_observations(conn, [
            Observation("gone", "old-node", f"GPU-gone-{i}", "nvidia", index=i,
                        allocations={(HOSTILE_NS, "pod-0", "main")},
                        health=("failed", "degraded", "ok")[i],
                        health_reasons=("xid 79", "row remap pending", None)[i])
            for i in range(3)
        ], long_ago)
    fleet("east", [sample_text("dcgm-h100-8gpu-aicr-eks-156a357e.prom")])
    wait_for(hub.url, "count(DCGM_FI_DEV_GPU_UTIL)", lambda r: bool(r))
    client = HubClient(hub.url)
    jobs = service_jobs(engine, client, ServeSettings())
    readonly = read_only_engine(url)
    service = build_service(jobs, every=3600, engine=readonly, process_metrics=False).start()
    try:
        base = service.url
        deadline = time.monotonic() + 30
        while not service.scheduler.state.findings_at and time.monotonic() < deadline:
            time.sleep(0.2)
        assert service.scheduler.state.findings_at, service.scheduler.state

        def api(path: str) -> dict:
            r = requests.get(base + path, timeout=10)
            assert r.status_code == 200, r.text
            return r.json()

        head = requests.get(base + "/", timeout=10)
        assert head.headers["Content-Type"].startswith("text/html")
        assert "default-src 'none'" in head.headers["Content-Security-Policy"]
        dom = chromium_dom(base + "/")
        assert dom.find("title")[0]["text"] == "GPU fleet"
        assert dom.find("script") == [] and dom.find("img") == []
        assert not [e for e in dom.elements if e["tag"] == "link"]

        clusters = {c["cluster"]: c for c in api("/api/v1/clusters")["items"]}
        shown = {r["cluster"]: r for r in _cells(dom, "clusters")}
        assert set(shown) == set(clusters) == {"east", "gone"}
        for name, c in clusters.items():
            assert shown[name]["state"] == c["state"]
            assert int(shown[name]["nodes"]) == c["nodes"]
            assert int(shown[name]["gpus"]) == c["gpus"]
        assert int(shown["east"]["gpus"]) == 8 and shown["gone"]["state"] == "stale"

        stale = api("/api/v1/gpus?state=stale")["items"]
        assert len(stale) == 3  # one line for the switched-off cluster, not one per GPU
        assert _count(dom, "stale-clusters") == 1
        assert [(r["cluster"], int(r["stale_gpus"])) for r in _cells(dom, "stale-clusters")] \
            == [("gone", 3)]

        findings = api("/api/v1/findings")["items"]
        assert findings, "a stale cluster is a finding"
        assert _count(dom, "findings") == len(findings)
        assert len([r for r in dom.find("tr") if "data-severity" in r["attrs"]]) == len(findings)
        named = {(f["cluster"], f["gpu"]) for f in findings if f.get("gpu")}
        assert _count(dom, "gpus-with-findings") == len(named)
        for level in ("failed", "degraded"):  # health as the exporter reports it
            unhealthy = api(f"/api/v1/gpus?health={level}")["items"]
            assert _count(dom, f"{level}-gpus") == len(unhealthy) >= 1
            assert [r["uuid"] for r in _cells(dom, f"{level}-gpus")] == [
                g["uuid"] for g in unhealthy]

        links = {a["attrs"]["href"] for a in dom.find("a")}
        assert {"/api/v1/clusters", "/api/v1/gpus", "/api/v1/findings",
                "/api/v1/openapi.json"} <= links
        for link in links:  # every link of the page answers
            assert requests.get(base + link, timeout=10).status_code == 200, link

        # search: a UUID, a node, a namespace (hostile: must stay text)
        east_gpu = api("/api/v1/gpus?cluster=east&limit=1")["items"][0]
        by_uuid = chromium_dom(f"{base}/?q={quote(east_gpu['uuid'])}")
        assert [r["uuid"] for r in _cells(by_uuid, "search-gpus")] == [east_gpu["uuid"]]
        by_node = chromium_dom(f"{base}/?q={quote(east_gpu['node'])}")
        node_gpus = api("/api/v1/gpus?" + f"node={quote(east_gpu['node'])}")["items"]
        assert _count(by_node, "search-gpus") == len(node_gpus) == 8
        by_ns = chromium_dom(f"{base}/?q={quote(HOSTILE_NS)}")
        assert by_ns.find("script") == []
        rows = _cells(by_ns, "search-allocations")
        assert {(r["namespace"], r["cluster"]) for r in rows} == {(HOSTILE_NS, "gone")}
        assert len(rows) == 3
        assert requests.get(base + "/?nope=1", timeout=10).status_code == 400
    finally:
        service.stop()
        readonly.dispose()
        engine.dispose()
        client.close()


def test_sections_from_optional_parts_appear_only_when_they_answer(tmp_path):
    """Usage, idle and capacity come from parts not every install has: a section function
    that answers None (its part is absent or empty) leaves no trace on the page."""
    from hub.service import build_app
    from hub.service._page import Section
    from tests.support.asgi import AppClient, no_metrics

    url = f"sqlite:///{tmp_path / 'inv.db'}"
    migrate.ensure_schema(_db.make_engine(url, create=True))

    def usage(conn) -> Section:
        return Section("usage", "Usage by namespace", [("namespace", "Namespace"),
                                                       ("gpu_hours", "GPU-hours")],
                       [{"namespace": "team-a", "gpu_hours": 12.5}], "No usage.")

    router = AppClient(build_app(read_only_engine(url), health=lambda: (True, {}),
                          findings=lambda: ([], None), metrics=no_metrics,
                          page_sections=[usage, lambda conn: None]))
    status, page = router.handle("/", {})
    assert status == 200
    dom = Dom(page.text)
    assert _cells(dom, "usage") == [{"namespace": "team-a", "gpu_hours": "12.5"}]
    assert [e["attrs"]["id"] for e in dom.find("table")] == [
        "clusters", "failed-gpus", "degraded-gpus", "stale-clusters", "gpus-with-findings",
        "usage", "findings"]
    status, body = router.handle("/", {"q": ["x" * 300]})
    assert status == 400 and "at most 253" in body["error"]


def test_before_the_first_sync_the_page_says_so_in_html(tmp_path):
    from hub.service import build_app
    from tests.support.asgi import AppClient, no_metrics

    url = f"sqlite:///{tmp_path / 'empty.db'}"  # no schema yet: no sync has run
    router = AppClient(build_app(read_only_engine(url), health=lambda: (False, {}),
                          findings=lambda: ([], None), metrics=no_metrics))
    status, page = router.handle("/", {})
    assert status == 503 and page.headers["content-type"].startswith("text/html")
    dom = Dom(page.text)
    assert "no sync has completed yet" in dom.find("p", id="notice")[0]["text"]
    assert dom.find("form")  # the search and the API links are still there


def test_the_usage_sections_serve_shows_agree_with_the_api(tmp_path):
    """serve's page sections for usage, idle GPUs and capacity read the same ledger the API
    answers from: the same namespaces, GPU-hours and idle GPUs."""
    from hub.service import USAGE_SECTIONS, build_app
    from hub.usage import write_bucket
    from tests.support.asgi import AppClient, no_metrics

    url = f"sqlite:///{tmp_path / 'inv.db'}"
    engine = _db.make_engine(url, create=True)
    migrate.ensure_schema(engine)
    now = _db.now_utc().replace(minute=0, second=0, microsecond=0)
    with engine.begin() as conn:
        apply_observations(conn, [
            Observation("c1", "n1", "GPU-busy", "nvidia", index=0, model="H100",
                        allocations={("team-a", "train-0", "main")}),
            Observation("c1", "n1", "GPU-idle", "nvidia", index=1, model="H100",
                        allocations={("team-b", "notebook", "main")})], now)
        for hours_ago in (3, 2, 1):
            start = now - dt.timedelta(hours=hours_ago)
            rows = [{"cluster": "c1", "node": "n1", "uuid": uuid, "slice": "",
                     "namespace": ns, "pod": pod, "bucket_start": start,
                     "bucket_end": start + dt.timedelta(hours=1), "vendor": "nvidia",
                     "model": "H100", "gpu_share": 1.0, "gpu_hours": 1.0,
                     "avg_utilisation_pct": util, "max_utilisation_pct": util,
                     "avg_memory_used_mib": 1000.0, "max_memory_used_mib": 1000.0,
                     "avg_power_w": 300.0, "energy_wh": 300.0, "coverage": 1.0}
                    for uuid, ns, pod, util in (("GPU-busy", "team-a", "train-0", 90.0),
                                                ("GPU-idle", "team-b", "notebook", 0.0))]
            write_bucket(conn, start.replace(tzinfo=dt.UTC).timestamp(), 3600.0, rows, 14)
    engine.dispose()
    router = AppClient(build_app(read_only_engine(url), health=lambda: (True, {}),
                          findings=lambda: ([], None), metrics=no_metrics,
                          page_sections=USAGE_SECTIONS))
    status, page = router.handle("/", {})
    assert status == 200
    dom = Dom(page.text)
    status, api_usage = router.handle("/api/v1/usage", {"by": ["namespace"], "since": ["24h"]})
    assert status == 200, api_usage
    page_usage = {r["namespace"]: float(r["gpu_hours"]) for r in _cells(dom, "usage")}
    assert page_usage == {r["namespace"]: round(r["gpu_hours"], 2) for r in api_usage["items"]}
    assert page_usage == {"team-a": 3.0, "team-b": 3.0}
    status, api_idle = router.handle("/api/v1/idle", {"since": ["24h"]})
    assert status == 200, api_idle
    assert [(r["uuid"], r["pod"]) for r in _cells(dom, "idle")] == [
        (r["uuid"], r["pod"]) for r in api_idle["items"]] == [("GPU-idle", "notebook")]
    capacity = _cells(dom, "capacity")
    assert [(r["model"], float(r["total"]), float(r["allocated"])) for r in capacity] == [
        ("H100", 2.0, 2.0)]
