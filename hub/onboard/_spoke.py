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

from hub.common import InputError
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
from hub.store import (
    ACM_COLLECTIONS,
    DCGM47,
    LEGACY,
    LEGACY_COLLECTION,
    MCOA_COLLECTION,
    allocation_agent_keep,
    allocation_matches,
    allocation_recording_rules,
    allowlist_metrics,
    dcgm_collectors,
    exporter_selectors,
    kube_selectors,
    mcoa_metric_relabelings,
    mcoa_recording_rules,
)

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
#: MCOA: the labels that hand a ScrapeConfig or PrometheusRule to the addon's collectors
MCOA_PART_OF = "multicluster-observability-addon"
MCOA_COMPONENTS = {"platform": "platform-metrics-collector",
                   "user-workload": "user-workload-metrics-collector"}
#: the namespace of a bare ``--placement NAME``: ACM's global ManagedClusterSet binding
DEFAULT_PLACEMENT_NAMESPACE = "open-cluster-management-global-set"
#: where MCOA's spokes evaluate gpufleet's rules: kube-state-metrics is platform monitoring's
RULES_TARGET_NAMESPACE = "openshift-monitoring"
CREDENTIALS_DIR = "/etc/gpufleet/remote-write"
#: `--dcgm-names`: the naming the pinned collectors CSV asks dcgm-exporter for
DCGM_NAMINGS = (LEGACY, DCGM47)
#: the ConfigMap the GPU Operator mounts into dcgm-exporter (ClusterPolicy
#: spec.dcgmExporter.config.name; the key must be dcgm-metrics.csv), and the ClusterPolicy's
#: default name
DCGM_CONFIGMAP = "gpufleet-dcgm-metrics"
DCGM_CSV_KEY = "dcgm-metrics.csv"
CLUSTER_POLICY = "gpu-cluster-policy"



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
    #: One or more of VENDORS, in VENDORS order: one agent scrapes every vendor's exporter.
    vendors: tuple[str, ...]
    mode: str = "remote-write"
    exporter: str = "upstream"
    remote_write_url: str | None = None
    remote_write_secret: str = DEFAULT_SECRET
    monitoring: str = "platform"
    platform: str = "kubernetes"
    namespace: str = DEFAULT_NAMESPACE
    exporter_namespace: str | None = None
    exporter_selector: tuple[tuple[str, str], ...] = ()
    #: Per-vendor upstream exporter namespace / pod labels (``amd=NS``, ``amd:KEY=VALUE``):
    #: a mixed cluster's operators each have their own.
    vendor_namespaces: tuple[tuple[str, str], ...] = ()
    vendor_selectors: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    agent_image: str = DEFAULT_AGENT_IMAGE
    exporter_image: str = DEFAULT_EXPORTER_IMAGE
    #: Set only for ACM policies: the Secret's data come from the hub (``fromSecret``).
    secret_data: tuple[tuple[str, str], ...] = ()
    #: Render a NetworkPolicy in an upstream exporter's namespace (the GPU operator's, not ours).
    restrict_exporter_ingress: bool = False
    #: Render the read-only identity `reconcile --context` uses (nodes, DRA objects).
    reconcile_reader: bool = False
    #: remote-write: kube-state-metrics' HOST:PORT, scraped for allocation intervals
    kube_state_metrics: tuple[str, int] | None = None
    #: The naming the upstream dcgm-exporter is pinned to (its collectors CSV).
    dcgm_names: str = LEGACY
    #: The user's own collectors ConfigMap the ClusterPolicy already names: never overwritten
    dcgm_config_name: str | None = None
    #: --merge-dcgm-config: the ConfigMap the ClusterPolicy named, and its rows, pinned first
    #: in gpufleet's CSV (so none of its consumers loses a field)
    dcgm_merged_from: str | None = None
    dcgm_their_rows: tuple[tuple[str, str, str], ...] = ()
    #: acm mode: which ACM collection path carries the series (legacy allowlist or MCOA)
    acm_collection: str = LEGACY_COLLECTION
    #: MCOA: the placements annotation (``namespace/name,...``); None: MCOA's default
    placements: str | None = None

    @property
    def vendor(self) -> str:
        """The vendor set as one name ("nvidia", "amd", "nvidia-amd"): policy names, labels."""
        return "-".join(self.vendors)

    @property
    def mixed(self) -> bool:
        return len(self.vendors) > 1


def parse_vendors(value: str | None) -> tuple[str, ...]:
    """``nvidia``, ``amd`` or a comma list such as ``nvidia,amd``, in VENDORS order."""
    items = [item.strip() for item in (value or "").split(",")]
    if not any(items):
        raise InputError(f"vendor is required: choose one of {', '.join(VENDORS)} "
                         "or a comma list such as nvidia,amd")
    chosen = {_choice(item, VENDORS, "vendor") for item in items}
    return tuple(v for v in VENDORS if v in chosen)



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
    restrict_exporter_ingress: bool = False,
    reconcile_reader: bool = False,
    kube_state_metrics: str | None = None,
    dcgm_names: str | None = LEGACY,
    dcgm_config_name: str | None = None,
    acm_collection: str | None = LEGACY_COLLECTION,
    placement: str | None = None,
    cluster_is_template: bool = False,
) -> SpokeValues:
    """Check raw option values and build :class:`SpokeValues`; InputError names the bad one."""
    vendors = parse_vendors(vendor)
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
    vendor_namespaces, exporter_namespace = _vendor_namespaces(exporter_namespace, vendors)
    vendor_selectors, plain = _vendor_selectors(exporter_selector, vendors)
    selector = tuple(sorted(label_pair(s, "exporter selector") for s in plain))
    if (vendor_namespaces or vendor_selectors) and exporter_ == "builtin":
        raise InputError("VENDOR=NS and VENDOR:KEY=VALUE describe upstream exporters: the "
                         "builtin exporter runs in the spoke namespace")
    if len(vendors) > 1 and exporter_ == "upstream" and (exporter_namespace or selector):
        raise InputError("with several vendors, name the vendor: --exporter-namespace "
                         "nvidia=NS,amd=NS and --exporter-selector amd:KEY=VALUE")
    if exporter_ == "builtin":
        exporter_ns: str | None = dns_label(exporter_namespace or namespace_,
                                            "exporter namespace")
    elif exporter_namespace:
        exporter_ns = dns_label(exporter_namespace, "exporter namespace")
    else:  # each vendor's GPU operator namespace (VENDOR_DEPLOYMENT)
        exporter_ns = None
    if dcgm_config_name and ("nvidia" not in vendors or exporter_ != "upstream"):
        raise InputError("--dcgm-config-name is for an upstream NVIDIA exporter (the GPU "
                         "Operator's dcgm-exporter)")
    if remote_write_url and mode_ != "remote-write":
        raise InputError("--remote-write-url is for remote-write mode: in acm mode ACM's "
                         "collector pushes to the hub it belongs to")
    url = _url(remote_write_url) if mode_ == "remote-write" else None
    collection = _choice(acm_collection or LEGACY_COLLECTION, ACM_COLLECTIONS,
                         "ACM collection path")
    if collection != LEGACY_COLLECTION and mode_ != "acm":
        raise InputError("--acm-collection is for --mode acm")
    placements = parse_placements(placement) if placement else None
    if placements and collection != MCOA_COLLECTION:
        raise InputError("--placement is for --acm-collection mcoa (the legacy allowlist "
                         "is hub-wide)")
    secret = _dns_subdomain(remote_write_secret or "", "remote-write Secret name")
    return SpokeValues(
        cluster=cluster_,
        vendors=vendors,
        mode=mode_,
        exporter=exporter_,
        remote_write_url=url,
        remote_write_secret=secret,
        monitoring=monitoring_,
        platform=platform_,
        namespace=namespace_,
        exporter_namespace=exporter_ns,
        exporter_selector=selector,
        vendor_namespaces=vendor_namespaces,
        vendor_selectors=vendor_selectors,
        agent_image=_image(agent_image, "--agent-image"),
        exporter_image=_image(exporter_image, "--exporter-image"),
        restrict_exporter_ingress=bool(restrict_exporter_ingress),
        reconcile_reader=bool(reconcile_reader),
        kube_state_metrics=_host_port(kube_state_metrics, mode_),
        # None is "not given"; an empty --dcgm-names is a mistake, not the default
        dcgm_names=_choice(LEGACY if dcgm_names is None else dcgm_names, DCGM_NAMINGS,
                           "dcgm naming (--dcgm-names)"),
        dcgm_config_name=(_dns_subdomain(dcgm_config_name, "--dcgm-config-name")
                          if dcgm_config_name else None),
        acm_collection=collection,
        placements=placements,
    )


def parse_placements(value: str) -> str:
    """``--placement``: ``NAME`` or ``NAMESPACE/NAME`` (a comma list for several), as MCOA's
    placements annotation spells them (``namespace/name`` pairs, comma-separated, no spaces);
    a bare name is a Placement in ACM's global set namespace."""
    pairs = []
    for item in value.split(","):
        namespace, _, name = item.strip().rpartition("/")
        pairs.append(f"{dns_label(namespace or DEFAULT_PLACEMENT_NAMESPACE, 'placement namespace')}"
                     f"/{dns_label(name, 'placement name')}")
    return ",".join(pairs)


def _host_port(value: str | None, mode: str) -> tuple[str, int] | None:
    """--kube-state-metrics HOST:PORT (remote-write mode; ACM's collector already has it)."""
    if not value:
        return None
    if mode != "remote-write":
        raise InputError("--kube-state-metrics is for remote-write mode (in acm mode the "
                         "cluster's monitoring already scrapes kube-state-metrics)")
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"--kube-state-metrics {value[:80]!r} is not HOST:PORT")
    return _dns_subdomain(host, "kube-state-metrics host"), int(port)



def _vendor_namespaces(value: str | None, vendors: tuple[str, ...],
                       ) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """``NS`` (for every vendor) or ``nvidia=NS,amd=NS``: (per-vendor pairs, plain NS)."""
    if not value or "=" not in value:
        return (), value
    pairs: dict[str, str] = {}
    for item in value.split(","):
        vendor, _, ns = item.partition("=")
        vendor = _vendor_of(vendor, vendors, "--exporter-namespace")
        pairs[vendor] = dns_label(ns.strip(), "exporter namespace")
    return tuple(sorted(pairs.items())), None


def _vendor_selectors(values: Iterable[str], vendors: tuple[str, ...],
                      ) -> tuple[tuple[tuple[str, tuple[tuple[str, str], ...]], ...], list[str]]:
    """``KEY=VALUE`` (every vendor) or ``amd:KEY=VALUE`` (label keys never contain ':')."""
    scoped: dict[str, list[tuple[str, str]]] = {}
    plain: list[str] = []
    for item in values:
        vendor, sep, pair = item.partition(":")
        if not sep:
            plain.append(item)
            continue
        vendor = _vendor_of(vendor, vendors, "--exporter-selector")
        scoped.setdefault(vendor, []).append(label_pair(pair, "exporter selector"))
    return tuple(sorted((v, tuple(sorted(p))) for v, p in scoped.items())), plain


def _vendor_of(text: str, vendors: tuple[str, ...], option: str) -> str:
    vendor = _choice(text, VENDORS, "vendor")
    if vendor not in vendors:
        raise InputError(f"{option} names vendor {vendor!r}, which --vendor does not list")
    return vendor


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
    "dcgm-metrics-configmap.yaml",
    "clusterpolicy-dcgm-exporter.yaml",
    "servicemonitor.yaml",
    "agent-networkpolicy.yaml",
    "agent-deployment.yaml",
    "reader-serviceaccount.yaml",
    "reader-clusterrole.yaml",
    "reader-clusterrolebinding.yaml",
]


#: Files rendered once per vendor (each vendor's exporter has its own pods, port, namespace).
_PER_VENDOR = {
    "exporter-serviceaccount.yaml",
    "exporter-service.yaml",
    "exporter-networkpolicy.yaml",
    "exporter-daemonset.yaml",
    "servicemonitor.yaml",
}


@dataclass(frozen=True)
class ExporterTarget:
    """One vendor's exporter as the manifests see it: where it runs and how it is reached."""

    vendor: str
    name: str  # our objects' name: gpufleet-exporter, or gpufleet-exporter-<vendor> when mixed
    job: str  # the agent's scrape job
    suffix: str  # file name suffix: "" or "-<vendor>"
    deployment: VendorDeployment
    namespace: str
    pods: dict[str, str]
    port: int
    node_selector: dict[str, str]

    @property
    def service_dns(self) -> str:
        """The exporter Service's name in cluster DNS (the agent's dns_sd target)."""
        return f"{self.name}.{self.namespace}.svc"


def exporter_targets(values: SpokeValues) -> list[ExporterTarget]:
    """Each vendor's exporter. A single vendor keeps the historical names (no suffix), so a
    re-render of an existing spoke changes nothing; with several vendors every per-vendor
    object carries the vendor in its name, so two builtin DaemonSets never share one."""
    builtin = values.exporter == "builtin"
    targets = []
    for vendor in values.vendors:
        deployment = VENDOR_DEPLOYMENT[vendor]
        suffix = f"-{vendor}" if values.mixed else ""
        name = f"gpufleet-exporter{suffix}"
        pods = (_selector(name, values.namespace) if builtin
                else dict(dict(values.vendor_selectors).get(vendor) or values.exporter_selector
                          or deployment.upstream_selector))
        targets.append(ExporterTarget(
            vendor=vendor,
            name=name,
            job=f"gpu-exporter{suffix}",
            suffix=suffix,
            deployment=deployment,
            namespace=(dict(values.vendor_namespaces).get(vendor) or values.exporter_namespace
                       or deployment.upstream_namespace),
            pods=pods,
            port=BUILTIN_PORT if builtin else deployment.upstream_port,
            node_selector=dict(deployment.node_selector),
        ))
    return targets


def _spoke_context(values: SpokeValues) -> dict[str, Any]:
    instance = values.namespace
    if values.mode == "acm":
        # The cluster's own Prometheus scrapes: platform or user-workload monitoring.
        scraper_namespace = ("openshift-monitoring" if values.monitoring == "platform"
                             else "openshift-user-workload-monitoring")
        scraper_pods = {"app.kubernetes.io/name": "prometheus"}
    else:
        scraper_namespace = values.namespace
        scraper_pods = _selector("gpufleet-agent", instance)
    return {
        "v": values,
        "builtin": values.exporter == "builtin",
        "instance": instance,
        "labels": lambda name, component: _labels(name, component, instance),
        "selector": lambda name: _selector(name, instance),
        "exporters": exporter_targets(values),
        "scraper_namespace": scraper_namespace,
        "scraper_pods": scraper_pods,
        "keep_regex": metrics_keep_regex(),
        "ksm_keep": allocation_agent_keep(),
        "credentials_dir": CREDENTIALS_DIR,
        "secret_data": dict(values.secret_data),
        "dcgm": _dcgm_context(values),
    }


def _dcgm_context(values: SpokeValues) -> dict[str, Any] | None:
    """The pinned collectors CSV of an upstream dcgm-exporter (None: no NVIDIA upstream)."""
    if "nvidia" not in values.vendors or values.exporter != "upstream":
        return None
    nvidia = next(t for t in exporter_targets(values) if t.vendor == "nvidia")
    theirs = {row[0] for row in values.dcgm_their_rows}
    rows = [*values.dcgm_their_rows,
            *(row for row in dcgm_collectors(values.dcgm_names) if row[0] not in theirs)]
    return {"configmap": DCGM_CONFIGMAP, "key": DCGM_CSV_KEY, "namespace": nvidia.namespace,
            "naming": values.dcgm_names, "rows": rows, "merged_from": values.dcgm_merged_from,
            "their_count": len(values.dcgm_their_rows), "cluster_policy": CLUSTER_POLICY}


def _spoke_names(values: SpokeValues) -> list[str]:
    builtin = values.exporter == "builtin"
    names = {"namespace.yaml", "exporter-service.yaml"}
    if values.reconcile_reader:  # the read-only identity of `reconcile --context`, on request
        names |= {"reader-serviceaccount.yaml", "reader-clusterrole.yaml",
                  "reader-clusterrolebinding.yaml"}
    # A NetworkPolicy selecting pods cuts off every scraper it does not list. In our own
    # namespace (builtin exporter) that is what we want; in the GPU operator's namespace it
    # would cut off the scrapers already there (OpenShift monitoring, a team's Prometheus), so
    # only on explicit request (--restrict-exporter-ingress).
    if builtin or values.restrict_exporter_ingress:
        names.add("exporter-networkpolicy.yaml")
    if builtin:
        names |= {"exporter-serviceaccount.yaml", "exporter-daemonset.yaml"}
    elif "nvidia" in values.vendors and values.dcgm_config_name is None:
        # pin dcgm-exporter's series (--dcgm-names); a user's own config is left as it is
        names |= {"dcgm-metrics-configmap.yaml", "clusterpolicy-dcgm-exporter.yaml"}
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
    # our namespace (remote-write), else the first exporter's (acm mode creates no other)
    context["reader_namespace"] = (values.namespace if values.mode == "remote-write"
                                   else context["exporters"][0].namespace)
    for name in _spoke_names(values):
        template = f"templates/spoke/{name}.j2"
        if name == "namespace.yaml":
            files.update(_namespace_files(values, context))
        elif name in _PER_VENDOR:
            stem = name.removesuffix(".yaml")
            for target in context["exporters"]:
                files[f"{stem}{target.suffix}.yaml"] = _render(template, **context, x=target)
        elif name in _NOT_OURS:
            files[f"{PATCHES}/{name}"] = _render(template, **context)
        else:
            files[name] = _render(template, **context)
    return files


#: objects gpufleet changes but does not own (the GPU Operator's ClusterPolicy, its
#: namespace): rendered under PATCHES/ as the fields gpufleet sets, applied with `kubectl
#: patch` (an ACM policy: musthave on those fields), never listed by a kustomization, so
#: `kubectl delete -k` to offboard deletes only gpufleet's own objects
PATCHES = "patches"
_NOT_OURS = {"clusterpolicy-dcgm-exporter.yaml"}


def owned(files: dict[str, str]) -> list[str]:
    """The manifests a kustomization lists: gpufleet's own objects, not the patches."""
    return [name for name in files
            if not name.startswith(f"{PATCHES}/") and name.endswith(".yaml")]


def dcgm_fields_csv(values: SpokeValues) -> str:
    """The collectors rows gpufleet reads, for a user's own ConfigMap (--dcgm-config-name)."""
    rows = "".join(f"{name}, {kind}, {text}\n"
                   for name, kind, text in dcgm_collectors(values.dcgm_names))
    return (f"# Add these rows to the collectors CSV of ConfigMap {values.dcgm_config_name} "
            "(the one your ClusterPolicy names),\n# keeping your own: gpufleet reads these "
            f"fields ({values.dcgm_names} naming). docs/onboarding.md.\n{rows}")


def _namespace_files(values: SpokeValues, context: dict[str, Any]) -> dict[str, str]:
    """Our namespace (remote-write), or each exporter namespace (acm: it gets labels); with
    two namespaces (a mixed cluster's GPU operators) each file names its vendor."""
    targets: dict[str, ExporterTarget] = {}
    for target in context["exporters"]:
        ns = values.namespace if values.mode == "remote-write" else target.namespace
        targets.setdefault(ns, target)
    ours = values.mode == "remote-write" or values.exporter == "builtin"
    if not ours and values.monitoring != "platform":
        return {}  # the operator's namespace needs no label of ours: nothing to patch
    where = "" if ours else f"{PATCHES}/"
    return {
        f"{where}namespace{'' if len(targets) == 1 else target.suffix}.yaml":
            _render("templates/spoke/namespace.yaml.j2", **context, x=target, ns=ns)
        for ns, target in targets.items()
    }



def hub_allowlist(monitoring: str = "platform") -> str:
    """The ACM allowlist ConfigMap: one hub-wide list for both vendors."""
    key = "metrics_list.yaml" if monitoring == "platform" else "uwl_metrics_list.yaml"
    return _render(
        "templates/hub/metrics-allowlist.yaml.j2",
        name=ALLOWLIST_CONFIGMAP,
        namespace=ACM_OBSERVABILITY_NAMESPACE,
        key=key,
        metrics=allowlist_metrics(),
        matches=allocation_matches(),
        # recording rules are read from the platform list only (not uwl_metrics_list.yaml)
        recording_rules=allocation_recording_rules() if monitoring == "platform" else [],
        labels=_labels("gpufleet-metrics-allowlist", "allowlist", "gpufleet"),
    )


def mcoa_objects(values: SpokeValues) -> dict[str, str]:
    """MCOA's objects on the hub: a ScrapeConfig federating the exporter series from the
    monitoring stack that scrapes them, one federating kube-state-metrics' series from
    platform monitoring (where kube-state-metrics runs, whichever stack scrapes the
    exporter), and the PrometheusRule narrowing the GPU pods' series."""
    def labels(name: str, monitoring: str) -> dict[str, str]:
        return {**_labels(name, "metrics-collection", "gpufleet"),
                "app.kubernetes.io/component": MCOA_COMPONENTS[monitoring],
                "app.kubernetes.io/part-of": MCOA_PART_OF}

    stacks = {"platform": "platform monitoring's", "user-workload": "user-workload monitoring's"}
    common = {"namespace": ACM_OBSERVABILITY_NAMESPACE, "placements": values.placements}
    return {
        "scrapeconfig-gpu.yaml": _render(
            "templates/hub/scrapeconfig.yaml.j2", **common, name="gpufleet-gpu-metrics",
            labels=labels("gpufleet-gpu-metrics", values.monitoring),
            monitoring_stack=stacks[values.monitoring], selectors=exporter_selectors(),
            relabelings=[], source="exporter_selectors()",
            what="the GPU exporters (both dcgm namings, both AMD spellings, gpufleet's own)"),
        "scrapeconfig-kube.yaml": _render(
            "templates/hub/scrapeconfig.yaml.j2", **common, name="gpufleet-kube-metrics",
            labels=labels("gpufleet-kube-metrics", "platform"),
            monitoring_stack=stacks["platform"], selectors=kube_selectors(),
            relabelings=mcoa_metric_relabelings(), source="kube_selectors()",
            what="kube-state-metrics (nodes' GPU resources, labels and info; GPU pods)"),
        "prometheusrule.yaml": _render(
            "templates/hub/prometheusrule.yaml.j2", **common, name="gpufleet-gpu-pods",
            labels=labels("gpufleet-gpu-pods", "platform"),
            target_namespace=RULES_TARGET_NAMESPACE, rules=mcoa_recording_rules()),
    }


def hub_objects(values: SpokeValues) -> dict[str, str]:
    """What acm mode applies on the hub: the legacy allowlist, or MCOA's objects."""
    if values.acm_collection == MCOA_COLLECTION:
        return mcoa_objects(values)
    return {"metrics-allowlist.yaml": hub_allowlist(values.monitoring)}


def render_spoke(values: SpokeValues) -> dict[str, str]:
    """All files of ``gpufleet spoke render``: relative path -> text."""
    manifests = spoke_manifests(values)
    if values.dcgm_config_name is not None:
        manifests["dcgm-fields.csv"] = dcgm_fields_csv(values)
    if values.mode == "remote-write":
        return {**manifests, "kustomization.yaml": _kustomization(owned(manifests))}
    hub = hub_objects(values)
    files = {f"hub/{name}": text for name, text in hub.items()}
    files["hub/kustomization.yaml"] = _kustomization(hub)
    files.update({f"spoke/{name}": text for name, text in manifests.items()})
    files["spoke/kustomization.yaml"] = _kustomization(owned(manifests))
    return files
