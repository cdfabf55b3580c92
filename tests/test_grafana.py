"""`gpufleet hub render --grafana`: a dashboard ConfigMap ACM Observability's Grafana picks up,
whose every panel expression is run against a real hub Prometheus and answers what the
inventory would (GPUs counted once per physical GPU, failed and degraded by its rules)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests
import yaml

from hub.onboard import OBSERVABILITY_NAMESPACE, dashboard_panels
from tests.support.backfill import backfilled_hub, openmetrics
from tests.support.clirun import gpufleet
from tests.support.manifests import assert_core_objects_valid, objects
from tests.support.samples import dcgm47

HUB = "https://rbac-query-proxy-open-cluster-management-observability.apps.hub.example.com"
H100 = 'modelName="NVIDIA H100 80GB HBM3"'
A100 = 'modelName="NVIDIA A100-SXM4-80GB"'
MI300X = 'card_series="AMD Instinct MI300X OAM",card_model="102-G30211-00"'


def _fleet(t_end: float) -> str:
    """east: three H100 (one failed by XID 79, one degraded by XID 13) and an A100 in MIG
    mode reporting through two slices; amdc: two MI300X (one unhealthy, one under the amd_
    prefix); gone: two A100 whose last samples are two hours old."""
    series = []

    def const(v: float, until: float = t_end):
        return lambda t: v if t <= until else None

    for gpu, (uuid, util, engine, xid) in enumerate(
            [("GPU-1", 50, 0.6, 0), ("GPU-2", 0, 0.0, 79), ("GPU-3", 100, 0.9, 13)]):
        labels = f'cluster="east",Hostname="n1",gpu="{gpu}",UUID="{uuid}",{H100}'
        for name, v in (("DCGM_FI_DEV_GPU_TEMP", 40), ("DCGM_FI_DEV_GPU_UTIL", util),
                        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", engine),
                        ("DCGM_FI_DEV_XID_ERRORS", xid)):
            series.append((name, labels, const(v)))
    for profile, gid in (("3g.40gb", 1), ("4g.40gb", 2)):
        labels = (f'cluster="east",hostname="n2",gpu="0",UUID="GPU-M",{A100},'
                  f'GPU_I_PROFILE="{profile}",GPU_I_ID="{gid}"')
        series += [("DCGM_FI_DEV_GPU_TEMP", labels, const(35)),
                   ("DCGM_FI_DEV_XID_ERRORS", labels, const(0))]
    for prefix, gid, health, act in (("", 0, 1, 80), ("amd_", 1, 0, 0)):
        labels = f'cluster="amdc",hostname="n3",gpu_id="{gid}",gpu_uuid="amd-{gid}",{MI300X}'
        for name, v in (("gpu_edge_temperature", 50), ("gpu_gfx_activity", act),
                        ("gpu_health", health)):
            series.append((prefix + name, labels, const(v)))
    for gpu in range(2):
        labels = f'cluster="gone",Hostname="old",gpu="{gpu}",UUID="GPU-G{gpu}",{A100}'
        series.append(("DCGM_FI_DEV_GPU_TEMP", labels, const(30, until=t_end - 7200)))
    return openmetrics(series, [t_end - 3 * 3600 + 30 * k for k in range(361)])


def _query(url: str, expr: str, at: float) -> list[dict]:
    r = requests.get(f"{url}/api/v1/query", params={"query": expr, "time": at}, timeout=30)
    assert r.status_code == 200, (expr, r.text)
    body = r.json()
    assert body["status"] == "success" and not body.get("warnings"), body
    return body["data"]["result"]


def _rendered(tmp_path: Path) -> dict[str, str]:
    out = tmp_path / "hub"
    result = gpufleet("hub", "render", "--out", str(out), "--hub-url", HUB,
                      "--tokens-secret", "api-tokens", "--grafana")
    assert result.exit_code == 0, result.output
    return {p.name: p.read_text() for p in out.glob("*.yaml")}


def test_the_dashboard_is_a_configmap_acm_grafana_loads(tmp_path):
    files = _rendered(tmp_path)
    assert "grafana-dashboard.yaml" in yaml.safe_load(files["kustomization.yaml"])["resources"]
    assert_core_objects_valid({"grafana-dashboard.yaml": files["grafana-dashboard.yaml"]})
    [cm] = objects({"grafana-dashboard.yaml": files["grafana-dashboard.yaml"]}).values()
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"]["namespace"] == OBSERVABILITY_NAMESPACE
    assert cm["metadata"]["labels"]["grafana-custom-dashboard"] == "true"
    assert cm["metadata"]["annotations"] == {
        "observability.open-cluster-management.io/dashboard-folder": "GPU fleet"}
    [(key, text)] = cm["data"].items()
    assert key == "gpufleet-gpus.json"
    board = json.loads(text)
    assert board["uid"] == "gpufleet-gpus" and board["templating"]["list"][0]["current"][
        "value"] == "Observatorium"
    titles = [p["title"] for p in board["panels"]]
    assert titles == ["GPUs by cluster and model", "Utilisation by cluster",
                      "SM activity by cluster", "Stale clusters", "Failed GPUs by cluster",
                      "Degraded GPUs by cluster"]
    assert [t["expr"] for p in board["panels"] for t in p["targets"]] == [
        p.expr for p in dashboard_panels()]
    # without --grafana, no dashboard
    plain = gpufleet("hub", "render", "--out", str(tmp_path / "plain"), "--hub-url", HUB,
                     "--tokens-secret", "api-tokens")
    assert plain.exit_code == 0 and not (tmp_path / "plain" / "grafana-dashboard.yaml").exists()


def _named(text: str, naming: str) -> str:
    """The fleet's NVIDIA series in one dcgm naming, or in both at once (two exporters)."""
    if naming == "legacy":
        return text
    if naming == "dcgm-4.7":
        return dcgm47(text)
    return text.replace("# EOF\n", "") + dcgm47(text, only_renamed=True) + "# EOF\n"


@pytest.mark.parametrize("naming", ["legacy", "dcgm-4.7", "both"])
def test_every_panel_answers_on_a_real_hub_what_the_inventory_would(tmp_path, naming):
    """The same answers whichever dcgm naming the GPUs send (4.9's in its units), and a GPU
    sending both counts once."""
    board = json.loads(next(iter(objects(
        {"g.yaml": _rendered(tmp_path)["grafana-dashboard.yaml"]}).values()))["data"][
        "gpufleet-gpus.json"])
    t_end = (time.time() // 60) * 60 - 3600
    hub = backfilled_hub(tmp_path / "prom", _named(_fleet(t_end), naming)).start(timeout=120)
    try:
        answers = {}
        for panel in board["panels"]:
            [target] = panel["targets"]
            result = _query(hub.url, target["expr"], t_end)
            assert result, f"panel {panel['title']!r} returned no data"
            answers[panel["title"]] = {
                tuple(v for k, v in sorted(r["metric"].items())): float(r["value"][1])
                for r in result}
    finally:
        hub.stop()
    assert answers["GPUs by cluster and model"] == {
        ("amdc", "AMD Instinct MI300X OAM"): 2, ("east", "NVIDIA A100-SXM4-80GB"): 1,
        ("east", "NVIDIA H100 80GB HBM3"): 3}
    assert answers["Utilisation by cluster"] == {("amdc",): 40.0, ("east",): 50.0}
    assert answers["SM activity by cluster"] == {("east",): 50.0}
    assert answers["Stale clusters"] == {("gone",): 2}
    assert answers["Failed GPUs by cluster"] == {("amdc",): 1, ("east",): 1}
    assert answers["Degraded GPUs by cluster"] == {("east",): 1}
