"""Rendering the report (table, JSON, Markdown for PR comments, an HTML page checked in headless
Chromium), writing it atomically, and `gpufleet report` over a database without a hub."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from hub.common import InputError
from hub.inventory import _db as inventory
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations
from hub.validate import _checks as checks
from hub.validate import _reconcile as rc
from hub.validate import _reconcile_store as store
from hub.validate import _report as rpt
from hub.validate._checks import ERROR, INFO, WARNING, Finding
from tests.support.browser import chromium_dom
from tests.support.clirun import gpufleet

NOW = dt.datetime(2026, 11, 28, 12, 0, 0)
HOSTILE = '<script>alert("x")</script>|`rm`'


def sample_report(findings: int = 3) -> rpt.Report:
    summary = [
        {"cluster": "east", "status": "ok", "state": "active", "last_sample_at": NOW,
         "age_seconds": 40.0, "age": "40s", "nodes_reporting": 3, "nodes_expected": 3,
         "gpus": 17, "expected": True, "findings": 0},
        {"cluster": "west", "status": "warning", "state": "active",
         "last_sample_at": NOW - dt.timedelta(minutes=12), "age_seconds": 720.0, "age": "12m",
         "nodes_reporting": 2, "nodes_expected": 3, "gpus": 3, "expected": True, "findings": 1},
        {"cluster": HOSTILE, "status": "error", "state": "stale",
         "last_sample_at": NOW - dt.timedelta(hours=30), "age_seconds": 108000.0,
         "age": "1d6h", "nodes_reporting": 0, "nodes_expected": 1, "gpus": 0, "expected": None,
         "findings": 1},
        {"cluster": "ghost", "status": "error", "state": "absent", "last_sample_at": None,
         "age_seconds": None, "age": "never", "nodes_reporting": 0, "nodes_expected": 0,
         "gpus": 0, "expected": True, "findings": 1},
    ]
    found = [Finding(ERROR, "freshness", "newest GPU sample is 1d6h old", HOSTILE),
             Finding(ERROR, "missing_cluster", "never sent GPU metrics", "ghost"),
             Finding(WARNING, "partial_data", "node stopped | reporting", "west", "gpu-2")]
    found += [Finding(INFO, "zero_usage", f"finding {i} " + "x" * 300, "east", f"n{i}",
                      f"GPU-{i}") for i in range(max(0, findings - 3))]
    return rpt.Report(generated_at=NOW, max_age=3600, push_interval=300, window=3600,
                      summary=summary, findings=found, hub="https://hub.example.com",
                      reconcile={"finished_at": NOW, "source": "kube"})


# -- the HTML page in a real browser --------------------------------------------------------------
def test_html_report_is_one_self_contained_page_that_escapes_names(tmp_path):
    report = sample_report()
    html = rpt.render(report, "html")
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    for external in ('src="http', "src='http", 'href="http', "@import", "url("):
        assert external not in html
    page = rpt.write_atomic(tmp_path / "report.html", html)
    dom = chromium_dom(page)
    assert dom.find("script") == []  # the hostile name stayed text
    assert dom.find("title")[0]["text"].startswith("GPU fleet report")
    assert dom.find("span", id="verdict")[0]["text"] == "FAILED"
    assert "2 errors, 1 warning, 0 info" in dom.find("p", id="counts")[0]["text"]
    rows = {r["attrs"]["data-cluster"]: r for r in dom.find("tr") if "data-cluster" in r["attrs"]}
    assert set(rows) == {"east", "west", HOSTILE, "ghost"}
    assert rows[HOSTILE]["attrs"]["data-status"] == "error" and HOSTILE in rows[HOSTILE]["text"]
    assert rows["west"]["attrs"]["data-status"] == "warning" and "2/3" in rows["west"]["text"]
    assert rows["ghost"]["text"].split()[:3] == ["ghost", "error", "absent"]
    # the inline SVG chart: a bar per cluster, the error threshold line, ages as labels
    [svg] = dom.find("svg", id="age-chart")
    bars = [e for e in dom.elements if e["tag"] == "rect" and "bar" in e["attrs"].get("class", "")]
    assert len(bars) == 4 and {b["attrs"]["class"] for b in bars} == {
        "bar ok", "bar warning", "bar error"}
    widths = {b["text"].split(":")[0]: float(b["attrs"]["width"]) for b in bars}
    assert widths["east"] < widths["west"] < widths[HOSTILE] == widths["ghost"]
    assert "max age 1h" in svg["text"] and "12m" in svg["text"] and "1d6h ›" in svg["text"]
    findings = [r for r in dom.find("tr") if "data-severity" in r["attrs"]]
    assert [r["attrs"]["data-check"] for r in findings] == [
        "freshness", "missing_cluster", "partial_data"]


# -- markdown, json, table ------------------------------------------------------------------------
def test_markdown_fits_a_pull_request_comment():
    text = rpt.render(sample_report(), "markdown")
    assert text.startswith("## GPU fleet report\n")
    assert "| Cluster | Status | Newest sample | Age | Nodes reporting | GPUs |" in text
    # no HTML, no cell break, and no HTML entities where the text is read unrendered
    assert "\\<script>alert(\"x\")\\</script>\\|\\`rm\\`" in text
    assert "&gt;" not in text and "&lt;" not in text and "&amp;" not in text
    assert "node stopped \\| reporting" in text and "❌ error" in text
    assert "more finding" not in text
    big = rpt.render(sample_report(5000), "markdown", max_findings=50)
    assert len(big) < rpt.MARKDOWN_LIMIT
    assert "_…and 4950 more findings (`gpufleet report -o json` lists all)._" in big
    huge = rpt.render_markdown(sample_report(5000), max_findings=1000)
    assert len(huge) < rpt.MARKDOWN_LIMIT and "more findings" in huge


def test_json_and_table():
    data = json.loads(rpt.render(sample_report(4), "json"))
    assert set(data) >= {"summary", "findings", "counts", "generated_at", "settings"}
    assert data["counts"] == {"error": 2, "warning": 1, "info": 1}
    assert data["summary"][0]["last_sample_at"] == "2026-11-28T12:00:00.000Z"
    assert set(data["findings"][0]) == {"severity", "check", "cluster", "node", "gpu", "message"}
    table = rpt.render(sample_report(), "table")
    assert "CLUSTER" in table and "SEVERITY" in table and "2 errors, 1 warning" in table


def test_write_atomic_replaces_whole_files(tmp_path):
    target = tmp_path / "sub" / "r.html"
    with pytest.raises(InputError, match="does not exist"):
        rpt.write_atomic(target, "one")
    target.parent.mkdir()
    rpt.write_atomic(target, "one")
    inode = target.stat().st_ino
    rpt.write_atomic(target, "two")
    assert target.read_text() == "two" and target.stat().st_ino != inode
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.html"]
    with pytest.raises(InputError, match="is a directory"):
        rpt.write_atomic(tmp_path, "x")


# -- the command over a database, without a hub ---------------------------------------------------
def _fill(url: str, *, stale_cluster: bool = True) -> None:
    engine = inventory.make_engine(url, create=True)
    try:
        migrate.upgrade(engine)
        now = inventory.now_utc()
        t = now.replace(tzinfo=dt.UTC).timestamp()
        obs = [Observation("east", "a", f"GPU-{i}", "nvidia", index=i, sample_at=t - 5)
               for i in range(2)]
        if stale_cluster:
            obs.append(Observation("west", "x", "GPU-x", "nvidia", index=0, sample_at=t - 7200))
        with engine.begin() as conn:
            apply_observations(conn, obs, now)
            inventory.record_run(conn, started_at=now, status="ok", requests=17)
            rec = rc.compare([rc.NodeView("east", "a", {"nvidia.com/gpu": 2})],
                             store.observed_nodes(conn), covered={"east"},
                             managed=[rc.ManagedCluster("east", "True")])
            store.save_run(conn, rec, source="file", started_at=now, managed_clusters=True)
    finally:
        engine.dispose()


def test_report_command_exit_codes_and_outputs(db_url, tmp_path):
    _fill(db_url)
    result = gpufleet("report", "--db", db_url, "-o", "json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    found = {(f["severity"], f["check"], f["cluster"]) for f in data["findings"]}
    assert ("error", "freshness", "west") in found
    assert ("info", "hub_checks", None) in found  # the hub checks are skipped, and say so
    assert {r["cluster"]: r["status"] for r in data["summary"]} == {
        "east": "ok", "west": "error"}
    out = tmp_path / "page" / "fleet.html"
    result = gpufleet("report", "--db", db_url, "-o", "html", "--out", str(out))
    assert result.exit_code == 2 and "directory" in result.stderr and "does not exist" \
        in result.stderr and not out.parent.exists()  # a typo never grows a new tree
    out.parent.mkdir()
    result = gpufleet("report", "--db", db_url, "-o", "html", "--out", str(out))
    assert result.exit_code == 1 and result.stdout == ""
    assert "wrote" in result.stderr and out.read_text().startswith("<!DOCTYPE html>")
    # a generous max age: only the info notices are left, and the command passes
    result = gpufleet("report", "--db", db_url, "--max-age", "1d", "--push-interval", "1d",
                      "-o", "markdown")
    assert result.exit_code == 0, result.output
    assert "**0 errors, 0 warnings, 1 info**" in result.stdout


def test_report_command_refuses_what_it_cannot_read(tmp_path):
    missing = gpufleet("report", "--db", f"sqlite:///{tmp_path / 'absent.db'}")
    assert missing.exit_code == 3 and missing.stderr.count("\n") == 1
    empty = tmp_path / "empty.db"
    empty.touch()
    result = gpufleet("report", "--db", f"sqlite:///{empty}")
    assert result.exit_code == 3 and "is empty: run `gpufleet sync` first" in result.stderr
    bad = gpufleet("report", "--db", f"sqlite:///{empty}", "--max-age", "0s")
    assert bad.exit_code == 2 and "greater than 0" in bad.stderr
    url = f"sqlite:///{tmp_path / 'ok.db'}"
    _fill(url, stale_cluster=False)
    unreachable = gpufleet("report", "--db", url, "--hub-url", "http://127.0.0.1:1", "-o",
                           "json")
    assert unreachable.exit_code == 3 and "unreachable" in unreachable.stderr
    data = json.loads(unreachable.stdout)  # the report is still written, saying why
    assert data["findings"][0]["check"] == "hub" and data["findings"][0]["severity"] == "error"


def test_finding_order_is_by_severity():
    found = checks.run_checks(checks.Facts(now=NOW, clusters=[], nodes=[], gpus=[],
                                           hub_skipped="no hub"))
    assert [f.severity for f in found] == ["error", "info", "info"]
