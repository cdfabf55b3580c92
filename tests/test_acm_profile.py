"""The hub service against a hub that behaves like ACM's (tests/conftest.py `acm_hub`).

Scaled down 100x with the ratios kept: one push every 3 s (ACM: 300 s) without staleness
markers, a 6 s look-back (ACM: 600 s), `clusterID` on every series, and an rbac-query-proxy that
narrows a limited token's queries to its clusters. The sync's --stale-after is 6 s (ACM: the
default 10m), the report's --push-interval 3 s.
"""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest
import requests

from hub.devstack._acm import Scope, cluster_id, encode_write_request, inject_matchers
from tests.conftest import ACM_TEST_LOOKBACK, ACM_TEST_PUSH
from tests.support.clirun import gpufleet, gpufleet_json
from tests.support.promql import wait_for
from tests.support.samples import sample_text

T4 = "dcgm-t4-loaded-ericsson-ccd.prom"
STALE_AFTER = 2 * ACM_TEST_PUSH  # ACM: 10m for a 300 s push


class Switch:
    """An exporter that can stop answering (the collector then skips it: no marker)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.on = True

    def __call__(self) -> str:
        if not self.on:
            raise ConnectionError("exporter gone")
        return self.text


def query(url: str, promql: str, token: str | None = None) -> list:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = requests.post(f"{url}/api/v1/query", data={"query": promql}, headers=headers,
                      timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["data"]["result"]


# -- the pieces of the profile ---------------------------------------------------------------------
CLUSTERS = 'cluster=~"east"'


@pytest.mark.parametrize(("promql", "expected"), [
    ("up", 'up{cluster=~"east"}'),
    ('DCGM_FI_DEV_GPU_UTIL{Hostname="n1",}',
     'DCGM_FI_DEV_GPU_UTIL{Hostname="n1", cluster=~"east"}'),
    ('count by (cluster, Hostname) (last_over_time(x[10m:30s]))',
     'count by (cluster, Hostname) (last_over_time(x{cluster=~"east"}[10m:30s]))'),
    ('{__name__=~"gpu_.*"} or on(cluster) group_left(node) y offset 5m',
     '{__name__=~"gpu_.*", cluster=~"east"} or on(cluster) group_left(node) '
     'y{cluster=~"east"} offset 5m'),
    ('label_replace(a, "dst", "$1 {x}", "src", "(.*)") > bool 1e3',
     'label_replace(a{cluster=~"east"}, "dst", "$1 {x}", "src", "(.*)") > bool 1e3'),
    ('max(timestamp(a{b="}"})) by (cluster)',
     'max(timestamp(a{b="}", cluster=~"east"})) by (cluster)'),
    ("1 + 2", "1 + 2"),
])
def test_proxy_injects_the_cluster_matcher_into_every_selector(promql, expected):
    assert inject_matchers(promql, CLUSTERS) == expected


def test_collector_pushes_every_interval_with_cluster_id_and_no_staleness_marker(acm_hub):
    exporter = Switch(sample_text(T4))
    collector = acm_hub.cluster("east", [exporter])
    [series] = wait_for(acm_hub.url, "DCGM_FI_DEV_GPU_TEMP", bool)
    assert series["metric"]["cluster"] == "east"
    assert series["metric"]["clusterID"] == cluster_id("east")
    time.sleep(3 * ACM_TEST_PUSH)
    [count] = query(acm_hub.url, f"count_over_time(DCGM_FI_DEV_GPU_TEMP[{3 * ACM_TEST_PUSH:g}s])")
    assert 2 <= float(count["value"][1]) <= 4  # one sample per push, not one per second
    exporter.on = False
    last = collector.last_pushed[0]
    # no staleness marker: the series stays visible for the whole look-back after its last push
    time.sleep(max(0.0, last + ACM_TEST_LOOKBACK / 2 - time.time()))
    assert query(acm_hub.url, "DCGM_FI_DEV_GPU_TEMP")
    time.sleep(max(0.0, last + ACM_TEST_LOOKBACK + 1 - time.time()))
    assert query(acm_hub.url, "DCGM_FI_DEV_GPU_TEMP") == []


def test_write_request_encoding_reaches_a_real_receiver(hub):
    import cramjam

    labels = {"__name__": "probe_metric", "cluster": "c", "zz": "é"}
    now = int(time.time() * 1000)
    body = bytes(cramjam.snappy.compress_raw(encode_write_request([(labels, 2.5, now)])))
    r = requests.post(f"{hub.url}/api/v1/write", data=body, timeout=5,
                      headers={"Content-Encoding": "snappy",
                               "Content-Type": "application/x-protobuf"})
    assert r.status_code == 204, r.text
    [series] = query(hub.url, "probe_metric")
    assert series["metric"] == labels
    assert series["value"][1] == "2.5"
    [stamp] = query(hub.url, "timestamp(probe_metric)")
    assert abs(float(stamp["value"][1]) * 1000 - now) < 1


# -- the hub service against it --------------------------------------------------------------------
def states(env: dict[str, str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for gpu in gpufleet_json("inventory", "gpus", env=env):
        out.setdefault(gpu["cluster"], set()).add(gpu["state"])
    return out


def sync(env: dict[str, str], url: str) -> None:
    result = gpufleet("sync", "--hub-url", url, "--stale-after", f"{STALE_AFTER:g}s", env=env)
    assert result.exit_code == 0, result.output


def test_a_silent_gpu_turns_stale_on_time_and_never_flaps(acm_hub, db_url):
    """ACM's sparse pushes must not make healthy GPUs flap, and a GPU that stops must turn
    stale when its newest sample is --stale-after old: not a look-back later."""
    acm_hub.cluster("east", [sample_text(T4)])
    west = Switch(sample_text("amd-mi300x.prom"))
    west_collector = acm_hub.cluster("west", [west])
    wait_for(acm_hub.url, "count(DCGM_FI_DEV_GPU_UTIL) + count(gpu_gfx_activity)", bool)
    env = {"GPUFLEET_DB": db_url}
    # three push intervals of syncs: every GPU stays active between sparse pushes
    deadline = time.time() + 3 * ACM_TEST_PUSH
    while time.time() < deadline:
        sync(env, acm_hub.url)
        assert states(env) == {"east": {"active"}, "west": {"active"}}
        time.sleep(0.3)
    west.on = False
    last = west_collector.last_pushed[0]
    first_stale = None  # (sync started, sync finished)
    while time.time() < last + STALE_AFTER + ACM_TEST_LOOKBACK + 2:
        started = time.time()
        sync(env, acm_hub.url)
        finished, seen = time.time(), states(env)
        assert seen["east"] == {"active"}
        if seen["west"] == {"stale"}:
            first_stale = first_stale or (started, finished)
            # never before its newest sample is --stale-after old
            assert finished >= last + STALE_AFTER - 0.5
        else:
            assert first_stale is None, "west came back after turning stale (flapping)"
            # never still active once --stale-after has passed (a look-back late)
            assert started <= last + STALE_AFTER + 0.5, "west active after --stale-after"
        time.sleep(0.3)
    assert first_stale is not None, "west never turned stale"
    # and on time: well before the hub's look-back would have dropped the series too (the
    # "5 minutes late" of ACM, scaled)
    assert first_stale[0] <= last + STALE_AFTER + ACM_TEST_PUSH
    # the report's freshness check agrees: west missed pushes, east's sparse pushes are fine
    result = gpufleet("report", "--hub-url", acm_hub.url, "--push-interval",
                      f"{ACM_TEST_PUSH:g}s", "-o", "json", env=env)
    freshness = {f["cluster"] for f in json.loads(result.stdout)["findings"]
                 if f["check"] == "freshness"}
    assert freshness == {"west"}, result.output


def test_freshness_and_partial_visibility_through_the_query_proxy(acm_hub, db_url):
    """Synced with a token that sees everything, reported with one that sees only east: the
    proxy narrows every query silently, and the report must say so instead of looking healthy."""
    acm_hub.cluster("east", [sample_text(T4)])
    acm_hub.cluster("west", [sample_text("amd-mi300x.prom")])
    proxy = acm_hub.proxy({"admin-token": None, "team-token": ["east"]})
    wait_for(acm_hub.url, "count(DCGM_FI_DEV_GPU_UTIL) + count(gpu_gfx_activity)", bool)
    env = {"GPUFLEET_DB": db_url, "GPUFLEET_TOKEN": "admin-token"}
    sync(env, proxy.url)
    assert states(env) == {"east": {"active"}, "west": {"active"}}
    # clusterID, job and instance on every series change nothing: each GPU once
    gpus = gpufleet_json("inventory", "gpus", env=env)
    expected = {"east": sample_text(T4).count("\nDCGM_FI_DEV_GPU_UTIL{"),
                "west": sample_text("amd-mi300x.prom").count("\ngpu_gfx_activity{")}
    assert {c: sum(g["cluster"] == c for g in gpus) for c in expected} == expected
    assert len({g["uuid"] for g in gpus}) == len(gpus)
    args = ["report", "--hub-url", proxy.url, "--push-interval", f"{ACM_TEST_PUSH:g}s",
            "--max-age", "1h"]
    result = gpufleet(*args, "-o", "json", env=env)
    report = json.loads(result.stdout)
    checks = {(f["check"], f["cluster"]) for f in report["findings"]}
    assert not any(check == "freshness" for check, _ in checks), report["findings"]
    assert ("hub_visibility", None) not in checks
    proxy.seen.clear()
    result = gpufleet(*args, "-o", "json", env={**env, "GPUFLEET_TOKEN": "team-token"})
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    [visibility] = [f for f in report["findings"] if f["check"] == "hub_visibility"]
    assert "not visible: west" in visibility["message"]
    assert not any(f["check"] == "freshness" for f in report["findings"]), report["findings"]
    assert proxy.seen and all('cluster=~"east"' in q for q in proxy.seen)


def test_the_syncs_queries_stay_valid_when_the_proxy_narrows_them(acm_hub, tmp_path):
    """A limited token's sync goes through the rewritten queries: valid PromQL for the store,
    and it sees only its clusters (which the report's hub_visibility finding warns about)."""
    acm_hub.cluster("east", [sample_text(T4)])
    acm_hub.cluster("west", [sample_text("amd-mi300x.prom")])
    proxy = acm_hub.proxy({"team-token": ["east"]})
    wait_for(acm_hub.url, "count(DCGM_FI_DEV_GPU_UTIL) + count(gpu_gfx_activity)", bool)
    env = {"GPUFLEET_DB": f"sqlite:///{tmp_path / 'team.db'}", "GPUFLEET_TOKEN": "team-token"}
    sync(env, proxy.url)
    assert states(env) == {"east": {"active"}}
    assert proxy.seen and all('cluster=~"east"' in q for q in proxy.seen)
    result = gpufleet("sync", "--hub-url", proxy.url, env={**env, "GPUFLEET_TOKEN": "nobody"})
    assert result.exit_code == 3 and "refused" in result.output


def test_a_namespace_scoped_token_sees_only_gpus_its_namespaces_use(acm_hub, tmp_path):
    """ACM's proxy adds a namespace matcher for a namespace-scoped user: only GPU series that
    carry one of its namespaces (a pod of theirs on it) remain; the report must say the rest of
    the fleet is not visible rather than show a small healthy fleet."""
    acm_hub.cluster("east", [sample_text(T4)])
    acm_hub.cluster("west", [sample_text("amd-mi300x.prom")])
    proxy = acm_hub.proxy({"team-token": Scope(namespaces=("inference",)),
                           "admin-token": None})
    wait_for(acm_hub.url, "count(DCGM_FI_DEV_GPU_UTIL) + count(gpu_gfx_activity)", bool)
    env = {"GPUFLEET_DB": f"sqlite:///{tmp_path / 'team.db'}", "GPUFLEET_TOKEN": "admin-token"}
    sync(env, proxy.url)
    assert len(gpufleet_json("inventory", "gpus", env=env)) == 3
    proxy.seen.clear()
    team = {**env, "GPUFLEET_TOKEN": "team-token"}
    result = gpufleet("report", "--hub-url", proxy.url, "--push-interval",
                      f"{ACM_TEST_PUSH:g}s", "-o", "json", env=team)
    assert result.exit_code == 1, result.output
    [visibility] = [f for f in json.loads(result.stdout)["findings"]
                    if f["check"] == "hub_visibility"]
    assert "not visible: east" in visibility["message"]
    assert proxy.seen and all('namespace=~"inference"' in q for q in proxy.seen)
    # a sync with the namespace-scoped token sees the one GPU a pod of theirs uses
    narrow = {**team, "GPUFLEET_DB": f"sqlite:///{tmp_path / 'narrow.db'}"}
    sync(narrow, proxy.url)
    gpus = gpufleet_json("inventory", "gpus", env=narrow)
    assert [(g["cluster"], g["index"]) for g in gpus] == [("west", 1)]


# -- the usage ledger at ACM's cadence, through `serve` -------------------------------------------
def test_serve_books_exact_gpu_hours_at_acms_push_interval(acm_hub, tmp_path):
    """One push per push interval (ACM: 300 s; here 3 s) is a whole GPU's worth of hours:
    every bucket the collector pushed through holds exactly bucket-hours per GPU. (Measured
    in 1-minute slices, as serve did, ACM's cadence booked a fifth of that.)"""
    import os
    import subprocess
    import sys

    import sqlalchemy as sa

    from hub import inventory as inv

    bucket = 5 * ACM_TEST_PUSH
    started = time.time()
    acm_hub.cluster("east", [sample_text("dcgm-h100-8gpu-aicr-eks-156a357e.prom")])
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    inv.ensure_schema(inv.make_engine(db, create=True))
    serve = subprocess.Popen(
        [sys.executable, "-m", "hub", "serve", "--hub-url", acm_hub.url, "--db", db,
         "--listen", "127.0.0.1:0", "--every", f"{ACM_TEST_PUSH:g}s",
         "--push-interval", f"{ACM_TEST_PUSH:g}s", "--usage-bucket", f"{bucket:g}s",
         "--usage-max-backfill", "1m",
         "--stale-after", f"{STALE_AFTER:g}s"],
        env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        full: list = []
        while time.monotonic() < deadline and len(full) < 2:
            assert serve.poll() is None, serve.communicate()
            time.sleep(1)
            try:
                engine = inv.make_engine(db)
                with engine.connect() as conn:
                    rows = conn.execute(sa.select(inv.usage)).mappings().all()
                engine.dispose()
            except sa.exc.OperationalError:
                continue  # not created yet
            # buckets that began after the first push: the collector pushed all through them
            firsts = sorted({r["bucket_start"] for r in rows
                             if r["bucket_start"].replace(tzinfo=dt.UTC).timestamp()
                             >= started + ACM_TEST_PUSH})
            full = [[r for r in rows if r["bucket_start"] == b] for b in firsts]
    finally:
        serve.terminate()
        _, log = serve.communicate(timeout=30)
    assert len(full) >= 2, f"serve collected no bucket the collector pushed through:\n{log}"
    for rows in full:
        assert len(rows) == 8  # the eight H100s of the sample
        assert [r["coverage"] for r in rows] == [1.0] * 8
        assert sum(r["gpu_hours"] for r in rows) == pytest.approx(8 * bucket / 3600)
