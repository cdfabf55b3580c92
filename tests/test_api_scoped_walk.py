"""Scope by construction: every route the app declares, asked with a team's token, names
nothing outside the team's scope.

The inventory holds two clusters: ``east`` (the team's) with the team's pods and another
team's, and ``west-hidden`` with a third team's. A GPU moved from west-hidden to east, so
its events remember where it came from. The findings name other teams' pods in words, as
the zero-usage and idle checks do. The walk reads ``app.routes`` itself, so a route added
later is walked too, with every GPU uuid, every grouping and a few searches, and pages
with ``limit=1`` so continue tokens (readable base64) are checked as well.
"""

from __future__ import annotations

import base64
import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.routing import APIRoute

from hub.inventory import _db as inventory
from hub.inventory import _migrate as migrate
from hub.inventory import list_allocations
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations
from hub.service import (
    USAGE_SECTIONS,
    Authenticator,
    TokenFile,
    build_app,
    read_only_engine,
    token_entry,
)
from hub.service._deps import CallerScope, ReadEngine
from hub.service._routing import route as add_route
from hub.usage import write_bucket
from tests.support.asgi import no_metrics

TEAM = "gpf_walk-team-token"
ADMIN = "gpf_walk-admin-token"
#: names the team must never read, in any answer, page or token
FOREIGN = ("west-hidden", "west-node-x", "GPU-west-1", "team-b", "secret-pod-b",
           "idle-pod-b", "team-c", "west-pod-c")
UUIDS = ("GPU-east-1", "GPU-east-2", "GPU-west-1", "GPU-mover")
NOW = time.time()
FINDINGS = [
    {"severity": "warning", "check": "zero_usage", "cluster": "east", "node": "east-n1",
     "gpu": "GPU-east-1", "namespace": "team-b",
     "message": "utilisation exactly 0 for the whole 1h while pod team-b/secret-pod-b is "
                "allocated to it"},
    {"severity": "warning", "check": "idle_allocated_gpu", "cluster": "east",
     "node": "east-n1", "gpu": "GPU-east-1", "namespace": "team-a",
     "message": "allocated to team-a/train-a but under 5% utilisation for 2h in a row"},
    {"severity": "error", "check": "heartbeat", "cluster": "west-hidden", "node": None,
     "gpu": None, "message": "no sample from west-hidden for 2h"},
    {"severity": "info", "check": "hub_visibility", "cluster": None, "node": None,
     "gpu": None, "message": "the hub token sees west-hidden and east"},
]


def _inventory(tmp: Path) -> str:
    url = f"sqlite:///{tmp / 'walk.db'}"
    engine = inventory.make_engine(url, create=True)
    migrate.ensure_schema(engine)
    now = inventory.now_utc().replace(minute=0, second=0, microsecond=0)
    placed = [
        ("east", "east-n1", "GPU-east-1", {("team-a", "train-a", "main"),
                                           ("team-b", "secret-pod-b", "main")}),
        ("east", "east-n2", "GPU-east-2", {("team-b", "idle-pod-b", "main")}),
        ("west-hidden", "west-node-x", "GPU-west-1", {("team-c", "west-pod-c", "main")}),
    ]
    with engine.begin() as conn:
        apply_observations(conn, [
            *(Observation(c, n, u, "nvidia", index=0, model="H100", allocations=a)
              for c, n, u, a in placed),
            Observation("west-hidden", "west-node-x", "GPU-mover", "nvidia", index=1,
                        model="H100")], now - dt.timedelta(hours=2))
        apply_observations(conn, [  # the mover is in east now: a `moved` event
            *(Observation(c, n, u, "nvidia", index=0, model="H100", allocations=a)
              for c, n, u, a in placed),
            Observation("east", "east-n2", "GPU-mover", "nvidia", index=1, model="H100",
                        allocations={("team-a", "train-a", "main")})], now)
        for hours_ago in (3, 2, 1):
            start = now - dt.timedelta(hours=hours_ago)
            write_bucket(conn, start.replace(tzinfo=dt.UTC).timestamp(), 3600.0, [
                {"cluster": c, "node": n, "uuid": u, "slice": "", "namespace": ns,
                 "pod": pod, "bucket_start": start, "bucket_end": start + dt.timedelta(hours=1),
                 "vendor": "nvidia", "model": "H100", "gpu_share": 1.0, "gpu_hours": 1.0,
                 "avg_utilisation_pct": util, "max_utilisation_pct": util,
                 "avg_memory_used_mib": 1.0, "max_memory_used_mib": 1.0, "avg_power_w": 1.0,
                 "energy_wh": 1.0, "coverage": 1.0}
                for c, n, u, ns, pod, util in (
                    ("east", "east-n1", "GPU-east-1", "team-a", "train-a", 0.0),
                    ("east", "east-n2", "GPU-east-2", "team-b", "idle-pod-b", 0.0),
                    ("west-hidden", "west-node-x", "GPU-west-1", "team-c", "west-pod-c",
                     0.0))], 14)
    engine.dispose()
    return url


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("walk")
    url = _inventory(tmp)
    tokens = tmp / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"tokens": [
        token_entry("admin", ADMIN),
        token_entry("team-a", TEAM, clusters=["east"], namespaces=["team-a"])]}))
    engine = read_only_engine(url)
    made = build_app(engine, health=lambda: (True, {
        "status": "ok", "interval_seconds": 60.0, "last_success": None,
        "last_success_age_seconds": None, "last_error": None, "consecutive_failures": 0}),
        findings=lambda: (FINDINGS, NOW), metrics=no_metrics, page_sections=USAGE_SECTIONS,
        auth=Authenticator(tokens=TokenFile(tokens)), metrics_open=False)
    yield made
    engine.dispose()


def _client(app: Any) -> Any:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient
    return TestClient(app, raise_server_exceptions=False)


def _variants(route: APIRoute) -> list[tuple[str, dict[str, str]]]:
    """The URLs to ask of one route: each uuid for a path parameter, each grouping, a few
    searches, and limit=1 where it pages."""
    names = {p.alias for p in route.dependant.query_params}
    for sub in route.dependant.dependencies:
        names |= {p.alias for p in sub.query_params}
    paths = [route.path_format]
    for name, values in (("{uuid}", UUIDS), ("{cluster}", ("east", "west-hidden")),
                         ("{node}", ("east-n1", "west-node-x"))):
        paths = [p.replace(name, v) for p in paths for v in values] if any(
            name in p for p in paths) else paths
    queries: list[dict[str, str]] = [{}]
    if "by" in names:
        queries += [{"by": by} for by in ("cluster", "node", "namespace", "gpu", "model",
                                          "cluster,node")]
    if "limit" in names and "continue" in names:
        queries.append({"limit": "1"})
    if "q" in names:
        queries += [{"q": q} for q in ("team-b", "west-node-x", "GPU-west", "GPU-", "east-n1")]
    if "since" in names:
        queries.append({"since": "30d"})
    return [(path, query) for path in paths for query in queries]


def _leaks(text: str, allowed: str = "") -> list[str]:
    return [name for name in FOREIGN if name in text and name not in allowed]


def _token_leaks(body: Any) -> list[str]:
    token = body.get("continue") if isinstance(body, dict) else None
    if not token:
        return []
    decoded = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    return _leaks(decoded)


def _walk(client: Any, app: Any, headers: dict[str, str]) -> tuple[set[str], list[str]]:
    walked: set[str] = set()
    problems: list[str] = []
    for route in app.routes:
        if not isinstance(route, APIRoute) or "GET" not in route.methods:
            continue
        for path, query in _variants(route):
            pages = 0
            params = dict(query)
            while True:
                r = client.get(path, params=params, headers=headers)
                assert r.status_code < 500, (path, params, r.status_code, r.text[:300])
                # the caller's own words (a searched name, a uuid in the path) may come back
                found = _leaks(r.text, allowed=query.get("q", "") + path)
                body = r.json() if "json" in r.headers.get("content-type", "") else None
                found += _token_leaks(body)
                if found:
                    problems.append(f"{path}?{params}: {found}")
                pages += 1
                if not (body and isinstance(body, dict) and body.get("continue")) \
                        or pages > 50:
                    break
                params["continue"] = body["continue"]
        walked.add(route.path_format)
    return walked, problems


def test_every_route_with_a_scoped_token_names_nothing_outside_its_scope(app):
    client = _client(app)
    walked, problems = _walk(client, app, {"Authorization": f"Bearer {TEAM}"})
    declared = {r.path_format for r in app.routes
                if isinstance(r, APIRoute) and "GET" in r.methods}
    assert walked == declared and len(declared) >= 18  # the pages of a cluster, node, GPU too
    assert problems == []


def test_the_same_walk_through_a_browser_session(app):
    client = _client(app)
    r = client.post("/login", data={"token": TEAM}, follow_redirects=False)
    assert r.status_code == 303 and "gpufleet-session" in r.headers["set-cookie"]
    walked, problems = _walk(client, app, {})
    assert problems == [] and "/" in walked


def test_the_walk_would_see_a_leak_the_whole_fleet_may_read(app):
    """The check can fail: an unrestricted token reads every one of the foreign names."""
    client = _client(app)
    _, seen = _walk(client, app, {"Authorization": f"Bearer {ADMIN}"})
    named = {name for line in seen for name in FOREIGN if name in line}
    assert named == set(FOREIGN)


def test_what_the_team_does_see(app):
    """Confinement keeps the team's own: its pods, its findings, other teams' as "other",
    the fleet's capacity as numbers."""
    client = _client(app)
    team = {"Authorization": f"Bearer {TEAM}"}
    allocations = client.get("/api/v1/allocations", headers=team).json()["items"]
    assert {(a["namespace"], a["pod"]) for a in allocations} == {
        ("team-a", "train-a"), ("other", None)}
    findings = client.get("/api/v1/findings", headers=team).json()["items"]
    assert [f["check"] for f in findings] == ["idle_allocated_gpu"]
    capacity = client.get("/api/v1/capacity", headers=team, params={"by": "cluster"}).json()
    assert [r["cluster"] for r in capacity["items"]] == ["east"]
    assert capacity["fleet"]["total"] == 4.0
    history = client.get("/api/v1/gpus/GPU-mover/history", headers=team).json()
    moved = [e for e in history["events"] if e["type"] == "moved"]
    assert moved and moved[0]["details"]["from"] is None
    assert moved[0]["details"]["to"] == {"cluster": "east", "node": "east-n2"}


def test_a_handler_that_forgets_the_scope_still_cannot_leak(app):
    """A new endpoint that takes the scope but filters nothing: the app's one confine step
    still drops other clusters' rows and masks other teams' pods on the way out."""
    def careless(engine: ReadEngine, scope: CallerScope) -> dict[str, Any]:
        """Every allocation of the fleet, unfiltered."""
        with engine.connect() as conn:
            return {"items": list_allocations(conn)}

    add_route(app, "/api/v1/careless", careless, dict[str, Any], visibility="scoped")
    client = _client(app)
    r = client.get("/api/v1/careless", headers={"Authorization": f"Bearer {TEAM}"})
    assert r.status_code == 200 and _leaks(r.text) == []
    assert {(a["cluster"], a["namespace"]) for a in r.json()["items"]} == {
        ("east", "team-a"), ("east", "other")}
    whole = client.get("/api/v1/careless", headers={"Authorization": f"Bearer {ADMIN}"})
    assert "west-pod-c" in whole.text


def test_the_pages_links_open_pages_with_the_json_one_click_away(app):
    """From the live page to a cluster, a node and a GPU: each an HTML page of its own,
    each with links to the JSON behind it that answer."""
    import re

    client = _client(app)
    admin = {"Authorization": f"Bearer {ADMIN}"}

    def links(html: str) -> list[str]:
        return re.findall(r'href="([^"]+)"', html)

    page = client.get("/", headers=admin).text
    assert "/clusters/east" in links(page) and "/gpus/GPU-east-1" in links(page)
    cluster = client.get("/clusters/east", headers=admin)
    assert cluster.status_code == 200 and cluster.headers["content-type"].startswith(
        "text/html")
    assert "/nodes/east/east-n1" in links(cluster.text)
    node = client.get("/nodes/east/east-n1", headers=admin)
    assert node.status_code == 200 and "/gpus/GPU-east-1" in links(node.text)
    gpu = client.get("/gpus/GPU-mover", headers=admin)
    assert gpu.status_code == 200 and 'id="usage"' in gpu.text and 'id="events"' in gpu.text
    assert "moved" in gpu.text and "west-hidden" in gpu.text  # the admin sees where from
    for html in (cluster.text, node.text, gpu.text):
        json_links = [link for link in links(html) if link.startswith("/api/v1/")]
        assert json_links
        for link in json_links:
            r = client.get(link.replace("&amp;", "&"), headers=admin)
            assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    team = {"Authorization": f"Bearer {TEAM}"}
    assert client.get("/clusters/west-hidden", headers=team).status_code == 404
    assert client.get("/gpus/GPU-west-1", headers=team).status_code == 404
    mover = client.get("/gpus/GPU-mover", headers=team)
    assert mover.status_code == 200 and "west-hidden" not in mover.text


def test_a_test_stands_in_for_the_caller_through_dependency_overrides(app):
    """The routes depend on ``hub.service._deps``'s very functions, so a test that wants a
    caller without a token overrides ``identify``: the route then answers that caller,
    confined to its scope, and a fleet-only route refuses it, as with a real token."""
    from hub.service._auth import Caller, Scope
    from hub.service._deps import identify

    team = Caller(Scope("team-a", frozenset({"east"}), frozenset({"team-a"}),
                        fleet_counts=False), "team-a (stand-in)")
    client = _client(app)
    app.dependency_overrides[identify] = lambda: team
    try:
        gpus = client.get("/api/v1/gpus")  # no token at all: the stand-in is the caller
        assert gpus.status_code == 200
        assert {g["cluster"] for g in gpus.json()["items"]} == {"east"}
        assert _leaks(gpus.text) == []
        allocations = client.get("/api/v1/allocations").json()["items"]
        assert {a["namespace"] for a in allocations} == {"team-a", "other"}
        assert client.get("/metrics").status_code == 403  # declared fleet (metrics closed)
    finally:
        app.dependency_overrides.clear()
    assert client.get("/api/v1/gpus").status_code == 401  # the override is gone


def test_the_scope_and_the_engine_are_overridden_as_fastapi_documents(app, tmp_path):
    """``scope_of`` and ``engine_of`` are dependencies like ``identify``: an override of
    either is what the routes answer from (the scope confines the answer, as a token of
    that scope would; the engine is the database read), and the override's end ends it."""
    from fastapi import Request

    from hub.service._auth import Scope
    from hub.service._deps import engine_of, scope_of

    client = _client(app)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    everything = {g["uuid"] for g in client.get("/api/v1/gpus", headers=admin).json()["items"]}
    assert "GPU-west-1" in everything
    app.dependency_overrides[scope_of] = lambda: Scope("east only", frozenset({"east"}),
                                                       None)
    try:
        gpus = client.get("/api/v1/gpus", headers=admin)
        assert gpus.status_code == 200
        assert {g["cluster"] for g in gpus.json()["items"]} == {"east"}
        assert client.get("/api/v1/gpus/GPU-west-1", headers=admin).status_code == 404
        assert "west-hidden" not in client.get("/api/v1/clusters", headers=admin).text
    finally:
        app.dependency_overrides.clear()
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    migrate.ensure_schema(inventory.make_engine(empty, create=True))
    other = read_only_engine(empty)

    async def elsewhere(request: Request) -> Any:  # an async override taking the request
        assert request.url.path.startswith("/api/v1/")
        return other

    app.dependency_overrides[engine_of] = elsewhere
    try:
        assert client.get("/api/v1/gpus", headers=admin).json()["items"] == []
    finally:
        app.dependency_overrides.clear()
        other.dispose()
    after = {g["uuid"] for g in client.get("/api/v1/gpus", headers=admin).json()["items"]}
    assert after == everything


def test_a_page_section_is_shown_to_a_team_only_when_declared_scoped(tmp_path):
    """A section of the live page says who it is for, as a route does: one declared
    ``scoped`` is read with the team's scope; one that declares nothing reads the whole
    fleet and is left off a team's page (its chart, drawn before the page is confined, would
    name other teams' clusters), while a whole-fleet caller still sees it."""
    from hub.service._page import Section, section_source
    from tests.support.asgi import AppClient

    def fleet_chart(conn: Any) -> Section:
        return Section("fleet-chart", "Every cluster", [("cluster", "Cluster")],
                       [{"cluster": "west-hidden"}], "", figure="<b>west-hidden: 1 GPU</b>")

    @section_source(visibility="scoped")
    def mine(conn: Any, *, scope: Any) -> Section:
        return Section("mine", "My clusters", [("cluster", "Cluster")],
                       [{"cluster": c} for c in sorted(scope.clusters or {"(all)"})], "")

    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"tokens": [
        token_entry("admin", ADMIN),
        token_entry("team-a", TEAM, clusters=["east"], namespaces=["team-a"])]}))
    engine = read_only_engine(_inventory(tmp_path))
    try:
        client = AppClient(build_app(engine, health=lambda: (True, {}),
                                     findings=lambda: ([], None), metrics=no_metrics,
                                     page_sections=[fleet_chart, mine],
                                     auth=Authenticator(tokens=TokenFile(tokens))))
        status, team = client.handle("/", Authorization=f"Bearer {TEAM}")
        assert status == 200
        assert 'id="mine"' in team.text and "(all)" not in team.text
        assert 'id="fleet-chart"' not in team.text and _leaks(team.text) == []
        status, admin = client.handle("/", Authorization=f"Bearer {ADMIN}")
        assert status == 200 and 'id="fleet-chart"' in admin.text and "(all)" in admin.text
    finally:
        engine.dispose()
