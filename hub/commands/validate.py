"""`reconcile`, `report` and `alerts render`: thin click wrappers over hub.validate
(reconcile, checks, report and alerts).

The commands gather plain data through the project's doors (the inventory database, the hub
client, the Kubernetes client) and hand it to pure functions; exit 1 means "ran and found
problems", so cron jobs and CI can gate on it.
"""

from __future__ import annotations

import json
from typing import Any

import click

from hub import inventory as inv
from hub import validate as validation
from hub.commands.usage import idle_options
from hub.common import (
    DURATION,
    EXIT_FINDINGS,
    MAX_JSON_BYTES,
    ConfiguredCommand,
    ConfiguredGroup,
    InputError,
    LedgerSettings,
    ReportSettings,
    ServeOptions,
    SyncSettings,
    check_document,
    cluster_label_option,
    counts_line,
    db_option,
    emit,
    env,
    hub_options,
    max_age_option,
    option,
    options_of,
    output_option,
    parse_json,
    pick,
    push_interval_option,
    read_text,
    window_option,
)

SOURCES = ("hub", "kube", "file")


def load_catalog(path: str | None):  # -> hub.kube.Catalog
    from hub.kube import load_catalog as load

    return load(path)


#: --instance-types FILE: entries that add to or override the shipped instance-type catalog
#: (reconcile's expected GPUs, usage's GPUs per instance); declared with serve's options
instance_types_option = option(ServeOptions, "instance_types")
#: cluster -> the GPUs pods hold through ResourceClaims, as read this run
DraClaims = dict[str, list[Any]]
RECONCILE_COLUMNS = ["scope", "cluster", "node", "status", "mode", "k8s_gpus",
                     "k8s_allocatable", "expected_gpus", "observed_gpus", "k8s_slices",
                     "observed_slices", "reason", "metrics_node", "resources", "managed",
                     "available", "instance_type", "provider_id"]
RECONCILE_TABLE = ["cluster", "node", "status", "mode", "instance_type", "expected_gpus",
                   "k8s_gpus", "observed_gpus", "reason"]
#: `--managed-clusters` given without a value: the kubeconfig's current context
CURRENT_CONTEXT = "-"


def _pairs(values: tuple[str, ...], flag: str, *, value_required: bool) -> list[tuple[str, str]]:
    """``A=B`` flags (``A`` alone means ``A=A`` unless a value is required)."""
    out: list[tuple[str, str]] = []
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep and not value_required:
            value = key
        if not key or not value:
            form = "CLUSTER=FILE" if value_required else "CTX[=CLUSTER]"
            raise InputError(f"{flag} {raw!r}: expected {form}")
        out.append((key, value))
    return out


def _json_file(flag: str, cluster: str, path: str) -> Any:
    """The file's JSON, bounded (hub.common.parse_json): nesting, numbers beyond 64 bits or
    infinite, and a NUL in any string are one-line input errors, never a RecursionError,
    an OverflowError or a database error far from here."""
    what = f"{flag} {cluster}={path}"
    return parse_json(read_text(path, what, max_bytes=MAX_JSON_BYTES), what)


def _per_cluster(pairs: list[tuple[str, str]], flag: str,
                 clusters: set[str]) -> dict[str, list[Any]]:
    """``--resourceslices-json``/``--resourceclaims-json`` items per cluster (a cluster may
    be named more than once: one file per version or per driver)."""
    out: dict[str, list[Any]] = {}
    for cluster, path in pairs:
        if cluster not in clusters:
            raise InputError(f"{flag} {cluster}={path}: cluster {cluster!r} has no "
                             "--nodes-json (the slices need the cluster's nodes beside them)")
        doc = _json_file(flag, cluster, path)
        out.setdefault(cluster, []).extend(
            validation.slices_from_document(doc, f"{flag} {cluster}={path}"))
    return out


def _nodes_from_files(pairs: list[tuple[str, str]], slice_pairs: list[tuple[str, str]],
                      claim_pairs: list[tuple[str, str]], keep: tuple[str, ...] = ()
                      ) -> tuple[list[validation.NodeView], set[str], DraClaims]:
    views: list[validation.NodeView] = []
    seen: set[str] = set()
    for cluster, path in pairs:
        if cluster in seen:
            raise InputError(f"--nodes-json names cluster {cluster!r} twice")
        seen.add(cluster)
        doc = _json_file("--nodes-json", cluster, path)
        views += validation.nodes_from_document(cluster, doc, f"--nodes-json {cluster}={path}",
                                                keep)
    slices = _per_cluster(slice_pairs, "--resourceslices-json", seen)
    for cluster, items in slices.items():
        views = validation.with_dra(views, cluster, items,
                                    f"--resourceslices-json {cluster}")
    claims = {c: validation.claim_allocations_of(views, c, items, f"--resourceclaims-json {c}")
              for c, items in _per_cluster(claim_pairs, "--resourceclaims-json", seen).items()}
    unjoined = sorted(set(claims) - set(slices))
    if unjoined:  # claims name devices of slices: without them nothing can be joined
        raise InputError(f"--resourceclaims-json {unjoined[0]}: the cluster has no "
                         "--resourceslices-json to join its claims to")
    return views, seen, claims


def _nodes_from_kube(pairs: list[tuple[str, str]], kubeconfig: str | None,
                     keep: tuple[str, ...] = ()
                     ) -> tuple[list[validation.NodeView], set[str], DraClaims]:
    """Nodes, and where the cluster serves resource.k8s.io, its ResourceSlices and claims."""
    from hub import kube as kube_

    views: list[validation.NodeView] = []
    clusters: set[str] = set()
    claims: DraClaims = {}
    for context, cluster in pairs:
        if cluster in clusters:
            raise InputError(f"--context maps two contexts to cluster {cluster!r}")
        clusters.add(cluster)
        api = kube_.api_client(kubeconfig, context)
        try:
            found = kube_.read_gpu_objects(api)
        finally:
            api.close()
        # what a cluster's API serves is checked as a file would be: a NUL in a nodeName or
        # a namespace must not reach the database
        check_document([found.nodes, found.slices, found.claims], f"context {context}")
        views += [validation.node_from_object(cluster, obj, keep) for obj in found.nodes]
        views = validation.with_dra(views, cluster, found.slices)
        if found.claims is not None:
            claims[cluster] = validation.claim_allocations_of(views, cluster, found.claims)
        for note in found.notes:
            click.echo(f"note: context {context}: {note}", err=True)
    return views, clusters, claims


def _managed(context: str, kubeconfig: str | None,
             selector: str | None) -> list[validation.ManagedCluster]:
    from hub import kube as kube_

    api = kube_.api_client(kubeconfig, None if context == CURRENT_CONTEXT else context)
    try:
        return [validation.managed_cluster(obj)
                for obj in kube_.list_managed_clusters(api, label_selector=selector)]
    finally:
        api.close()


@click.command(cls=ConfiguredCommand)
@click.option("--source", type=click.Choice(SOURCES), envvar=env("source"),
              help="Where the Kubernetes view comes from. Default: file with --nodes-json, "
                   "kube with --context, else hub (kube-state-metrics through the hub).")
@click.option("--context", "contexts", multiple=True, metavar="CTX[=CLUSTER]",
              help="kubeconfig context of a spoke cluster (repeatable); the cluster name is "
                   "the context's unless mapped with =CLUSTER. Config key: contexts.")
@click.option("--kubeconfig", envvar=env("kubeconfig"), metavar="FILE",
              help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).")
@click.option("--nodes-json", "nodes_json", multiple=True, metavar="CLUSTER=FILE",
              help="`kubectl get nodes -o json` of a cluster, for air-gapped sites "
                   "(repeatable).")
@click.option("--resourceslices-json", "resourceslices_json", multiple=True,
              metavar="CLUSTER=FILE",
              help="`kubectl get resourceslices -o json` of a --nodes-json cluster: its GPUs "
                   "published through Dynamic Resource Allocation (repeatable).")
@click.option("--resourceclaims-json", "resourceclaims_json", multiple=True,
              metavar="CLUSTER=FILE",
              help="`kubectl get resourceclaims -A -o json` of a --nodes-json cluster: which "
                   "pods hold which DRA GPUs, for `capacity` (repeatable).")
@click.option("--managed-clusters", "managed_clusters", is_flag=False,
              flag_value=CURRENT_CONTEXT, default=None, envvar=env("managed-clusters"),
              metavar="[HUB_CONTEXT]",
              help="Read the ACM ManagedCluster list from this kubeconfig context (the "
                   "current one when no value is given): the clusters that should report.")
@click.option("--managed-cluster-selector", "managed_cluster_selector",
              envvar=env("managed-cluster-selector"), metavar="SELECTOR",
              help="Only ManagedClusters with these labels are expected (a label selector, "
                   "e.g. gpufleet.io/onboard=true, the label `policy render` places on).")
@option(SyncSettings, "stale_after",
        help="--source hub: look-back window of the kube-state-metrics queries.")
@instance_types_option
@hub_options
@cluster_label_option
@db_option
@output_option()
@click.pass_context
def reconcile(ctx: click.Context, source: str | None, contexts: tuple[str, ...],
              kubeconfig: str | None, nodes_json: tuple[str, ...],
              resourceslices_json: tuple[str, ...], resourceclaims_json: tuple[str, ...],
              managed_clusters: str | None, managed_cluster_selector: str | None,
              stale_after: float, instance_types: str | None, cluster_label: str,
              db: str | None, output: str, **opts: Any) -> None:
    """Compare, per node, the GPUs the hub sees with what Kubernetes advertises.

    Reads the inventory database (run `gpufleet sync` first; this command never syncs) and
    the Kubernetes view from one source, then gives every GPU node one status: match,
    missing_in_metrics, missing_in_kubernetes, count_mismatch, node_not_reporting,
    device_plugin_and_dra, gpus_missing_by_instance_type (the node's instance type, per
    the catalog shipped in gpufleet and --instance-types, has GPUs that neither Kubernetes
    nor the exporter shows), instance_type_mismatch (the node shows more GPUs than its
    instance type has, or another model) or unknown. MIG (mixed and single strategy),
    time-slicing, AMD partitions and Dynamic Resource Allocation (GPUs in ResourceSlices,
    read with --context or --resourceslices-json; kube-state-metrics cannot show them, so
    through the hub a DRA node is unknown) are understood. The run is stored for
    `gpufleet report`, and the DRA claims it read for `gpufleet capacity`. Exits 1 when any
    node does not match (unknown does not fail), or a managed cluster sends no GPU metrics.

    \b
    Examples:
      gpufleet reconcile                                  # kube-state-metrics via the hub
      gpufleet reconcile --context east --context ocp-west=west
      gpufleet reconcile --nodes-json lab=nodes.json -o json
      gpufleet reconcile --nodes-json lab=nodes.json --resourceslices-json lab=slices.json
      gpufleet reconcile --managed-clusters acm-hub
    """
    from hub.commands.core import database, hub_client

    if contexts and nodes_json:
        raise InputError("--context and --nodes-json exclude each other: one source per run")
    source = source or ("file" if nodes_json else "kube" if contexts else "hub")
    if nodes_json and source != "file":
        raise InputError(f"--nodes-json applies to --source file, not --source {source}")
    if contexts and source != "kube":
        raise InputError(f"--context applies to --source kube, not --source {source}")
    if source == "file" and not nodes_json:
        raise InputError("--source file needs --nodes-json CLUSTER=FILE")
    if (resourceslices_json or resourceclaims_json) and source != "file":
        raise InputError("--resourceslices-json and --resourceclaims-json apply to --source "
                         f"file, not --source {source} (--source kube reads them itself)")
    if source == "kube" and not contexts:
        raise InputError("--source kube needs --context CTX (one per cluster)")
    if managed_cluster_selector and not managed_clusters:
        raise InputError("--managed-cluster-selector needs --managed-clusters")
    if source == "hub" and not opts.get("hub_url"):
        raise InputError("--source hub (the default without --context or --nodes-json) needs "
                         "--hub-url or GPUFLEET_HUB_URL")
    file_pairs = _pairs(nodes_json, "--nodes-json", value_required=True)
    slice_pairs = _pairs(resourceslices_json, "--resourceslices-json", value_required=True)
    claim_pairs = _pairs(resourceclaims_json, "--resourceclaims-json", value_required=True)
    claims: DraClaims | None = None
    context_pairs = _pairs(contexts, "--context", value_required=False)
    catalog = load_catalog(instance_types)
    keep = catalog.label_keys

    with database(db) as engine:
        inv.ensure_schema(engine)
        if source == "file":
            views, covered, claims = _nodes_from_files(file_pairs, slice_pairs, claim_pairs,
                                                       keep)
        elif source == "kube":
            views, covered, claims = _nodes_from_kube(context_pairs, kubeconfig, keep)
        else:
            with hub_client(opts) as client:
                views, covered = validation.nodes_from_hub(client, stale_after=stale_after,
                                                         cluster_label=cluster_label, keep=keep)
        managed = (_managed(managed_clusters, kubeconfig, managed_cluster_selector)
                   if managed_clusters else None)
        run_id, result = validation.reconcile_run(engine, views, covered, source=source,
                                                managed=managed, claims=claims,
                                                catalog=catalog)
    rows = result.rows()
    where = ", ".join(v for _, v in file_pairs) if source == "file" else \
        ", ".join(k for k, _ in context_pairs)
    empty = validation.nothing_to_compare(views, source, where)
    if empty:
        rows.append({"scope": "fleet", "cluster": None, "node": None,
                     "status": validation.NOTHING_TO_COMPARE, "reason": empty})
    if output == "csv":
        rows = [{**r, "resources": json.dumps(r.get("resources") or {})} for r in rows]
    emit(rows, RECONCILE_COLUMNS, output, RECONCILE_TABLE)
    if output == "table":
        problems = sum(1 for r in result.nodes if r.status != validation.MATCH)
        click.echo(f"reconcile run {run_id} ({source}): {len(result.nodes)} GPU nodes, "
                   f"{problems} not matching", err=True)
        if empty:
            click.echo(f"finding: {empty}", err=True)
        unknown = sum(1 for r in result.nodes if r.status == "unknown")
        if unknown and source == "hub":
            click.echo(f"note: {unknown} node(s) unknown: kube-state-metrics has no "
                       "ResourceSlice metric, so GPUs published through DRA cannot be checked "
                       "from the hub (use --context or --resourceslices-json)", err=True)
    if result.failed or empty:
        ctx.exit(EXIT_FINDINGS)


@click.command(cls=ConfiguredCommand)
@options_of(ReportSettings, "max_age")
@options_of(LedgerSettings, "push_interval")
@options_of(ReportSettings, "window")
@idle_options
@options_of(ReportSettings, "naming_mix_for", "acm_silent_after", "lemon_threshold")
@click.option("--max-findings", type=click.IntRange(1), default=50, show_default=True,
              help="Findings listed in -o markdown (the rest are counted).")
@click.option("--out", metavar="FILE",
              help="Write the report to FILE (atomically) instead of standard output.")
@hub_options
@cluster_label_option
@db_option
@output_option("table", "json", "markdown", "html", json_is="one object")
@click.pass_context
def report(ctx: click.Context, max_findings: int, out: str | None, db: str | None,
           output: str, **opts: Any) -> None:
    """Check the latest data and print findings with a per-cluster summary.

    Checks freshness (newest sample against --max-age and twice --push-interval), expected
    but silent clusters (the ACM list of the latest `reconcile --managed-clusters`), partial
    data and GPUs gone from reporting nodes, GPU count mismatches (latest reconcile),
    duplicate GPU UUIDs, and, with --hub-url, zero-usage GPUs with pods, stuck collectors,
    exporter health and clusters the hub's token cannot see. Exits 1 on any error finding.

    \b
    Examples:
      gpufleet report
      gpufleet report --hub-url https://rbac-query-proxy... -o html --out /srv/fleet.html
      gpufleet report -o markdown > comment.md
    """
    from hub.commands.core import database, hub_client

    checks = ReportSettings.build(**pick(ReportSettings, opts))
    push_interval = opts["push_interval"]
    if min(checks.max_age, push_interval, checks.window, checks.acm_silent_after) <= 0:
        raise InputError("--max-age, --push-interval, --window and --acm-silent-after must "
                         "be greater than 0")
    given = dict(**checks.of(ReportSettings), push_interval=push_interval,
                 cluster_label=opts["cluster_label"], idle_threshold=opts["idle_threshold"],
                 idle_for=opts["idle_for"])
    with database(db) as engine:
        if opts.get("hub_url"):
            with hub_client(opts) as client:
                assessed = validation.assess(engine, client, **given)
        else:
            assessed = validation.assess(engine, None, **given)
    facts, findings, now = assessed.facts, assessed.findings, assessed.now
    hub_url, hub_failure = assessed.hub_url, assessed.hub_failure
    run = facts.reconcile
    result = validation.Report(
        generated_at=now, max_age=checks.max_age, push_interval=push_interval,
        window=checks.window,
        summary=validation.summarize(facts, findings), findings=findings, hub=hub_url,
        reconcile={"finished_at": run.finished_at, "source": run.source} if run else None,
        usage=assessed.usage,
    )
    text = validation.render_report(result, output, max_findings=max_findings)
    if out:
        validation.write_atomic(out, text)
        click.echo(f"wrote {out}: {counts_line(result.counts)}", err=True)
    else:
        click.echo(text, nl=False)
    if hub_failure is not None:
        raise hub_failure
    if result.failed:
        ctx.exit(EXIT_FINDINGS)


@click.group(cls=ConfiguredGroup)
def alerts() -> None:
    """Prometheus alerting rules for the hub (Thanos Ruler, ACM, Prometheus Operator)."""


@alerts.command("render", cls=ConfiguredCommand)
@click.option("--out", envvar=env("alerts-out"), metavar="DIR",
              help="Directory to write (replaced as a whole on re-render).")
@max_age_option
@push_interval_option
@window_option
@click.option("--lookback", type=DURATION, default="24h", show_default=True,
              envvar=env("lookback"), metavar="DURATION",
              help="How long a silent cluster stays in the stale alert.")
@click.option("--namespace", envvar=env("alerts-namespace"), default="gpufleet",
              show_default=True, metavar="NS", help="Namespace of the PrometheusRule.")
@instance_types_option
@cluster_label_option
def alerts_render(out: str | None, max_age: float, push_interval: float, window: float,
                  lookback: float, namespace: str, instance_types: str | None,
                  cluster_label: str, **_: Any) -> None:
    """Write the report's failure modes as alerting rules into --out.

    gpufleet-alerts.rules.yaml is a plain rules file (Prometheus, Thanos Ruler; for ACM,
    merge its groups into the thanos-ruler-custom-rules ConfigMap); the same groups as a
    PrometheusRule (monitoring.coreos.com/v1) are in gpufleet-alerts.prometheusrule.yaml.
    Alerts: cluster data late/stale, exporter down, collection errors, GPU count dropped,
    zero usage with a pod allocated, stuck collector, GPUs missing by instance type (the
    catalog shipped in gpufleet and --instance-types). Both vendors, both AMD name prefixes.
    """
    from hub import onboard as onboarding

    if not out:
        raise InputError("--out DIR is required")
    if min(max_age, push_interval, window, lookback) <= 0:
        raise InputError("durations must be greater than 0")
    if lookback <= max_age:
        raise InputError("--lookback must be longer than --max-age")
    if not onboarding.DNS_LABEL.match(namespace):
        raise InputError(f"--namespace {namespace!r} is not a valid namespace name")
    settings = validation.AlertSettings(max_age=max_age, push_interval=push_interval, window=window,
                                lookback=lookback, cluster_label=cluster_label, namespace=namespace,
                                catalog=load_catalog(instance_types))
    files = validation.render_alert_files(settings)
    onboarding.write_tree(files, out)
    click.echo(f"wrote {len(files)} files to {out} ({', '.join(sorted(files))})")
