"""What a spoke cluster installs to join the fleet (``gpufleet spoke render``).

The agent's keep filter and the ACM allowlist both come from the vendor module's one list of
metrics, so a spoke never pushes what the hub would drop, nor misses what it reads.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hub.onboard._render import (
    DEFAULT_EXPORTER_IMAGE,
    DEFAULT_NAMESPACE,
    _choice,
    _dns_subdomain,
    _image,
    _kustomization,
    _labels,
    _render,
    _selector,
    _url,
    dns_label,
    label_pair,
)
from hub.store import allowlist_metrics

VENDORS = ("nvidia", "amd")
MODES = ("remote-write", "acm")
EXPORTERS = ("upstream", "builtin")
MONITORING = ("platform", "user-workload")
PLATFORMS = ("kubernetes", "openshift")
DEFAULT_AGENT_IMAGE = "quay.io/prometheus/prometheus:v2.53.1"
DEFAULT_SECRET = "gpufleet-remote-write"
BUILTIN_PORT = 9400
ACM_OBSERVABILITY_NAMESPACE = "open-cluster-management-observability"
ALLOWLIST_CONFIGMAP = "observability-metrics-custom-allowlist"
CREDENTIALS_DIR = "/etc/gpufleet/remote-write"



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
    "agent-networkpolicy.yaml",
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
                  "agent-config.yaml", "agent-networkpolicy.yaml", "agent-deployment.yaml"}
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
