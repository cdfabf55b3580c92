"""`gpufleet policy render|apply|status`: ACM objects that onboard every labelled cluster."""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner, Result

from hub import onboard as render
from hub.cli import cli
from tests.support.kubeapi import KubeAPI
from tests.support.kubeapi import kube_api as kube_api
from tests.support.manifests import HOSTILE, promtool_check

URL = "https://receive.hub.example.com/api/v1/receive"
CLUSTER_NAME = "{{hub .ManagedClusterName hub}}"
TOKEN = '{{hub fromSecret "gpufleet-policies" "gpufleet-remote-write" "token" hub}}'
CA = '{{hub fromSecret "gpufleet-policies" "gpufleet-remote-write" "ca.crt" hub}}'
NS = "gpufleet-policies"
POLICIES = "/apis/policy.open-cluster-management.io/v1/namespaces/gpufleet-policies/policies"


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def render_policy(tmp_path: Path, *args: str, out: str = "policy") -> Path:
    result = run("policy", "render", "--out", str(tmp_path / out), *args)
    assert result.exit_code == 0, result.output
    return tmp_path / out


def load(directory: Path) -> dict[str, dict[str, Any]]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(directory.glob("*.yaml"))
            if p.name != "kustomization.yaml"}


def object_templates(policy: dict[str, Any]) -> list[dict[str, Any]]:
    [template] = policy["spec"]["policy-templates"]
    return template["objectDefinition"]["spec"]["object-templates"]


def simulate_acm(text: str, cluster: str) -> str:
    """What the hub's template resolution does for one managed cluster."""
    secret = base64.b64encode(b"not-a-real-value").decode()
    text = text.replace(CLUSTER_NAME, cluster)
    return re.sub(r"\{\{hub fromSecret [^}]* hub\}\}", secret, text)


# -- render ------------------------------------------------------------------------------------


def test_policy_objects_live_in_one_namespace(tmp_path):
    out = render_policy(tmp_path, "--remote-write-url", URL)
    objects = load(out)
    assert sorted(objects) == ["managedclustersetbinding.yaml", "namespace.yaml",
                               "placement.yaml", "placementbinding.yaml", "policy.yaml"]
    assert objects["namespace.yaml"]["metadata"]["name"] == NS
    kubernetes_validate.validate(objects["namespace.yaml"], "1.30", strict=True)
    for name, obj in objects.items():
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == NS, name
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpufleet"
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(objects)


def test_policy_carries_the_spoke_manifests_from_the_same_templates(tmp_path):
    out = render_policy(tmp_path, "--remote-write-url", URL, "--vendor", "amd",
                        "--exporter", "builtin")
    policy = load(out)["policy.yaml"]
    assert policy["apiVersion"] == "policy.open-cluster-management.io/v1"
    assert policy["metadata"]["name"] == "gpufleet-onboard-amd"
    assert policy["spec"]["remediationAction"] == "inform" and policy["spec"]["disabled"] is False
    [template] = policy["spec"]["policy-templates"]
    config_policy = template["objectDefinition"]
    assert config_policy["apiVersion"] == "policy.open-cluster-management.io/v1"
    assert config_policy["kind"] == "ConfigurationPolicy"
    assert config_policy["spec"]["remediationAction"] == "inform"
    assert config_policy["spec"]["severity"] in ("low", "medium", "high", "critical")
    templates = object_templates(policy)
    assert {t["complianceType"] for t in templates} == {"musthave"}
    spoke = render.policy_spoke(NS, vendor="amd", exporter="builtin", remote_write_url=URL,
                                platform="openshift")
    expected = [yaml.safe_load(text) for text in render.spoke_manifests(spoke).values()]
    assert [t["objectDefinition"] for t in templates] == expected
    assert templates[0]["objectDefinition"]["kind"] == "Namespace"  # created first
    kinds = [t["objectDefinition"]["kind"] for t in templates]
    assert {"Secret", "ConfigMap", "Deployment", "DaemonSet", "NetworkPolicy"} <= set(kinds)


def test_per_cluster_values_are_literal_acm_hub_templates(tmp_path):
    out = render_policy(tmp_path, "--remote-write-url", URL)
    text = (out / "policy.yaml").read_text()
    # Jinja2 did not eat ACM's {{ }}: the file holds the hub templates verbatim.
    for literal in (CLUSTER_NAME, TOKEN, CA):
        assert literal in text
    for match in re.finditer(r"\{\{.*?\}\}", text):
        assert match.group().startswith("{{hub ") and match.group().endswith(" hub}}"), match
    templates = {t["objectDefinition"]["kind"]: t["objectDefinition"]
                 for t in object_templates(load(out)["policy.yaml"])
                 if t["objectDefinition"]["metadata"]["name"] != render.DCGM_CONFIGMAP}
    config = yaml.safe_load(templates["ConfigMap"]["data"]["prometheus.yml"])
    assert config["global"]["external_labels"] == {"cluster": CLUSTER_NAME}
    assert templates["Secret"]["data"] == {"ca.crt": CA, "token": TOKEN}
    assert render.acm_hub(".ManagedClusterName") == CLUSTER_NAME


def test_each_cluster_gets_a_valid_configuration_once_acm_resolves_it(tmp_path):
    out = render_policy(tmp_path, "--remote-write-url", URL, "--exporter", "builtin")
    resolved = yaml.safe_load(simulate_acm((out / "policy.yaml").read_text(), "east"))
    for template in object_templates(resolved):
        obj = template["objectDefinition"]
        kubernetes_validate.validate(obj, "1.30", strict=True)
        if obj["kind"] == "ConfigMap":
            config = obj["data"]["prometheus.yml"]
            assert yaml.safe_load(config)["global"]["external_labels"] == {"cluster": "east"}
            promtool_check(config, tmp_path)


def test_no_secret_value_is_rendered(tmp_path):
    out = render_policy(tmp_path, "--remote-write-url", URL)
    text = "".join(p.read_text() for p in out.glob("*.yaml"))
    templates = object_templates(load(out)["policy.yaml"])
    [secret] = [t["objectDefinition"] for t in templates
                if t["objectDefinition"]["kind"] == "Secret"]
    assert all(value.startswith("{{hub fromSecret") for value in secret["data"].values())
    assert "stringData" not in secret
    assert text.count("kind: Secret") == 1


def test_placement_selects_by_label_and_tolerates_unreachable_clusters(tmp_path):
    objects = load(render_policy(tmp_path, "--remote-write-url", URL))
    placement = objects["placement.yaml"]
    assert placement["apiVersion"] == "cluster.open-cluster-management.io/v1beta1"
    assert placement["spec"]["clusterSets"] == ["default"]
    [predicate] = placement["spec"]["predicates"]
    assert predicate["requiredClusterSelector"]["labelSelector"] == {
        "matchLabels": {"gpufleet.io/onboard": "true", "gpufleet.io/gpu-vendor": "nvidia"}}
    assert placement["spec"]["tolerations"] == [
        {"key": "cluster.open-cluster-management.io/unreachable", "operator": "Exists"},
        {"key": "cluster.open-cluster-management.io/unavailable", "operator": "Exists"},
    ]
    objects = load(render_policy(tmp_path, "--remote-write-url", URL, "--placement-label",
                                 "gpufleet.io/vendor=nvidia", "--placement-label", "env=prod",
                                 "--cluster-set", "gpu-clusters", out="custom"))
    selector = objects["placement.yaml"]["spec"]["predicates"][0]["requiredClusterSelector"]
    assert selector["labelSelector"]["matchLabels"] == {"env": "prod",
                                                        "gpufleet.io/vendor": "nvidia",
                                                        "gpufleet.io/gpu-vendor": "nvidia"}
    assert objects["placement.yaml"]["spec"]["clusterSets"] == ["gpu-clusters"]
    binding = objects["managedclustersetbinding.yaml"]
    assert binding["apiVersion"] == "cluster.open-cluster-management.io/v1beta2"
    assert binding["metadata"]["name"] == binding["spec"]["clusterSet"] == "gpu-clusters"


def owned(directory: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every object a rendered policy directory manages: hub-side and inside the Policy."""
    hub = load(directory)
    found = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
             for o in hub.values()}
    for template in object_templates(hub["policy.yaml"]):
        obj = template["objectDefinition"]
        found[(obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])] = obj
    return found


def placement_labels(directory: Path) -> dict[str, str]:
    placement = load(directory)["placement.yaml"]
    return placement["spec"]["predicates"][0]["requiredClusterSelector"]["labelSelector"][
        "matchLabels"]


def selects(labels: dict[str, str], cluster: dict[str, str]) -> bool:
    return all(cluster.get(k) == v for k, v in labels.items())


@pytest.mark.parametrize("exporter", ["upstream", "builtin"])
def test_policies_of_different_vendors_never_own_the_same_object(tmp_path, exporter):
    """Rendered side by side (the same placement labels), vendor policies never fight: their
    hub objects differ by name or are identical, and no cluster is selected by two of them."""
    dirs = {vendor: render_policy(tmp_path, "--remote-write-url", URL, "--exporter", exporter,
                                  "--vendor", vendor, "--placement-label", "env=prod",
                                  out=vendor.replace(",", "-"))
            for vendor in ("nvidia", "amd", "nvidia,amd")}
    hub = {vendor: {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
                    for o in load(d).values()} for vendor, d in dirs.items()}
    for a, b in (("nvidia", "amd"), ("nvidia", "nvidia,amd"), ("amd", "nvidia,amd")):
        # hub side: an object both write (the policy namespace, the cluster-set binding) is
        # identical; the Policy, Placement and PlacementBinding have their own names
        for key in hub[a].keys() & hub[b].keys():
            assert key[0] in {"Namespace", "ManagedClusterSetBinding"}, key
            assert hub[a][key] == hub[b][key], key
        # spoke side (gpufleet-agent, its config, ...): the same names, so no cluster, whatever
        # its labels, may be placed by both
        # no cluster, whatever its labels, is placed by both
        la, lb = placement_labels(dirs[a]), placement_labels(dirs[b])
        cluster = {**la, **lb}
        assert not (selects(la, cluster) and selects(lb, cluster))
    # each vendor policy places a cluster labelled for it
    for vendor, directory in dirs.items():
        labels = placement_labels(directory)
        assert labels["gpufleet.io/gpu-vendor"] == vendor.replace(",", "-")
        assert labels["env"] == "prod"


def test_one_policy_onboards_a_mixed_fleet(tmp_path):
    """`--vendor nvidia,amd`: one agent scraping both exporters, each vendor's exporter once."""
    directory = render_policy(tmp_path, "--remote-write-url", URL, "--vendor", "amd,nvidia",
                              "--exporter", "builtin")
    objects = owned(directory)
    assert objects[("Policy", NS, "gpufleet-onboard-nvidia-amd")]
    daemonsets = {key[2]: obj for key, obj in objects.items() if key[0] == "DaemonSet"}
    assert sorted(daemonsets) == ["gpufleet-exporter-amd", "gpufleet-exporter-nvidia"]
    args = {name: d["spec"]["template"]["spec"]["containers"][0]["args"]
            for name, d in daemonsets.items()}
    assert args["gpufleet-exporter-nvidia"][2] == "nvml"
    assert args["gpufleet-exporter-amd"][2] == "amdsmi"
    [agent] = [obj for key, obj in objects.items() if key[0] == "Deployment"]
    assert agent["metadata"]["name"] == "gpufleet-agent"
    [config_map] = [obj for key, obj in objects.items() if key[0] == "ConfigMap"]
    config = yaml.safe_load(config_map["data"]["prometheus.yml"])
    jobs = {job["job_name"]: job["dns_sd_configs"][0]["names"]
            for job in config["scrape_configs"]}
    assert jobs == {"gpu-exporter-nvidia": ["gpufleet-exporter-nvidia.gpufleet.svc"],
                    "gpu-exporter-amd": ["gpufleet-exporter-amd.gpufleet.svc"]}
    services = {key[2]: obj["spec"]["selector"] for key, obj in objects.items()
                if key[0] == "Service"}
    for name, selector in services.items():
        pods = daemonsets[name]["spec"]["template"]["metadata"]["labels"]
        assert all(pods.get(k) == v for k, v in selector.items())
    assert services["gpufleet-exporter-nvidia"] != services["gpufleet-exporter-amd"]


def test_placement_binding_has_top_level_ref_and_subjects(tmp_path):
    objects = load(render_policy(tmp_path, "--remote-write-url", URL))
    binding = objects["placementbinding.yaml"]
    assert "spec" not in binding
    assert binding["placementRef"] == {"apiGroup": "cluster.open-cluster-management.io",
                                       "kind": "Placement",
                                       "name": objects["placement.yaml"]["metadata"]["name"]}
    assert binding["subjects"] == [{"apiGroup": "policy.open-cluster-management.io",
                                    "kind": "Policy",
                                    "name": objects["policy.yaml"]["metadata"]["name"]}]


def test_enforce_reaches_the_configuration_policy(tmp_path):
    policy = load(render_policy(tmp_path, "--remote-write-url", URL, "--remediation",
                                "enforce"))["policy.yaml"]
    assert policy["spec"]["remediationAction"] == "enforce"
    config_policy = policy["spec"]["policy-templates"][0]["objectDefinition"]
    assert config_policy["spec"]["remediationAction"] == "enforce"


def test_acm_mode_policy_carries_the_acm_spoke_objects(tmp_path):
    policy = load(render_policy(tmp_path, "--mode", "acm", "--exporter", "builtin"))["policy.yaml"]
    kinds = sorted(t["objectDefinition"]["kind"] for t in object_templates(policy))
    assert kinds == ["DaemonSet", "Namespace", "NetworkPolicy", "Service", "ServiceAccount",
                     "ServiceMonitor"]
    assert "{{" not in (tmp_path / "policy" / "policy.yaml").read_text().split("apiVersion", 1)[1]


def test_policy_render_is_byte_identical_and_quotes_hostile_values(tmp_path):
    refused = run("policy", "render", "--out", str(tmp_path / "refused"), "--remote-write-url",
                  URL, "--exporter", "builtin", "--exporter-image", HOSTILE)
    assert refused.exit_code == 2 and "is not an image reference" in refused.output
    assert not (tmp_path / "refused").exists()  # a newline: no image name has one
    hostile = HOSTILE.replace("\n ", "").replace(" ", "")  # quotes and colons stay
    args = ["--remote-write-url", URL, "--exporter", "builtin", "--exporter-image", hostile]
    one = render_policy(tmp_path, *args, out="one")
    two = render_policy(tmp_path, *args, out="two")
    for path in one.iterdir():
        assert path.read_bytes() == (two / path.name).read_bytes()
    templates = object_templates(load(one)["policy.yaml"])
    [daemonset] = [t["objectDefinition"] for t in templates
                   if t["objectDefinition"]["kind"] == "DaemonSet"]
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"] == hostile
    assert "evil" not in json.dumps([list(t["objectDefinition"]) for t in templates])


@pytest.mark.parametrize(("args", "message"), [
    (["--placement-label", "bad label=x"], "label key"),
    (["--placement-label", "env"], "KEY=VALUE"),
    (["--placement-label", "env=a b"], "label value"),
    (["--remediation", "fix"], "unknown remediation"),
    (["--cluster-set", "Default"], "DNS-1123"),
    (["--namespace", "n" * 40], "62 characters"),
    (["--vendor", "intel"], "unknown vendor"),
    (["--vendor", "nvidia,intel"], "unknown vendor"),
    (["--vendor", ","], "vendor is required"),
    (["--placement-label", "gpufleet.io/gpu-vendor=amd"], "set from --vendor"),
    (["--vendor", "nvidia,amd", "--exporter-namespace", "gpu"], "name the vendor"),
    (["--vendor", "nvidia,amd", "--exporter-selector", "app=x"], "name the vendor"),
    (["--vendor", "nvidia", "--exporter-namespace", "amd=gpu"], "does not list"),
    (["--vendor", "amd", "--exporter-selector", "intel:app=x"], "unknown vendor"),
    (["--vendor", "amd", "--exporter", "builtin", "--exporter-namespace", "amd=x"],
     "upstream exporters"),
    (["--remote-write-url", ""], "required"),
    (["--remote-write-url", URL, "--spoke-namespace", "-x"], "DNS-1123"),
])
def test_policy_render_bad_input(tmp_path, args, message):
    result = run("policy", "render", "--out", str(tmp_path / "out"),
                 *(["--remote-write-url", URL] if "--remote-write-url" not in args else []),
                 *args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1
    assert message in result.output
    assert list(tmp_path.iterdir()) == []


# -- apply -------------------------------------------------------------------------------------


def apply(api: KubeAPI, directory: Path, *args: str) -> Result:
    return run("policy", "apply", "--dir", str(directory), "--kubeconfig",
               str(api.kubeconfig_path("hub")), "--context", "hub", *args)


def test_apply_creates_every_object_namespace_first(kube_api, tmp_path):
    out = render_policy(tmp_path, "--remote-write-url", URL)
    result = apply(kube_api, out, "-o", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["kind"], r["action"]) for r in rows] == [
        ("Namespace", "created"), ("ManagedClusterSetBinding", "created"),
        ("Placement", "created"), ("Policy", "created"), ("PlacementBinding", "created")]
    # server-side apply: one PATCH with the apply content type per object, in order
    patches = [r.path for r in kube_api.requests if r.method == "PATCH"]
    assert patches == [
        f"/api/v1/namespaces/{NS}",
        f"/apis/cluster.open-cluster-management.io/v1beta2/namespaces/{NS}/"
        "managedclustersetbindings/default",
        f"/apis/cluster.open-cluster-management.io/v1beta1/namespaces/{NS}/placements/"
        "gpufleet-onboard-nvidia",
        f"{POLICIES}/gpufleet-onboard-nvidia",
        f"/apis/policy.open-cluster-management.io/v1/namespaces/{NS}/placementbindings/"
        "gpufleet-onboard-nvidia",
    ]
    assert all(r.query == {"fieldManager": "gpufleet"}
               for r in kube_api.requests if r.method == "PATCH")
    assert not kube_api.requests_to("PUT") and not kube_api.requests_to("POST")
    stored = kube_api.get_object("policy.open-cluster-management.io/v1", "Policy",
                                 "gpufleet-onboard-nvidia", NS)
    assert stored["spec"] == load(out)["policy.yaml"]["spec"]
    assert json.dumps(TOKEN)[1:-1] in json.dumps(stored)  # reaches the hub unresolved
    assert [m["manager"] for m in stored["metadata"]["managedFields"]] == ["gpufleet"]


def test_apply_again_owns_only_its_fields(kube_api, tmp_path):
    """Labels and annotations another tool set stay; a field gpufleet applied before and
    renders no more goes; an unchanged object is left alone."""
    kube_api.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": NS, "labels": {"owner": "platform"},
        "annotations": {"openshift.io/sa.scc.uid-range": "1000/10000"}}}, manager="openshift")
    out = render_policy(tmp_path, "--remote-write-url", URL, "--placement-label", "a=1")
    assert apply(kube_api, out).exit_code == 0
    # ACM (or a person) labels and annotates the Policy: not gpufleet's to wipe
    policy = kube_api.get_object("policy.open-cluster-management.io/v1", "Policy",
                                 "gpufleet-onboard-nvidia", NS)
    policy["metadata"].setdefault("labels", {})["policy.open-cluster-management.io/root"] = "x"
    policy["metadata"].setdefault("annotations", {})["acm.example/reviewed-by"] = "sre"
    kube_api.put_object(policy, manager="acm-ui")
    result = apply(kube_api, out, "-o", "json")
    assert result.exit_code == 0, result.output
    assert {r["action"] for r in json.loads(result.output)} == {"unchanged"}, result.output
    # Render with another label and apply again: the Placement's old label is gpufleet's
    # own field no longer rendered, so it goes
    out = render_policy(tmp_path, "--remote-write-url", URL, "--placement-label", "b=2")
    result = apply(kube_api, out, "-o", "json")
    assert result.exit_code == 0, result.output
    assert {(r["kind"], r["action"]) for r in json.loads(result.output)} >= {
        ("Placement", "configured")}
    placement = kube_api.get_object("cluster.open-cluster-management.io/v1beta1", "Placement",
                                    "gpufleet-onboard-nvidia", NS)
    selector = placement["spec"]["predicates"][0]["requiredClusterSelector"]["labelSelector"]
    assert selector == {"matchLabels": {"b": "2", "gpufleet.io/gpu-vendor": "nvidia"}}
    after = kube_api.get_object("policy.open-cluster-management.io/v1", "Policy",
                                "gpufleet-onboard-nvidia", NS)
    assert after["metadata"]["labels"]["policy.open-cluster-management.io/root"] == "x"
    assert after["metadata"]["annotations"]["acm.example/reviewed-by"] == "sre"
    namespace = kube_api.get_object("v1", "Namespace", NS)
    assert namespace["metadata"]["labels"]["owner"] == "platform"
    assert namespace["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpufleet"
    assert namespace["metadata"]["annotations"] == {"openshift.io/sa.scc.uid-range": "1000/10000"}


def test_a_field_another_manager_owns_is_one_line_and_taken_only_when_forced(kube_api,
                                                                           tmp_path):
    out = render_policy(tmp_path, "--remote-write-url", URL)
    assert apply(kube_api, out).exit_code == 0
    policy = kube_api.get_object("policy.open-cluster-management.io/v1", "Policy",
                                 "gpufleet-onboard-nvidia", NS)
    rendered = policy["spec"]["remediationAction"]
    policy["spec"]["remediationAction"] = "inform" if rendered == "enforce" else "enforce"
    kube_api.put_object(policy, manager="acm-console")  # someone switched it by hand
    result = apply(kube_api, out)
    assert result.exit_code == 1, result.output
    assert result.output.count("\n") == 1 and result.output.startswith("error: ")
    assert (f"Policy {NS}/gpufleet-onboard-nvidia: .spec.remediationAction set by "
            "acm-console; not applied") in result.output
    assert "--force-conflicts" in result.output
    kept = kube_api.get_object("policy.open-cluster-management.io/v1", "Policy",
                               "gpufleet-onboard-nvidia", NS)
    assert kept["spec"]["remediationAction"] != rendered  # the other manager's value stays
    result = apply(kube_api, out, "--force-conflicts", "-o", "json")
    assert result.exit_code == 0, result.output
    forced = kube_api.get_object("policy.open-cluster-management.io/v1", "Policy",
                                 "gpufleet-onboard-nvidia", NS)
    assert forced["spec"]["remediationAction"] == rendered
    assert [r.query.get("force") for r in kube_api.requests_to("PATCH", POLICIES)][-1] == \
        "true"


def test_apply_keeps_status_written_by_acm(kube_api, tmp_path):
    out = render_policy(tmp_path, "--remote-write-url", URL)
    assert apply(kube_api, out).exit_code == 0
    current = kube_api.get_object("policy.open-cluster-management.io/v1", "Policy",
                                  "gpufleet-onboard-nvidia", NS)
    current["status"] = {"compliant": "Compliant"}
    kube_api.put_object(current)
    assert apply(kube_api, out).exit_code == 0
    after = kube_api.get_object("policy.open-cluster-management.io/v1", "Policy",
                                "gpufleet-onboard-nvidia", NS)
    assert after["status"] == {"compliant": "Compliant"}


def test_apply_errors_are_one_line_with_exit_codes(kube_api, tmp_path):
    out = render_policy(tmp_path, "--remote-write-url", URL)
    kube_api.fail("PATCH", f"{POLICIES}/gpufleet-onboard-nvidia", 403, "Forbidden")
    result = apply(kube_api, out)
    assert result.exit_code == 2 and "HTTP 403" in result.output
    kube_api.fail("PATCH", f"{POLICIES}/gpufleet-onboard-nvidia", 500, "InternalError")
    result = apply(kube_api, out)
    assert result.exit_code == 3 and "HTTP 500" in result.output
    result = run("policy", "apply", "--dir", str(out), "--kubeconfig",
                 str(kube_api.kubeconfig_path("hub")), "--context", "elsewhere")
    assert result.exit_code == 2
    assert result.output.startswith("error: context 'elsewhere' not found")
    kubeconfig = kube_api.kubeconfig_path("hub")
    kube_api.stop()
    result = run("policy", "apply", "--dir", str(out), "--kubeconfig", str(kubeconfig))
    assert result.exit_code == 3 and "unreachable" in result.output
    for output in (result.output,):
        assert output.count("\n") == 1 and "test-token" not in output


def test_apply_input_errors(tmp_path):
    result = run("policy", "apply")
    assert result.exit_code == 2 and result.output == "error: --dir DIR is required\n"
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "x.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")
    result = run("policy", "apply", "--dir", str(tmp_path / "odd"))
    assert result.exit_code == 2 and "not a kind gpufleet applies" in result.output
    result = run("policy", "apply", "--dir", str(tmp_path / "missing"))
    assert result.exit_code == 2 and "not a directory" in result.output


# -- status ------------------------------------------------------------------------------------


def stored_policy(name: str, status: dict[str, Any] | None = None,
                  namespace: str = NS, managed: bool = True) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "gpufleet"} if managed else {}
    obj: dict[str, Any] = {"apiVersion": "policy.open-cluster-management.io/v1", "kind": "Policy",
                           "metadata": {"name": name, "namespace": namespace, "labels": labels},
                           "spec": {"remediationAction": "inform", "disabled": False}}
    if status is not None:
        obj["status"] = copy.deepcopy(status)
    return obj


def status(api: KubeAPI, *args: str) -> Result:
    return run("policy", "status", "--kubeconfig", str(api.kubeconfig_path("hub")), *args)


def test_status_reports_each_cluster_and_exits_1_on_noncompliance(kube_api):
    kube_api.put_object(stored_policy("gpufleet-onboard-nvidia", {
        "compliant": "NonCompliant",
        "status": [{"clustername": "west", "clusternamespace": "west", "compliant": "NonCompliant"},
                   {"clustername": "east", "clusternamespace": "east", "compliant": "Compliant"}],
    }))
    kube_api.put_object(stored_policy("gpufleet-onboard-amd"))  # nothing reported yet
    kube_api.put_object(stored_policy("someone-elses", {"compliant": "NonCompliant"},
                                      managed=False))
    # ACM's per-cluster copies live in the cluster namespaces: not listed.
    kube_api.put_object(stored_policy(f"{NS}.gpufleet-onboard-nvidia", {"compliant": "Compliant"},
                                      namespace="east"))
    result = status(kube_api, "-o", "json")
    assert result.exit_code == 1, result.output
    assert json.loads(result.output) == [
        {"policy": "gpufleet-onboard-amd", "remediation": "inform", "overall": "Pending",
         "cluster": None, "compliant": None},
        {"policy": "gpufleet-onboard-nvidia", "remediation": "inform", "overall": "NonCompliant",
         "cluster": "east", "compliant": "Compliant"},
        {"policy": "gpufleet-onboard-nvidia", "remediation": "inform", "overall": "NonCompliant",
         "cluster": "west", "compliant": "NonCompliant"},
    ]
    [listing] = kube_api.requests_to("GET", POLICIES)
    assert listing.query["labelSelector"] == "app.kubernetes.io/managed-by=gpufleet"


def test_status_table_and_compliant_fleet(kube_api):
    kube_api.put_object(stored_policy("gpufleet-onboard-nvidia", {
        "compliant": "Compliant",
        "status": [{"clustername": "east", "clusternamespace": "east", "compliant": "Compliant"}],
    }))
    result = status(kube_api)
    assert result.exit_code == 0, result.output
    header, row = result.output.splitlines()[:2]
    assert header.split() == ["POLICY", "REMEDIATION", "OVERALL", "CLUSTER", "COMPLIANT"]
    assert row.split() == ["gpufleet-onboard-nvidia", "inform", "Compliant", "east", "Compliant"]


def test_status_pages_through_many_policies(kube_api):
    for i in range(260):
        kube_api.put_object(stored_policy(f"p{i:03d}", {"compliant": "Compliant"}))
    result = status(kube_api, "-o", "json", "--namespace", NS)
    assert result.exit_code == 0
    assert len(json.loads(result.output)) == 260
    pages = kube_api.requests_to("GET", POLICIES)
    assert [r.query.get("limit") for r in pages] == ["250", "250"]
    assert "continue" in pages[1].query


def test_status_errors(kube_api):
    result = status(kube_api, "--namespace", "Bad_NS")
    assert result.exit_code == 2 and "DNS-1123" in result.output
    result = status(kube_api, "--context", "missing")
    assert result.exit_code == 2
    kube_api.fail("GET", POLICIES, 503, "ServiceUnavailable")
    result = status(kube_api)
    assert result.exit_code == 3 and result.output.count("\n") == 1


def test_the_policy_can_roll_out_the_reconcile_reader(tmp_path):
    policy = load(render_policy(tmp_path, "--mode", "acm", "--reconcile-reader"))["policy.yaml"]
    kinds = {t["objectDefinition"]["kind"]: t["objectDefinition"]
             for t in object_templates(policy)}
    assert {"ClusterRole", "ClusterRoleBinding"} <= set(kinds)
    assert kinds["ClusterRole"]["rules"][1]["resources"] == [
        "resourceslices", "resourceclaims", "deviceclasses"]
