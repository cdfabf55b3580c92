"""`gpufleet hub render`: the hub service's own manifests validate, hold no secret, are safe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner, Result

from hub import __version__
from hub.cli import cli
from hub.common import InputError
from hub.onboard import cron_schedule, hub_service_values, render_hub_service
from tests.support.manifests import HOSTILE, all_keys, assert_core_objects_valid, objects, one

HUB = "https://rbac-query-proxy-open-cluster-management-observability.apps.hub.example.com"


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env or {}, catch_exceptions=False)


#: the least a Deployment needs besides the hub: who may read its API
ACCESS = ("--tokens-secret", "api-tokens")
OIDC = {"oidc_issuer": "https://sso.example.com/realms/gpu", "oidc_audience": "gpufleet",
        "scopes_configmap": "gpufleet-scopes"}


def render(tmp_path: Path, *args: str, out: str = "out") -> Result:
    return run("hub", "render", "--out", str(tmp_path / out), *args)


def files_for(**overrides: Any) -> dict[str, str]:
    options: dict[str, Any] = {"hub_url": HUB, "tokens_secret": "api-tokens"}
    options.update(overrides)
    return render_hub_service(hub_service_values(**options))


def pod_of(files: dict[str, str]) -> dict[str, Any]:
    if any(o["kind"] == "CronJob" for o in objects(files).values()):
        return one(files, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return one(files, "Deployment")["spec"]["template"]["spec"]


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


VARIANTS = [
    {},
    {"kind": "cronjob"},
    {"hub_ca_configmap": "hub-ca", "hub_ca_key": "ca-bundle.crt"},
    {"kind": "cronjob", "hub_token_secret": "", "every": 3600.0},
    {"tls_secret": "gpufleet-tls", "tokens_secret": "gpufleet-api-tokens"},
    {"tokens_secret": None, **OIDC, "allow_from_namespaces": ["openshift-ingress"]},
    {"tokens_secret": None, "allow_unauthenticated": True},
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_core_objects_validate_against_kubernetes_1_30(variant):
    assert_core_objects_valid(files_for(**variant))


def test_strict_validation_catches_a_misspelt_field():
    deployment = one(files_for(), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.30", strict=True)


def test_deployment_runs_serve_with_secrets_by_reference_only():
    files = files_for(hub_ca_configmap="hub-ca")
    pod = pod_of(files)
    [container] = pod["containers"]
    assert container["command"] == ["gpufleet"]
    assert container["args"] == [
        "serve", "--listen", "0.0.0.0:8080", "--every", "5m", "--workers", "2", "--hub-url", HUB,
        "--db-file", "/etc/gpufleet/db/url",
        "--token-file", "/etc/gpufleet/hub-token/token", "--ca-file", "/etc/gpufleet/hub-ca/ca.crt",
        "--tokens-file", "/etc/gpufleet/access/tokens.yaml"]
    assert "UNSAFE" not in files["deployment.yaml"]
    assert "env" not in container  # the database URL is a mounted file, never an env var
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["db-url"]["secret"] == {"secretName": "gpufleet-db", "defaultMode": 292,
                                           "items": [{"key": "url", "path": "url"}]}
    assert volumes["hub-token"]["secret"]["secretName"] == "gpufleet-hub-token"
    assert volumes["hub-ca"]["configMap"] == {"name": "hub-ca", "items": [
        {"key": "ca.crt", "path": "ca.crt"}]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["hub-token"] == {"name": "hub-token", "mountPath": "/etc/gpufleet/hub-token",
                                   "readOnly": True}
    assert mounts["hub-ca"]["mountPath"] == "/etc/gpufleet/hub-ca"
    kinds = sorted(o["kind"] for o in objects(files).values())
    assert kinds == ["Deployment", "Namespace", "NetworkPolicy", "PodDisruptionBudget",
                     "Service", "ServiceAccount", "ServiceMonitor"]
    ingress = one(files, "NetworkPolicy")["spec"]
    assert ingress["podSelector"]["matchLabels"] == one(files, "Service")["spec"]["selector"]
    assert ingress["ingress"] == [{
        "from": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "gpufleet"}}}],
        "ports": [{"protocol": "TCP", "port": 8080}]}]
    assert "Secret" not in kinds and "ConfigMap" not in kinds
    assert "stringData" not in "".join(files.values())


def test_tls_and_tokens_secrets_are_mounted_and_served(tmp_path):
    result = render(tmp_path, "--hub-url", HUB, "--tls-secret", "gpufleet-tls",
                    "--tokens-secret", "api-tokens")
    assert result.exit_code == 0, result.output
    files = files_for(tls_secret="gpufleet-tls", tokens_secret="api-tokens")
    written = snapshot(tmp_path / "out")
    assert all(written[k] == v.encode() for k, v in files.items())
    pod = pod_of(files)
    [container] = pod["containers"]
    args = container["args"]
    assert "--allow-unauthenticated" not in args and "UNSAFE" not in files["deployment.yaml"]
    assert args[args.index("--tokens-file") + 1] == "/etc/gpufleet/access/tokens.yaml"
    assert args[args.index("--tls-cert-file") + 1] == "/etc/gpufleet/tls/tls.crt"
    assert args[args.index("--tls-key-file") + 1] == "/etc/gpufleet/tls/tls.key"
    volumes = {v["name"]: v for v in pod["volumes"]}
    # whole Secret, no items: a subPath or projected item would never see a rotation
    assert volumes["tls"]["secret"] == {"secretName": "gpufleet-tls", "defaultMode": 292}
    assert volumes["access"]["secret"]["secretName"] == "api-tokens"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["tls"] == "/etc/gpufleet/tls" and mounts["access"] == "/etc/gpufleet/access"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    [endpoint] = one(files, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "gpufleet-tls", "key": "ca.crt"}
    bad = render(tmp_path, "--hub-url", HUB, "--tls-secret", "Bad_Name", out="bad")
    assert bad.exit_code == 2 and "--tls-secret" in bad.output


def test_without_token_or_ca_nothing_is_mounted_or_passed():
    files = files_for(hub_token_secret=None)
    container = pod_of(files)["containers"][0]
    assert "--token-file" not in container["args"] and "--ca-file" not in container["args"]
    assert [v["name"] for v in pod_of(files)["volumes"]] == ["tmp", "db-url", "access"]


@pytest.mark.parametrize("variant", [{}, {"kind": "cronjob"}])
def test_workloads_are_locked_down(variant):
    files = files_for(**variant)
    pod = pod_of(files)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    ctx = pod["containers"][0]["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False and ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]} and not ctx.get("privileged")
    assert one(files, "ServiceAccount")["automountServiceAccountToken"] is False
    assert one(files, "Namespace")["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "restricted"


def test_probes_service_and_servicemonitor_agree():
    files = files_for()
    container = pod_of(files)["containers"][0]
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http",
                                                      "scheme": "HTTP"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http",
                                                      "scheme": "HTTP"}
    service = one(files, "Service")
    pods = one(files, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pods.items()
    assert service["spec"]["publishNotReadyAddresses"] is True
    monitor = one(files, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["gpufleet"]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"

def test_replicas_with_a_disruption_budget_and_workers_from_the_cpu_limit():
    files = files_for()
    deployment = one(files, "Deployment")
    assert deployment["spec"]["replicas"] == 2  # one leads the schedule, both serve
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    budget = one(files, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    container = pod_of(files)["containers"][0]
    args = container["args"]
    assert args[args.index("--workers") + 1] == "2"
    assert container["resources"]["limits"]["cpu"] == "2"
    spread = pod_of(files)["topologySpreadConstraints"][0]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    for limit, workers, memory in ((4, "4", "1536Mi"), (1.5, "1", "768Mi"), (0.5, "1", "768Mi")):
        sized = files_for(cpu_limit=limit, replicas=3)
        container = pod_of(sized)["containers"][0]
        assert container["args"][container["args"].index("--workers") + 1] == workers
        assert container["resources"]["limits"] == {"cpu": f"{limit:g}", "memory": memory}
        assert one(sized, "Deployment")["spec"]["replicas"] == 3
        assert_core_objects_valid(sized)
    single = files_for(replicas=1)
    assert one(single, "PodDisruptionBudget")["spec"] == {
        "maxUnavailable": 1, "selector": budget["spec"]["selector"]}


def test_cronjob_runs_sync_on_the_derived_schedule_and_serves_nothing():
    files = files_for(kind="cronjob", every=900.0)
    cron = one(files, "CronJob")
    assert cron["spec"]["schedule"] == "*/15 * * * *"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    container = pod_of(files)["containers"][0]
    assert container["args"][0] == "sync" and "--every" not in container["args"]
    assert not [o for o in objects(files).values() if o["kind"] in ("Service", "ServiceMonitor")]


@pytest.mark.parametrize(("every", "schedule"), [
    (60, "* * * * *"), (300, "*/5 * * * *"), (1800, "*/30 * * * *"), (3600, "0 * * * *"),
    (7200, "0 */2 * * *"), (6 * 3600, "0 */6 * * *"), (86400, "0 0 * * *"),
])
def test_cron_schedules(every, schedule):
    assert cron_schedule(every) == schedule


@pytest.mark.parametrize("every", [30, 90, 7 * 60, 45 * 60, 5 * 3600, 2 * 86400])
def test_intervals_cron_cannot_keep_are_refused(every):
    with pytest.raises(InputError):
        cron_schedule(every)


def test_every_object_carries_the_recommended_labels():
    for variant in VARIANTS:
        for path, obj in objects(files_for(**variant)).items():
            labels = obj["metadata"]["labels"]
            for key in ("name", "instance", "component", "part-of", "managed-by", "version"):
                assert labels.get(f"app.kubernetes.io/{key}"), f"{path} lacks {key}"
            assert labels["app.kubernetes.io/version"] == __version__
            if obj["kind"] != "Namespace":
                assert obj["metadata"]["namespace"] == "gpufleet"


def test_kustomization_lists_every_file(tmp_path):
    for kind in ("deployment", "cronjob"):
        out = tmp_path / kind
        result = render(tmp_path, "--hub-url", HUB, "--kind", kind, *ACCESS, out=kind)
        assert result.exit_code == 0, result.output
        kustomization = yaml.safe_load((out / "kustomization.yaml").read_text())
        on_disk = sorted(p.name for p in out.glob("*.yaml") if p.name != "kustomization.yaml")
        assert sorted(kustomization["resources"]) == on_disk


def test_rendering_twice_is_byte_identical(tmp_path):
    args = ["--hub-url", HUB, "--hub-ca-configmap", "hub-ca", "--namespace", "fleet-hub",
            *ACCESS]
    assert render(tmp_path, *args, out="one").exit_code == 0
    assert render(tmp_path, *args, out="two").exit_code == 0
    first = snapshot(tmp_path / "one")
    assert first == snapshot(tmp_path / "two")
    assert render(tmp_path, *args, out="one").exit_code == 0
    assert snapshot(tmp_path / "one") == first


def test_hostile_image_is_quoted_and_cannot_add_keys(tmp_path):
    refused = render(tmp_path, "--hub-url", HUB, "--image", HOSTILE, *ACCESS, out="refused")
    assert refused.exit_code == 2 and "is not an image reference" in refused.output
    assert not (tmp_path / "refused").exists()  # a newline: no image name has one
    hostile = HOSTILE.replace("\n ", "").replace(" ", "")  # quotes and colons stay
    result = render(tmp_path, "--hub-url", HUB, "--image", hostile, *ACCESS)
    assert result.exit_code == 0, result.output

    for path in (tmp_path / "out").glob("*.yaml"):
        assert "evil" not in all_keys(yaml.safe_load(path.read_text())), path.name
    deployment = yaml.safe_load((tmp_path / "out" / "deployment.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == hostile


def test_retention_is_off_unless_asked():
    assert "--prune-stale-after" not in pod_of(files_for())["containers"][0]["args"]
    args = pod_of(files_for(prune_stale_after=90 * 86400))["containers"][0]["args"]
    assert args[args.index("--prune-stale-after") + 1] == "2160h"


def test_hub_url_with_query_characters_stays_one_argument():
    url = "https://hub.example.com/api?tenant=a&x='1'#frag:y,*z"
    args = pod_of(files_for(hub_url=url))["containers"][0]["args"]
    assert args[args.index("--hub-url") + 1] == url


@pytest.mark.parametrize(("args", "message"), [
    ([], "--hub-url is required"),
    (["--hub-url", HOSTILE], "spaces or control characters"),
    (["--hub-url", "ftp://hub/"], "http(s)"),
    (["--hub-url", "https://user:pw@hub.example.com/"], "must not carry credentials"),
    (["--hub-url", HUB, "--kind", "statefulset"], "unknown kind"),
    (["--hub-url", HUB, "--namespace", "Fleet Hub"], "DNS-1123"),
    (["--hub-url", HUB, "--every", "soon"], "--every: invalid duration"),
    (["--hub-url", HUB, "--every", "0s"], "--every must be at least 1s"),
    (["--hub-url", HUB, "--kind", "cronjob", "--every", "45m"], "cannot be a cron schedule"),
    (["--hub-url", HUB, "--kind", "cronjob", "--every", "30s"], "not whole minutes"),
    (["--hub-url", HUB, "--db-secret", "DB_Secret"], "--db-secret"),
    (["--hub-url", HUB, "--db-secret", ""], "--db-secret"),
    (["--hub-url", HUB, "--hub-token-secret", "a b"], "--hub-token-secret"),
    (["--hub-url", HUB, "--hub-ca-configmap", "ca\nx"], "--hub-ca-configmap"),
    (["--hub-url", HUB, "--hub-ca-configmap", "ca", "--hub-ca-key", "../x"], "--hub-ca-key"),
    (["--hub-url", HUB, "--image", "{{ evil }}"], "templates"),
    (["--hub-url", HUB, "--prune-stale-after", "90m"], "at least 1d"),
    (["--hub-url", HUB, "--kind", "cronjob", "--prune-stale-after", "90d"],
     "needs --kind deployment"),
    (["--hub-url", HUB, "--image", ""], "--image must not be empty"),
    (["--hub-url", HUB], "the service would answer anyone who reaches it"),
    (["--hub-url", HUB, "--tokens-secret", "t", "--allow-unauthenticated"], "contradicts"),
    (["--hub-url", HUB, "--oidc-issuer", "https://sso.example.com"], "--oidc-audience"),
    (["--hub-url", HUB, "--oidc-issuer", "http://sso.example.com", "--oidc-audience", "a",
      "--scopes-configmap", "s"], "https://"),
    (["--hub-url", HUB, "--oidc-issuer", "https://sso.example.com", "--oidc-audience", "a"],
     "--scopes-configmap"),
    (["--hub-url", HUB, "--oidc-audience", "a", *ACCESS], "need --oidc-issuer"),
    (["--hub-url", HUB, *ACCESS, "--allow-from-namespace", "Open Sesame"],
     "--allow-from-namespace"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message):
    result = render(tmp_path, *args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1
    assert message in result.output
    assert list(tmp_path.iterdir()) == []


def test_missing_out_is_an_input_error():
    result = run("hub", "render", "--hub-url", HUB)
    assert result.exit_code == 2 and result.output == "error: --out DIR is required\n"


def test_refuses_to_replace_a_directory_it_did_not_write(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    result = render(tmp_path, "--hub-url", HUB, *ACCESS)
    assert result.exit_code == 2 and "not written by gpufleet" in result.output
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["notes.txt"]


def test_options_come_from_the_environment_and_config_file(tmp_path):
    env = {"GPUFLEET_HUB_URL": HUB, "GPUFLEET_HUB_KIND": "cronjob", "GPUFLEET_EVERY": "1h"}
    result = run("hub", "render", "--out", str(tmp_path / "env"), env=env)
    assert result.exit_code == 0, result.output
    cron = yaml.safe_load((tmp_path / "env" / "cronjob.yaml").read_text())
    assert cron["spec"]["schedule"] == "0 * * * *"
    config = tmp_path / "gpufleet.yaml"
    config.write_text(yaml.safe_dump({"hub-url": HUB, "db-secret": "inventory-pg",
                                      "every": "10m", "tokens-secret": "api-tokens"}))
    result = run("hub", "render", "--config", str(config), "--out", str(tmp_path / "cfg"))
    assert result.exit_code == 0, result.output
    deployment = yaml.safe_load((tmp_path / "cfg" / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["db-url"]["secret"]["secretName"] == "inventory-pg"
    assert container["args"][container["args"].index("--every") + 1] == "10m"


def test_a_deployment_requires_a_token_unless_told_otherwise_loudly(tmp_path):
    refused = render(tmp_path, "--hub-url", HUB, out="open")
    assert refused.exit_code == 2 and "--allow-unauthenticated" in refused.output
    assert not (tmp_path / "open").exists()
    result = render(tmp_path, "--hub-url", HUB, "--allow-unauthenticated", out="open")
    assert result.exit_code == 0, result.output
    assert "WARNING: rendered with --allow-unauthenticated" in result.stderr
    deployment = (tmp_path / "open" / "deployment.yaml").read_text()
    assert "# UNSAFE (rendered with --allow-unauthenticated)" in deployment
    args = yaml.safe_load(deployment)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-1] == "--allow-unauthenticated" and "--tokens-file" not in args
    # a CronJob serves nothing: no access to decide
    assert render(tmp_path, "--hub-url", HUB, "--kind", "cronjob", out="cron").exit_code == 0


def test_oidc_is_passed_to_serve_with_its_scopes_mounted():
    files = files_for(tokens_secret=None, **OIDC, oidc_scope_claim="roles")
    pod = pod_of(files)
    [container] = pod["containers"]
    args = container["args"]
    assert args[args.index("--oidc-issuer"):] == [
        "--oidc-issuer", OIDC["oidc_issuer"], "--oidc-audience", "gpufleet",
        "--oidc-scope-claim", "roles", "--scopes-file", "/etc/gpufleet/oidc-scopes/scopes.yaml"]
    assert "--allow-unauthenticated" not in args and "--tokens-file" not in args
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["oidc-scopes"]["configMap"] == {"name": "gpufleet-scopes", "items": [
        {"key": "scopes.yaml", "path": "scopes.yaml"}]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["oidc-scopes"] == "/etc/gpufleet/oidc-scopes"
    both = pod_of(files_for(**OIDC))["containers"][0]["args"]  # tokens and OIDC together
    assert "--tokens-file" in both and "--oidc-issuer" in both


def test_the_network_policy_admits_only_the_namespaces_given(tmp_path):
    def admitted(files: dict[str, str]) -> list[str]:
        [rule] = one(files, "NetworkPolicy")["spec"]["ingress"]
        assert rule["from"], "an empty from would admit every source"
        assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]
        return [peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                for peer in rule["from"]]

    assert admitted(files_for()) == ["gpufleet"]
    assert admitted(files_for(namespace="fleet-hub")) == ["fleet-hub"]
    given = ["openshift-ingress", "openshift-monitoring", "openshift-ingress"]
    assert admitted(files_for(allow_from_namespaces=given)) == [
        "openshift-ingress", "openshift-monitoring"]
    result = render(tmp_path, "--hub-url", HUB, *ACCESS, "--allow-from-namespace",
                    "openshift-ingress", "--allow-from-namespace", "openshift-monitoring")
    assert result.exit_code == 0, result.output
    assert "admits pods of namespace(s): openshift-ingress, openshift-monitoring" in \
        result.stderr
    assert admitted({"networkpolicy.yaml": (tmp_path / "out" / "networkpolicy.yaml")
                     .read_text()}) == ["openshift-ingress", "openshift-monitoring"]


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.get("kind") != "cronjob"])
def test_the_deployments_arguments_are_options_serve_has(variant):
    """What `hub render` passes is what `gpufleet serve` parses: a renamed or dropped serve
    option fails here, not in a crash-looping pod."""
    import click

    from hub.commands.service import serve

    args = pod_of(files_for(**variant))["containers"][0]["args"]
    assert args[0] == "serve"
    known = {o for p in serve.params if isinstance(p, click.Option) for o in p.opts}
    assert {a for a in args[1:] if a.startswith("--")} <= known
    # the files the options name exist only in the pod: parse without their callbacks
    ctx = serve.make_context("serve", list(args[1:]), resilient_parsing=True)
    expected = {"tokens_file": "tokens_secret", "oidc_issuer": "oidc_issuer",
                "allow_unauthenticated": "allow_unauthenticated"}
    for param, option in expected.items():
        assert bool(ctx.params.get(param)) == bool(
            {"tokens_secret": "api-tokens", **variant}.get(option)), param


def test_forwarded_allow_ips_reaches_serve_and_a_bad_one_writes_nothing(tmp_path):
    result = render(tmp_path, "--hub-url", HUB, *ACCESS, "--forwarded-allow-ips",
                    "10.128.0.0/14, fd01::/48")
    assert result.exit_code == 0, result.output
    deployment = yaml.safe_load((tmp_path / "out" / "deployment.yaml").read_text())
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--forwarded-allow-ips") + 1] == "10.128.0.0/14,fd01::/48"
    plain = render(tmp_path, "--hub-url", HUB, *ACCESS, out="plain")
    assert "--forwarded-allow-ips" not in (tmp_path / "plain" / "deployment.yaml").read_text()
    assert plain.exit_code == 0
    bad = render(tmp_path, "--hub-url", HUB, *ACCESS, "--forwarded-allow-ips", "router",
                 out="bad")
    assert bad.exit_code == 2 and "'router' is not an IP address or network" in bad.output
    assert not (tmp_path / "bad").exists()
