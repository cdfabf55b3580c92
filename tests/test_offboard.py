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
