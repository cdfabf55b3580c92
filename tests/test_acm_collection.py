"""ACM's two collection paths: `spoke render --mode acm --acm-collection legacy|mcoa|auto`.

The multicluster-observability-addon (MCOA) reads no allowlist: it federates each spoke's
Prometheus with the match[] selectors of ScrapeConfig objects and runs PrometheusRules in the
spoke's Prometheus. These tests check what is rendered for it (one list of names feeding both
paths, schemas of the CRD fields used, promtool on the rules), what `auto` reads from a hub's
MultiClusterObservability through the official client, and the one-line errors. That the hub
gets the same answers through a real federating agent is tests/test_acm_mcoa_e2e.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from hub import onboard as render
from hub import store
from hub.devstack import free_port
from tests.support.clirun import gpufleet
from tests.support.kubeapi import KubeAPI
from tests.support.kubeapi import kube_api as kube_api
from tests.support.manifests import objects, promtool_check

CRDS = Path(__file__).parent / "fixtures" / "crds"
MCO_GROUP = "observability.open-cluster-management.io/v1beta2"


def schema(name: str) -> dict[str, Any]:
    return yaml.safe_load((CRDS / f"{name}.schema.yaml").read_text())


def mcoa_files(**options: Any) -> dict[str, str]:
    values = render.spoke_values(cluster="east", vendor=options.pop("vendor", "nvidia"),
                                 mode="acm", acm_collection="mcoa", **options)
    return render.render_spoke(values)


def hub_objects(files: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {path.removeprefix("hub/"): obj for path, obj in objects(files).items()
            if path.startswith("hub/")}


def selectors(scrape_config: dict[str, Any]) -> list[str]:
    return scrape_config["spec"]["params"]["match[]"]


# -- what mcoa renders ----------------------------------------------------------------------------
def test_mcoa_writes_scrape_configs_and_a_rule_and_no_allowlist():
    hub = hub_objects(mcoa_files())
    assert sorted(hub) == ["prometheusrule.yaml", "scrapeconfig-gpu.yaml",
                           "scrapeconfig-kube.yaml"]
    assert "ConfigMap" not in {o["kind"] for o in hub.values()}
    for obj in hub.values():
        meta = obj["metadata"]
        assert meta["namespace"] == "open-cluster-management-observability"
        assert meta["labels"]["app.kubernetes.io/part-of"] == "multicluster-observability-addon"
        assert meta["labels"]["app.kubernetes.io/component"] == "platform-metrics-collector"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "gpufleet"
        assert "annotations" not in meta or \
            "observability.open-cluster-management.io/placements" not in meta["annotations"]
    for name in ("scrapeconfig-gpu.yaml", "scrapeconfig-kube.yaml"):
        spec = hub[name]["spec"]
        assert spec["metricsPath"] == "/federate" and spec["honorLabels"] is True
        # MCOA's controller fills these per spoke for a platform job
        assert not {"scrapeClass", "scheme", "staticConfigs"} & set(spec)
    rule = hub["prometheusrule.yaml"]
    assert rule["metadata"]["annotations"] == {
        "observability.open-cluster-management.io/target-namespace": "openshift-monitoring"}


def test_the_selectors_carry_every_name_the_legacy_allowlist_names():
    """One source of names: whatever the allowlist forwards, a ScrapeConfig federates."""
    hub = hub_objects(mcoa_files())
    federated = selectors(hub["scrapeconfig-gpu.yaml"]) + selectors(hub["scrapeconfig-kube.yaml"])
    names = set()
    for selector in federated:
        match = re.fullmatch(r'\{__name__="([^"]+)"(?:,.*)?\}', selector)
        assert match, selector
        names.add(match.group(1))
    assert set(store.allowlist_metrics()) <= names
    # both dcgm namings, both AMD spellings, gpufleet's exporter and its allocation edges
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "gpu_edge_temperature",
                 "amd_gpu_edge_temperature", "gpufleet_exporter_up",
                 "gpufleet_allocation_start_timestamp_seconds"):
        assert name in names
    # what MCOA's default set lacks and reconcile --source hub and the ledger need
    for name in ("kube_node_status_capacity", "kube_node_status_allocatable",
                 "kube_node_labels", "kube_node_info", "kube_pod_container_resource_requests",
                 "gpufleet:kube_pod_start_time:gpu_pods",
                 "gpufleet:kube_pod_completion_time:gpu_pods",
                 "gpufleet:kube_pod_status_phase:gpu_pods"):
        assert name in names
    # the GPU pods' requests only, never every pod's CPU and memory
    [requests] = [s for s in federated if "kube_pod_container_resource_requests" in s]
    assert 'resource=~"nvidia_com_gpu|' in requests


def test_the_recorded_pod_series_get_their_kube_state_metrics_names_back():
    hub = hub_objects(mcoa_files())
    rules = hub["prometheusrule.yaml"]["spec"]["groups"][0]["rules"]
    legacy = {r["record"]: r["expr"] for r in store.allocation_recording_rules()}
    assert {r["record"] for r in rules} == {store.mcoa_record(name) for name in legacy}
    assert all(r["expr"] == legacy[r["record"].split(":")[1]] for r in rules)
    [rename] = hub["scrapeconfig-kube.yaml"]["spec"]["metricRelabelings"]
    assert rename["action"] == "replace" and rename["targetLabel"] == "__name__"
    pattern = re.compile(rename["regex"])  # Prometheus anchors relabel regexes
    for record in (r["record"] for r in rules):
        match = pattern.fullmatch(record)
        assert match and rename["replacement"].replace("$1", match.group(1)) in legacy
    assert not pattern.fullmatch("kube_pod_start_time")


def test_the_objects_validate_against_the_crd_fields_and_the_rules_pass_promtool(tmp_path):
    for files in (mcoa_files(), mcoa_files(vendor="nvidia,amd", monitoring="user-workload",
                                           placement="gpus")):
        hub = hub_objects(files)
        for obj in hub.values():
            kind = "scrapeconfig" if obj["kind"] == "ScrapeConfig" else "prometheusrule"
            jsonschema.validate(obj, schema(kind))
        promtool_check(yaml.safe_dump({"groups": hub["prometheusrule.yaml"]["spec"]["groups"]}),
                       tmp_path, kind="rules")


def test_the_schema_check_would_catch_a_misspelt_field():
    obj = hub_objects(mcoa_files())["scrapeconfig-gpu.yaml"]
    obj["spec"]["metricPath"] = obj["spec"].pop("metricsPath")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, schema("scrapeconfig"))


def test_user_workload_federates_the_exporter_from_its_stack_and_kube_state_metrics_from_platform():
    hub = hub_objects(mcoa_files(monitoring="user-workload"))
    component = "app.kubernetes.io/component"
    assert hub["scrapeconfig-gpu.yaml"]["metadata"]["labels"][component] == \
        "user-workload-metrics-collector"
    assert hub["scrapeconfig-kube.yaml"]["metadata"]["labels"][component] == \
        "platform-metrics-collector"


def test_placement_becomes_mcoas_annotation():
    hub = hub_objects(mcoa_files(placement="gpu-fleet,team-a/ai"))
    for obj in hub.values():
        assert obj["metadata"]["annotations"][
            "observability.open-cluster-management.io/placements"] == \
            "open-cluster-management-global-set/gpu-fleet,team-a/ai"


def test_both_paths_share_the_spoke_side_and_differ_only_on_the_hub():
    legacy = render.render_spoke(render.spoke_values(cluster="east", vendor="nvidia", mode="acm"))
    mcoa = mcoa_files()
    spoke = {p: t for p, t in legacy.items() if p.startswith("spoke/")}
    assert spoke == {p: t for p, t in mcoa.items() if p.startswith("spoke/")}
    assert "hub/metrics-allowlist.yaml" in legacy and "hub/metrics-allowlist.yaml" not in mcoa


# -- the CLI -----------------------------------------------------------------------------------
BASE = ["spoke", "render", "--cluster", "east", "--vendor", "nvidia", "--mode", "acm"]


def test_cli_renders_mcoa_and_says_what_to_apply(tmp_path):
    result = gpufleet(*BASE, "--acm-collection", "mcoa", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out/hub/scrapeconfig-gpu.yaml").is_file()
    kustomization = yaml.safe_load((tmp_path / "out/hub/kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == ["prometheusrule.yaml",
                                                  "scrapeconfig-gpu.yaml",
                                                  "scrapeconfig-kube.yaml"]


def test_policy_render_writes_the_collection_objects_for_the_hub(tmp_path):
    result = gpufleet("policy", "render", "--vendor", "nvidia", "--mode", "acm",
                      "--acm-collection", "mcoa", "--out", str(tmp_path / "p"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p/hub/scrapeconfig-kube.yaml").is_file()
    assert "oc apply -k" in result.output and "(mcoa)" in result.output
    legacy = gpufleet("policy", "render", "--vendor", "nvidia", "--mode", "acm",
                      "--out", str(tmp_path / "q"))
    assert legacy.exit_code == 0, legacy.output
    assert (tmp_path / "q/hub/metrics-allowlist.yaml").is_file()


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--acm-collection", "thanos"], 2, "--acm-collection 'thanos' is not one of legacy, "
                                        "mcoa, auto"),
    (["--acm-collection", "mcoa", "--placement", "GPU_Fleet"], 2, "placement name"),
    (["--acm-collection", "mcoa", "--placement", "ns/"], 2, "placement name"),
    (["--acm-collection", "mcoa", "--placement", "Bad NS/x"], 2, "placement namespace"),
    (["--placement", "gpus"], 2, "--placement is for --acm-collection mcoa"),
    (["--remote-write-url", "https://receive.example.com/api/v1/receive"], 2,
     "--remote-write-url is for remote-write mode"),
])
def test_bad_collection_input_is_one_line_and_writes_nothing(tmp_path, args, code, message):
    result = gpufleet(*BASE, *args, "--out", str(tmp_path / "out"))
    assert result.exit_code == code, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1
    assert message in result.output
    assert list(tmp_path.iterdir()) == []


def test_mcoa_is_for_acm_mode_only(tmp_path):
    result = gpufleet("spoke", "render", "--cluster", "east", "--vendor", "nvidia",
                      "--remote-write-url", "https://receive.example.com/api/v1/receive",
                      "--acm-collection", "mcoa", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and "--acm-collection is for --mode acm" in result.output
    assert list(tmp_path.iterdir()) == []


# -- auto: the hub's MultiClusterObservability ---------------------------------------------------
def mco(capabilities: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"observabilityAddonSpec": {"interval": 300}}
    if capabilities is not None:
        spec["capabilities"] = capabilities
    return {"apiVersion": MCO_GROUP, "kind": "MultiClusterObservability",
            "metadata": {"name": "observability"}, "spec": spec}


def auto(api: KubeAPI, tmp_path: Path, *extra: str):
    return gpufleet(*BASE, "--acm-collection", "auto", "--kubeconfig",
                    str(api.kubeconfig_path("hub")), "--context", "hub", *extra,
                    "--out", str(tmp_path / "out"))


@pytest.mark.parametrize(("capabilities", "path"), [
    ({"platform": {"metrics": {"default": {"enabled": True}}}}, "mcoa"),
    ({"platform": {"metrics": {"collection": {"enabled": True}}}}, "mcoa"),  # other builds
    ({"platform": {"metrics": {"default": {"enabled": False}}}}, "legacy"),
    ({"userWorkloads": {"metrics": {"default": {"enabled": True}}}}, "legacy"),  # not platform
    (None, "legacy"),
])
def test_auto_picks_the_path_the_hub_has_enabled(kube_api, tmp_path, capabilities, path):
    kube_api.put_object(mco(capabilities), plural="multiclusterobservabilities",
                        namespaced=False)
    result = auto(kube_api, tmp_path)
    assert result.exit_code == 0, result.output
    assert f"acm collection: {path} (MultiClusterObservability observability" in result.stderr
    hub = sorted(p.name for p in (tmp_path / "out/hub").iterdir())
    expected = ["metrics-allowlist.yaml"] if path == "legacy" else [
        "prometheusrule.yaml", "scrapeconfig-gpu.yaml", "scrapeconfig-kube.yaml"]
    assert hub == ["kustomization.yaml", *expected]
    assert ("GET", "/apis/observability.open-cluster-management.io/v1beta2/"
                   "multiclusterobservabilities") in [(r.method, r.path)
                                                      for r in kube_api.requests]


def test_auto_reads_the_user_workload_capability_for_user_workload_monitoring(kube_api, tmp_path):
    kube_api.put_object(mco({"userWorkloads": {"metrics": {"default": {"enabled": True}}}}),
                        plural="multiclusterobservabilities", namespaced=False)
    result = auto(kube_api, tmp_path, "--monitoring", "user-workload")
    assert result.exit_code == 0, result.output
    assert "acm collection: mcoa" in result.stderr


def test_auto_without_the_crd_is_one_line_exit_3_and_writes_nothing(kube_api, tmp_path):
    result = auto(kube_api, tmp_path)
    assert result.exit_code == 3, result.output
    assert result.output.count("\n") == 1 and "serves no MultiClusterObservability" in \
        result.output
    assert not (tmp_path / "out").exists()


def test_auto_without_a_reachable_hub_api_is_exit_3_and_writes_nothing(tmp_path):
    port = free_port()  # nothing listens there: a closed loopback port
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "hub",
        "clusters": [{"name": "hub", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "hub", "user": {"token": "t"}}],
        "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "hub"}}]}))
    result = gpufleet(*BASE, "--acm-collection", "auto", "--kubeconfig", str(kubeconfig),
                      "--out", str(tmp_path / "out"))
    assert result.exit_code == 3, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1
    assert "unreachable" in result.output
    assert not (tmp_path / "out").exists()


# -- what a cluster's GPUs are seen through ----------------------------------------------------
@pytest.mark.parametrize(("vendors", "naming", "sources", "seen"), [
    ({"nvidia"}, "legacy", {}, "dcgm legacy"),
    ({"nvidia"}, "dcgm-4.7", {}, "dcgm 4.7"),
    ({"nvidia"}, "both", {}, "both"),
    ({"amd"}, None, {}, "amd"),
    ({"nvidia", "amd"}, "legacy", {"card-info": 16}, "dcgm legacy + amd"),
    ({"nvidia"}, "legacy", {"gpufleet-exporter": 2}, "gpufleet exporter"),
    (set(), None, {"card-info": 8}, "card info only"),
    (set(), None, {"accelerator": 4}, "card info only"),
    (set(), None, {"gpufleet-exporter": 1, "acm-managed": 1}, "none"),
    (set(), "legacy", {}, "none"),  # a cluster that stopped reporting
])
def test_seen_through(vendors, naming, sources, seen):
    assert store.seen_through(vendors, naming, sources) == seen


def test_known_cards_and_acm_view():
    assert store.known_cards({"card-info": 8, "accelerator": 6}) == 8
    assert store.known_cards({"acm-managed": 1}) is None
    assert store.acm_view({"acm-managed": 1}) == "managed"
    assert store.acm_view({"acm-maintenance": 1, "acm-managed": 1}) == "maintenance"
    assert store.acm_view({}) is None
