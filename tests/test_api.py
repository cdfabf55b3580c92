"""The read-only API, /metrics and /healthz over a real inventory filled by a real sync.

One hub Prometheus with real agents serves the whole module; each database (SQLite and
PostgreSQL) gets its own service, started in-process on a free port, whose first scheduled
sync fills it. Then the endpoints are asked what a client would ask.
"""

from __future__ import annotations

import base64
import json
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from hub.devstack._prometheus import PrometheusProcess, StaticServer, hub_config, start_agent
from hub.inventory import _db as inventory
from hub.inventory import read_only_engine, run_sync
from hub.service import Jobs, Service, build_service
from hub.service import _api as api
from hub.store import HubClient
from tests.support.clirun import gpufleet_json
from tests.support.promql import wait_for
from tests.support.samples import AMD, EAST, WEST, sample_text, series_count, sync_requests

CLUSTERS = {"east": EAST, "west": WEST, "amd": AMD}
MIG_PARENT = "GPU-a1000000-0000-4000-8000-000000000000"
SECRET_PASSWORD = "pw-s3cret-db"  # a marker never to be served
SECRET_TOKEN = "tok-s3cret-hub"


@pytest.fixture(scope="module")
def hub_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A hub Prometheus fed by one agent per cluster with the real exporter samples."""
    base = tmp_path_factory.mktemp("api-hub")
    hub = PrometheusProcess(base / "hub", hub_config()).start()
    things: list[PrometheusProcess | StaticServer] = [hub]
    try:
        for name, files in CLUSTERS.items():
            servers = [StaticServer(sample_text(f)).start() for f in files]
            things += servers
            things.append(start_agent(base / f"agent-{name}", name,
                                      [s.target for s in servers], hub.url))
        expected = sum(series_count(files) for files in CLUSTERS.values())
        wait_for(hub.url, 'count({__name__=~"DCGM_.+|(amd_)?gpu_.+"})',
                 lambda r: bool(r) and int(float(r[0]["value"][1])) == expected)
        yield hub.url
    finally:
        for thing in reversed(things):
            thing.stop()


class Api:
    """A started service and a tiny client for it."""

    def __init__(self, service: Service, db_url: str) -> None:
        self.service = service
        self.url = service.url
        self.db_url = db_url

    def get(self, path: str, **params: Any) -> requests.Response:
        return requests.get(self.url + path, params=params, timeout=10)

    def json(self, path: str, status: int = 200, **params: Any) -> Any:
        r = self.get(path, **params)
        assert r.status_code == status, (r.status_code, r.text)
        assert r.headers["Content-Type"] == "application/json"
        return r.json()


def _database(kind: str, request: pytest.FixtureRequest, tmp: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp / 'inventory.db'}"
    server = request.getfixturevalue("postgres_server")
    name = "api_" + uuidlib.uuid4().hex[:10]
    admin = sa.create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    # trust authentication ignores the password: it is here to prove it is never served
    return f"{server}/{name}".replace("gpufleet@", f"gpufleet:{SECRET_PASSWORD}@")


def start_service(hub_url: str, db_url: str, every: float, token: str | None = None) -> Service:
    write = inventory.make_engine(db_url, create=True)
    session = requests.Session()
    if token:
        session.headers["Authorization"] = f"Bearer {token}"
    client = HubClient(hub_url, session=session, timeout=10)

    def sync() -> Any:
        return run_sync(write, client, stale_after=600)

    return build_service(Jobs(sync=sync), every=every, engine=read_only_engine(db_url),
                         port=0).start()


def wait_healthy(api_: Api | str, want: int = 200, timeout: float = 30.0) -> dict[str, Any]:
    import time

    url = api_ if isinstance(api_, str) else api_.url
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        r = requests.get(url + "/healthz", timeout=5)
        body = r.json()
        if r.status_code == want:
            return body
        time.sleep(0.1)
    raise AssertionError(f"/healthz never answered {want}: {body}")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request: pytest.FixtureRequest, hub_store: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    db_url = _database(request.param, request, tmp_path_factory.mktemp("api-db"))
    service = start_service(hub_store, db_url, every=3600, token=SECRET_TOKEN)
    client = Api(service, db_url)
    try:
        wait_healthy(client)
        yield client
    finally:
        service.stop()
        service.engine.dispose()


def cli_json(served: Api, *args: str) -> Any:
    return gpufleet_json(*args, env={"GPUFLEET_DB": served.db_url})


def walk(served: Api, limit: int, **filters: str) -> list[list[dict[str, Any]]]:
    pages: list[list[dict[str, Any]]] = []
    token: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit, **filters}
        if token:
            params["continue"] = token
        body = served.json("/api/v1/gpus", **params)
        assert set(body) == {"items", "continue"}
        pages.append(body["items"])
        token = body["continue"]
        if token is None:
            return pages
        assert len(pages) < 200, "paging does not end"


def key(item: dict[str, Any]) -> tuple[Any, ...]:
    return item["cluster"], item["node"], item["uuid"], item["mig_profile"], item["mig_instance"]


# -- inventory endpoints -------------------------------------------------------------------------


def test_clusters_and_nodes_are_what_the_inventory_command_shows(served):
    assert served.json("/api/v1/clusters") == {
        "items": cli_json(served, "inventory", "clusters"),
        "continue": None}
    clusters = {c["cluster"]: (c["nodes"], c["gpus"]) for c in
                served.json("/api/v1/clusters")["items"]}
    assert clusters == {"east": (3, 17), "west": (3, 4), "amd": (2, 5)}
    west = served.json("/api/v1/nodes", cluster="west")["items"]
    assert west == cli_json(served, "inventory", "nodes", "--cluster", "west")
    assert {n["node"]: n["gpus"] for n in west} == {
        "gpu-node-a1": 2, "gpu1-wl8sg": 1, "cp-bm14r7": 1}
    assert served.json("/api/v1/clusters", cluster="nowhere")["items"] == []


def test_gpus_carry_the_inventory_fields_and_rows(served):
    body = served.json("/api/v1/gpus")
    assert body["continue"] is None  # 29 rows fit the default page of 500
    expected = cli_json(served, "inventory", "gpus")
    assert len(body["items"]) == len(expected) == 17 + 4 + 5 + 3
    assert [list(item) for item in body["items"]] == [list(e) for e in expected]  # same fields
    assert sorted(body["items"], key=lambda i: json.dumps(i)) == \
        sorted(expected, key=lambda i: json.dumps(i))


@pytest.mark.parametrize("limit", [1, 4, 7, 29, 30])
def test_paging_with_small_limits_returns_every_gpu_once(served, limit):
    everything = served.json("/api/v1/gpus", limit=5000)["items"]
    pages = walk(served, limit)
    assert all(len(p) == limit for p in pages[:-1]) and 0 < len(pages[-1]) <= limit
    flat = [item for page in pages for item in page]
    assert flat == everything  # same order, nothing repeated, nothing missing
    assert len({key(i) for i in flat}) == len(flat)
    assert len(pages) == -(-len(everything) // limit)  # no trailing empty page


def test_paging_composes_with_filters(served):
    pages = walk(served, 4, cluster="east", state="active")
    flat = [i for p in pages for i in p]
    assert len(flat) == 17 and {i["cluster"] for i in flat} == {"east"}


def test_filters(served):
    def rows(**params: str) -> list[dict[str, Any]]:
        return served.json("/api/v1/gpus", **params)["items"]

    amd = rows(vendor="amd")
    assert len(amd) == 5 and {g["cluster"] for g in amd} == {"amd"}
    node = rows(cluster="west", node="gpu-node-a1")
    assert len(node) == 2 + 3  # two GPUs, one of them split into three MIG slices
    assert rows(state="stale") == []
    assert len(rows(state="active")) == 29
    assert rows(cluster="east", vendor="amd") == []


def test_a_mig_gpu_comes_with_its_slices(served):
    body = served.json(f"/api/v1/gpus/{MIG_PARENT}")
    assert body["gpu"]["uuid"] == MIG_PARENT and body["gpu"]["mig_profile"] is None
    assert body["gpu"]["node"] == "gpu-node-a1"
    assert sorted((s["mig_profile"], s["mig_instance"]) for s in body["slices"]) == [
        ("1g.10gb", 13), ("2g.20gb", 5), ("3g.40gb", 1)]
    assert all(s["uuid"] == MIG_PARENT for s in body["slices"])
    assert body["also_seen_on"] == []
    plain = served.json("/api/v1/gpus/GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005")
    assert plain["gpu"]["model"] == "NVIDIA H100 80GB HBM3" and plain["slices"] == []


def test_uuids_with_reserved_characters_are_percent_encoded(served):
    body = served.json("/api/v1/gpus/amd-vf-node%2F2")
    assert body["gpu"]["uuid"] == "amd-vf-node/2" and body["gpu"]["temperature_c"] == 33
    assert served.json("/api/v1/gpus/serial%3AVF-SERIAL-0")["gpu"]["model"] == "0x74b5"


def test_unknown_gpu_is_a_json_404(served):
    body = served.json("/api/v1/gpus/GPU-nope", 404)
    assert body == {"error": "unknown GPU 'GPU-nope'"}
    assert "error" in served.json("/api/v1/gpus/", 404)


def test_a_uuid_is_one_gpu_wherever_it_reports(served):
    """Since migration 0005 a GPU is its uuid: a second row on another node is refused by the
    schema (a move updates the row and writes a `moved` event), so the answer is never split."""
    engine = inventory.make_engine(served.db_url)
    gpus = inventory.gpus
    uuid = "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"
    try:
        with engine.begin() as conn:
            row = dict(conn.execute(sa.select(gpus).where(gpus.c.uuid == uuid))
                       .mappings().one())
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(gpus.insert().values(**{**row, "node": "aaa-old-node"}))
        body = served.json(f"/api/v1/gpus/{uuid}")
        assert body["gpu"]["node"] == row["node"] and body["gpu"]["state"] == "active"
        assert body["also_seen_on"] == []
    finally:
        engine.dispose()


@pytest.mark.parametrize(("path", "params", "needle"), [
    ("/api/v1/gpus", {"limit": "abc"}, "limit must be a whole number from 1 to 5000"),
    ("/api/v1/gpus", {"limit": "0"}, "limit must be"),
    ("/api/v1/gpus", {"limit": "5001"}, "limit must be"),
    ("/api/v1/gpus", {"limit": "-1"}, "limit must be"),
    ("/api/v1/gpus", {"state": "broken"}, "unknown state 'broken': choose one of active, stale"),
    ("/api/v1/gpus", {"vendor": "intel"}, "unknown vendor 'intel'"),
    ("/api/v1/gpus", {"continue": "garbage!!"}, "invalid continue token"),
    ("/api/v1/gpus", {"continue": "WyJ4Il0"}, "invalid continue token"),  # ["x"]
    ("/api/v1/gpus", {"clustr": "east"}, "unknown query parameter 'clustr'"),
    ("/api/v1/gpus", {"limit": "²"}, "limit must be"),  # str.isdigit() says yes
    ("/api/v1/gpus", {"limit": "9" * 5000}, "limit must be"),
    ("/api/v1/gpus", {"limit": ""}, "limit must be"),
    ("/api/v1/gpus", {"node": "a\x00b"}, "must not contain control characters"),
    ("/api/v1/nodes", {"continue": "garbage!!"}, "invalid continue token"),
    ("/api/v1/clusters", {"limit": "0"}, "limit must be"),
    ("/api/v1/sync-runs", {"limit": "many"}, "limit must be a whole number from 1 to 1000"),
    ("/api/v1/findings", {"severity": "fatal"}, "unknown severity 'fatal'"),
    ("/api/v1/clusters", {"node": "x"}, "unknown query parameter 'node'"),
    ("/healthz", {"verbose": "1"}, "unknown query parameter 'verbose'"),
    # client mistakes that once answered 500 or 503 (issue 22)
    *((path, {"since": "100000000d"}, "since: duration 100000000d is too long (at most 100y)")
      for path in ("/api/v1/usage", "/api/v1/idle", "/api/v1/events")),
    ("/api/v1/usage", {"since": "1e400"}, "since: invalid duration"),
    ("/api/v1/usage", {"from": "0001-01-01T00:00:00+14:00"}, "not an ISO-8601 time"),
    ("/api/v1/idle", {"for": "100000000d"}, "for: duration 100000000d is too long"),
    ("/api/v1/events", {"continue": api.encode_token(["9" * 30, "", "", ""])},
     "invalid continue token"),
    ("/api/v1/events", {"continue": api.encode_token(["²", "", "", ""])},
     "invalid continue token"),
    ("/api/v1/events", {"continue": "A" * 5000}, "invalid continue"),
    ("/api/v1/gpus", {"continue": base64.urlsafe_b64encode(b"[" * 100_00).decode()},
     "invalid continue"),
    ("/api/v1/gpus", {"continue": base64.urlsafe_b64encode(b"[" * 1500).decode()},
     "invalid continue token"),
])
def test_bad_query_parameters_are_400_naming_the_problem(served, path, params, needle):
    body = served.json(path, 400, **params)
    assert set(body) == {"error"} and needle in body["error"]


@pytest.mark.parametrize("path", ["/api/v1/gpus/a%00b", "/api/v1/gpus/a%00b/history",
                                  "/api/v1/gpus/GPU-%1b[31m/history"])
def test_control_characters_in_a_gpu_path_are_400_on_every_database(served, path):
    """PostgreSQL refuses NUL in a text parameter: that once read as 'database unavailable'."""
    body = served.json(path, 400)
    assert body == {"error": "uuid must not contain control characters"}


def test_empty_parameters_mean_no_filter_as_the_schema_allows(served):
    assert served.json("/api/v1/gpus", cluster="", node="") == served.json("/api/v1/gpus")
    assert served.json("/api/v1/nodes", cluster="") == served.json("/api/v1/nodes")


@pytest.mark.parametrize("path", ["/api/v1/clusters", "/api/v1/nodes", "/api/v1/allocations"])
def test_every_listing_pages_like_gpus(served, path):
    whole = served.json(path)
    assert whole["continue"] is None and len(whole["items"]) >= 2
    seen: list[Any] = []
    params: dict[str, Any] = {"limit": 1}
    while True:
        body = served.json(path, **params)
        assert len(body["items"]) == 1
        seen += body["items"]
        if body["continue"] is None:
            break
        params["continue"] = body["continue"]
    assert seen == whole["items"]


def test_repeated_parameter_is_400(served):
    r = requests.get(served.url + "/api/v1/gpus?cluster=east&cluster=west", timeout=5)
    assert r.status_code == 400 and "more than once" in r.json()["error"]


def test_unknown_path_and_other_methods(served):
    assert "no such path" in served.json("/api/v1/racks", 404)["error"]
    assert served.json("/index.html", 404)["error"]  # "/" is the live page
    r = requests.post(served.url + "/api/v1/gpus", data="x", timeout=5)
    assert r.status_code == 405 and r.headers["Allow"] == "GET, HEAD"
    assert "read-only" in r.json()["error"]
    trace = requests.request("TRACE", served.url + "/api/v1/gpus", timeout=5)
    assert trace.status_code == 405 and trace.headers["Content-Type"] == "application/json"
    odd = requests.request("BREW", served.url + "/api/v1/gpus", timeout=5)
    assert odd.status_code == 405 and odd.headers["Allow"] == "GET, HEAD"
    head = requests.head(served.url + "/api/v1/clusters", timeout=5)
    get = requests.get(served.url + "/api/v1/clusters", timeout=5)
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["Content-Length"]) == len(get.content)


def test_sync_runs_latest_first(served):
    runs = served.json("/api/v1/sync-runs")["items"]
    assert runs and runs[0]["status"] == "ok" and runs[0]["gpus"] == 26
    assert runs[0]["requests"] == sync_requests("".join(
        sample_text(f) for f in EAST + WEST + AMD))
    assert runs[0]["shards"] == 1 and runs[0]["finished_at"].endswith("Z")
    assert [r["id"] for r in runs] == sorted((r["id"] for r in runs), reverse=True)
    assert len(served.json("/api/v1/sync-runs", limit=1)["items"]) == 1


def test_findings_are_empty_until_checks_are_configured(served):
    assert served.json("/api/v1/findings") == {"items": [], "continue": None,
                                               "generated_at": None,
                                               "last_check_failed": None,
                                               "checks": "not checked yet"}


def test_the_api_engine_cannot_write(served):
    engine = served.service.engine
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
        conn.execute(inventory.gpus.delete())
    assert len(served.json("/api/v1/gpus")["items"]) == 29


# -- /metrics and /healthz ------------------------------------------------------------------------


def metric_families(served: Api) -> dict[str, Any]:
    r = served.get("/metrics")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def test_metrics_expose_the_documented_families(served):
    families = metric_families(served)
    assert families["gpufleet_sync_duration_seconds"].type == "histogram"
    assert families["gpufleet_sync_last_success_timestamp_seconds"].type == "gauge"
    assert families["gpufleet_sync_failures"].type == "counter"
    gpus = {(s.labels["cluster"], s.labels["state"]): s.value
            for s in families["gpufleet_gpus"].samples}
    # the fleet states (issue 38): reserved are the GPUs pods hold, none idle yet
    held: dict[str, set[str]] = {}
    for a in served.json("/api/v1/allocations", limit=1000)["items"]:
        held.setdefault(a["cluster"], set()).add(a["uuid"])
    expected = {}
    for cluster, known in (("east", 17), ("west", 4), ("amd", 5)):
        reserved = len(held.get(cluster, ()))
        expected.update({(cluster, "delivered"): known, (cluster, "healthy"): known,
                         (cluster, "reserved"): reserved, (cluster, "active"): reserved,
                         (cluster, "stale"): 0})
    assert gpus == expected and 0 < sum(len(v) for v in held.values()) < 26
    states = served.json("/api/v1/states", by="cluster")["items"]
    assert {(r["cluster"], k): r[k] for r in states for k in
            ("delivered", "healthy", "reserved", "active")} == {
        k: v for k, v in expected.items() if k[1] != "stale"}
    findings = {s.labels["severity"]: s.value for s in families["gpufleet_findings"].samples}
    assert findings == {"error": 0, "warning": 0, "info": 0}
    samples = {s.name: s.value for f in families.values() for s in f.samples if not s.labels}
    assert samples["gpufleet_sync_duration_seconds_count"] >= 1
    assert samples["gpufleet_sync_last_success_timestamp_seconds"] > 1.7e9
    assert samples["gpufleet_sync_failures_total"] == 0
    assert samples["gpufleet_inventory_read_ok"] == 1
    assert "process_resident_memory_bytes" in samples


def test_metrics_negotiate_openmetrics_and_gzip_as_prometheus_client_does(served):
    """A Prometheus that asks for OpenMetrics gets it (with # EOF), one that accepts gzip
    gets it compressed; a plain scraper still gets text 0.0.4."""
    import gzip

    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om

    r = requests.get(served.url + "/metrics", timeout=10, headers={
        "Accept": "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5",
        "Accept-Encoding": "gzip"}, stream=True)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert r.headers["Content-Encoding"] == "gzip"
    text = gzip.decompress(r.raw.read()).decode()
    assert text.rstrip().endswith("# EOF")
    assert "gpufleet_sync_duration_seconds" in {f.name for f in om(text)}
    plain = requests.get(served.url + "/metrics", timeout=10,
                         headers={"Accept-Encoding": "identity"})
    assert plain.headers["Content-Type"] == api.METRICS_CONTENT_TYPE
    assert "Content-Encoding" not in plain.headers and "# EOF" not in plain.text


def test_healthz_while_healthy(served):
    body = served.json("/healthz")
    assert body["status"] == "ok" and body["last_sync"]["gpus"] == 26
    assert body["last_error"] is None and body["interval_seconds"] == 3600


def test_livez_answers_from_the_event_loop_without_a_token(served):
    r = requests.get(served.url + "/livez", timeout=10)
    assert r.status_code == 200 and r.json() == {"status": "alive"}


# -- the description -----------------------------------------------------------------------------


def test_openapi_describes_every_served_path_and_every_documented_path_answers(served):
    doc = served.json("/api/v1/openapi.json")
    assert doc["openapi"].startswith("3.")
    # every route but the browser pages of one cluster, node or GPU (HTML, not the API)
    served_paths = {r.path.replace(":path}", "}") for r in served.service.app.routes
                    if r.include_in_schema}
    assert set(doc["paths"]) == served_paths
    assert {"/healthz", "/metrics", "/api/v1/openapi.json", "/api/v1/clusters",
            "/api/v1/nodes", "/api/v1/gpus", "/api/v1/gpus/{uuid}", "/api/v1/findings",
            "/api/v1/sync-runs"} <= served_paths
    schemas = doc["components"]["schemas"]
    for path, item in doc["paths"].items():
        operation = item["get"]
        for param in operation["parameters"]:
            assert param["in"] in ("query", "path") and param["schema"]
        url = path.replace("{uuid}", MIG_PARENT)
        r = served.get(url)
        assert r.status_code == 200, (path, r.status_code, r.text)
        ref = operation["responses"]["200"]["content"]
        # one kind of answer per path; /metrics also speaks OpenMetrics when asked
        assert r.headers["Content-Type"].split(";")[0] == next(iter(ref)), path
        assert len(ref) == 1 or path == "/metrics", path
    # the item schemas list exactly the fields the endpoints return
    gpu = served.json("/api/v1/gpus", limit=1)["items"][0]
    assert schemas["Gpu"]["required"] == list(gpu)
    assert schemas["Cluster"]["required"] == list(served.json("/api/v1/clusters")["items"][0])
    assert schemas["Node"]["required"] == list(served.json("/api/v1/nodes")["items"][0])
    assert schemas["SyncRun"]["required"] == list(served.json("/api/v1/sync-runs")["items"][0])


def test_no_response_carries_a_secret(served):
    bodies = [served.get(path.replace("{uuid}", MIG_PARENT)).text
              for path in served.json("/api/v1/openapi.json")["paths"]]
    bodies += [served.get("/api/v1/nope").text, served.get("/api/v1/gpus?x=1").text]
    for text in bodies:
        assert SECRET_PASSWORD not in text and SECRET_TOKEN not in text
        assert "postgresql" not in text and "sqlite:" not in text


# -- health over time, with the hub going away -----------------------------------------------------


def test_healthz_turns_503_when_the_hub_goes_away(hub, fleet, tmp_path):
    cluster = fleet("east", [sample_text(EAST[2])])
    wait_for(hub.url, 'count(DCGM_FI_DEV_GPU_TEMP{cluster="east"})', lambda r: bool(r))
    service = start_service(hub.url, f"sqlite:///{tmp_path / 'health.db'}", every=1.0)
    try:
        body = wait_healthy(service.url, 200)
        assert body["last_sync"]["gpus"] == 1
        cluster.agent.stop()  # first, or it waits at exit to flush to a hub that is gone
        hub.stop()
        body = wait_healthy(service.url, 503, timeout=15)
        assert body["status"] == "unavailable"
        assert "more than two intervals (2s)" in body["reason"]
        assert "unreachable" in body["reason"] and body["consecutive_failures"] >= 1
        failures = {s.name: s.value for f in text_string_to_metric_families(
            requests.get(service.url + "/metrics", timeout=5).text) for s in f.samples}
        assert failures["gpufleet_sync_failures_total"] >= 1
        # the inventory stays readable while the hub is away
        assert len(requests.get(service.url + "/api/v1/gpus", timeout=5).json()["items"]) == 1
    finally:
        service.stop()
