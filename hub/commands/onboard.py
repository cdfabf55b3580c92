"""``gpufleet spoke render`` and ``gpufleet policy render|apply|status``: joining the fleet.

Thin click layer: options in, :mod:`hub.onboard` (rendering and ACM) does the work. Choice-like
options are plain strings checked by ``hub.onboard`` so that a wrong value gets the same one-line
error (exit 2) as every other input error, and ``--out`` is checked there too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from hub import onboard as onboarding
from hub.common import (
    EXIT_FINDINGS,
    ConfiguredCommand,
    ConfiguredGroup,
    InputError,
    emit,
    env,
    output_option,
)

#: the columns of `policy status` and `policy apply`
STATUS_COLUMNS = ["policy", "remediation", "overall", "cluster", "compliant"]
APPLY_COLUMNS = ["kind", "namespace", "name", "action"]

F = Callable[..., Any]
# Every command also receives ``config`` (the --config FILE that ConfiguredCommand adds); click
# has already turned it into option defaults by the time a command runs, so it is unused here.


def _spoke_options(func: F) -> F:
    """Options shared by ``spoke render`` and ``policy render`` (same manifests underneath)."""
    options = [
        click.option("--vendor", envvar=env("vendor"), metavar="nvidia|amd|nvidia,amd",
                     help="GPU vendor(s) of the cluster's nodes. A comma list renders one "
                          "agent scraping every listed vendor's exporter (mixed clusters)."),
        click.option("--mode", envvar=env("mode"), default="remote-write", show_default=True,
                     metavar="remote-write|acm",
                     help="remote-write: a Prometheus agent pushes to Thanos Receive. "
                          "acm: ACM Observability collects through OpenShift monitoring."),
        click.option("--exporter", envvar=env("exporter"), default="upstream",
                     show_default=True, metavar="upstream|builtin",
                     help="upstream: the GPU operator's exporter (dcgm-exporter / AMD "
                          "device-metrics-exporter) is already there; builtin: deploy "
                          "gpufleet's own exporter DaemonSet."),
        click.option("--remote-write-url", envvar=env("remote-write-url"), metavar="URL",
                     help="The hub's receive endpoint (remote-write mode). Not --hub-url, "
                          "which is the query endpoint."),
        click.option("--remote-write-secret", envvar=env("remote-write-secret"),
                     default=onboarding.DEFAULT_SECRET, show_default=True, metavar="NAME",
                     help="Secret with keys 'token' and 'ca.crt' for remote-write."),
        click.option("--monitoring", envvar=env("monitoring"), default="platform",
                     show_default=True, metavar="platform|user-workload",
                     help="acm mode: which OpenShift monitoring stack scrapes the exporter."),
        click.option("--platform", envvar=env("platform"), metavar="kubernetes|openshift",
                     help="Pins non-root UIDs on kubernetes; lets the SCC assign them on "
                          "openshift. Default: openshift in acm mode, else kubernetes."),
        click.option("--exporter-namespace", envvar=env("exporter-namespace"),
                     metavar="NS|VENDOR=NS,...",
                     help="Namespace of the upstream exporter (default: nvidia-gpu-operator "
                          "or kube-amd-gpu); builtin: the spoke namespace. With several "
                          "vendors name each: nvidia=NS,amd=NS."),
        click.option("--exporter-selector", envvar=env("exporter-selector"), multiple=True,
                     metavar="[VENDOR:]KEY=VALUE",
                     help="Pod labels of the upstream exporter (repeatable). Default: "
                          "app=nvidia-dcgm-exporter / app.kubernetes.io/name=metrics-exporter. "
                          "With several vendors prefix the vendor: amd:KEY=VALUE."),
        click.option("--agent-image", envvar=env("agent-image"),
                     default=onboarding.DEFAULT_AGENT_IMAGE, show_default=True,
                     help="Prometheus image of the agent."),
        click.option("--exporter-image", "--image", "exporter_image",
                     envvar=env("exporter-image"), default=onboarding.DEFAULT_EXPORTER_IMAGE,
                     show_default=True,
                     help="gpufleet image of the builtin exporter (--image for short)."),
        click.option("--restrict-exporter-ingress", envvar=env("restrict-exporter-ingress"),
                     is_flag=True, default=False,
                     help="Upstream exporter: also render a NetworkPolicy in the GPU "
                          "operator's namespace admitting only our scraper. It cuts off every "
                          "other scraper there (see docs/onboarding.md). Builtin exporters "
                          "always get one."),
        click.option("--reconcile-reader", envvar=env("reconcile-reader"), is_flag=True,
                     default=False,
                     help="Also render a read-only ServiceAccount and ClusterRole for "
                          "`gpufleet reconcile --context`: get/list nodes, and the DRA "
                          "objects resourceslices, resourceclaims and deviceclasses "
                          "(resource.k8s.io)."),
        click.option("--kube-state-metrics", envvar=env("kube-state-metrics"),
                     metavar="HOST:PORT",
                     help="remote-write mode: also scrape kube-state-metrics here (e.g. "
                          "kube-state-metrics.kube-system.svc:8080) for the pods' GPU "
                          "requests, start, completion and Running phase, so the ledger "
                          "meters allocations from their edges with an upstream exporter "
                          "(the builtin exporter publishes its own)."),
        click.option("--dcgm-names", envvar=env("dcgm-names"), default="legacy",
                     show_default=True, metavar="legacy|dcgm-4.7",
                     help="Upstream NVIDIA exporter: pin dcgm-exporter's collectors CSV (a "
                          "ConfigMap the GPU Operator's ClusterPolicy mounts) to the fields "
                          "gpufleet reads in this naming, so an operator upgrade (4.9 renames "
                          "them) cannot change the series. dcgm-4.7 needs DCGM >= 4.7."),
        click.option("--dcgm-config-name", envvar=env("dcgm-config-name"), metavar="NAME",
                     help="Upstream NVIDIA exporter whose ClusterPolicy already names a "
                          "collectors ConfigMap (spec.dcgmExporter.config.name): keep it. "
                          "Nothing of yours is declared or patched; dcgm-fields.csv lists "
                          "the rows gpufleet reads, to add to NAME's CSV."),
        click.option("--acm-collection", envvar=env("acm-collection"), default="legacy",
                     show_default=True, metavar="legacy|mcoa|auto",
                     help="acm mode: which ACM collection path carries the series. legacy: "
                          "the metrics-collector and its allowlist ConfigMap. mcoa: the "
                          "multicluster-observability-addon (ScrapeConfig objects federating "
                          "/federate every 300 s, a PrometheusRule). auto: read the hub's "
                          "MultiClusterObservability (--context/--kubeconfig) and pick the "
                          "path it has enabled."),
        click.option("--placement", envvar=env("placement"), metavar="[NS/]NAME,...",
                     help="mcoa: the Placement(s) whose clusters get gpufleet's ScrapeConfig "
                          "and PrometheusRule (MCOA's placements annotation; a bare NAME is in "
                          "open-cluster-management-global-set). Default: MCOA's own."),
        click.option("--out", envvar=env("out"), metavar="DIR",
                     help="Directory to write (replaced as a whole on re-render)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _kube_options(func: F) -> F:
    func = click.option("--context", envvar=env("context"), metavar="CTX",
                        help="kubeconfig context of the ACM hub (default: current context).")(func)
    return click.option("--kubeconfig", envvar=env("kubeconfig"), metavar="FILE",
                        help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).")(func)


def _require_out(out: str | None) -> str:
    if not out:
        raise InputError("--out DIR is required")
    return out


def _spoke_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    keys = ("vendor", "mode", "exporter", "remote_write_url", "remote_write_secret",
            "monitoring", "platform", "exporter_namespace", "exporter_selector",
            "agent_image", "exporter_image", "restrict_exporter_ingress", "reconcile_reader",
            "kube_state_metrics", "dcgm_names", "dcgm_config_name", "acm_collection",
            "placement")
    out = {key: params[key] for key in keys}
    out["acm_collection"] = _collection(params)
    return out


def _collection(params: dict[str, Any]) -> str:
    """--acm-collection, with ``auto`` read from the hub's MultiClusterObservability through
    the official client (one line to stderr says what was read)."""
    choice = onboarding.check_choice(params.get("acm_collection"))
    if choice != "auto":
        return choice
    if (params.get("mode") or "remote-write") != "acm":
        raise InputError("--acm-collection is for --mode acm")
    from hub import kube  # the kubernetes client loads only for commands that need it

    api = kube.api_client(params.get("kubeconfig"), params.get("context"))
    with api:
        found = onboarding.collection_of(kube.list_multicluster_observability(api),
                                         params.get("monitoring") or "platform")
    click.echo(f"acm collection: {found.path} ({found.reason})", err=True)
    return found.path


def _existing_dcgm_config(values: onboarding.SpokeValues, kubeconfig: str | None,
                          context: str, merge: bool) -> onboarding.SpokeValues:
    """Read the ClusterPolicy (and with --merge-dcgm-config the ConfigMap it names) through
    the official client: refuse or merge before anything is written, never overwrite."""
    reading = onboarding.needs_reading(values)
    if reading is None:
        return values
    from hub import kube  # the kubernetes client loads only for commands that need it

    api = kube.api_client(kubeconfig, context)
    with api:
        policy = kube.get_cluster_policy(api, reading.cluster_policy)
        if policy is None:
            click.echo(f"dcgm config: no ClusterPolicy {reading.cluster_policy} at "
                       f"{kube.host_of(api)} (no GPU Operator there?): nothing of anyone "
                       "else's to keep", err=True)
            return values
        existing = onboarding.configured_name(policy)
        theirs = onboarding.theirs_to_merge(existing, merge)
        if theirs is None:
            click.echo(f"dcgm config: ClusterPolicy {reading.cluster_policy} names "
                       f"{existing or 'no collectors ConfigMap'}: pinning "
                       f"{onboarding.DCGM_CONFIGMAP}", err=True)
            return values
        rows = onboarding.parse_collectors(
            kube.get_config_map(api, reading.namespace, theirs), theirs, reading.namespace)
    ours = onboarding.merged(values, theirs, rows)
    click.echo(f"dcgm config: merged ConfigMap {theirs}'s {len(rows)} fields with gpufleet's "
               f"into {onboarding.DCGM_CONFIGMAP} ({theirs} is left untouched)", err=True)
    return ours


def _written(out: str, files: dict[str, str], hint: str) -> None:
    click.echo(f"wrote {len(files)} files to {out} ({hint})")


@click.group(cls=ConfiguredGroup)
def spoke() -> None:
    """Render what a spoke cluster applies to send its GPU metrics to the hub."""


@spoke.command("render", cls=ConfiguredCommand)
@click.option("--cluster", envvar=env("cluster"), metavar="NAME",
              help="Cluster name: the 'cluster' label of every series it sends.")
@click.option("--namespace", envvar=env("spoke-namespace"), default=onboarding.DEFAULT_NAMESPACE,
              show_default=True, metavar="NS", help="Namespace of the agent and exporter.")
@click.option("--cluster-context", envvar=env("cluster-context"), metavar="CTX",
              help="kubeconfig context (in --kubeconfig) of the cluster itself. Upstream "
                   "NVIDIA exporter: read its ClusterPolicy gpu-cluster-policy first; if "
                   "spec.dcgmExporter.config.name names a collectors ConfigMap other than "
                   "gpufleet's, refuse (one line, exit 2) unless --merge-dcgm-config. "
                   "Without it nothing is read: check that field yourself before patching "
                   "(docs/onboarding.md).")
@click.option("--merge-dcgm-config", envvar=env("merge-dcgm-config"), is_flag=True,
              default=False,
              help="With --cluster-context, when the ClusterPolicy already names a collectors "
                   "ConfigMap: pin the union of its rows (kept as they are) and gpufleet's "
                   "under gpufleet's name; theirs is left untouched.")
@_spoke_options
@_kube_options
def spoke_render(cluster: str | None, namespace: str, out: str | None,
                 cluster_context: str | None, merge_dcgm_config: bool,
                 config: str | None = None, **params: Any) -> None:
    """Write the spoke manifests for one cluster into --out.

    remote-write mode writes a kustomization (agent, exporter scraping, RBAC, and a
    NetworkPolicy for a builtin exporter or with --restrict-exporter-ingress); acm mode
    writes hub/ (the legacy allowlist ConfigMap, or with --acm-collection mcoa the addon's
    ScrapeConfig and PrometheusRule objects) and spoke/ (ServiceMonitor, namespace label).
    """
    target = _require_out(out)
    values = onboarding.spoke_values(cluster=cluster, namespace=namespace, **_spoke_kwargs(params))
    if merge_dcgm_config and not cluster_context:
        raise InputError("--merge-dcgm-config reads the cluster's ClusterPolicy and the "
                         "ConfigMap it names: give --cluster-context CTX")
    if merge_dcgm_config and values.dcgm_config_name:
        raise InputError("choose one: --dcgm-config-name keeps your ConfigMap as the "
                         "exporter's, --merge-dcgm-config pins the union as gpufleet's")
    if cluster_context:
        values = _existing_dcgm_config(values, params.get("kubeconfig"), cluster_context,
                                       merge_dcgm_config)
    files = onboarding.render_spoke(values)
    onboarding.write_tree(files, target)
    hint = ("kubectl apply -k " + target if values.mode == "remote-write"
            else f"apply {target}/hub on the hub and {target}/spoke on the cluster")
    _written(target, files, hint)


@click.group(cls=ConfiguredGroup)
def policy() -> None:
    """ACM governance: onboard every labelled ManagedCluster with one policy."""


@policy.command("render", cls=ConfiguredCommand)
@click.option("--namespace", envvar=env("policy-namespace"),
              default=onboarding.DEFAULT_POLICY_NAMESPACE, show_default=True, metavar="NS",
              help="Hub namespace of the Policy, Placement and bindings.")
@click.option("--placement-label", envvar=env("placement-label"), multiple=True,
              metavar="KEY=VALUE",
              help="ManagedCluster label the Placement selects (repeatable). "
                   "Default: gpufleet.io/onboard=true.")
@click.option("--remediation", envvar=env("remediation"), default="inform", show_default=True,
              metavar="inform|enforce", help="inform reports drift; enforce creates the objects.")
@click.option("--cluster-set", envvar=env("cluster-set"), default="default", show_default=True,
              metavar="NAME", help="ManagedClusterSet the Placement selects from.")
@click.option("--spoke-namespace", envvar=env("spoke-namespace"),
              default=onboarding.DEFAULT_NAMESPACE, show_default=True, metavar="NS",
              help="Namespace of the agent and exporter on each cluster.")
@_spoke_options
@_kube_options
def policy_render(namespace: str, placement_label: tuple[str, ...], remediation: str,
                  cluster_set: str, spoke_namespace: str, out: str | None,
                  config: str | None = None, **params: Any) -> None:
    """Write an ACM Policy, Placement and bindings that install the spoke manifests.

    The cluster name and the remote-write credentials are ACM hub templates, resolved per
    cluster: create Secret --remote-write-secret (keys token, ca.crt) in --namespace on the hub.
    """
    target = _require_out(out)
    kwargs = _spoke_kwargs(params)
    kwargs["vendor"] = kwargs["vendor"] or "nvidia"
    kwargs["platform"] = kwargs["platform"] or "openshift"
    spoke_values = onboarding.policy_spoke(namespace, namespace=spoke_namespace, **kwargs)
    values = onboarding.policy_values(spoke_values, namespace=namespace,
                                  placement_labels=placement_label, remediation=remediation,
                                  cluster_set=cluster_set)
    files = onboarding.render_policy(values)
    hint = ""
    if spoke_values.mode == "acm":  # what the collection path needs on the hub, beside
        hub = onboarding.hub_objects(spoke_values)
        files.update({f"hub/{name}": text for name, text in hub.items()})
        files["hub/kustomization.yaml"] = onboarding.kustomization(hub)
        hint = f"; and oc apply -k {target}/hub on the hub ({spoke_values.acm_collection})"
    onboarding.write_tree(files, target)
    _written(target, files, f"gpufleet policy apply --dir {target}; it places clusters "
                            f"labelled {onboarding.VENDOR_LABEL}={values.spoke.vendor}{hint}")


@policy.command("apply", cls=ConfiguredCommand)
@click.option("--dir", "directory", envvar=env("dir"), metavar="DIR",
              help="Directory written by `gpufleet policy render`.")
@click.option("--force-conflicts", is_flag=True,
              help="Take over fields another field manager (ACM, kubectl) set on an object; "
                   "without it such a conflict stops the apply with one line (exit 1).")
@_kube_options
@output_option("table", "json")
def policy_apply(directory: str | None, kubeconfig: str | None, context: str | None,
                 output: str, force_conflicts: bool, config: str | None = None) -> None:
    """Create or update the rendered policy objects on the ACM hub by server-side apply.

    As `kubectl apply --server-side --field-manager gpufleet`: gpufleet owns the fields it
    sets and no others, so labels, annotations and fields ACM or another tool set on the
    objects stay. A field another manager owns is reported (exit 1) and taken over only with
    --force-conflicts. action: created, configured or unchanged.
    """
    from hub import kube  # the kubernetes client loads only for commands that need it

    if not directory:
        raise InputError("--dir DIR is required")
    objects = onboarding.load_dir(directory)
    api = kube.api_client(kubeconfig, context)
    with api:
        rows = onboarding.apply_objects(api, objects, force_conflicts=force_conflicts)
    emit(rows, APPLY_COLUMNS, output)


@policy.command("status", cls=ConfiguredCommand)
@click.option("--namespace", envvar=env("policy-namespace"),
              default=onboarding.DEFAULT_POLICY_NAMESPACE, show_default=True, metavar="NS",
              help="Hub namespace of the gpufleet policies.")
@_kube_options
@output_option("table", "json")
def policy_status(namespace: str, kubeconfig: str | None, context: str | None,
                  output: str, config: str | None = None) -> None:
    """Compliance of the gpufleet policies, per cluster. Exit 1 when a cluster is NonCompliant."""
    from hub import kube

    onboarding.dns_label(namespace, "policy namespace")
    api = kube.api_client(kubeconfig, context)
    with api:
        rows = onboarding.policy_status(api, namespace)
    emit(rows, STATUS_COLUMNS, output)
    if onboarding.any_noncompliant(rows):
        sys.exit(EXIT_FINDINGS)
