"""`gpufleet spoke render`: manifests that validate, pass promtool, are safe and reproducible."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner, Result

from hub import __version__
from hub import onboard as render
from hub.cli import cli
from hub.common import InputError
from hub.store import KUBE_STATE_METRICS, allowlist_metrics
from tests.support.manifests import (
    HOSTILE,
    all_keys,
    assert_core_objects_valid,
    by_kind,
    objects,
    one,
    promtool_check,
)

URL = "https://receive.hub.example.com/api/v1/receive"
MATRIX = [
    (vendor, exporter, mode)
    for vendor in ("nvidia", "amd", "nvidia,amd")
    for exporter in ("upstream", "builtin")
    for mode in ("remote-write", "acm")
]


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env or {}, catch_exceptions=False)


def spoke(tmp_path: Path, *args: str, out: str = "out") -> Result:
    return run("spoke", "render", "--out", str(tmp_path / out), *args)


def values(**overrides: Any) -> render.SpokeValues:
    options: dict[str, Any] = {"cluster": "east", "vendor": "nvidia", "remote_write_url": URL}
    options.update(overrides)
    if options.get("mode") == "acm":  # ACM's collector pushes: no URL to give
        options.pop("remote_write_url")
    return render.spoke_values(**options)



def url_for(mode: str) -> list[str]:
    """--remote-write-url where the mode takes one (acm mode refuses it: ACM pushes)."""
    return ["--remote-write-url", URL] if mode == "remote-write" else []


def quantity(text: str) -> float:
    units = {"m": 1e-3, "": 1.0, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text)).groups()  # type: ignore[union-attr]
    return float(number) * units[unit]


def subset(small: dict[str, str], big: dict[str, str]) -> bool:
    return all(big.get(k) == v for k, v in small.items())


# -- schemas and promtool ------------------------------------------------------------------------


@pytest.mark.parametrize(("vendor", "exporter", "mode"), MATRIX)
def test_every_core_object_validates_against_kubernetes_1_30(vendor, exporter, mode):
    assert_core_objects_valid(render.render_spoke(values(vendor=vendor, exporter=exporter,
                                                         mode=mode)))


def test_strict_validation_would_catch_a_misspelt_field():
    # The control for the test above: strict schemas reject unknown fields.
    daemonset = one(render.render_spoke(values(exporter="builtin")), "DaemonSet")
    daemonset["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, "1.30", strict=True)


@pytest.mark.parametrize("vendor", ["nvidia", "amd", "nvidia,amd"])
@pytest.mark.parametrize("exporter", ["upstream", "builtin"])
def test_agent_config_in_the_configmap_passes_promtool(vendor, exporter, tmp_path):
    files = render.render_spoke(values(vendor=vendor, exporter=exporter))
    promtool_check(agent_config_map(files)["data"]["prometheus.yml"], tmp_path)


def test_promtool_rejects_a_broken_agent_config(tmp_path):
    # The control for the promtool test: it does fail on a bad configuration.
    with pytest.raises(AssertionError):
        promtool_check("scrape_configs:\n  - job_name: x\n    kubernetes_sd_configs: [{}]\n"
                       "    bogus_key: 1\n", tmp_path)


# -- remote-write mode -----------------------------------------------------------------------------


def agent_config_map(files: dict[str, str]) -> dict[str, Any]:
    """The agent's ConfigMap (an upstream dcgm-exporter also gets its pinned CSV's)."""
    [config_map] = [c for c in by_kind(files, "ConfigMap") if "prometheus.yml" in c["data"]]
    return config_map


def agent_config(files: dict[str, str]) -> dict[str, Any]:
    return yaml.safe_load(agent_config_map(files)["data"]["prometheus.yml"])


def test_agent_scrapes_through_dns_and_pushes_with_the_cluster_label():
    files = render.render_spoke(values(cluster="gpu-east-1", exporter="builtin"))
    config = agent_config(files)
    assert config["global"]["external_labels"] == {"cluster": "gpu-east-1"}
    [job] = config["scrape_configs"]
    assert job["honor_labels"] is True
    assert job["scrape_interval"] == "30s"
    assert "kubernetes_sd_configs" not in job
    [dns] = job["dns_sd_configs"]
    service = one(files, "Service")
    assert service["spec"]["clusterIP"] == "None"  # headless: one A record per pod
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    assert dns == {"names": [f"{name}.{namespace}.svc"], "type": "A", "port": 9400,
                   "refresh_interval": "30s"}
    [write] = config["remote_write"]
    assert write["url"] == URL
    assert write["authorization"] == {"type": "Bearer",
                                      "credentials_file": "/etc/gpufleet/remote-write/token"}
    assert write["tls_config"] == {"ca_file": "/etc/gpufleet/remote-write/ca.crt"}


def test_agent_keeps_exactly_the_allowlisted_metrics():
    config = agent_config(render.render_spoke(values()))
    [rule] = config["scrape_configs"][0]["metric_relabel_configs"]
    assert rule["action"] == "keep" and rule["source_labels"] == ["__name__"]
    regex = re.compile(rule["regex"])  # Prometheus anchors its regexes: fullmatch
    for name in allowlist_metrics():
        assert regex.fullmatch(name), name
    for name in ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "go_goroutines", "DCGM_FI_DEV_GPU_UTILX",
                 "gpu_gfx_activity_total"):
        assert not regex.fullmatch(name), name


def test_credentials_come_from_a_secret_volume_named_by_the_flag(tmp_path):
    result = spoke(tmp_path, "--cluster", "east", "--vendor", "nvidia", "--remote-write-url", URL,
                   "--remote-write-secret", "hub-push-creds")
    assert result.exit_code == 0, result.output
    deployment = yaml.safe_load((tmp_path / "out" / "agent-deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "hub-push-creds"
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount == {"name": volume["name"], "mountPath": "/etc/gpufleet/remote-write",
                     "readOnly": True}
    # Only references: no Secret object and no credential value is rendered in this mode.
    assert not (tmp_path / "out" / "remote-write-secret.yaml").exists()
    assert all(o["kind"] != "Secret" for o in
               objects(render.render_spoke(values(remote_write_secret="hub-push-creds"))).values())


def test_agent_needs_no_kubernetes_api_access():
    files = render.render_spoke(values())
    for account in by_kind(files, "ServiceAccount"):
        assert account["automountServiceAccountToken"] is False
    role = one(files, "Role")
    assert role["rules"] == []
    assert "needs NO Kubernetes API access" in files["agent-role.yaml"]
    binding = one(files, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    pod = one(files, "Deployment")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    assert not by_kind(files, "ClusterRole") and not by_kind(files, "ClusterRoleBinding")


def test_agent_restarts_when_its_configuration_changes():
    def checksum(url: str) -> str:
        deployment = one(render.render_spoke(values(remote_write_url=url)), "Deployment")
        return deployment["spec"]["template"]["metadata"]["annotations"][
            "gpufleet.io/config-checksum"]

    assert checksum(URL) == checksum(URL)
    assert checksum(URL) != checksum(URL + "x")


@pytest.mark.parametrize("exporter", ["upstream", "builtin"])
@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_only_the_agent_may_scrape_the_exporter(vendor, exporter):
    restrict = exporter == "upstream"  # upstream: only on request (next test)
    files = render.render_spoke(values(vendor=vendor, exporter=exporter,
                                       restrict_exporter_ingress=restrict))
    policy = objects(files)["exporter-networkpolicy.yaml"]["spec"]
    service = one(files, "Service")
    agent = one(files, "Deployment")
    # and nothing may reach the agent, which only sends
    deny = objects(files)["agent-networkpolicy.yaml"]["spec"]
    assert deny["policyTypes"] == ["Ingress"] and "ingress" not in deny
    assert subset(deny["podSelector"]["matchLabels"],
                  agent["spec"]["template"]["metadata"]["labels"])
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["podSelector"]["matchLabels"] == service["spec"]["selector"]
    [rule] = policy["ingress"]
    [peer] = rule["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": agent["metadata"]["namespace"]}
    assert subset(peer["podSelector"]["matchLabels"],
                  agent["spec"]["template"]["metadata"]["labels"])
    port = 9400 if exporter == "builtin" or vendor == "nvidia" else 5000
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]
    assert agent_config(files)["scrape_configs"][0]["dns_sd_configs"][0]["port"] == port
    if exporter == "builtin":
        pods = one(files, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
        assert subset(policy["podSelector"]["matchLabels"], pods)


@pytest.mark.parametrize("mode", ["remote-write", "acm"])
def test_no_networkpolicy_in_a_namespace_we_do_not_own_unless_asked(mode, tmp_path):
    """A NetworkPolicy in the GPU operator's namespace would cut off the scrapers already there."""
    for vendor in ("nvidia", "amd", "nvidia,amd"):
        files = render.render_spoke(values(vendor=vendor, mode=mode))
        # only our own namespace's (the agent's deny-all) may remain
        assert {p["metadata"]["namespace"] for p in by_kind(files, "NetworkPolicy")} <= {
            "gpufleet"}
    result = spoke(tmp_path, "--cluster", "east", "--vendor", "nvidia", "--mode", mode,
                   *url_for(mode), "--restrict-exporter-ingress")
    assert result.exit_code == 0, result.output
    written = {str(p.relative_to(tmp_path / "out")): p.read_text()
               for p in (tmp_path / "out").rglob("*.yaml")}
    [policy] = [p for p in by_kind(written, "NetworkPolicy")
                if p["metadata"]["namespace"] == "nvidia-gpu-operator"]
    assert policy["metadata"]["name"] == "gpufleet-exporter-ingress"
    assert "cuts off every other scraper" in "".join(written.values())


@pytest.mark.parametrize("exporter", ["upstream", "builtin"])
def test_one_agent_scrapes_both_vendors_of_a_mixed_cluster(exporter, tmp_path):
    result = spoke(tmp_path, "--cluster", "east", "--vendor", "nvidia,amd", "--exporter",
                   exporter, "--remote-write-url", URL)
    assert result.exit_code == 0, result.output
    files = {p.name: p.read_text() for p in (tmp_path / "out").glob("*.yaml")}
    assert one(files, "Deployment")["metadata"]["name"] == "gpufleet-agent"
    jobs = {job["job_name"]: (job["dns_sd_configs"][0]["names"], job["dns_sd_configs"][0]["port"])
            for job in agent_config(files)["scrape_configs"]}
    services = {s["metadata"]["name"]: s for s in by_kind(files, "Service")}
    assert sorted(services) == ["gpufleet-exporter-amd", "gpufleet-exporter-nvidia"]
    for vendor, port in (("nvidia", 9400), ("amd", 5000 if exporter == "upstream" else 9400)):
        service = services[f"gpufleet-exporter-{vendor}"]
        namespace = service["metadata"]["namespace"]
        assert jobs[f"gpu-exporter-{vendor}"] == (
            [f"gpufleet-exporter-{vendor}.{namespace}.svc"], port)
    if exporter == "upstream":
        assert services["gpufleet-exporter-nvidia"]["metadata"]["namespace"] == \
            "nvidia-gpu-operator"
        assert services["gpufleet-exporter-amd"]["metadata"]["namespace"] == "kube-amd-gpu"
    else:  # two DaemonSets, each on its vendor's nodes, each selected by its own Service
        daemonsets = {d["metadata"]["name"]: d for d in by_kind(files, "DaemonSet")}
        assert sorted(daemonsets) == sorted(services)
        for name, daemonset in daemonsets.items():
            pods = daemonset["spec"]["template"]["metadata"]["labels"]
            assert subset(services[name]["spec"]["selector"], pods)
        assert "nvidia.com/gpu.present" in daemonsets["gpufleet-exporter-nvidia"]["spec"][
            "template"]["spec"]["nodeSelector"]
        namespace = one(files, "Namespace")["metadata"]["labels"]
        assert namespace["pod-security.kubernetes.io/enforce"] == "privileged"  # AMD hostPath
    kustomization = yaml.safe_load(files["kustomization.yaml"])
    assert sorted(kustomization["resources"]) == sorted(n for n in files
                                                         if n != "kustomization.yaml")


def test_mixed_cluster_names_each_vendors_exporter_namespace_and_pods(tmp_path):
    result = spoke(tmp_path, "--cluster", "east", "--vendor", "nvidia,amd", "--remote-write-url",
                   URL, "--exporter-namespace", "amd=amd-ops,nvidia=gpu-operator",
                   "--exporter-selector", "amd:app=my-metrics")
    assert result.exit_code == 0, result.output
    files = {p.name: p.read_text() for p in (tmp_path / "out").glob("*.yaml")}
    services = {s["metadata"]["name"]: s for s in by_kind(files, "Service")}
    nvidia, amd = services["gpufleet-exporter-nvidia"], services["gpufleet-exporter-amd"]
    assert nvidia["metadata"]["namespace"] == "gpu-operator"
    assert nvidia["spec"]["selector"] == {"app": "nvidia-dcgm-exporter"}  # the default
    assert amd["metadata"]["namespace"] == "amd-ops"
    assert amd["spec"]["selector"] == {"app": "my-metrics"}
    names = {job["job_name"]: job["dns_sd_configs"][0]["names"]
             for job in agent_config(files)["scrape_configs"]}
    assert names == {"gpu-exporter-nvidia": ["gpufleet-exporter-nvidia.gpu-operator.svc"],
                     "gpu-exporter-amd": ["gpufleet-exporter-amd.amd-ops.svc"]}
    # a single vendor may name itself too
    single = render.render_spoke(values(vendor="amd", exporter_namespace="amd=amd-ops",
                                        exporter_selector=["amd:app=m"]))
    assert one(single, "Service")["metadata"]["namespace"] == "amd-ops"
    assert one(single, "Service")["spec"]["selector"] == {"app": "m"}


def test_acm_mixed_cluster_labels_both_gpu_operator_namespaces():
    files = render.render_spoke(values(vendor="nvidia,amd", mode="acm"))
    namespaces = {n["metadata"]["name"]: n["metadata"]["labels"]
                  for n in by_kind(files, "Namespace")}
    assert sorted(namespaces) == ["kube-amd-gpu", "nvidia-gpu-operator"]
    assert all(labels["openshift.io/cluster-monitoring"] == "true"
               for labels in namespaces.values())
    monitors = {m["metadata"]["namespace"]: m["metadata"]["name"]
                for m in by_kind(files, "ServiceMonitor")}
    assert monitors == {"nvidia-gpu-operator": "gpufleet-exporter-nvidia",
                        "kube-amd-gpu": "gpufleet-exporter-amd"}
    # the GPU operators' namespaces are patches of one label, never gpufleet's objects
    assert {"spoke/patches/namespace-nvidia.yaml", "spoke/patches/namespace-amd.yaml"} <= set(
        files)
    assert all(labels == {"openshift.io/cluster-monitoring": "true"}
               for labels in namespaces.values())
    assert "namespace" not in files["spoke/kustomization.yaml"]


def test_upstream_exporter_is_found_where_the_gpu_operator_runs_it():
    nvidia = render.render_spoke(values(vendor="nvidia"))
    service = one(nvidia, "Service")
    assert service["metadata"]["namespace"] == "nvidia-gpu-operator"
    assert service["spec"]["selector"] == {"app": "nvidia-dcgm-exporter"}
    assert not by_kind(nvidia, "DaemonSet")
    amd = render.render_spoke(values(vendor="amd", exporter_namespace="gpu-ops",
                                     exporter_selector=["app=my-metrics"]))
    service = one(amd, "Service")
    assert service["metadata"]["namespace"] == "gpu-ops"
    assert service["spec"]["selector"] == {"app": "my-metrics"}
    assert service["spec"]["ports"][0]["port"] == 5000
    assert agent_config(amd)["scrape_configs"][0]["dns_sd_configs"][0]["names"] == [
        "gpufleet-exporter.gpu-ops.svc"]


# -- the builtin exporter's security posture ------------------------------------------------------


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_builtin_exporter_daemonset_is_locked_down(vendor):
    files = render.render_spoke(values(vendor=vendor, exporter="builtin"))
    daemonset = one(files, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert pod["automountServiceAccountToken"] is False
    ctx = container["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert not ctx.get("privileged")
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in \
        container["env"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert container["args"] == ["exporter", "--backend", "nvml" if vendor == "nvidia"
                                 else "amdsmi", "--port", "9400"]
    resources = container["resources"]
    for kind in ("requests", "limits"):
        assert quantity(resources[kind]["cpu"]) <= 0.2
        assert quantity(resources[kind]["memory"]) <= 256 * 2**20
    toleration = "nvidia.com/gpu" if vendor == "nvidia" else "amd.com/gpu"
    assert pod["tolerations"] == [{"key": toleration, "operator": "Exists",
                                   "effect": "NoSchedule"}]
    selector = ({"nvidia.com/gpu.present": "true"} if vendor == "nvidia"
                else {"feature.node.kubernetes.io/amd-gpu": "true"})
    assert pod["nodeSelector"] == selector


def test_nvidia_exporter_reaches_gpus_through_the_runtime_not_privileges():
    files = render.render_spoke(values(vendor="nvidia", exporter="builtin"))
    pod = one(files, "DaemonSet")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    # the only host path: the kubelet's pod-resources directory, read-only (pod attribution)
    assert [v["hostPath"] for v in pod["volumes"] if "hostPath" in v] == [
        {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "pod-resources"]
    assert mount == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                     "readOnly": True}
    assert "runtimeClassName: nvidia" in files["exporter-daemonset.yaml"]  # explained, optional
    assert "nvidia.com/gpu" not in str(pod["containers"][0]["resources"])  # takes no GPU
    namespace = one(files, "Namespace")
    # hostPath (the pod-resources socket) is beyond "restricted" and "baseline"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_amd_exporter_exceptions_are_minimal_and_explained():
    files = render.render_spoke(values(vendor="amd", exporter="builtin"))
    pod = one(files, "DaemonSet")["spec"]["template"]["spec"]
    host_paths = sorted(v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v)
    assert host_paths == ["/dev/dri", "/dev/kfd", "/var/lib/kubelet/pod-resources"]
    assert 44 in pod["securityContext"]["supplementalGroups"]
    text = files["exporter-daemonset.yaml"]
    assert text.count("EXCEPTION (AMD)") == 2
    assert "render" in text and "video" in text
    namespace = one(files, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert "hostPath" in files["namespace.yaml"]


def test_openshift_platform_lets_the_scc_choose_the_uid():
    kube = render.render_spoke(values(exporter="builtin"))
    shift = render.render_spoke(values(exporter="builtin", platform="openshift"))
    assert one(kube, "Deployment")["spec"]["template"]["spec"]["securityContext"][
        "runAsUser"] == 65534
    # the DaemonSet runs as the user the exporter image itself declares
    containerfile = (Path(__file__).resolve().parents[1] / "spoke" / "Containerfile").read_text()
    image_uid = int(re.search(r"^USER (\d+)", containerfile, re.M).group(1))
    assert one(kube, "DaemonSet")["spec"]["template"]["spec"]["securityContext"][
        "runAsUser"] == image_uid
    for kind in ("Deployment", "DaemonSet"):
        ctx = one(shift, kind)["spec"]["template"]["spec"]["securityContext"]
        assert "runAsUser" not in ctx and ctx["runAsNonRoot"] is True


# -- labels, images, kustomization -------------------------------------------------------------


@pytest.mark.parametrize(("vendor", "exporter", "mode"), MATRIX)
def test_every_object_carries_the_recommended_labels(vendor, exporter, mode):
    files = render.render_spoke(values(vendor=vendor, exporter=exporter, mode=mode))
    for path, obj in objects(files).items():
        if "patches/" in path:
            continue  # the GPU Operator's objects: we patch fields into them, never our labels
        labels = obj["metadata"]["labels"]
        for key in ("name", "instance", "component", "part-of", "managed-by", "version"):
            assert labels.get(f"app.kubernetes.io/{key}"), f"{path} lacks {key}"
        assert labels["app.kubernetes.io/part-of"] == "gpufleet"
        assert labels["app.kubernetes.io/managed-by"] == "gpufleet"
        assert labels["app.kubernetes.io/version"] == __version__


def test_images_are_flags_with_pinned_defaults(tmp_path):
    defaults = render.render_spoke(values(exporter="builtin"))
    images = {c["image"] for kind in ("Deployment", "DaemonSet")
              for c in one(defaults, kind)["spec"]["template"]["spec"]["containers"]}
    assert images == {"quay.io/prometheus/prometheus:v2.53.1",
                      f"ghcr.io/gpufleet/gpufleet:{__version__}"}
    result = spoke(tmp_path, "--cluster", "east", "--vendor", "nvidia", "--remote-write-url", URL,
                   "--exporter", "builtin", "--agent-image", "registry.local/prom:v9@sha256:ab",
                   "--exporter-image", "registry.local/gpufleet:dev")
    assert result.exit_code == 0, result.output
    text = "".join(p.read_text() for p in (tmp_path / "out").glob("*.yaml"))
    assert "registry.local/prom:v9@sha256:ab" in text and "registry.local/gpufleet:dev" in text
    assert "quay.io/prometheus" not in text


@pytest.mark.parametrize("mode", ["remote-write", "acm"])
def test_kustomization_lists_every_file(mode, tmp_path):
    result = spoke(tmp_path, "--cluster", "east", "--vendor", "amd", "--mode", mode,
                   *url_for(mode), "--exporter", "builtin")
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    folders = [out] if mode == "remote-write" else [out / "hub", out / "spoke"]
    for folder in folders:
        kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
        on_disk = sorted(p.name for p in folder.glob("*.yaml") if p.name != "kustomization.yaml")
        assert sorted(kustomization["resources"]) == on_disk
        assert kustomization["kind"] == "Kustomization"


# -- acm mode --------------------------------------------------------------------------------------


def allowlist(files: dict[str, str]) -> tuple[str, list[str]]:
    config_map = yaml.safe_load(files["hub/metrics-allowlist.yaml"])
    assert config_map["metadata"] == {**config_map["metadata"],
                                      "name": "observability-metrics-custom-allowlist",
                                      "namespace": "open-cluster-management-observability"}
    [(key, text)] = config_map["data"].items()
    return key, yaml.safe_load(text)["names"]


def test_acm_allowlist_is_the_hub_list_for_both_vendors():
    nvidia = render.render_spoke(values(vendor="nvidia", mode="acm"))
    amd = render.render_spoke(values(vendor="amd", mode="acm"))
    key, names = allowlist(nvidia)
    assert key == "metrics_list.yaml"
    assert names == allowlist_metrics()
    assert not set(KUBE_STATE_METRICS) & set(names)  # ACM's default allowlist has them
    assert any(n.startswith("DCGM_") for n in names) and any(n.startswith("gpu_") for n in names)
    assert nvidia["hub/metrics-allowlist.yaml"] == amd["hub/metrics-allowlist.yaml"]
    # both dcgm namings of what the hub reads (a 4.9 spoke's series must reach the hub too)
    for legacy, new in (("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO"),
                        ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS"),
                        ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR"),
                        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED"),
                        ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO"),
                        ("DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO")):
        assert legacy in names and new in names
    assert "DCGM_FI_DEV_FB_CAPACITY_BYTES" in names


def test_acm_user_workload_uses_the_uwl_key_and_no_cluster_monitoring_label():
    files = render.render_spoke(values(mode="acm", monitoring="user-workload", exporter="builtin"))
    key, names = allowlist(files)
    assert key == "uwl_metrics_list.yaml" and names == allowlist_metrics()
    namespace = yaml.safe_load(files["spoke/namespace.yaml"])
    assert "openshift.io/cluster-monitoring" not in namespace["metadata"]["labels"]
    peer = one(files, "NetworkPolicy")["spec"]["ingress"][0]["from"][0]
    assert peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "openshift-user-workload-monitoring"}


@pytest.mark.parametrize("exporter", ["upstream", "builtin"])
def test_acm_spoke_has_a_labelled_namespace_and_a_servicemonitor_only(exporter):
    files = render.render_spoke(values(mode="acm", exporter=exporter))
    spoke_files = {p: t for p, t in files.items() if p.startswith("spoke/")}
    kinds = sorted(o["kind"] for o in objects(spoke_files).values())
    expected = ["Namespace", "Service", "ServiceMonitor"]
    if exporter == "builtin":
        expected += ["DaemonSet", "NetworkPolicy", "ServiceAccount"]
    else:  # dcgm-exporter's pinned collectors CSV and the ClusterPolicy field mounting it
        expected += ["ClusterPolicy", "ConfigMap"]
    assert kinds == sorted(expected)  # no agent, no remote-write: ACM's collector does that
    ns_file = "spoke/namespace.yaml" if exporter == "builtin" else "spoke/patches/namespace.yaml"
    namespace = yaml.safe_load(files[ns_file])
    assert namespace["metadata"]["labels"]["openshift.io/cluster-monitoring"] == "true"
    monitor = one(files, "ServiceMonitor")
    service = one(files, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == namespace["metadata"]["name"] == \
        service["metadata"]["namespace"]
    assert subset(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace["metadata"]["name"]]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
    assert endpoint["interval"] == "30s" and endpoint["honorLabels"] is True
    [keep] = endpoint["metricRelabelings"]
    assert keep["action"] == "keep" and keep["regex"] == render.metrics_keep_regex()
    if exporter == "builtin":
        peer = one(files, "NetworkPolicy")["spec"]["ingress"][0]["from"][0]
        assert peer["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": "openshift-monitoring"}
    assert "remote_write" not in "".join(files.values())


# -- safety: quoting, names, atomic writes, determinism --------------------------------------------


NASTY = [HOSTILE, "a'b\"c", "\\", "#comment", "key: value", "- item", "&a *b !tag", "\t",
         "é ü", "😀", "\x00", "\u2028", "\x85", " lead", "trail ", "{{hub x hub}}", "yes",
         "null", "0o17", "", "'", '"', "a\\nb", "---", "...", "%YAML"]


@pytest.mark.parametrize("text", NASTY)
def test_quoted_scalars_always_parse_back_to_themselves(text):
    quoted = render.yaml_quote(text)
    assert "\n" not in quoted
    assert yaml.safe_load(f"key: {quoted}\nother: 1\n") == {"key": text, "other": 1}


def test_hostile_image_cannot_inject_keys(tmp_path):
    refused = spoke(tmp_path, "--cluster", "east", "--vendor", "nvidia", "--remote-write-url",
                    URL, "--agent-image", HOSTILE, out="refused")
    assert refused.exit_code == 2 and "is not an image reference" in refused.output
    assert not (tmp_path / "refused").exists()  # a newline: no image name has one
    hostile = HOSTILE.replace("\n ", "").replace(" ", "")  # quotes and colons stay
    result = spoke(tmp_path, "--cluster", "east", "--vendor", "nvidia", "--remote-write-url", URL,
                   "--exporter", "builtin", "--exporter-image", hostile, "--agent-image", hostile)
    assert result.exit_code == 0, result.output

    for path in (tmp_path / "out").glob("*.yaml"):
        obj = yaml.safe_load(path.read_text())
        assert "evil" not in all_keys(obj), path.name
    pod = yaml.safe_load((tmp_path / "out" / "exporter-daemonset.yaml").read_text())
    assert pod["spec"]["template"]["spec"]["containers"][0]["image"] == hostile


def test_hostile_url_is_refused_with_one_line_and_nothing_written(tmp_path):
    result = spoke(tmp_path, "--cluster", "east", "--vendor", "nvidia",
                   "--remote-write-url", HOSTILE)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("error: ")
    assert not (tmp_path / "out").exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("args", "message"), [
    (["--cluster", "East_1", "--vendor", "nvidia"], "DNS-1123"),
    (["--cluster", "a" * 64, "--vendor", "nvidia"], "DNS-1123"),
    (["--cluster", "east", "--vendor", "intel"], "unknown vendor"),
    (["--cluster", "east", "--vendor", "nvidia", "--mode", "push"], "unknown mode"),
    (["--cluster", "east", "--vendor", "nvidia", "--exporter", "dcgm"], "unknown exporter"),
    (["--cluster", "east", "--vendor", "nvidia", "--namespace", "gpu fleet"], "DNS-1123"),
    (["--cluster", "east"], "vendor is required"),
    (["--vendor", "nvidia"], "cluster name"),
    (["--cluster", "east", "--vendor", "nvidia", "--remote-write-url", ""], "required"),
    (["--cluster", "east", "--vendor", "nvidia", "--remote-write-url", "ftp://x/"], "http(s)"),
    (["--cluster", "east", "--vendor", "nvidia", "--remote-write-url", "https://u:p@h/"],
     "credentials"),
    (["--cluster", "east", "--vendor", "nvidia", "--exporter-selector", "app"], "KEY=VALUE"),
    (["--cluster", "east", "--vendor", "nvidia", "--remote-write-url", URL,
      "--agent-image", "{{ evil }}"], "templates"),
    (["--cluster", "east", "--vendor", "nvidia", "--mode", "acm", "--monitoring", "x"],
     "unknown monitoring"),
    (["--cluster", "east", "--vendor", "nvidia", "--remote-write-url", URL,
      "--kube-state-metrics", "ksm.svc"], "HOST:PORT"),
    (["--cluster", "east", "--vendor", "nvidia", "--mode", "acm",
      "--kube-state-metrics", "ksm.svc:8080"], "remote-write mode"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message):
    result = spoke(tmp_path, *args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1
    assert message in result.output
    assert list(tmp_path.iterdir()) == []


def test_missing_out_is_an_input_error():
    result = run("spoke", "render", "--cluster", "east", "--vendor", "nvidia",
                 "--remote-write-url", URL)
    assert result.exit_code == 2
    assert result.output == "error: --out DIR is required\n"


def test_failed_write_leaves_nothing_behind(tmp_path):
    # "a.yaml" as a file and as a directory: the second write fails half-way through.
    with pytest.raises(InputError):
        render.write_tree({"a.yaml": "x: 1\n", "a.yaml/b.yaml": "y: 2\n"}, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_rerender_replaces_the_directory_it_wrote(tmp_path):
    args = ["--cluster", "east", "--vendor", "nvidia", "--remote-write-url", URL]
    assert spoke(tmp_path, *args, "--exporter", "builtin").exit_code == 0
    assert (tmp_path / "out" / "exporter-daemonset.yaml").exists()
    inode = (tmp_path / "out").stat().st_ino
    assert spoke(tmp_path, *args, "--exporter", "upstream").exit_code == 0
    assert not (tmp_path / "out" / "exporter-daemonset.yaml").exists()  # no stale leftovers
    assert (tmp_path / "out").stat().st_ino == inode  # same directory: a shell inside stays valid
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary directories


def test_refuses_to_replace_a_directory_it_did_not_write(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    result = spoke(tmp_path, "--cluster", "east", "--vendor", "nvidia", "--remote-write-url", URL)
    assert result.exit_code == 2 and "not written by gpufleet" in result.output
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["notes.txt"]
    # An empty directory is fine.
    (tmp_path / "empty").mkdir()
    result = spoke(tmp_path, "--cluster", "east", "--vendor", "nvidia", "--remote-write-url", URL,
                   out="empty")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("mode", ["remote-write", "acm"])
def test_rendering_twice_is_byte_identical(mode, tmp_path):
    args = ["--cluster", "east", "--vendor", "amd", "--exporter", "builtin", "--mode", mode,
            *url_for(mode)]
    assert spoke(tmp_path, *args, out="one").exit_code == 0
    assert spoke(tmp_path, *args, out="two").exit_code == 0

    def snapshot(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file()}

    first = snapshot(tmp_path / "one")
    assert first == snapshot(tmp_path / "two")
    assert spoke(tmp_path, *args, out="one").exit_code == 0
    assert snapshot(tmp_path / "one") == first


def test_options_come_from_the_environment_and_config_file(tmp_path):
    env = {"GPUFLEET_VENDOR": "amd", "GPUFLEET_REMOTE_WRITE_URL": URL}
    result = run("spoke", "render", "--cluster", "west", "--out", str(tmp_path / "env"), env=env)
    assert result.exit_code == 0, result.output
    assert "amd.com/gpu" not in (tmp_path / "env" / "agent-deployment.yaml").read_text()
    service = yaml.safe_load((tmp_path / "env" / "exporter-service.yaml").read_text())
    assert service["spec"]["ports"][0]["port"] == 5000  # AMD's exporter port
    config = tmp_path / "gpufleet.yaml"
    config.write_text(yaml.safe_dump({"cluster": "north", "vendor": "nvidia",
                                      "remote-write-url": URL}))
    result = run("spoke", "render", "--config", str(config), "--out", str(tmp_path / "cfg"))
    assert result.exit_code == 0, result.output
    assert 'cluster: "north"' in (tmp_path / "cfg" / "agent-config.yaml").read_text()


def test_templates_come_from_the_checkout_in_an_editable_install():
    templates, policies = render.template_roots()
    repo = Path(__file__).resolve().parents[1]
    assert (templates, policies) == (repo / "templates", repo / "policies")


def test_image_is_short_for_exporter_image(tmp_path):
    result = spoke(tmp_path, "--cluster", "east", "--vendor", "nvidia", "--remote-write-url", URL,
                   "--exporter", "builtin", "--image", "registry.example.com/gpufleet:9.9")
    assert result.exit_code == 0, result.output
    daemonset = yaml.safe_load((tmp_path / "out" / "exporter-daemonset.yaml").read_text())
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "registry.example.com/gpufleet:9.9")


@pytest.mark.parametrize("mode", ["remote-write", "acm"])
def test_the_reconcile_reader_may_list_nodes_and_dra_objects_and_nothing_else(mode):
    """`--reconcile-reader`: the identity `reconcile --context` reads a cluster as, DRA
    clusters included (ResourceSlices, ResourceClaims, DeviceClasses); get/list only."""
    files = render.render_spoke(values(mode=mode, reconcile_reader=True))
    assert_core_objects_valid(files, "1.34")
    role = one(files, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]},
        {"apiGroups": ["resource.k8s.io"],
         "resources": ["resourceslices", "resourceclaims", "deviceclasses"],
         "verbs": ["get", "list"]},
    ]
    binding = one(files, "ClusterRoleBinding")
    [subject] = binding["subjects"]
    reader = [a for a in by_kind(files, "ServiceAccount")
              if a["metadata"]["name"] == "gpufleet-reader"]
    assert [(a["metadata"]["namespace"], a["automountServiceAccountToken"]) for a in reader] == [
        (subject["namespace"], False)]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == subject["name"] == \
        "gpufleet-reader"
    namespaces = {o["metadata"]["name"] for o in by_kind(files, "Namespace")}
    assert subject["namespace"] in namespaces  # created by the same bundle
    assert not by_kind(render.render_spoke(values(mode=mode)), "ClusterRole")  # opt-in


def test_the_reconcile_reader_option_reaches_the_files(tmp_path):
    result = CliRunner().invoke(cli, ["spoke", "render", "--cluster", "east", "--vendor",
                                      "nvidia", "--remote-write-url", URL,
                                      "--reconcile-reader", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "reader-clusterrole.yaml").exists()
    kustomization = yaml.safe_load((tmp_path / "out" / "kustomization.yaml").read_text())
    assert "reader-clusterrolebinding.yaml" in kustomization["resources"]


# -- metered allocation: kube-state-metrics' pod series, kept to pods requesting GPUs -------------
def test_agent_scrapes_kube_state_metrics_for_gpu_pods_and_passes_promtool(tmp_path):
    files = render.render_spoke(values(kube_state_metrics="kube-state-metrics.kube-system"
                                                          ".svc:8080"))
    promtool_check(agent_config_map(files)["data"]["prometheus.yml"], tmp_path)
    jobs = {j["job_name"]: j for j in agent_config(files)["scrape_configs"]}
    ksm = jobs["kube-state-metrics"]
    assert ksm["dns_sd_configs"][0]["names"] == ["kube-state-metrics.kube-system.svc"]
    [rule] = ksm["metric_relabel_configs"]
    assert rule["action"] == "keep" and rule["source_labels"] == ["__name__", "resource", "phase"]
    keep = re.compile(rule["regex"])  # Prometheus anchors: fullmatch of name;resource;phase
    for kept in ("kube_pod_container_resource_requests;nvidia_com_gpu;",
                 "kube_pod_container_resource_requests;nvidia_com_mig_1g_10gb;",
                 "kube_pod_container_resource_requests;amd_com_gpu;",
                 "kube_pod_container_resource_requests;nvidia_com_gpu_shared;",
                 "kube_pod_start_time;;", "kube_pod_completion_time;;",
                 "kube_pod_status_phase;;Running", "kube_node_labels;;"):
        assert keep.fullmatch(kept), kept
    for dropped in ("kube_pod_container_resource_requests;cpu;",
                    "kube_pod_container_resource_requests;memory;",
                    "kube_pod_status_phase;;Pending", "kube_pod_status_phase;;Succeeded",
                    "kube_pod_info;;", "kube_pod_container_resource_limits;nvidia_com_gpu;"):
        assert not keep.fullmatch(dropped), dropped
    # the exporters' job forwards the builtin exporter's edges (bounded: GPU pods only)
    exporter_keep = re.compile(jobs["gpu-exporter"]["metric_relabel_configs"][0]["regex"])
    assert exporter_keep.fullmatch("gpufleet_allocation_start_timestamp_seconds")
    assert exporter_keep.fullmatch("gpufleet_allocation_end_timestamp_seconds")
    assert "kube-state-metrics" not in {
        j["job_name"] for j in agent_config(render.render_spoke(values()))["scrape_configs"]}


def test_acm_allowlist_forwards_allocation_series_of_gpu_pods_only(tmp_path):
    import shutil
    import subprocess

    platform = yaml.safe_load(render.render_spoke(values(mode="acm"))[
        "hub/metrics-allowlist.yaml"])["data"]["metrics_list.yaml"]
    listed = yaml.safe_load(platform)
    assert {"gpufleet_allocation_start_timestamp_seconds",
            "gpufleet_allocation_end_timestamp_seconds"} <= set(listed["names"])
    assert listed["matches"] == [
        '__name__="kube_pod_container_resource_requests",resource=~"nvidia_com_gpu|'
        'nvidia_com_gpu_shared|nvidia_com_gpucores|nvidia_com_mig_.+|amd_com_gpu|'
        'amd_com_.+_nps.+"']
    rules = {r["record"]: r["expr"] for r in listed["recording_rules"]}
    assert set(rules) == {"kube_pod_start_time", "kube_pod_completion_time",
                          "kube_pod_status_phase"}
    assert all(" and on (namespace, pod, uid) (kube_pod_container_resource_requests" in e
               for e in rules.values())
    # the expressions are PromQL promtool accepts
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "acm", "rules": [
        {"record": f"check:{k}", "expr": v} for k, v in rules.items()]}]}))
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found on PATH: install the Debian package 'prometheus'"
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    uwl = yaml.safe_load(yaml.safe_load(render.render_spoke(values(
        mode="acm", monitoring="user-workload"))["hub/metrics-allowlist.yaml"])["data"][
        "uwl_metrics_list.yaml"])
    assert "recording_rules" not in uwl and uwl["matches"] == listed["matches"]
