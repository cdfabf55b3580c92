"""Onboarding adds, never takes: the pinned dcgm-exporter collectors CSV keeps every field of
dcgm-exporter's default set, a user's own collectors ConfigMap is kept (--dcgm-config-name),
and offboarding with `kubectl delete -k` (every object a kustomization lists; patches are not
listed) deletes only gpufleet's own objects, in every vendor, exporter, mode and monitoring
combination."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from hub import onboard as render
from hub.store import DCGM_DEFAULT_COUNTERS, dcgm_collectors, dcgm_names
from tests.support.clirun import gpufleet
from tests.support.kubeapi import kube_api as kube_api

URL = "https://receive.hub.example.com/api/v1/receive"
COMBINATIONS = [
    (vendor, exporter, mode, monitoring)
    for vendor in ("nvidia", "amd", "nvidia,amd")
    for exporter in ("upstream", "builtin")
    for mode in ("remote-write", "acm")
    for monitoring in ("platform", "user-workload")
    if mode == "acm" or monitoring == "platform"
]


def _render(vendor: str, exporter: str, mode: str, monitoring: str = "platform",
            **more: Any) -> dict[str, str]:
    options: dict[str, Any] = {"cluster": "east", "vendor": vendor, "exporter": exporter,
                               "mode": mode, "monitoring": monitoring, **more}
    if mode == "remote-write":
        options["remote_write_url"] = URL
    return render.render_spoke(render.spoke_values(**options))


def delete_k(files: dict[str, str]) -> list[dict[str, Any]]:
    """What `kubectl delete -k DIR` deletes, per kustomization of the render: every object
    of every file its ``resources`` list."""
    out = []
    for path, text in files.items():
        if not path.endswith("kustomization.yaml"):
            continue
        where = path.rpartition("/")[0]
        for resource in yaml.safe_load(text)["resources"]:
            out += [o for o in yaml.safe_load_all(files[f"{where}/{resource}" if where
                                                        else resource]) if o]
    return out


@pytest.mark.parametrize(("vendor", "exporter", "mode", "monitoring"), COMBINATIONS)
def test_offboarding_with_delete_k_deletes_only_gpufleets_objects(vendor, exporter, mode,
                                                                   monitoring):
    files = _render(vendor, exporter, mode, monitoring)
    deleted = delete_k(files)
    assert deleted
    for obj in deleted:
        what = f"{obj['kind']} {obj['metadata']['name']}"
        assert obj["metadata"].get("labels", {}).get("app.kubernetes.io/managed-by") == \
            "gpufleet", f"{what} is not gpufleet's"
        assert obj["kind"] != "ClusterPolicy", what
        if obj["kind"] == "Namespace":  # only gpufleet's own namespace is ever deleted
            assert obj["metadata"]["name"] == "gpufleet", what
    for name in ("nvidia-gpu-operator", "kube-amd-gpu", "gpu-cluster-policy"):
        assert name not in {o["metadata"]["name"] for o in deleted
                            if o["kind"] in ("Namespace", "ClusterPolicy")}


def test_the_gpu_operators_objects_are_patches_of_the_fields_gpufleet_sets():
    files = _render("nvidia", "upstream", "acm")
    namespace = yaml.safe_load(files["spoke/patches/namespace.yaml"])
    assert namespace["metadata"] == {"name": "nvidia-gpu-operator", "labels": {
        "openshift.io/cluster-monitoring": "true"}}  # the label alone: no managed-by gpufleet
    assert "kubectl patch namespace nvidia-gpu-operator --type merge" in \
        files["spoke/patches/namespace.yaml"]
    policy = yaml.safe_load(files["spoke/patches/clusterpolicy-dcgm-exporter.yaml"])
    assert policy["spec"] == {"dcgmExporter": {"config": {"name": render.DCGM_CONFIGMAP}}}
    assert "--dcgm-config-name" in files["spoke/patches/clusterpolicy-dcgm-exporter.yaml"]
    # user-workload monitoring needs no label on the operator's namespace: nothing patched
    assert not [p for p in _render("nvidia", "upstream", "acm", "user-workload")
                if "namespace" in p]


@pytest.mark.parametrize("naming", ["legacy", "dcgm-4.7"])
def test_the_pinned_csv_is_the_exporters_default_set_plus_what_gpufleet_reads(naming):
    spelled = dcgm_names(naming)
    driver = "DCGM_FI_SYSTEM_DRIVER_VERSION" if naming == "dcgm-4.7" else \
        "DCGM_FI_DRIVER_VERSION"
    defaults = {driver if n == "DCGM_FI_DRIVER_VERSION" else spelled.get(n, n)
                for n, _, _ in DCGM_DEFAULT_COUNTERS}
    assert len(DCGM_DEFAULT_COUNTERS) == 25  # default-counters.csv's uncommented rows
    files = _render("nvidia", "upstream", "remote-write", dcgm_names=naming)
    csv = yaml.safe_load(files["dcgm-metrics-configmap.yaml"])["data"]["dcgm-metrics.csv"]
    pinned = [line.split(",")[0].strip() for line in csv.splitlines()
              if line.strip() and not line.startswith("#")]
    assert defaults <= set(pinned)  # never fewer fields than the exporter had
    assert len(pinned) == len(set(pinned))
    read = {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_PROF_SM_UTIL_RATIO"
            if naming == "dcgm-4.7" else "DCGM_FI_PROF_SM_ACTIVE"}
    assert read <= set(pinned)  # and what gpufleet reads beyond them
    assert [r[0] for r in dcgm_collectors(naming)] == pinned


def test_a_custom_collectors_configmap_is_kept_not_overwritten(tmp_path):
    out = tmp_path / "spoke"
    result = gpufleet("spoke", "render", "--cluster", "c1", "--vendor", "nvidia",
                      "--remote-write-url", URL, "--dcgm-config-name", "team-dcgm-metrics",
                      "--out", str(out))
    assert result.exit_code == 0, result.output
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert not [p for p in written if "clusterpolicy" in p or "dcgm-metrics-configmap" in p]
    fields = (out / "dcgm-fields.csv").read_text()
    assert "ConfigMap team-dcgm-metrics" in fields and "DCGM_FI_DEV_GPU_UTIL, gauge" in fields
    assert "dcgm-fields.csv" not in (out / "kustomization.yaml").read_text()
    bad = gpufleet("spoke", "render", "--cluster", "c1", "--vendor", "amd",
                   "--remote-write-url", URL, "--dcgm-config-name", "x", "--out",
                   str(tmp_path / "bad"))
    assert bad.exit_code == 2 and "--dcgm-config-name is for an upstream NVIDIA" in bad.output
    assert len(bad.output.strip().splitlines()) == 1


# -- with the cluster readable (--cluster-context): an existing config is refused or merged ---
THEIR_CSV = ("# Format\n# DCGM FI Field ID, Prometheus metric type, help message\n"
             "DCGM_FI_DEV_GPU_TEMP, gauge, Their GPU temperature.\n"
             "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, counter, Their NVLink bandwidth.\n")


def cluster_policy(config_name: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"dcgmExporter": {"enabled": True}}
    if config_name is not None:
        spec["dcgmExporter"]["config"] = {"name": config_name}
    return {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "gpu-cluster-policy"}, "spec": spec}


def render_reading(api: Any, out: Any, *extra: str):
    return gpufleet("spoke", "render", "--cluster", "c1", "--vendor", "nvidia",
                    "--remote-write-url", URL, "--kubeconfig", str(api.kubeconfig_path("c1")),
                    "--cluster-context", "c1", *extra, "--out", str(out))


def pinned_rows(out: Any) -> list[str]:
    csv = yaml.safe_load((out / "dcgm-metrics-configmap.yaml").read_text())["data"][
        "dcgm-metrics.csv"]
    return [line for line in csv.splitlines() if line.strip() and not line.startswith("#")]


def test_an_existing_custom_config_is_refused_in_one_line_and_nothing_is_written(kube_api,
                                                                                tmp_path):
    kube_api.put_object(cluster_policy("team-dcgm"), plural="clusterpolicies", namespaced=False)
    result = render_reading(kube_api, tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and result.output.startswith("error: ")
    assert "already names collectors ConfigMap 'team-dcgm'" in result.output
    assert "--dcgm-config-name team-dcgm" in result.output
    assert "--merge-dcgm-config" in result.output
    assert not (tmp_path / "out").exists()
    assert ("GET", "/apis/nvidia.com/v1/clusterpolicies/gpu-cluster-policy") in [
        (r.method, r.path) for r in kube_api.requests]
    # keeping theirs, as the line says: nothing of theirs is declared or patched
    kept = gpufleet("spoke", "render", "--cluster", "c1", "--vendor", "nvidia",
                    "--remote-write-url", URL, "--dcgm-config-name", "team-dcgm",
                    "--out", str(tmp_path / "kept"))
    assert kept.exit_code == 0, kept.output
    assert not (tmp_path / "kept/patches").exists()


def test_merge_pins_their_rows_and_gpufleets_under_gpufleets_name(kube_api, tmp_path):
    kube_api.put_object(cluster_policy("team-dcgm"), plural="clusterpolicies", namespaced=False)
    kube_api.put_object({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": "team-dcgm", "namespace": "nvidia-gpu-operator"},
                         "data": {"dcgm-metrics.csv": THEIR_CSV}})
    out = tmp_path / "out"
    result = render_reading(kube_api, out, "--merge-dcgm-config")
    assert result.exit_code == 0, result.output
    assert "merged ConfigMap team-dcgm's 2 fields" in result.stderr
    rows = pinned_rows(out)
    assert rows[:2] == ["DCGM_FI_DEV_GPU_TEMP, gauge, Their GPU temperature.",
                        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, counter, Their NVLink bandwidth."]
    fields = [row.split(",")[0] for row in rows]
    assert set(fields) == {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"} | {
        r[0] for r in dcgm_collectors("legacy")}  # the union: theirs and ours, once each
    assert len(fields) == len(set(fields))
    policy = yaml.safe_load((out / "patches/clusterpolicy-dcgm-exporter.yaml").read_text())
    assert policy["spec"]["dcgmExporter"]["config"]["name"] == render.DCGM_CONFIGMAP
    # their ConfigMap is read, never written
    assert not [r for r in kube_api.requests if r.method != "GET"]


@pytest.mark.parametrize("config_name", [None, render.DCGM_CONFIGMAP])
def test_a_policy_with_no_other_config_is_pinned_as_before(kube_api, tmp_path, config_name):
    kube_api.put_object(cluster_policy(config_name), plural="clusterpolicies", namespaced=False)
    out = tmp_path / "out"
    result = render_reading(kube_api, out)
    assert result.exit_code == 0, result.output
    assert f"pinning {render.DCGM_CONFIGMAP}" in result.stderr
    assert [r.split(",")[0] for r in pinned_rows(out)] == [r[0] for r in
                                                           dcgm_collectors("legacy")]


@pytest.mark.parametrize(("configmap", "message"), [
    (None, "ConfigMap nvidia-gpu-operator/team-dcgm, which ClusterPolicy gpu-cluster-policy "
           "names, is not there"),
    ({"other.csv": "x"}, "has no dcgm-metrics.csv key"),
    ({"dcgm-metrics.csv": "DCGM_FI_DEV_GPU_TEMP\n"}, "line 1 is not 'FIELD, TYPE, HELP'"),
])
def test_merge_refuses_a_config_it_cannot_read_in_one_line(kube_api, tmp_path, configmap,
                                                           message):
    kube_api.put_object(cluster_policy("team-dcgm"), plural="clusterpolicies", namespaced=False)
    if configmap is not None:
        kube_api.put_object({"apiVersion": "v1", "kind": "ConfigMap", "data": configmap,
                             "metadata": {"name": "team-dcgm",
                                          "namespace": "nvidia-gpu-operator"}})
    result = render_reading(kube_api, tmp_path / "out", "--merge-dcgm-config")
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and message in result.output
    assert not (tmp_path / "out").exists()


def test_merge_needs_the_cluster_and_excludes_keeping_theirs(tmp_path):
    base = ("spoke", "render", "--cluster", "c1", "--vendor", "nvidia", "--remote-write-url",
            URL, "--out", str(tmp_path / "out"))
    alone = gpufleet(*base, "--merge-dcgm-config")
    assert alone.exit_code == 2 and "give --cluster-context CTX" in alone.output
    both = gpufleet(*base, "--merge-dcgm-config", "--cluster-context", "c1",
                    "--dcgm-config-name", "team-dcgm")
    assert both.exit_code == 2 and "choose one" in both.output
    assert not (tmp_path / "out").exists()


def test_a_cluster_without_the_gpu_operator_is_rendered_as_before_and_said(kube_api, tmp_path):
    result = render_reading(kube_api, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "no ClusterPolicy gpu-cluster-policy" in result.stderr
    assert (tmp_path / "out/patches/clusterpolicy-dcgm-exporter.yaml").is_file()
