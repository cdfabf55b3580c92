"""Issue 37, point 7: the cluster, node and GPU pages show what is wrong. The findings of the
latest checks (grey "not checked yet" before any, never green), failed GPUs with a health
column, Kubernetes' count beside the reported one, MIG slices by profile and instance, every
GPU of a cluster reachable on the page itself, and "idle" on an idle GPU's page (the usage
ledger's idle rule, as `gpufleet idle` applies it)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any
from urllib.parse import quote

from hub.inventory import _db
from hub.inventory._normalize import Observation
from hub.inventory._reconcile_runs import reconcile_results, reconcile_runs
from hub.inventory._writer import apply_observations
from tests.support.asgi import no_metrics, page_client
from tests.support.browser import Browser, Dom
from tests.test_idle_agreement import _ledger

H100 = "NVIDIA H100 80GB HBM3"
FAILED = "GPU-big-n7-6"


def _fleet(url: str, now: dt.datetime) -> None:
    """c1 of the idle ledger (GPU-idle held by an idle notebook), and cluster big: 55 GPU
    rows over 7 nodes, big-n7 reporting 7 (one fallen off the bus) where Kubernetes
    advertises 8; cluster mig: one GPU split into two 3g.40gb slices."""
    _ledger(url, now)
    engine = _db.make_engine(url)
    big = [Observation("big", f"big-n{n}", f"GPU-big-n{n}-{i}", "nvidia", index=i, model=H100,
                       health="failed" if f"GPU-big-n{n}-{i}" == FAILED else "ok",
                       health_reasons="xid 79" if f"GPU-big-n{n}-{i}" == FAILED else None)
           for n in range(1, 8) for i in range(8 if n < 7 else 7)]
    mig = [Observation("mig", "mig-n1", "GPU-mig-0", "nvidia", index=0, model=H100),
           *(Observation("mig", "mig-n1", "GPU-mig-0", "nvidia", mig_profile="3g.40gb",
                         mig_instance=str(k), index=0, model=H100) for k in (1, 2))]
    with engine.begin() as conn:
        apply_observations(conn, big, now)
        apply_observations(conn, mig, now)
        run = conn.execute(reconcile_runs.insert().values(
            started_at=now, finished_at=now, source="file", managed_clusters=False,
            clusters=1, nodes=2, problems=1)).inserted_primary_key[0]
        conn.execute(reconcile_results.insert(), [
            {"run_id": run, "cluster": "big", "node": "big-n7", "status": "count_mismatch",
             "mode": "device-plugin", "k8s_gpus": 8, "observed_gpus": 7,
             "reason": "k8s 8 vs 7 observed"},
            {"run_id": run, "cluster": "big", "node": "big-n1", "status": "match",
             "mode": "device-plugin", "k8s_gpus": 8, "observed_gpus": 8,
             "reason": "k8s 8 = 8 observed"}])
    engine.dispose()


def _checked_client(url: str, findings: list[dict[str, Any]]) -> Any:
    """The service's app whose latest checks found ``findings`` (as the scheduler keeps
    them)."""
    from hub.service import USAGE_SECTIONS, build_app, read_only_engine
    from tests.support.asgi import TestClient

    at = _db.now_utc().replace(tzinfo=dt.UTC).timestamp()
    app = build_app(read_only_engine(url), health=lambda: (True, {}),
                    findings=lambda: (findings, at), metrics=no_metrics,
                    page_sections=USAGE_SECTIONS)
    return TestClient(app, raise_server_exceptions=False)


def _badges(html: str) -> list[tuple[str, str]]:
    return [(e["attrs"]["data-level"], e["text"].strip()) for e in Dom(html).elements
            if e["tag"] == "span" and "data-level" in e["attrs"]]


FINDINGS = [
    {"severity": "error", "check": "gpu_health", "cluster": "big", "node": "big-n7",
     "gpu": FAILED, "message": "GPU fell off the bus (XID 79): replace the GPU"},
    {"severity": "warning", "check": "count_mismatch", "cluster": "big", "node": "big-n7",
     "gpu": None, "message": "k8s advertises 8 GPUs, 7 report"},
    {"severity": "error", "check": "stale_cluster", "cluster": "other", "node": None,
     "gpu": None, "message": "not this cluster's"},
]


def test_the_pages_show_findings_health_and_kubernetes_count(tmp_path):
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    _fleet(url, _db.now_utc().replace(minute=0, second=0, microsecond=0))
    client = _checked_client(url, FINDINGS)

    cluster = client.get("/clusters/big").text
    assert ("error", "1 error, 1 warning, 0 info") in _badges(cluster)
    assert ("error", "1 failed GPU") in _badges(cluster)
    found = Dom(cluster).table("findings")
    assert [(f["check"], f["node"]) for f in found] == [("gpu_health", "big-n7"),
                                                       ("count_mismatch", "big-n7")]
    [bad] = Dom(cluster).table("unhealthy-gpus")
    assert (bad["uuid"], bad["health"], bad["health_reasons"]) == (FAILED, "failed", "xid 79")
    nodes = {n["node"]: n for n in Dom(cluster).table("nodes")}
    assert (nodes["big-n7"]["unhealthy_gpus"], nodes["big-n7"]["findings"]) == ("1 failed", "2")
    assert nodes["big-n1"]["unhealthy_gpus"] == "" and nodes["big-n1"]["findings"] == "0"

    node = client.get("/nodes/big/big-n7").text
    badges = _badges(node)
    assert ("warning", "Kubernetes advertises 8, 7 report (reconcile: count_mismatch, "
            "k8s 8 vs 7 observed)") in badges
    assert ("error", "1 failed GPU") in badges
    gpus = {g["uuid"]: g for g in Dom(node).table("gpus")}
    assert gpus[FAILED]["state"] == "active" and gpus[FAILED]["health"] == "failed"
    assert len(Dom(node).table("findings")) == 2
    assert ("ok", "Kubernetes advertises 8, 8 report") in _badges(
        client.get("/nodes/big/big-n1").text)
    assert _badges(client.get("/nodes/big/big-n2").text)[0] == (
        "unchecked", "Kubernetes count unknown (no reconcile has read this node); 8 report")

    gpu = client.get("/gpus/" + quote(FAILED)).text
    assert ("error", "failed (xid 79)") in _badges(gpu)
    assert [f["check"] for f in Dom(gpu).table("findings")] == ["gpu_health"]


def test_mig_slices_are_told_apart_by_profile_and_instance(tmp_path):
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    _fleet(url, _db.now_utc().replace(minute=0, second=0, microsecond=0))
    client = page_client(url)
    for path, table in (("/nodes/mig/mig-n1", "gpus"), ("/gpus/GPU-mig-0", "slices"),
                        ("/clusters/mig", "gpus")):
        rows = [(r["mig_profile"], r["mig_instance"]) for r in
                Dom(client.get(path).text).table(table) if r["mig_profile"]]
        assert rows == [("3g.40gb", "1"), ("3g.40gb", "2")], path


def test_every_gpu_of_a_cluster_is_reachable_on_its_page(tmp_path):
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    _fleet(url, _db.now_utc().replace(minute=0, second=0, microsecond=0))
    client = page_client(url)
    seen: list[str] = []
    path: str | None = "/clusters/big"
    pages = 0
    while path is not None:
        html = client.get(path).text
        seen += [r["uuid"] for r in Dom(html).table("gpus")]
        following = re.search(r'<a id="gpus-next" href="([^"]+)"', html)
        path = following[1].replace("&amp;", "&") if following else None
        pages += 1
        assert pages < 5
    assert pages == 2 and len(seen) == 55 == len(set(seen))
    assert 'id="gpus-first" href="/clusters/big"' in html
    assert client.get("/clusters/big?continue=bogus").status_code == 400


def test_an_idle_gpus_page_says_idle_and_nothing_unchecked_looks_green(tmp_path):
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    _fleet(url, _db.now_utc().replace(minute=0, second=0, microsecond=0))
    client = page_client(url)  # no checks have run
    idle = client.get("/gpus/GPU-idle").text
    [said] = [text for level, text in _badges(idle) if text.startswith("idle")]
    assert said.startswith("idle since ") and "3.00 allocated GPU-hours wasted" in said
    assert "(team-b/notebook)" in said
    [run] = Dom(idle).table("idle")
    assert (run["namespace"], run["pod"], run["wasted_gpu_hours"]) == ("team-b", "notebook", "3")
    busy = client.get("/gpus/GPU-busy").text
    assert not any(text.startswith("idle") for _, text in _badges(busy))
    assert Dom(busy).table("idle") == []

    page = tmp_path / "node.html"
    page.write_text(client.get("/nodes/big/big-n7").text)
    browser = Browser()
    try:
        browser.open(page.as_uri())
        shown = browser.evaluate(
            "[...document.querySelectorAll('#summary .badge')].map(b => [b.textContent, "
            "getComputedStyle(b).backgroundColor])")
        cells = browser.evaluate(
            "document.querySelector('#findings tbody').innerText")
    finally:
        browser.close()
    colours = dict(shown)
    assert "findings: not checked yet" in colours
    assert colours["findings: not checked yet"] == "rgb(102, 102, 102)"  # grey, not green
    assert "Not checked yet" in cells
