"""``gpufleet serve`` and ``gpufleet hub render``: thin click wrappers over hub.service."""

from __future__ import annotations

import json
import logging
from typing import Any

import click
import yaml

from hub import onboard
from hub import service as svc
from hub.commands.core import hub_settings
from hub.common import (
    ConfiguredCommand,
    ConfiguredGroup,
    InputError,
    RedactingFilter,
    ServeOptions,
    cluster_label_option,
    db_option,
    env,
    hub_options,
    option,
    options_of,
    output_option,
    parse_duration,
    pick,
    proxy_addresses,
)

#: serve's options in the order `serve --help` lists them (the hub's, the database's and the
#: idle rule's follow)
SERVE_OPTIONS = (
    "every", "listen", "reconcile", "instance_types", "placement_scores",
    "placement_kubeconfig", "placement_context", "full_at", "tokens_file", "oidc_issuer",
    "oidc_audience", "oidc_scope_claim", "scopes_file", "allow_unauthenticated",
    "metrics_open", "session_ttl", "forwarded_allow_ips", "tls_cert_file", "tls_key_file",
    "prices", "usage_bucket", "usage_retention", "usage_max_backfill", "prune_stale_after",
    "workers", "max_age", "push_interval", "min_charge", "window", "stale_after",
    "replaced_within", "lemon_threshold", "lock_timeout", "query_concurrency", "shard_size",
    "cluster_label", "idle_threshold", "idle_for")


class _ServeGroup(ConfiguredCommand, click.Group):
    """``serve`` runs the service; ``serve token create`` helps configure who may read it."""


@click.group(cls=_ServeGroup, invoke_without_command=True)
@options_of(ServeOptions, *SERVE_OPTIONS)
@hub_options
@db_option
@click.pass_context
def serve(ctx: click.Context, db: str | None, **opts: Any) -> None:
    """Run the hub service: sync on a schedule and serve the inventory over HTTP.

    \b
    Endpoints (read-only, GET/HEAD):
      /                      a live HTML page of the fleet (search by GPU UUID, node, namespace)
      /clusters/C, /nodes/C/N, /gpus/UUID   pages of one cluster, node, GPU (links from /)
      /login, /logout        sign a browser in with a token, and out (with access configured)
      /healthz               200 while the last sync succeeded within two intervals, else 503
      /metrics               Prometheus metrics (sync duration, failures, GPUs by state, ...)
      /api/v1/openapi.json   the API's OpenAPI description
      /api/v1/clusters, /nodes, /gpus[/UUID[/history]], /findings, /sync-runs
      /api/v1/usage, /idle, /capacity, /events (docs/usage.md)

    \b
    Access: with --tokens-file and/or --oidc-issuer every endpoint but /healthz (and
    /metrics unless --metrics-closed) wants "Authorization: Bearer TOKEN" (401 without,
    403 outside the caller's scope), or the session cookie of a browser signed in at
    /login with such a token (--session-ttl). Without either the service listens on
    loopback only.
    /api/v1/allocations lists who uses which GPU.

    After each successful sync it runs the checks of `gpufleet report` (written to the
    database, from where every worker and replica serves them at /api/v1/findings and as
    gpufleet_findings; "not checked yet" until they first ran) and, with --reconcile, a
    reconcile from kube-state-metrics through the hub; with --placement-scores, the ACM
    placement scores (valid for three --every). Syncs take the same lock as `gpufleet sync`, so a
    CronJob or a second service on the same database never runs beside it. SIGTERM stops it
    cleanly (exit 0); Ctrl-C exits 130.

    The idle rule (--idle-threshold, --idle-for, GPUFLEET_IDLE_THRESHOLD/_FOR) is the
    page's and the default of /api/v1/usage and /api/v1/idle: the same answer as `gpufleet
    usage` and `gpufleet idle` given the same rule.
    """
    if ctx.invoked_subcommand is not None:
        return
    settings = svc.serve_settings(db=db, hub=hub_settings(opts), **pick(ServeOptions, opts))
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # no URL password in any line, whoever logs
        handler.addFilter(RedactingFilter())
        handler.addFilter(_UvicornNames())
    logging.getLogger("alembic").setLevel(logging.WARNING)
    svc.serve(settings)


class _UvicornNames(logging.Filter):
    """uvicorn logs its normal lines (started, waiting, shutting down) under "uvicorn.error";
    someone grepping the log for errors should not find them: they read as "uvicorn"."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "uvicorn.error" and record.levelno < logging.WARNING:
            record.name = "uvicorn"
        return True


@serve.group("token", cls=ConfiguredGroup)
def token_group() -> None:
    """Static tokens for --tokens-file."""


def _names(values: tuple[str, ...], option: str) -> list[str]:
    """The names of a ``--clusters``/``--namespaces`` option (repeatable, comma-separated).
    Given but naming nothing (``--clusters ''``) is an error: read as "no restriction" it
    would make a whole-fleet token out of a typo or an empty variable."""
    names = sorted({n.strip() for v in values for n in v.split(",") if n.strip()})
    if values and not names:
        raise InputError(f"{option} names no {option[2:-1]}: give at least one name, or "
                         f"leave {option} out for all")
    bad = next((n for n in names if not n.isprintable()), None)
    if bad is not None:
        raise InputError(f"{option}: {bad!r} is not a name (control characters)")
    return names


@token_group.command("create", cls=ConfiguredCommand)
@click.argument("name")
@click.option("--clusters", multiple=True, metavar="NAME[,NAME...]",
              help="Clusters the token may see (default: all).")
@click.option("--namespaces", multiple=True, metavar="NS[,NS...]",
              help="Namespaces whose allocations it may see by name (default: all).")
@output_option("text", "json", default="text", json_is="one object")
def token_create(name: str, clusters: tuple[str, ...], namespaces: tuple[str, ...],
                 output: str, **_: Any) -> None:
    """Make a new token: prints it once, and the line to add to the tokens file.

    The file keeps only the token's sha256, so it can live in a ConfigMap or Git; hand the
    token itself to the team through a secret channel.
    """
    if not name.strip() or not name.isprintable() or name != name.strip():
        raise InputError(f"token name {name!r}: give a name of printable characters, one "
                         "line, without surrounding spaces (it is what the log shows)")
    chosen_clusters = _names(clusters, "--clusters")
    chosen_namespaces = _names(namespaces, "--namespaces")
    token = svc.new_token()
    entry = svc.token_entry(name, token, chosen_clusters, chosen_namespaces)
    if output == "json":
        click.echo(json.dumps({"token": token, "entry": entry}))
        return
    line = "- " + yaml.safe_dump(entry, default_flow_style=True, sort_keys=False,
                                 width=10_000).strip()
    click.echo(f"token for {name} (shown once; give it to the team, keep no copy):\n"
               f"  {token}\n"
               f"add under 'tokens:' in the --tokens-file:\n  {line}")


# -- hub render -------------------------------------------------------------------------------
@click.group(cls=ConfiguredGroup)
def hub_group() -> None:
    """The hub service's own deployment."""


@hub_group.command("render", cls=ConfiguredCommand)
@click.option("--out", envvar=env("out"), metavar="DIR",
              help="Directory to write (replaced as a whole on re-render).")
@click.option("--namespace", envvar=env("hub-namespace"), default=onboard.DEFAULT_NAMESPACE,
              show_default=True, metavar="NS", help="Namespace of the hub service.")
@click.option("--image", envvar=env("hub-image"), default=onboard.DEFAULT_EXPORTER_IMAGE,
              show_default=True, help="gpufleet image.")
@click.option("--kind", envvar=env("hub-kind"), default="deployment", show_default=True,
              metavar="deployment|cronjob", help="deployment: `gpufleet serve` with metrics "
              "and API; cronjob: `gpufleet sync` on a schedule, nothing served.")
@click.option("--every", envvar=env("every"), default=ServeOptions.default("every"),
              show_default=True, metavar="DURATION",
              help="Sync interval (a CronJob needs a divisor of 1h or 24h).")
@click.option("--hub-url", envvar=env("hub-url"), metavar="URL",
              help="PromQL endpoint of the hub store, as reached from inside the cluster.")
@click.option("--db-secret", envvar=env("db-secret"), default=onboard.DEFAULT_DB_SECRET,
              show_default=True, metavar="NAME",
              help=f"Secret whose key '{onboard.DB_SECRET_KEY}' holds the database URL.")
@click.option("--hub-token-secret", envvar=env("hub-token-secret"),
              default=onboard.DEFAULT_TOKEN_SECRET, show_default=True, metavar="NAME",
              help=f"Secret whose key '{onboard.TOKEN_KEY}' holds the hub's bearer token "
                   "('' for none).")
@click.option("--hub-ca-configmap", envvar=env("hub-ca-configmap"), metavar="NAME",
              help="ConfigMap holding the hub's CA bundle (default: the system CAs).")
@click.option("--hub-ca-key", envvar=env("hub-ca-key"), default=onboard.DEFAULT_CA_KEY,
              show_default=True, metavar="KEY",
              help="Key of the CA bundle in --hub-ca-configmap (OpenShift's injected bundle: "
                   "ca-bundle.crt).")
@click.option("--tls-secret", envvar=env("tls-secret"), metavar="NAME",
              help="kubernetes.io/tls Secret (cert-manager's) to serve HTTPS with; mounted "
                   "whole so a rotation reaches the running service.")
@click.option("--tokens-secret", envvar=env("tokens-secret"), metavar="NAME",
              help=f"Secret whose key '{onboard.TOKENS_KEY}' is the API's --tokens-file "
                   "(`gpufleet serve token create` makes its entries).")
@option(ServeOptions, "oidc_issuer",
        help="Accept OIDC bearer tokens of this https issuer (serve --oidc-issuer); needs "
             "--oidc-audience and --scopes-configmap.")
@option(ServeOptions, "oidc_audience")
@click.option("--oidc-scope-claim", envvar=env("oidc-scope-claim"),
              default=ServeOptions.default("oidc_scope_claim"), show_default=True,
              metavar="CLAIM",
              help="Token claim holding the caller's groups.")
@click.option("--scopes-configmap", envvar=env("scopes-configmap"), metavar="NAME",
              help=f"ConfigMap whose key '{onboard.SCOPES_KEY}' maps OIDC groups to scopes "
                   "(serve --scopes-file).")
@option(ServeOptions, "allow_unauthenticated",
        help="UNSAFE: render a service that answers anyone who reaches it, without a token "
             "(refused unless given, when neither --tokens-secret nor --oidc-issuer is).")
@click.option("--allow-from-namespace", "allow_from_namespaces", multiple=True,
              envvar=env("allow-from-namespace"), metavar="NS",
              help="A namespace whose pods may reach the service (repeat: ingress "
                   "controller, monitoring). Default: only the service's own namespace.")
@option(ServeOptions, "forwarded_allow_ips",
        help="Proxies whose X-Forwarded-For the service believes (serve "
             "--forwarded-allow-ips): the cluster network's CIDR behind an ingress or an "
             "OpenShift route. Default: none.")
@option(ServeOptions, "prune_stale_after",
        help="Let the Deployment delete what has been stale for longer than this after each "
             "sync (serve --prune-stale-after). Default: never.")
@click.option("--replicas", type=click.IntRange(1, 100), default=onboard.DEFAULT_REPLICAS,
              show_default=True, envvar=env("replicas"), metavar="N",
              help="Replicas of the Deployment: every one serves, one (across them all) "
                   "runs the schedule; a PodDisruptionBudget keeps one up in a drain.")
@click.option("--cpu-limit", type=click.FloatRange(0.1, 64), default=onboard.DEFAULT_CPU_LIMIT,
              show_default=True, envvar=env("cpu-limit"), metavar="CORES",
              help="CPU limit of a replica; its `serve --workers` is one per whole core "
                   "(docs/operations.md says how to size them).")
@click.option("--grafana", is_flag=True, envvar=env("grafana"),
              help="Also write grafana-dashboard.yaml: a dashboard ConfigMap for ACM "
                   f"Observability's Grafana (namespace {onboard.OBSERVABILITY_NAMESPACE}, "
                   "apply on the ACM hub) with the inventory's PromQL.")
@cluster_label_option
def hub_render(out: str | None, every: str, forwarded_allow_ips: str, grafana: bool,
               cluster_label: str, **opts: Any) -> None:
    """Write the hub service's manifests into --out (apply with `kubectl apply -k DIR`).

    Secrets are referenced by name, never rendered: create the database Secret (and the
    token Secret / CA ConfigMap) yourself. The service requires a token: give
    --tokens-secret and/or --oidc-issuer, or (unsafe, warned about) --allow-unauthenticated.
    Its NetworkPolicy admits only the --allow-from-namespace namespaces.
    """
    if not out:
        raise InputError("--out DIR is required")
    try:
        seconds = parse_duration(every)
    except ValueError as exc:
        raise InputError(f"--every: {exc}") from None
    # the other options are hub_service_values' keywords, by the same names
    opts.pop("config", None)
    values = onboard.hub_service_values(
        every=seconds, forwarded_allow_ips=list(proxy_addresses(forwarded_allow_ips)), **opts)
    files = onboard.render_hub_service(
        values, extra=onboard.render_grafana(cluster_label) if grafana else None)
    onboard.write_tree(files, out)
    click.echo(f"wrote {len(files)} files to {out} (kubectl apply -k {out})")
    if values.kind == "deployment":
        click.echo("NetworkPolicy admits pods of namespace(s): "
                   + ", ".join(values.admitted_namespaces), err=True)
        if not values.authenticated:
            click.echo("WARNING: rendered with --allow-unauthenticated: the API and the page "
                       "answer anyone who reaches the service, namespace and pod names "
                       "included", err=True)


hub_group.name = "hub"
