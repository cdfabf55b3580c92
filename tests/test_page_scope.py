"""Scope on the live page by construction: as a namespace-only, a cluster-only and a
cluster-and-namespace token, every number and name on the page is the JSON the page links to
for the same token: the findings badge, "GPUs with findings", the findings, the clusters,
capacity, usage, idle, and a search for another team's namespace. Then the same pages in
headless Chromium, signed in through the login form, as a namespace-scoped and a
cluster-scoped team, with a screenshot of what the team sees.

The inventory is the scoped walk's (tests/test_api_scoped_walk.py): ``east`` holds team-a's
and team-b's pods, ``west-hidden`` team-c's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from hub.common import counts_line
from hub.inventory import _db as inventory
from hub.inventory._sync import SyncResult
from hub.service import (
    USAGE_SECTIONS,
    Authenticator,
    Jobs,
    TokenFile,
    build_service,
    read_only_engine,
    token_entry,
)
from tests.support.browser import Browser, Dom
from tests.support.png import decode
from tests.test_api_scoped_walk import FINDINGS, _inventory

TOKENS = {
    "namespace-only": ("gpf_page-ns-token", {"namespaces": ["team-a"]}),
    "cluster-only": ("gpf_page-cluster-token", {"clusters": ["east"]}),
    "both": ("gpf_page-both-token", {"clusters": ["east"], "namespaces": ["team-a"]}),
}
#: one more finding about another team's pod on a GPU the team shares a cluster with
PAGE_FINDINGS = [*FINDINGS, {
    "severity": "warning", "check": "zero_usage", "cluster": "east", "node": "east-n2",
    "gpu": "GPU-east-2", "namespace": "team-b",
    "message": "utilisation exactly 0 for the whole 1h while pod team-b/idle-pod-b is "
               "allocated to it"}]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import datetime as dt
    import time

    from hub.service import SignInLimit
    from hub.service.runtime import checks_recorder

    tmp = tmp_path_factory.mktemp("page-scope")
    url = _inventory(tmp)
    tokens = tmp / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"tokens": [
        token_entry(kind, token, **scope) for kind, (token, scope) in TOKENS.items()]}))
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)

    def no_sync() -> SyncResult:  # the inventory is written; nothing to ask a hub
        return SyncResult(now, now, 0, 2, 3, 4)

    # the leader writes its checks to the database, where every process reads them
    record = checks_recorder(inventory.make_engine(url))
    started = build_service(Jobs(sync=no_sync, findings=lambda: PAGE_FINDINGS,
                                 record_checks=record), every=3600.0,
                            engine=read_only_engine(url), process_metrics=False,
                            page_sections=USAGE_SECTIONS,
                            auth=Authenticator(tokens=TokenFile(tokens)),
                            metrics_open=False).start()
    started.app.state.gate.login.limit = SignInLimit(burst=10_000)
    deadline = time.monotonic() + 20
    while not _get(started, "/api/v1/findings", TOKENS["both"][0]).json()["generated_at"]:
        assert time.monotonic() < deadline, "the service never ran its checks"
        time.sleep(0.1)
    yield started
    started.stop()


def _get(service: Any, path: str, token: str, **params: Any) -> requests.Response:
    r = requests.get(service.url + path, params=params, timeout=10,
                     headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, (path, r.text[:300])
    return r


def _items(service: Any, path: str, token: str, **params: Any) -> list[dict[str, Any]]:
    body = _get(service, path, token, **params).json()
    assert body.get("continue") is None  # one page holds this small inventory
    return body["items"]


def _number(text: str) -> float:
    return float(text.replace(",", "")) if text else 0.0


def _count(dom: Dom, section: str) -> int | None:
    found = [e["text"] for e in dom.find("span") if e["attrs"].get("data-count") == section]
    return int(found[0].strip("()").replace(",", "")) if found else None


def _json_link(html: str, section: str) -> str | None:
    """The JSON link printed under a section (its table's id), as the page gives it."""
    tail = html.split(f'<table id="{section}"', 1)
    if len(tail) < 2:
        return None
    link = re.search(r'JSON: <a href="([^"]+)"', tail[1].split("<h2", 1)[0])
    return link.group(1).replace("&amp;", "&") if link else None


@pytest.mark.parametrize("kind", sorted(TOKENS))
def test_every_number_and_name_on_the_page_is_its_json(service, kind):
    token = TOKENS[kind][0]
    page = _get(service, "/", token).text
    dom = Dom(page)

    # findings: the badge counts exactly the list, and the list is /api/v1/findings
    findings = _items(service, "/api/v1/findings", token)
    by_severity = {s: sum(1 for f in findings if f["severity"] == s)
                   for s in ("error", "warning", "info")}
    [badge] = [e["text"] for e in dom.find("p", id="counts")]
    assert badge.strip() == counts_line(by_severity)
    shown = [(r["attrs"]["data-check"]) for r in dom.find("tr") if "data-check" in r["attrs"]]
    assert sorted(shown) == sorted(f["check"] for f in findings)
    assert _count(dom, "findings") == len(findings)
    # "GPUs with findings": exactly the GPUs those findings name
    gpus_named = {f["gpu"] for f in findings if f.get("gpu")}
    assert {r["uuid"] for r in dom.table("gpus-with-findings")} == gpus_named
    assert _count(dom, "gpus-with-findings") == len(gpus_named)

    # clusters
    clusters = _items(service, "/api/v1/clusters", token)
    assert {r["cluster"] for r in dom.table("clusters")} == {c["cluster"] for c in clusters}
    assert _count(dom, "clusters") == len(clusters)

    # capacity: the table's rows are the items of the JSON it links to
    link = _json_link(page, "capacity")
    assert link == "/api/v1/capacity?by=model"
    capacity = _get(service, link, token).json()["items"]
    rows = {r["model"]: r for r in dom.table("capacity")}
    assert set(rows) == {c["model"] or "unknown" for c in capacity}
    for item in capacity:
        row = rows[item["model"] or "unknown"]
        for figure in ("total", "active", "stale", "allocated", "free"):
            assert _number(row[figure]) == pytest.approx(item[figure], abs=0.01), figure

    # usage and idle: the same figures as their JSON links
    link = _json_link(page, "usage")
    assert link is not None
    used = {(u["namespace"] or "(unallocated)"): u for u in _get(service, link, token).json()[
        "items"]}
    table = {r["namespace"]: r for r in dom.table("usage")}
    assert set(table) == set(used)
    for ns, row in table.items():
        for figure in ("gpu_hours", "busy_gpu_hours", "idle_allocated_gpu_hours"):
            assert _number(row[figure]) == pytest.approx(used[ns][figure] or 0.0, abs=0.01)
    link = _json_link(page, "idle")
    assert link is not None
    idle = _get(service, link, token).json()["items"]
    assert sorted((r["uuid"], r["pod"]) for r in dom.table("idle")) == sorted(
        (i["uuid"], i["pod"] or "") for i in idle)

    # a search for another team's namespace finds what /api/v1/allocations lets this
    # token read of it: nothing for a team scoped to its namespace
    allocations = _items(service, "/api/v1/allocations", token)
    found = Dom(_get(service, "/", token, q="team-b").text)
    assert sorted(r["uuid"] for r in found.table("search-allocations")) == sorted(
        a["uuid"] for a in allocations if a["namespace"] == "team-b")
    gpus = _items(service, "/api/v1/gpus", token)
    found = Dom(_get(service, "/", token, q="GPU-").text)
    assert sorted(r["uuid"] for r in found.table("search-gpus")) == sorted(
        g["uuid"] for g in gpus if g["uuid"].startswith("GPU-"))


def test_the_kinds_see_different_things(service):
    """The walk above can fail: the three tokens' pages differ where their scopes do."""
    def page(kind: str) -> Dom:
        return Dom(_get(service, "/", TOKENS[kind][0]).text)

    ns_only, cluster_only = page("namespace-only"), page("cluster-only")
    # team-b's idle pod on GPU-east-2: a cluster-only token sees its finding, team-a's not
    assert "GPU-east-2" in {r["uuid"] for r in cluster_only.table("gpus-with-findings")}
    assert "GPU-east-2" not in {r["uuid"] for r in ns_only.table("gpus-with-findings")}
    # capacity of the cluster-only token: its cluster's 3 GPUs, not the fleet's 4
    assert [_number(r["total"]) for r in cluster_only.table("capacity")] == [3.0]
    assert [_number(r["total"]) for r in ns_only.table("capacity")] == [4.0]
    found = Dom(_get(service, "/", TOKENS["namespace-only"][0], q="team-b").text)
    assert found.table("search-allocations") == []
    assert "idle-pod-b" not in json.dumps(found.elements)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium = Browser()
    yield chromium
    chromium.close()


@pytest.mark.parametrize("kind", ["namespace-only", "cluster-only"])
def test_the_page_in_chromium_as_a_scoped_team(service, browser, kind, tmp_path: Path):
    """Signed in through the form, the team's page as Chromium draws it: the words on the
    screen (innerText) name nothing outside the scope, the badge is its JSON's, and the
    screenshot is the whole page, drawn (not blank)."""
    token = TOKENS[kind][0]
    browser.clear_cookies()
    browser.send("Emulation.setDeviceMetricsOverride", width=1200, height=900,
                 deviceScaleFactor=1, mobile=False)
    browser.open(service.url + "/")
    browser.submit("login", token=token)
    assert browser.location.rstrip("/") == service.url
    text = browser.evaluate("document.body.innerText")
    foreign = {"namespace-only": ("team-b", "secret-pod-b", "idle-pod-b", "team-c",
                                  "west-pod-c"),
               "cluster-only": ("west-hidden", "west-node-x", "GPU-west-1", "team-c",
                                "west-pod-c")}[kind]
    assert [name for name in foreign if name in text] == []
    findings = _items(service, "/api/v1/findings", token)
    counts = {s: sum(1 for f in findings if f["severity"] == s)
              for s in ("error", "warning", "info")}
    assert counts_line(counts) in text
    png, _ = browser.screenshot()
    (tmp_path / f"page-{kind}.png").write_bytes(png)  # kept for a person to look at
    image = decode(png)
    assert image.width > 1100 and image.height > 900  # (less a scrollbar)
    white = image.count((255, 255, 255))
    assert white < image.width * image.height * 0.98  # something is drawn on it
