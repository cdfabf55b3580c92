"""Render what a spoke cluster installs to join the fleet, and the ACM policies that install it.

Plain functions, values in and ``{relative path: text}`` out; only :func:`write_tree` touches
the disk. The manifests live as Jinja2 templates in ``templates/`` and ``policies/`` at the
repository top (``hub/_bundled/...`` inside a wheel) so that reviewers read YAML, not Python.

Two rules keep the output safe to apply and to diff in a pull request:

* every user-supplied value goes through the ``q`` filter, which emits a quoted YAML scalar, so
  no value (a URL, an image reference) can add keys or documents to a manifest;
* output is a pure function of the values (sorted keys, no timestamps), so rendering twice gives
  byte-identical files and a re-render shows only real changes.

Jinja2 and ACM hub templates both use ``{{ }}``. ACM expressions such as
``{{hub .ManagedClusterName hub}}`` never appear in template source, where Jinja2 would evaluate
them: :func:`acm_hub` builds them in Python and they enter the templates as ordinary values,
which Jinja2 copies verbatim. The tests check that the rendered policy contains them literally.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jinja2
import yaml

from hub import __version__
from hub.common._durations import format_duration
from hub.common._errors import InputError, UnavailableError
from hub.store._vendors import allowlist_metrics

VENDORS = ("nvidia", "amd")
MODES = ("remote-write", "acm")
EXPORTERS = ("upstream", "builtin")
MONITORING = ("platform", "user-workload")
PLATFORMS = ("kubernetes", "openshift")
REMEDIATIONS = ("inform", "enforce")

DEFAULT_AGENT_IMAGE = "quay.io/prometheus/prometheus:v2.53.1"
DEFAULT_EXPORTER_IMAGE = f"ghcr.io/gpufleet/gpufleet:{__version__}"
DEFAULT_NAMESPACE = "gpufleet"
DEFAULT_POLICY_NAMESPACE = "gpufleet-policies"
DEFAULT_SECRET = "gpufleet-remote-write"
DEFAULT_PLACEMENT_LABEL = ("gpufleet.io/onboard", "true")
BUILTIN_PORT = 9400
ACM_OBSERVABILITY_NAMESPACE = "open-cluster-management-observability"
ALLOWLIST_CONFIGMAP = "observability-metrics-custom-allowlist"
#: Where the agent finds the remote-write credentials; the Secret is mounted here.
CREDENTIALS_DIR = "/etc/gpufleet/remote-write"
#: Written into every rendered directory: only a directory carrying it is ever replaced.
MARKER = ".gpufleet-rendered"

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
PLAIN_KEY = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./]*$")


@dataclass(frozen=True)
class VendorDeployment:
    """How an exporter of one vendor is scheduled and where the upstream one usually lives."""

    node_selector: tuple[tuple[str, str], ...]
    toleration: str
    backend: str  # `gpufleet exporter --backend`
    upstream_namespace: str
    upstream_selector: tuple[tuple[str, str], ...]
    upstream_port: int


VENDOR_DEPLOYMENT: dict[str, VendorDeployment] = {
    # GPU feature discovery (GPU Operator) labels GPU nodes; dcgm-exporter listens on 9400.
    "nvidia": VendorDeployment(
        node_selector=(("nvidia.com/gpu.present", "true"),),
        toleration="nvidia.com/gpu",
        backend="nvml",
        upstream_namespace="nvidia-gpu-operator",
        upstream_selector=(("app", "nvidia-dcgm-exporter"),),
        upstream_port=9400,
    ),
    # Node Feature Discovery's AMD rule; device-metrics-exporter listens on 5000. The upstream
    # pod label differs between AMD GPU operator releases: check it and pass
    # --exporter-selector when it is not this one.
    "amd": VendorDeployment(
        node_selector=(("feature.node.kubernetes.io/amd-gpu", "true"),),
        toleration="amd.com/gpu",
        backend="amdsmi",
        upstream_namespace="kube-amd-gpu",
        upstream_selector=(("app.kubernetes.io/name", "metrics-exporter"),),
        upstream_port=5000,
    ),
}


# ---------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True)
class SpokeValues:
    """Everything that varies between two spokes' manifests."""

    cluster: str
    vendor: str
    mode: str = "remote-write"
    exporter: str = "upstream"
    remote_write_url: str | None = None
    remote_write_secret: str = DEFAULT_SECRET
    monitoring: str = "platform"
    platform: str = "kubernetes"
    namespace: str = DEFAULT_NAMESPACE
    exporter_namespace: str | None = None
    exporter_selector: tuple[tuple[str, str], ...] = ()
    agent_image: str = DEFAULT_AGENT_IMAGE
    exporter_image: str = DEFAULT_EXPORTER_IMAGE
    #: Set only for ACM policies: the Secret's data come from the hub (``fromSecret``).
    secret_data: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PolicyValues:
    """An ACM Policy that installs a spoke's manifests on every cluster its Placement selects."""

    spoke: SpokeValues
    namespace: str = DEFAULT_POLICY_NAMESPACE
    placement_labels: tuple[tuple[str, str], ...] = (DEFAULT_PLACEMENT_LABEL,)
    remediation: str = "inform"
    cluster_set: str = "default"
    name: str = ""  # default: gpufleet-onboard-<vendor>

    @property
    def policy_name(self) -> str:
        return self.name or f"gpufleet-onboard-{self.spoke.vendor}"


def acm_hub(expression: str) -> str:
    """An ACM hub template (``{{hub EXPR hub}}``) as a plain string value.

    The ACM policy framework resolves it on the hub, per managed cluster, before the policy
    reaches the cluster. Built here, never written in a Jinja2 template, so Jinja2 only copies it.
    """
    return "{{hub " + expression + " hub}}"


def acm_from_secret(namespace: str, name: str, key: str) -> str:
    """Hub template reading one key of a hub-side Secret (already base64, as Secret.data wants).

    Hub templates may only read objects in the policy's own namespace, so the Secret lives there.
    """
    return acm_hub(f'fromSecret "{namespace}" "{name}" "{key}"')


def _choice(value: str | None, choices: tuple[str, ...], what: str) -> str:
    text = (value or "").strip().lower()
    if not text:
        raise InputError(f"{what} is required: choose one of {', '.join(choices)}")
    if text not in choices:
        raise InputError(f"unknown {what} {value!r}: choose one of {', '.join(choices)}")
    return text


def dns_label(value: str | None, what: str) -> str:
    text = value or ""
    if len(text) > 63 or not DNS_LABEL.match(text):
        raise InputError(
            f"{what} {text!r} is not a valid DNS-1123 label "
            "(lower-case letters, digits and '-', at most 63 characters)"
        )
    return text


def _dns_subdomain(value: str, what: str) -> str:
    if len(value) > 253 or not DNS_SUBDOMAIN.match(value):
        raise InputError(f"{what} {value!r} is not a valid DNS-1123 subdomain")
    return value


def _no_templates(value: str, what: str) -> str:
    # ACM would evaluate "{{ ... }}" inside a policy; no user value has a reason to hold one.
    if "{{" in value or "}}" in value:
        raise InputError(f"{what} must not contain '{{{{' or '}}}}' (ACM reads them as templates)")
    return value


def label_pair(text: str, what: str = "label") -> tuple[str, str]:
    """Parse and check ``KEY=VALUE`` with Kubernetes label syntax."""
    key, sep, value = text.partition("=")
    if not sep:
        raise InputError(f"{what} {text!r} must be KEY=VALUE")
    prefix, slash, name = key.rpartition("/")
    ok = bool(LABEL_NAME.match(name)) and len(name) <= 63
    if slash:
        ok = ok and len(prefix) <= 253 and bool(DNS_SUBDOMAIN.match(prefix))
    if not ok:
        raise InputError(f"{what} key {key!r} is not a valid Kubernetes label key")
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise InputError(f"{what} value {value!r} is not a valid Kubernetes label value")
    return key, value


def _url(value: str | None) -> str:
    text = (value or "").strip()
    if not text:
        raise InputError("--remote-write-url is required in remote-write mode "
                         "(the hub's receive endpoint, e.g. https://receive.example.com/api/v1/receive)")
    if any(ch.isspace() or not ch.isprintable() for ch in text):
        raise InputError("--remote-write-url must not contain spaces or control characters")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"--remote-write-url {text!r} must be an http(s) URL with a host")
    if parts.username or parts.password:
        raise InputError("--remote-write-url must not carry credentials; "
                         "they belong in the remote-write Secret")
    return _no_templates(text, "--remote-write-url")


def _image(value: str | None, what: str) -> str:
    text = value or ""
    if not text.strip():
        raise InputError(f"{what} must not be empty")
    return _no_templates(text, what)


def spoke_values(
    *,
    cluster: str | None,
    vendor: str | None,
    mode: str | None = "remote-write",
    exporter: str | None = "upstream",
    remote_write_url: str | None = None,
    remote_write_secret: str | None = DEFAULT_SECRET,
    monitoring: str | None = "platform",
    platform: str | None = None,
    namespace: str | None = DEFAULT_NAMESPACE,
    exporter_namespace: str | None = None,
    exporter_selector: Iterable[str] = (),
    agent_image: str | None = DEFAULT_AGENT_IMAGE,
    exporter_image: str | None = DEFAULT_EXPORTER_IMAGE,
    cluster_is_template: bool = False,
) -> SpokeValues:
    """Check raw option values and build :class:`SpokeValues`; InputError names the bad one."""
    vendor_ = _choice(vendor, VENDORS, "vendor")
    mode_ = _choice(mode, MODES, "mode")
    exporter_ = _choice(exporter, EXPORTERS, "exporter")
    monitoring_ = _choice(monitoring, MONITORING, "monitoring stack")
    # ACM Observability collects through OpenShift monitoring: acm implies OpenShift.
    platform_ = _choice(platform or ("openshift" if mode_ == "acm" else "kubernetes"),
                        PLATFORMS, "platform")
    cluster_ = cluster or ""
    if not cluster_is_template:
        cluster_ = dns_label(cluster, "cluster name")
    namespace_ = dns_label(namespace, "namespace")
    deployment = VENDOR_DEPLOYMENT[vendor_]
    if exporter_ == "builtin":
        exporter_ns = dns_label(exporter_namespace or namespace_, "exporter namespace")
    else:
        exporter_ns = dns_label(exporter_namespace or deployment.upstream_namespace,
                                 "exporter namespace")
    selector = tuple(sorted(label_pair(s, "exporter selector") for s in exporter_selector))
    url = _url(remote_write_url) if mode_ == "remote-write" else None
    secret = _dns_subdomain(remote_write_secret or "", "remote-write Secret name")
    return SpokeValues(
        cluster=cluster_,
        vendor=vendor_,
        mode=mode_,
        exporter=exporter_,
        remote_write_url=url,
        remote_write_secret=secret,
        monitoring=monitoring_,
        platform=platform_,
        namespace=namespace_,
        exporter_namespace=exporter_ns,
        exporter_selector=selector,
        agent_image=_image(agent_image, "--agent-image"),
        exporter_image=_image(exporter_image, "--exporter-image"),
    )


def policy_values(
    spoke: SpokeValues,
    *,
    namespace: str | None = DEFAULT_POLICY_NAMESPACE,
    placement_labels: Iterable[str] = (),
    remediation: str | None = "inform",
    cluster_set: str | None = "default",
) -> PolicyValues:
    """Check the policy's own options; the spoke values must come from :func:`policy_spoke`."""
    namespace_ = dns_label(namespace, "policy namespace")
    labels = tuple(sorted(dict(label_pair(s, "placement label") for s in placement_labels).items()))
    values = PolicyValues(
        spoke=spoke,
        namespace=namespace_,
        placement_labels=labels or (DEFAULT_PLACEMENT_LABEL,),
        remediation=_choice(remediation, REMEDIATIONS, "remediation action"),
        cluster_set=dns_label(cluster_set, "cluster set"),
    )
    # ACM copies a policy into each cluster namespace as "<namespace>.<name>", which must stay
    # a valid label value: namespace and name together may have at most 62 characters.
    if len(values.namespace) + len(values.policy_name) > 62:
        raise InputError(f"policy namespace {namespace_!r} is too long: ACM needs the namespace "
                         "and the policy name to fit in 62 characters together")
    return values


def policy_spoke(policy_namespace: str | None = DEFAULT_POLICY_NAMESPACE,
                 **options: Any) -> SpokeValues:
    """Spoke values for a policy: per-cluster values become ACM hub templates.

    One policy serves every selected cluster, so the cluster name comes from
    ``.ManagedClusterName`` and the remote-write credentials from a hub-side Secret in the
    policy namespace, resolved by ACM on the hub; no secret value is ever in the rendered files.
    """
    ns = dns_label(policy_namespace, "policy namespace")
    values = spoke_values(cluster=acm_hub(".ManagedClusterName"), cluster_is_template=True,
                          **options)
    if values.mode != "remote-write":
        return values
    data = tuple((key, acm_from_secret(ns, values.remote_write_secret, key))
                 for key in ("ca.crt", "token"))
    return replace(values, secret_data=data)


# ---------------------------------------------------------------------------------------------
# Templates


def template_roots() -> tuple[Path, Path]:
    """(templates, policies) directories: bundled in a wheel, at the repo top in a checkout."""
    package = Path(__file__).resolve().parents[1]  # hub/
    for base in (package / "_bundled", package.parent):
        templates, policies = base / "templates", base / "policies"
        if (templates / "spoke").is_dir() and policies.is_dir():
            return templates, policies
    raise UnavailableError(f"gpufleet templates not found next to {package} (broken installation?)")


def yaml_quote(value: Any) -> str:
    """A YAML scalar that always parses back to ``str(value)``: no value can add keys.

    Double-quoted as a rule; single-quoted when the text holds ``"`` but nothing that needs an
    escape, so ACM's ``{{hub fromSecret "ns" ...}}`` stays readable in the file.
    """
    text = str(value)
    if text.isprintable():
        if '"' not in text and "\\" not in text:
            return '"' + text + '"'
        if "'" not in text:
            return "'" + text + "'"
    dumped = yaml.safe_dump(text, default_style='"', width=1 << 30, allow_unicode=False)
    return dumped.removesuffix("\n...\n").rstrip("\n")


def yaml_mapping(mapping: Mapping[str, Any], indent: int) -> str:
    """Lines ``key: "value"`` at ``indent`` spaces, sorted, for labels and selectors."""
    pad = " " * indent
    lines = []
    for key in sorted(mapping):
        shown = key if PLAIN_KEY.match(key) else yaml_quote(key)
        lines.append(f"{pad}{shown}: {yaml_quote(mapping[key])}")
    return "\n".join(lines)


@cache
def _environment(templates: Path, policies: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PrefixLoader({
            "templates": jinja2.FileSystemLoader(str(templates)),
            "policies": jinja2.FileSystemLoader(str(policies)),
        }),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = yaml_quote
    env.filters["mapping"] = yaml_mapping
    return env


def _render(template: str, /, **context: Any) -> str:
    env = _environment(*template_roots())
    text = env.get_template(template).render(version=__version__, **context)
    return text.rstrip("\n") + "\n"


def _labels(name: str, component: str, instance: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "gpufleet",
        "app.kubernetes.io/managed-by": "gpufleet",
        "app.kubernetes.io/version": __version__,
    }


def _selector(name: str, instance: str) -> dict[str, str]:
    # Only labels that never change: a Deployment's selector is immutable.
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": instance}


def metrics_keep_regex() -> str:
    """The agent's keep filter, from the same list as the ACM allowlist (never a second list)."""
    return "|".join(re.escape(name) for name in allowlist_metrics())


# Apply order: a namespace before what lives in it; ACM object-templates follow it too.
_SPOKE_ORDER = [
    "namespace.yaml",
    "agent-serviceaccount.yaml",
    "agent-role.yaml",
    "agent-rolebinding.yaml",
    "remote-write-secret.yaml",
    "agent-config.yaml",
    "exporter-serviceaccount.yaml",
    "exporter-service.yaml",
    "exporter-networkpolicy.yaml",
    "exporter-daemonset.yaml",
    "servicemonitor.yaml",
    "agent-deployment.yaml",
]


def _spoke_context(values: SpokeValues) -> dict[str, Any]:
    deployment = VENDOR_DEPLOYMENT[values.vendor]
    instance = values.namespace
    builtin = values.exporter == "builtin"
    exporter_pods = (
        _selector("gpufleet-exporter", instance) if builtin
        else dict(values.exporter_selector or deployment.upstream_selector)
    )
    if values.mode == "acm":
        # The cluster's own Prometheus scrapes: platform or user-workload monitoring.
        scraper_namespace = ("openshift-monitoring" if values.monitoring == "platform"
                             else "openshift-user-workload-monitoring")
        scraper_pods = {"app.kubernetes.io/name": "prometheus"}
    else:
        scraper_namespace = values.namespace
        scraper_pods = _selector("gpufleet-agent", instance)
    port = BUILTIN_PORT if builtin else deployment.upstream_port
    return {
        "v": values,
        "deployment": deployment,
        "builtin": builtin,
        "instance": instance,
        "labels": lambda name, component: _labels(name, component, instance),
        "selector": lambda name: _selector(name, instance),
        "exporter_pods": exporter_pods,
        "exporter_port": port,
        "exporter_namespace": values.exporter_namespace or values.namespace,
        "exporter_service_dns": (
            f"gpufleet-exporter.{values.exporter_namespace or values.namespace}.svc"
        ),
        "scraper_namespace": scraper_namespace,
        "scraper_pods": scraper_pods,
        "node_selector": dict(deployment.node_selector),
        "keep_regex": metrics_keep_regex(),
        "credentials_dir": CREDENTIALS_DIR,
        "secret_data": dict(values.secret_data),
    }


def _spoke_names(values: SpokeValues) -> list[str]:
    builtin = values.exporter == "builtin"
    names = {"namespace.yaml", "exporter-service.yaml", "exporter-networkpolicy.yaml"}
    if builtin:
        names |= {"exporter-serviceaccount.yaml", "exporter-daemonset.yaml"}
    if values.mode == "remote-write":
        names |= {"agent-serviceaccount.yaml", "agent-role.yaml", "agent-rolebinding.yaml",
                  "agent-config.yaml", "agent-deployment.yaml"}
        if values.secret_data:
            names.add("remote-write-secret.yaml")
    else:
        names.add("servicemonitor.yaml")
    return [n for n in _SPOKE_ORDER if n in names]


def agent_config(values: SpokeValues) -> str:
    """The Prometheus agent's prometheus.yml (also checked on its own by promtool in tests)."""
    return _render("templates/spoke/prometheus-agent.yml.j2", **_spoke_context(values))


def spoke_manifests(values: SpokeValues) -> dict[str, str]:
    """The Kubernetes objects of one spoke, one per file, in apply order (no kustomization)."""
    context = _spoke_context(values)
    files: dict[str, str] = {}
    if values.mode == "remote-write":
        config = agent_config(values)
        context["agent_config"] = config
        context["config_checksum"] = hashlib.sha256(config.encode()).hexdigest()
    for name in _spoke_names(values):
        files[name] = _render(f"templates/spoke/{name}.j2", **context)
    return files


def _kustomization(files: Iterable[str]) -> str:
    return _render("templates/common/kustomization.yaml.j2", resources=list(files))


def hub_allowlist(monitoring: str = "platform") -> str:
    """The ACM allowlist ConfigMap: one hub-wide list for both vendors."""
    key = "metrics_list.yaml" if monitoring == "platform" else "uwl_metrics_list.yaml"
    return _render(
        "templates/hub/metrics-allowlist.yaml.j2",
        name=ALLOWLIST_CONFIGMAP,
        namespace=ACM_OBSERVABILITY_NAMESPACE,
        key=key,
        metrics=allowlist_metrics(),
        labels=_labels("gpufleet-metrics-allowlist", "allowlist", "gpufleet"),
    )


def render_spoke(values: SpokeValues) -> dict[str, str]:
    """All files of ``gpufleet spoke render``: relative path -> text."""
    manifests = spoke_manifests(values)
    if values.mode == "remote-write":
        return {**manifests, "kustomization.yaml": _kustomization(manifests)}
    hub = {"metrics-allowlist.yaml": hub_allowlist(values.monitoring)}
    files = {f"hub/{name}": text for name, text in hub.items()}
    files["hub/kustomization.yaml"] = _kustomization(hub)
    files.update({f"spoke/{name}": text for name, text in manifests.items()})
    files["spoke/kustomization.yaml"] = _kustomization(manifests)
    return files


def render_policy(values: PolicyValues) -> dict[str, str]:
    """All files of ``gpufleet policy render``: the hub-side ACM objects, in apply order."""
    name = values.policy_name
    objects = [{"path": path, "text": text} for path, text in spoke_manifests(values.spoke).items()]
    context = {
        "name": name,
        "namespace": values.namespace,
        "cluster_set": values.cluster_set,
        "remediation": values.remediation,
        "placement_labels": dict(values.placement_labels),
        "objects": objects,
        "spoke": values.spoke,
        "labels": lambda component: _labels(name, component, name),
    }
    files = {
        "namespace.yaml": _render("templates/common/namespace.yaml.j2", ns_name=values.namespace,
                                  ns_labels=_labels(name, "policy", name)),
        "managedclustersetbinding.yaml": _render("policies/managedclustersetbinding.yaml.j2",
                                                 **context),
        "placement.yaml": _render("policies/placement.yaml.j2", **context),
        "policy.yaml": _render("policies/policy.yaml.j2", **context),
        "placementbinding.yaml": _render("policies/placementbinding.yaml.j2", **context),
    }
    files["kustomization.yaml"] = _kustomization(files)
    return files


# ---------------------------------------------------------------------------------------------
# Writing


def write_tree(files: Mapping[str, str], out: str | Path) -> Path:
    """Write ``files`` under directory ``out``, all or nothing.

    Everything is written into a temporary directory beside ``out`` first, so a failure never
    leaves half a set of manifests. A new ``out`` is that directory renamed into place. An
    existing one keeps its inode (a shell or editor inside it stays valid): its entries are
    swapped for the new ones by renames, undone if one fails. It is replaced only when empty or
    written by gpufleet (it holds the marker file); anything else is refused, never deleted.
    """
    try:
        # abspath, not resolve: "." gets a real name, and a symlinked --out stays a link.
        target = Path(os.path.abspath(out))
    except OSError:
        raise InputError("the current directory no longer exists") from None
    if target.exists() and not target.is_dir():
        raise InputError(f"--out {out} exists and is not a directory")
    existing = target.is_dir()
    if existing and any(target.iterdir()) and not (target / MARKER).is_file():
        raise InputError(f"--out {out} is not empty and was not written by gpufleet: "
                         "choose a new or empty directory")
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent))
    except OSError as exc:
        raise InputError(f"cannot write to {parent}: {exc.strerror}") from None
    try:
        for rel, text in sorted(files.items()):
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        (staging / MARKER).write_text(
            "Rendered by gpufleet. Re-rendering replaces every file in this directory.\n")
        if existing:
            _swap_entries(target, staging)
        else:
            staging.chmod(0o755)
            os.rename(staging, target)
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _swap_entries(target: Path, staging: Path) -> None:
    """Replace target's entries with staging's by renames; on failure put the old ones back."""
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    moved_out: list[str] = []
    moved_in: list[str] = []
    try:
        for entry in sorted(target.iterdir()):
            os.rename(entry, old / entry.name)
            moved_out.append(entry.name)
        for entry in sorted(staging.iterdir()):
            os.rename(entry, target / entry.name)
            moved_in.append(entry.name)
    except OSError:
        for name in moved_in:
            os.rename(target / name, staging / name)
        for name in moved_out:
            os.rename(old / name, target / name)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


# -- the service's own deployment (`gpufleet hub render`) ---------------------------------------
KINDS = ("deployment", "cronjob")
DEFAULT_EVERY = 300.0  # the service's default sync interval (gpufleet serve --every)
DEFAULT_DB_SECRET = "gpufleet-db"
DEFAULT_TOKEN_SECRET = "gpufleet-hub-token"
DB_SECRET_KEY = "url"
TOKEN_KEY = "token"
DEFAULT_CA_KEY = "ca.crt"
SERVICE_PORT = 8080
TOKEN_DIR = "/etc/gpufleet/hub-token"
CA_DIR = "/etc/gpufleet/hub-ca"
HUB_NAME = "gpufleet-hub"


@dataclass(frozen=True)
class HubServiceValues:
    """Everything that varies in the hub service's manifests; secrets only by name."""

    hub_url: str
    namespace: str = DEFAULT_NAMESPACE
    image: str = DEFAULT_EXPORTER_IMAGE
    kind: str = "deployment"
    every: float = DEFAULT_EVERY
    db_secret: str = DEFAULT_DB_SECRET
    hub_token_secret: str | None = DEFAULT_TOKEN_SECRET
    hub_ca_configmap: str | None = None
    hub_ca_key: str = DEFAULT_CA_KEY


def cron_schedule(every: float) -> str:
    """A cron schedule that fires every ``every`` seconds, when cron can say it exactly.

    Cron counts minutes within the hour and hours within the day, so only divisors of 60
    minutes or of 24 hours repeat evenly; anything else would drift at the hour or day
    boundary and is refused rather than approximated.
    """
    hint = ("use a divisor of 60 minutes (1m, 2m, 5m, 10m, 15m, 30m) or of 24 hours "
            "(1h, 2h, 3h, 4h, 6h, 8h, 12h, 24h)")
    if every < 60 or every % 60:
        raise InputError(f"--every {format_duration(every)} is not whole minutes: a CronJob "
                         f"runs at most once a minute; {hint}")
    minutes = int(every // 60)
    if minutes < 60 and 60 % minutes == 0:
        return "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"
    if minutes % 60 == 0:
        hours = minutes // 60
        if hours == 24:
            return "0 0 * * *"
        if hours < 24 and 24 % hours == 0:
            return "0 * * * *" if hours == 1 else f"0 */{hours} * * *"
    raise InputError(f"--every {format_duration(every)} cannot be a cron schedule; {hint}")


def _hub_url(value: str | None) -> str:
    text = (value or "").strip()
    if not text:
        raise InputError("--hub-url is required: the PromQL endpoint the service queries "
                         "(e.g. the rbac-query-proxy route of ACM Observability)")
    if any(ch.isspace() or not ch.isprintable() for ch in text):
        raise InputError("--hub-url must not contain spaces or control characters")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError("--hub-url must be an http(s) URL with a host")
    if parts.username or parts.password:
        raise InputError("--hub-url must not carry credentials; the token comes from "
                         "--hub-token-secret")
    return text


def hub_service_values(*, hub_url: str | None, namespace: str | None = DEFAULT_NAMESPACE,
                       image: str | None = DEFAULT_EXPORTER_IMAGE,
                       kind: str | None = "deployment", every: float = DEFAULT_EVERY,
                       db_secret: str | None = DEFAULT_DB_SECRET,
                       hub_token_secret: str | None = DEFAULT_TOKEN_SECRET,
                       hub_ca_configmap: str | None = None,
                       hub_ca_key: str | None = DEFAULT_CA_KEY) -> HubServiceValues:
    """Check raw option values; InputError names the bad one. Empty secret names mean none."""
    kind_ = _choice(kind, KINDS, "kind")
    if every < 1:
        raise InputError("--every must be at least 1s")
    if kind_ == "cronjob":
        cron_schedule(every)
    token = hub_token_secret or None
    ca = hub_ca_configmap or None
    key = hub_ca_key or ""
    if not PLAIN_KEY.match(key) or "/" in key or len(key) > 253:
        raise InputError(f"--hub-ca-key {key!r} is not a valid ConfigMap key")
    return HubServiceValues(
        hub_url=_hub_url(hub_url),
        namespace=dns_label(namespace, "namespace"),
        image=_image(image, "--image"),
        kind=kind_,
        every=float(every),
        db_secret=_dns_subdomain(db_secret or "", "--db-secret"),
        hub_token_secret=_dns_subdomain(token, "--hub-token-secret") if token else None,
        hub_ca_configmap=_dns_subdomain(ca, "--hub-ca-configmap") if ca else None,
        hub_ca_key=key,
    )


def _hub_args(values: HubServiceValues) -> list[str]:
    args = ["--hub-url", values.hub_url]
    if values.hub_token_secret:
        args += ["--token-file", f"{TOKEN_DIR}/{TOKEN_KEY}"]
    if values.hub_ca_configmap:
        args += ["--ca-file", f"{CA_DIR}/{values.hub_ca_key}"]
    return args


def render_hub_service(values: HubServiceValues) -> dict[str, str]:
    """All files of ``gpufleet hub render``: relative path -> text, in apply order.

    A Deployment runs ``gpufleet serve`` with a Service and ServiceMonitor for its /metrics;
    a CronJob runs ``gpufleet sync`` and has nothing to scrape, so it gets neither.
    """
    every = format_duration(values.every)
    if values.kind == "deployment":
        args = ["serve", "--listen", f"0.0.0.0:{SERVICE_PORT}", "--every", every,
                *_hub_args(values)]
    else:
        args = ["sync", *_hub_args(values)]
    context = {
        "v": values,
        "name": HUB_NAME,
        "labels": _labels(HUB_NAME, "hub", values.namespace),
        "selector": _selector(HUB_NAME, values.namespace),
        "args": args,
        "port": SERVICE_PORT,
        "every": every,
        "schedule": cron_schedule(values.every) if values.kind == "cronjob" else None,
        # A sync that outlives its interval is stopped before the next one is due.
        "deadline": max(60, int(values.every)),
        "db_key": DB_SECRET_KEY,
        "token_key": TOKEN_KEY,
        "token_dir": TOKEN_DIR,
        "ca_dir": CA_DIR,
    }
    files: dict[str, str] = {
        "namespace.yaml": _render(
            "templates/common/namespace.yaml.j2", ns_name=values.namespace,
            ns_labels={**_labels(values.namespace, "namespace", values.namespace),
                       "pod-security.kubernetes.io/enforce": "restricted"}),
        "serviceaccount.yaml": _render("templates/hubservice/serviceaccount.yaml.j2",
                                              **context),
    }
    if values.kind == "deployment":
        for name in ("service.yaml", "deployment.yaml", "servicemonitor.yaml"):
            files[name] = _render(f"templates/hubservice/{name}.j2", **context)
    else:
        files["cronjob.yaml"] = _render("templates/hubservice/cronjob.yaml.j2",
                                               **context)
    files["kustomization.yaml"] = _kustomization(files)
    return files
