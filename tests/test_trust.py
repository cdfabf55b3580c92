"""Never "ok" about what was not seen: a wrong cluster label, an empty hub, a bad label name."""

from __future__ import annotations

import json

import pytest

from hub import inventory as inv
from hub.common import InputError
from hub.inventory import _db
from hub.inventory._writer import apply_observations
from tests.support.clirun import gpufleet, gpufleet_json
from tests.support.httpstub import Request, Response, StubServer, json_response
from tests.support.promql import wait_for
from tests.support.samples import sample_text

T4 = "dcgm-t4-loaded-ericsson-ccd.prom"


def one_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


@pytest.fixture
def synced(hub, fleet, tmp_path):
    fleet("east", [sample_text(T4)])
    wait_for(hub.url, "count(DCGM_FI_DEV_GPU_UTIL)", lambda r: bool(r))
    env = {"GPUFLEET_DB": f"sqlite:///{tmp_path / 'inv.db'}", "GPUFLEET_STALE_AFTER": "30s",
           "GPUFLEET_HUB_URL": hub.url}
    assert gpufleet("sync", env=env).exit_code == 0
    return env, gpufleet_json("inventory", "gpus", env=env)


def test_a_cluster_label_no_series_carries_fails_the_sync_and_writes_nothing(synced):
    env, before = synced
    result = gpufleet("sync", "--cluster-label", "clustr", env=env)
    assert result.exit_code == 2
    line = one_line(result.stderr)
    assert "no GPU series carries label 'clustr'; they carry: " in line
    carried = line.split("they carry: ")[1].split(" (")[0].split(", ")
    assert "cluster" in carried and "UUID" in carried
    assert gpufleet_json("inventory", "gpus", env=env) == before
    assert {c["cluster"] for c in gpufleet_json("inventory", "clusters", env=env)} == {"east"}
    runs = gpufleet_json("inventory", "sync-runs", env=env)
    assert runs[0]["status"] == "failed" and "'clustr'" in runs[0]["error"]


def test_series_of_which_only_some_carry_the_label_are_left_out_and_named():
    from hub import store
    from hub.inventory._normalize import FleetBuilder
    from hub.inventory._sync import check_labelled, missing_label_error

    rows = [{"metric": {"cluster": "east", "UUID": "a"}},
            {"metric": {"UUID": "b", "Hostname": "n1", "team": "west"}},
            {"metric": {"cluster": "", "UUID": "c", "Hostname": "n2"}}]
    query = next(q for q in store.sync_queries("10m", "1m", "cluster") if q.kind == "values")
    builder = FleetBuilder("cluster")
    assert builder.add(query, rows) == (3, 2)  # rows, and those lacking it
    note = check_labelled(builder, "cluster")
    assert [o.uuid for o in builder.observations()] == ["a"]
    assert note == ("unlabelled_series: 2 GPU series lack label 'cluster' and were left out "
                    "of the sync (they carry: Hostname, UUID, cluster, team; hosts: n1, n2); "
                    "fix the external labels of the spoke that pushes them")
    only_bad = FleetBuilder("cluster")
    only_bad.add(query, rows[1:])
    with pytest.raises(InputError) as err:
        check_labelled(only_bad, "cluster")
    assert err.value.exit_code == 2
    err = missing_label_error("cluster", 2, 3, ["UUID", "instance"])
    assert err.exit_code == 2
    assert err.format_message().startswith("2 of 3 GPU series lack label 'cluster'; "
                                           "they carry: UUID, instance")


@pytest.mark.parametrize("command", [["sync"], ["serve"], ["report"], ["reconcile"],
                                     ["alerts", "render", "--out", "unused"]])
@pytest.mark.parametrize("label", ["cluster) (up) or count by (cluster", "Hostname, cluster",
                                   "9lives", ""])
def test_cluster_label_must_be_a_prometheus_label_name(command, label, tmp_path):
    env = {"GPUFLEET_DB": f"sqlite:///{tmp_path / 'inv.db'}",
           "GPUFLEET_HUB_URL": "http://127.0.0.1:1"}
    result = gpufleet(*command, "--cluster-label", label, env=env)
    assert result.exit_code == 2
    assert "is not a Prometheus label name" in one_line(result.stderr)
    env["GPUFLEET_CLUSTER_LABEL"] = label or "-"
    assert gpufleet(*command, env=env).exit_code == 2
    assert not (tmp_path / "inv.db").exists()


def empty_hub(req: Request) -> Response:
    return json_response(200, {"status": "success",
                               "data": {"resultType": "vector", "result": []}})


def test_a_sync_that_sees_no_gpu_series_says_so_and_report_makes_it_an_error(synced):
    env, _ = synced
    server = StubServer(empty_hub)
    try:
        result = gpufleet("sync", "--hub-url", server.url, env=env)
        assert result.exit_code == 0
        assert "the hub returned no GPU series" in one_line(result.stdout)
        runs = gpufleet_json("inventory", "sync-runs", env=env)
        assert runs[0]["status"] == "ok" and runs[0]["error"] == inv.NO_GPU_SERIES
    finally:
        server.stop()
    report = gpufleet("report", "--hub-url", "", "-o", "json", env=env)
    assert report.exit_code == 1
    findings = json.loads(report.stdout)["findings"]
    assert any(f["severity"] == "error" and f["check"] == "sync"
               and "no GPU series" in f["message"] for f in findings)


def test_rows_with_an_empty_cluster_name_are_left_alone_but_reported(tmp_path):
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = inv.make_engine(url, create=True)
    try:
        inv.ensure_schema(engine)
        now = inv.now_utc()
        with engine.begin() as conn:
            conn.execute(sa.insert(_db.clusters).values(cluster="", state="active",
                                                        first_seen=now, last_seen=now,
                                                        last_sample_at=now))
    finally:
        engine.dispose()
    result = gpufleet("report", "--db", url, "-o", "json")
    findings = json.loads(result.stdout)["findings"]
    assert any(f["check"] == "inventory" and "empty name" in f["message"] for f in findings)
    assert [c["cluster"] for c in gpufleet_json("inventory", "clusters", "--db", url)] == [""]


def test_query_of_a_metric_the_hub_does_not_know_warns_on_stderr(synced):
    env, _ = synced
    typo = gpufleet("query", "DCGM_FI_DEV_GPU_UTL", env=env)
    assert typo.exit_code == 0
    assert "(none)" in typo.stdout or typo.stdout.strip() == ""
    assert one_line(typo.stderr) == ("warning: the hub has no series named "
                                     "'DCGM_FI_DEV_GPU_UTL' (a typo, or not in the allowlist?)")
    # a known metric whose matchers select nothing is an honest empty answer
    empty = gpufleet("query", 'DCGM_FI_DEV_GPU_UTIL{cluster="nowhere"}', env=env)
    assert empty.exit_code == 0 and empty.stderr == ""
    assert gpufleet("query", "sum by (cluster) (DCGM_FI_DEV_GPU_UTIL)", env=env).stderr == ""
    # the dashboard's vendor alternatives: an NVIDIA hub lacks AMD's name, and that is fine
    either = gpufleet("query", 'DCGM_FI_DEV_GPU_UTIL{cluster="nowhere"} or '
                               'amd_gpu_gfx_activity{cluster="nowhere"}', env=env)
    assert either.exit_code == 0 and either.stderr == ""
    neither = gpufleet("query", "DCGM_FI_DEV_GPU_UTL or amd_gpu_gfx_activty", env=env)
    assert "no series named 'DCGM_FI_DEV_GPU_UTL'" in neither.stderr


def test_a_reconcile_that_compared_nothing_says_so_and_exits_1(synced, tmp_path):
    env, _ = synced  # the hub has GPU metrics but no kube-state-metrics
    result = gpufleet("reconcile", env=env)
    assert result.exit_code == 1
    assert ("finding: nothing to compare: no node capacity for GPU resources reached the hub"
            in result.stderr and "kube_node_status_capacity" in result.stderr)
    rows = json.loads(gpufleet("reconcile", "-o", "json", env=env).stdout)
    assert rows[-1]["status"] == "nothing_to_compare"
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"kind": "NodeList", "items": [
        {"metadata": {"name": "cpu-1", "labels": {}}, "status": {"capacity": {"cpu": "8"}}}]}))
    result = gpufleet("reconcile", "--nodes-json", f"east={nodes}", env=env)
    assert result.exit_code == 1
    assert f"nothing to compare: the file {nodes} listed no node with a GPU resource" \
        in result.stderr


def test_a_silent_cluster_shows_what_was_last_known_and_is_never_green(tmp_path):
    import datetime as dt

    from hub.inventory._normalize import Observation

    url = f"sqlite:///{tmp_path / 'inv.db'}"
    engine = inv.make_engine(url, create=True)
    try:
        inv.ensure_schema(engine)
        then = inv.now_utc() - dt.timedelta(seconds=60)
        t = then.replace(tzinfo=dt.UTC).timestamp()
        with engine.begin() as conn:
            apply_observations(conn, [Observation("east", "a", f"GPU-{i}", "nvidia",
                                                      index=i, sample_at=t) for i in range(32)],
                                   then)
            apply_observations(conn, [], inv.now_utc())  # the cluster went silent
            _db.record_run(conn, started_at=inv.now_utc(), status="ok", requests=1)
    finally:
        engine.dispose()
    [cluster] = gpufleet_json("inventory", "clusters", "--db", url)
    assert (cluster["gpus"], cluster["stale_gpus"], cluster["state"]) == (0, 32, "stale")
    [node] = gpufleet_json("inventory", "nodes", "--db", url)
    assert (node["gpus"], node["stale_gpus"]) == (0, 32)
    table = gpufleet("report", "--db", url, "--max-age", "1d", "--push-interval", "1d")
    assert "0 of 32 reporting" in table.stdout
    data = json.loads(gpufleet("report", "--db", url, "--max-age", "1d",
                               "--push-interval", "1d", "-o", "json").stdout)
    [row] = data["summary"]
    assert (row["gpus"], row["stale_gpus"], row["status"]) == (0, 32, "warning")
    html = gpufleet("report", "--db", url, "--max-age", "1d", "--push-interval", "1d",
                    "-o", "html").stdout
    assert 'class="bar ok"' not in html and 'class="bar warning"' in html
    assert "0 of 32 reporting" in html


def test_nothing_to_compare_names_the_empty_source():
    from hub.validate import NodeView, nothing_to_compare

    cpu_only = [NodeView("east", "cpu-1", {})]
    assert nothing_to_compare([NodeView("east", "g", {"nvidia.com/gpu": 8})], "kube") is None
    assert nothing_to_compare(cpu_only, "kube", "east-ctx") == (
        "nothing to compare: the Kubernetes API of context east-ctx listed no node with a "
        "GPU resource")
    assert "kube_node_status_capacity" in (nothing_to_compare([], "hub") or "")
