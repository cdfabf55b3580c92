"""Issue 39's three clusters of H100 nodes on a real hub Prometheus, end to end:

- frag: 8 free, 4 per node on two nodes;
- whole: 8 free on one node;
- sick: 8 on one node, 2 of them failed with XID 79 (DCGM_FI_DEV_XID_ERRORS).

`capacity --fits 8 --model H100` says fits / fragmented / short; `capacity` never counts the
failed GPUs as free; the API answers the same for a whole-fleet token and only the team's
cluster for a team token; `placement apply` writes the scores to a Kubernetes API (the
official client, server-side apply, the status subresource).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from click.testing import CliRunner

from hub.cli import cli
from hub.inventory import read_only_engine
from hub.service import Authenticator, Jobs, TokenFile, build_service
from spoke import Exporter, SimBackend
from spoke._sim import parse_fault
from tests.support.clirun import gpufleet, gpufleet_json
from tests.support.kubeapi import KubeAPI
from tests.support.promql import wait_for


def sim_text(node: str, gpus: int, faults: list[str] = ()) -> str:  # type: ignore[assignment]
    backend = SimBackend(gpus=gpus, node=node, seed=3, faults=[parse_fault(f) for f in faults],
                         clock=lambda: 1_800_000_000.0)
    backend.open()
    ticks = itertools.count(0.0, 0.001)
    exp = Exporter(backend, hostname=node, interval=30, timer=lambda: next(ticks))
    exp.collect_once()
    return exp.exposition().decode()


@pytest.fixture
def synced(hub, fleet, tmp_path: Path) -> dict[str, str]:
    fleet("frag", [sim_text("frag-a", 4), sim_text("frag-b", 4)])
    fleet("whole", [sim_text("whole-a", 8)])
    fleet("sick", [sim_text("sick-a", 8, ["2:xid=79", "5:xid=79"])])
    wait_for(hub.url, "count(DCGM_FI_DEV_XID_ERRORS)",
             lambda r: bool(r) and int(float(r[0]["value"][1])) == 24)
    db = f"sqlite:///{tmp_path / 'inventory.db'}"
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db}
    result = gpufleet("sync", "--stale-after", "30s", env=env)
    assert result.exit_code == 0, result.output
    return env


def test_where_an_8_gpu_job_fits_and_what_is_free(synced):
    env = synced
    rows = {r["cluster"]: r for r in gpufleet_json("capacity", "--fits", "8", "--model",
                                                   "H100", env=env)}
    assert {c: (r["status"], r["free"], r["largest_on_one_node"], r["nodes"])
            for c, r in rows.items()} == {
        "frag": ("fragmented", 8, 4, []), "whole": ("fits", 8, 8, ["whole-a"]),
        "sick": ("short", 6, 6, [])}
    four = {r["cluster"]: r for r in gpufleet_json("capacity", "--fits", "4", env=env)}
    assert four["frag"]["status"] == "fits" and four["frag"]["nodes"] == ["frag-a", "frag-b"]
    none = gpufleet_json("capacity", "--fits", "1", "--model", "A100", env=env)
    assert {r["status"] for r in none} == {"short"}
    table = gpufleet("capacity", "--fits", "8", "--model", "H100", env=env)
    assert table.exit_code == 0 and "fragmented" in table.stdout and "whole-a" in table.stdout
    by_cluster = {r["cluster"]: r for r in gpufleet_json("capacity", "--by", "cluster",
                                                         env=env)}
    assert by_cluster["sick"]["failed"] == 2 and by_cluster["sick"]["free"] == 6
    assert sum(r["free"] for r in by_cluster.values()) == 22  # the failed two are not free

    scores = {o["metadata"]["namespace"]: {s["name"]: s["value"] for s in o["status"]["scores"]}
              for o in yaml.safe_load_all(gpufleet("placement", "scores", env=env).stdout)}
    assert {c: s["gpuFreeNode"] for c, s in scores.items()} == {
        "frag": 0, "whole": 100, "sick": 50}
    assert scores["whole"]["gpuFree"] == scores["frag"]["gpuFree"] > scores["sick"]["gpuFree"]
    assert set(scores["whole"]) == {"gpuFree", "gpuFreeNode", "gpuReclaimable", "gpuFree-h100"}


def _serve(db: str, tokens: Path):
    def sync() -> Any:
        raise RuntimeError("not syncing in this test")

    return build_service(Jobs(sync=sync), every=3600, engine=read_only_engine(db),
                         auth=Authenticator(tokens=TokenFile(tokens)), process_metrics=False,
                         metrics_open=False).start()


def test_the_api_answers_the_same_and_a_team_sees_its_clusters_only(synced, tmp_path):
    made, entries = {}, []
    for name, args in (("admin", []), ("team", ["--clusters", "whole"])):
        out = json.loads(CliRunner().invoke(
            cli, ["serve", "token", "create", name, *args, "-o", "json"]).output)
        made[name] = out["token"]
        entries.append(out["entry"])
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"tokens": entries}))
    service = _serve(synced["GPUFLEET_DB"], path)
    try:
        def get(url: str, who: str, **params: Any) -> Any:
            r = requests.get(service.url + url, params=params, timeout=10,
                             headers={"Authorization": f"Bearer {made[who]}"})
            assert r.status_code == 200, r.text
            return r.json()

        cli_rows = gpufleet_json("capacity", "--fits", "8", "--model", "H100", env=synced)
        assert get("/api/v1/capacity", "admin", fits=8, model="H100")["items"] == cli_rows
        team = get("/api/v1/capacity", "team", fits=8, model="H100")["items"]
        assert [r["cluster"] for r in team] == ["whole"]
        scores = get("/api/v1/placement-scores", "team")["items"]
        assert [s["cluster"] for s in scores] == ["whole"]
        assert len(get("/api/v1/placement-scores", "admin")["items"]) == 3
        models = get("/api/v1/capacity", "admin")
        assert models["fleet"]["failed"] == 2 and models["fleet"]["free"] == 22
        bad = requests.get(service.url + "/api/v1/capacity", params={"fits": 0}, timeout=10,
                           headers={"Authorization": f"Bearer {made['admin']}"})
        assert bad.status_code in (400, 422)
    finally:
        service.stop()


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[KubeAPI]:
    with KubeAPI(workdir=tmp_path) as api:
        yield api


def test_placement_apply_writes_the_status_by_server_side_apply(synced, kube):
    for ns in ("frag", "whole"):  # sick has no namespace on this hub: not managed
        kube.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    env = {**synced, "KUBECONFIG": str(kube.kubeconfig_path("hub"))}
    result = gpufleet("placement", "apply", "-o", "json", env=env)
    assert result.exit_code == 0, result.output
    actions = {r["namespace"]: r["action"] for r in json.loads(result.stdout)}
    assert actions["frag"] == actions["whole"] == "created"
    assert actions["sick"].startswith("skipped")
    obj = kube.get_object("cluster.open-cluster-management.io/v1alpha1",
                          "addonplacementscores", "gpufleet", "whole")
    assert obj is not None
    assert {s["name"]: s["value"] for s in obj["status"]["scores"]}["gpuFreeNode"] == 100
    assert obj["status"]["validUntil"].endswith("Z")
    applies = [r for r in kube.requests if r.method == "PATCH"]
    assert any(r.path.endswith("/addonplacementscores/gpufleet/status") for r in applies)
    assert all(r.query.get("fieldManager") == "gpufleet" for r in applies)
    # another manager's status field is its own: a conflict is one line, exit 1
    kube.status_owners[("cluster.open-cluster-management.io", "v1alpha1",
                        "addonplacementscores", "frag", "gpufleet")]["acm"] = {
        ("status", "scores")}
    kube.objects[("cluster.open-cluster-management.io", "v1alpha1", "addonplacementscores",
                  "frag", "gpufleet")]["status"]["scores"] = []
    again = gpufleet("placement", "apply", env=env)
    assert again.exit_code == 1 and "status.scores" in again.output


def test_serve_writes_the_scores_after_each_sync_valid_for_three_intervals(synced, kube):
    from hub.inventory import make_engine
    from hub.service import ServeSettings, service_jobs
    from hub.store import HubClient

    kube.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "whole"}})
    settings = ServeSettings(db=synced["GPUFLEET_DB"], every=600.0, placement_scores=True,
                             placement_kubeconfig=str(kube.kubeconfig_path("hub")))
    engine = make_engine(synced["GPUFLEET_DB"])
    try:
        jobs = service_jobs(engine, HubClient(synced["GPUFLEET_HUB_URL"]), settings)
        assert jobs.after_sync[-1].__name__ == "placement_job"  # after usage: fresh idle
        jobs.after_sync[-1]()
    finally:
        engine.dispose()
    obj = kube.get_object("cluster.open-cluster-management.io/v1alpha1",
                          "addonplacementscores", "gpufleet", "whole")
    assert obj is not None and obj["status"]["scores"][0] == {"name": "gpuFree",
                                                               "value": -75}
    until = obj["status"]["validUntil"]
    left = dt.datetime.fromisoformat(until.replace("Z", "+00:00")) - dt.datetime.now(dt.UTC)
    assert dt.timedelta(minutes=25) < left <= dt.timedelta(minutes=30)
