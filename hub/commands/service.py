"""``gpufleet serve`` and ``gpufleet hub render``: thin click wrappers over hub.service."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import click
import yaml
from sqlalchemy.engine import Engine

from hub import inventory as inv
from hub import onboard, usage
from hub import service as svc
from hub.commands.core import database, hub_client
from hub.commands.usage import idle_options
from hub.commands.validate import instance_types_option, load_catalog
from hub.common import (
    DURATION,
    ConfiguredCommand,
    ConfiguredGroup,
    InputError,
    RedactingFilter,
    UnavailableError,
    cluster_label_option,
    db_option,
    env,
    format_duration,
    hub_options,
    lock_timeout_option,
    max_age_option,
    min_charge_option,
    on_sigterm,
    output_option,
    parse_duration,
    parse_listen,
    push_interval_option,
    register_secret,
    stale_after_option,
    window_option,
)
from hub.inventory import SyncResult, run_sync, safe_url
from hub.store import HubClient

log = logging.getLogger("gpufleet.service")


def service_jobs(engine: Engine, client: HubClient, *, stale_after: float, cluster_label: str,
                 lock_timeout: float, reconcile: bool = False, max_age: float = 3600.0,
                 push_interval: float = 300.0, window: float = 3600.0,
                 usage_bucket: float = 3600.0, usage_retention: float = 400 * 86400.0,
                 usage_max_backfill: float = 48 * 3600.0, min_charge: float = 0.0,
                 prune_stale_after: float | None = None, catalog: Any = None,
                 stopping: Callable[[], bool] = lambda: False) -> svc.Jobs:
    """The scheduled work: sync; then, when asked, a hub-side reconcile and a prune of what
    has been stale for longer than ``prune_stale_after``; then every completed usage bucket
    not collected yet (a push interval after its end); then the findings. ``stopping``
    (SIGTERM) ends a usage catch-up between two buckets; the next start resumes it.

    The findings are exactly `gpufleet report`'s (hub.validate.assess with this client), so
    /api/v1/findings and `gpufleet_findings` agree with what an operator prints.
    """
    from hub import validate as validation

    def sync() -> SyncResult:
        return run_sync(engine, client, stale_after=stale_after, cluster_label=cluster_label,
                        lock_timeout=lock_timeout)

    def reconcile_job() -> None:  # catalog: GPUs per instance type (None: the shipped one)
        views, covered = validation.nodes_from_hub(
            client, stale_after=stale_after, cluster_label=cluster_label,
            keep=catalog.label_keys if catalog is not None else ())
        validation.reconcile_run(engine, views, covered, source="hub", catalog=catalog)

    def findings() -> list[dict[str, Any]]:
        assessed = validation.assess(engine, client, max_age=max_age, push_interval=push_interval,
                                   window=window, cluster_label=cluster_label)
        # with the namespace a finding's message names, so the API can keep it from others
        return [{**f.as_dict(), "namespace": f.namespace} for f in assessed.findings]

    def usage_job() -> None:
        result = usage.collect_usage(engine, client, bucket=usage_bucket,
                                     push_interval=push_interval, retention=usage_retention,
                                     max_backfill=usage_max_backfill,
                                     cluster_label=cluster_label, min_charge=min_charge,
                                     lock_timeout=max(lock_timeout, 60.0), stop=stopping)
        if result.collected:
            log.info("usage: collected %d bucket(s), %d rows", len(result.collected),
                     result.rows)
        if result.stopped:
            log.info("usage: stopped between buckets, %d left for the next start",
                     result.stopped)
        if result.failed:
            raise UnavailableError(f"usage: {len(result.failed)} bucket(s) not collected "
                                   f"({result.failed[0][1]}); retried after the next sync")

    def prune_job() -> None:
        assert prune_stale_after is not None
        result = inv.prune(engine, stale_for=prune_stale_after, lock_timeout=lock_timeout)
        if result.rows:
            log.info("%s", result.summary())
            for row in result.rows:
                log.info("pruned %s %s", row["kind"], " ".join(
                    str(row[k]) for k in ("cluster", "node", "uuid", "slice") if row[k]))

    after: list = []
    if reconcile:
        after.append(reconcile_job)
    if prune_stale_after:
        after.append(prune_job)
    after.append(usage_job)
    return svc.Jobs(sync=sync, after_sync=after, findings=findings)


def _prepare_schema(engine: Engine) -> None:
    """Create the schema now so the API answers before the first sync finishes.

    An old schema is the user's to upgrade (exit 2, as `sync` does); a database that is not
    up yet is the scheduler's business: it retries with backoff and /healthz says why.
    """
    try:
        inv.ensure_schema(engine)
    except InputError:
        raise
    except Exception as exc:
        log.warning("inventory database not ready yet: %s", svc.describe_error(exc))


def _file_option(name: str, help: str) -> Any:
    return click.option(name, envvar=env(name[2:]), metavar="FILE",
                        type=click.Path(dir_okay=False), help=help)


class _ServeGroup(ConfiguredCommand, click.Group):
    """``serve`` runs the service; ``serve token create`` helps configure who may read it."""


@click.group(cls=_ServeGroup, invoke_without_command=True)
@click.option("--every", type=DURATION, default="5m", show_default=True, envvar=env("every"),
              metavar="DURATION", help="Sync interval; a failed sync is retried sooner "
              "(5s, 10s, 20s ... at most DURATION).")
@click.option("--listen", envvar=env("listen"), default="127.0.0.1:8080", show_default=True,
              metavar="HOST:PORT", help="Address of /metrics, /healthz and /api/v1 "
              "(0.0.0.0:8080 in a pod). Without --tokens-file or --oidc-issuer only a "
              "loopback address is accepted, unless --allow-unauthenticated.")
@click.option("--reconcile", is_flag=True, envvar=env("reconcile"),
              help="After each sync, reconcile GPU counts with kube-state-metrics through the "
                   "hub (no access to the spokes needed).")
@instance_types_option
@_file_option("--tokens-file",
              help="YAML of static tokens (name, sha256, scope), re-read when it changes; "
                   "make entries with `gpufleet serve token create`.")
@click.option("--oidc-issuer", envvar=env("oidc-issuer"), metavar="URL",
              help="Accept OIDC bearer tokens (JWTs) of this issuer (Keycloak realm URL, "
                   "Dex, OpenShift's OAuth as an OIDC issuer); needs --oidc-audience and "
                   "--scopes-file.")
@click.option("--oidc-audience", envvar=env("oidc-audience"), metavar="AUD",
              help="The audience ('aud') an OIDC token must be issued for.")
@click.option("--oidc-scope-claim", envvar=env("oidc-scope-claim"), default="groups",
              show_default=True, metavar="CLAIM",
              help="Token claim holding the caller's groups, mapped by --scopes-file.")
@_file_option("--scopes-file",
              help="YAML mapping OIDC groups to scopes (clusters, namespaces).")
@click.option("--allow-unauthenticated", is_flag=True, envvar=env("allow-unauthenticated"),
              help="UNSAFE: serve every namespace and pod name to anyone who reaches a "
                   "non-loopback --listen address, without a token.")
@click.option("--metrics-open/--metrics-closed", default=True, show_default=True,
              envvar=env("metrics-open"),
              help="Whether /metrics answers without a token (closed: a token whose scope "
                   "is the whole fleet).")
@click.option("--session-ttl", type=DURATION, default="8h", show_default=True,
              envvar=env("session-ttl"), metavar="DURATION",
              help="How long a browser stays signed in at /login (at most until its token "
                   "expires); sessions live in the inventory database, shared by replicas "
                   "and kept across a restart.")
@click.option("--forwarded-allow-ips", envvar=env("forwarded-allow-ips"), default="",
              metavar="IP[,CIDR...]",
              help="Proxies (an ingress controller, the OpenShift router) whose "
                   "X-Forwarded-For and X-Forwarded-Proto are believed: addresses or networks, "
                   "comma-separated, or '*' for any peer. Default: none, not even loopback, "
                   "so no client can pick the address the log and limits see.")
@_file_option("--tls-cert-file",
              help="Serve HTTPS with this certificate (PEM, chain allowed); re-read when it "
                   "changes, as cert-manager rotates it.")
@_file_option("--tls-key-file", help="Private key of --tls-cert-file (PEM).")
@_file_option("--prices", help="Showback: YAML of prices per GPU-hour by model (as in "
              "`gpufleet usage --prices`); /api/v1/usage then has cost per group.")
@click.option("--usage-bucket", type=DURATION, default="1h", show_default=True,
              metavar="DURATION", help="Usage ledger bucket: each completed one is collected "
              "after the sync that follows it (see `gpufleet usage collect`).")
@click.option("--usage-retention", type=DURATION, default="400d", show_default=True,
              metavar="DURATION", help="Usage rows older than this are removed (at least 1d).")
@click.option("--usage-max-backfill", type=DURATION, default="48h", show_default=True,
              metavar="DURATION", help="How far back missed usage buckets are caught up "
              "(after a restart or a hub outage).")
@click.option("--prune-stale-after", type=DURATION, envvar=env("prune-stale-after"),
              metavar="DURATION", help="After each sync, delete GPUs, nodes and clusters "
              "stale for longer than this (as `gpufleet inventory prune`). Default: never.")
@click.option("--workers", type=click.IntRange(1, 64), envvar=env("workers"), metavar="N",
              help="Processes serving the port (default: the CPUs available, a container's "
                   "CPU limit included). One of them, across workers and replicas, runs the "
                   "schedule; every one serves.")
@idle_options
@max_age_option
@push_interval_option
@min_charge_option
@window_option
@stale_after_option
@lock_timeout_option
@hub_options
@cluster_label_option
@db_option
@click.pass_context
def serve(ctx: click.Context, every: float, listen: str, reconcile: bool, workers: int | None,
          tokens_file: str | None, oidc_issuer: str | None, oidc_audience: str | None,
          oidc_scope_claim: str, scopes_file: str | None, allow_unauthenticated: bool,
          metrics_open: bool, session_ttl: float, forwarded_allow_ips: str,
          tls_cert_file: str | None,
          tls_key_file: str | None, usage_bucket: float, usage_retention: float,
          usage_max_backfill: float, prices: str | None, prune_stale_after: float | None,
          instance_types: str | None,
          max_age: float, push_interval: float, min_charge: float, window: float,
          stale_after: float,
          lock_timeout: float, cluster_label: str, db: str | None, idle_threshold: float,
          idle_for: float, **opts: Any) -> None:
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

    After each successful sync it runs the checks of `gpufleet report` (served at
    /api/v1/findings and as gpufleet_findings) and, with --reconcile, a reconcile from
    kube-state-metrics through the hub. Syncs take the same lock as `gpufleet sync`, so a
    CronJob or a second service on the same database never runs beside it. SIGTERM stops it
    cleanly (exit 0); Ctrl-C exits 130.

    The idle rule (--idle-threshold, --idle-for, GPUFLEET_IDLE_THRESHOLD/_FOR) is the
    page's and the default of /api/v1/usage and /api/v1/idle: the same answer as `gpufleet
    usage` and `gpufleet idle` given the same rule.
    """
    if ctx.invoked_subcommand is not None:
        return
    if every <= 0:
        raise InputError("--every must be greater than 0")
    if stale_after <= 0:
        raise InputError("--stale-after must be greater than 0")
    if session_ttl <= 0:
        raise InputError("--session-ttl must be greater than 0")
    if not oidc_scope_claim.strip() or not oidc_scope_claim.isprintable():
        raise InputError(f"--oidc-scope-claim {oidc_scope_claim!r} is not a claim name (every "
                         "OIDC caller would have no group and get 403)")
    if prune_stale_after is not None and prune_stale_after <= stale_after:
        raise InputError("--prune-stale-after must be longer than --stale-after")
    usage.check_settings(bucket=usage_bucket, push_interval=push_interval,
                         retention=usage_retention, max_backfill=usage_max_backfill)
    proxies = proxy_addresses(forwarded_allow_ips)
    price_table = usage.load_prices(prices) if prices else None
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise InputError(f"--listen: {exc}") from None
    auth = access(tokens_file=tokens_file, oidc_issuer=oidc_issuer,
                  oidc_audience=oidc_audience, oidc_scope_claim=oidc_scope_claim,
                  scopes_file=scopes_file)
    if not auth.enabled and not svc.is_loopback(host) and not allow_unauthenticated:
        raise InputError(f"--listen {listen} is not a loopback address and no access is "
                         "configured: give --tokens-file or --oidc-issuer (or, unsafe, "
                         "--allow-unauthenticated)")
    if (tls_cert_file is None) != (tls_key_file is None):
        raise InputError("--tls-cert-file and --tls-key-file go together")
    tls = svc.TlsFiles(tls_cert_file, tls_key_file) if tls_cert_file and tls_key_file else None
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # no URL password in any line, whoever logs
        handler.addFilter(RedactingFilter())
        handler.addFilter(_UvicornNames())
    logging.getLogger("alembic").setLevel(logging.WARNING)

    def worker(sock: Any = None) -> None:
        if auth.oidc is not None:  # in the worker: no HTTP connection shared over a fork
            auth.oidc.jwks.warm()
        stopping = threading.Event()  # SIGTERM: set at once, so long work ends between steps
        with hub_client(opts) as client, database(db, create=True) as engine:
            readonly = svc.read_only_engine(db)
            try:
                jobs = service_jobs(engine, client, stale_after=stale_after,
                                    cluster_label=cluster_label, lock_timeout=lock_timeout,
                                    reconcile=reconcile, max_age=max_age,
                                    push_interval=push_interval, window=window,
                                    usage_bucket=usage_bucket,
                                    usage_retention=usage_retention,
                                    usage_max_backfill=usage_max_backfill,
                                    min_charge=min_charge,
                                    prune_stale_after=prune_stale_after,
                                    catalog=(load_catalog(instance_types) if reconcile
                                             else None),
                                    stopping=stopping.is_set)
                rule = usage.IdleRule(idle_threshold, idle_for)
                try:  # bind first: a port in use fails before anything touches the database
                    service = svc.build_service(
                        jobs, every=every, engine=readonly, host=host, port=port,
                        page_sections=svc.usage_sections(rule), auth=auth,
                        metrics_open=metrics_open, tls=tls,
                        sessions=svc.DbSessions(engine, ttl=session_ttl),
                        prices=price_table, idle_rule=rule, forwarded_allow_ips=proxies,
                        leader=svc.leadership(engine), sock=sock)
                except OSError as exc:
                    reason = exc.strerror or str(exc)
                    raise InputError(f"cannot listen on {listen}: {reason}") from None
                try:
                    _prepare_schema(engine)
                except BaseException:
                    service.server.close()
                    raise
                _run(service, client, engine, every, stopping)
            finally:
                readonly.dispose()

    count = workers or svc.available_cpus()
    if count == 1:
        worker()
        return
    try:  # one socket, bound here, accepted from by every worker
        sock = svc.bind(host, port, listen=False)
    except OSError as exc:
        raise InputError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    with database(db, create=True) as engine:  # once, before the workers race for it
        _prepare_schema(engine)
    svc.prefork(count, lambda: worker(sock))


def proxy_addresses(text: str) -> list[str]:
    """``--forwarded-allow-ips``: addresses and networks (``10.128.0.0/14``), or ``*``."""
    import ipaddress

    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name == "*":
            continue
        try:
            ipaddress.ip_network(name, strict=False)
        except ValueError:
            raise InputError(f"--forwarded-allow-ips: {name!r} is not an IP address or "
                             "network (e.g. 10.128.0.0/14), nor '*'") from None
    return names


class _UvicornNames(logging.Filter):
    """uvicorn logs its normal lines (started, waiting, shutting down) under "uvicorn.error";
    someone grepping the log for errors should not find them: they read as "uvicorn"."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "uvicorn.error" and record.levelno < logging.WARNING:
            record.name = "uvicorn"
        return True


def access(*, tokens_file: str | None, oidc_issuer: str | None, oidc_audience: str | None,
           oidc_scope_claim: str = "groups", scopes_file: str | None) -> svc.Authenticator:
    """The authenticator the options describe; a bad combination or file is exit 2."""
    tokens = svc.TokenFile(tokens_file) if tokens_file else None
    oidc = None
    if oidc_issuer:
        # its password, if it has one, is never in a log line or an error (this one's too)
        register_secret(urlsplit(oidc_issuer).password)
        if not oidc_audience:
            raise InputError("--oidc-issuer needs --oidc-audience (the 'aud' tokens are "
                             "issued for)")
        if not scopes_file:
            raise InputError("--oidc-issuer needs --scopes-file (which group sees what)")
        parsed = urlsplit(oidc_issuer)
        if parsed.scheme != "https" and not (parsed.scheme == "http" and parsed.hostname
                                             and svc.is_loopback(parsed.hostname)):
            raise InputError(f"--oidc-issuer must be an https:// URL, not {oidc_issuer!r}")
        oidc = svc.OidcVerifier(oidc_issuer, oidc_audience, svc.load_group_scopes(scopes_file),
                                claim=oidc_scope_claim)
    elif oidc_audience or scopes_file:
        raise InputError("--oidc-audience and --scopes-file need --oidc-issuer")
    return svc.Authenticator(tokens=tokens, oidc=oidc)


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
@output_option("text", "json", default="text")
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


def _run(service: svc.Service, client: HubClient, engine: Engine, every: float,
         stop: threading.Event | None = None) -> None:
    stop = stop or threading.Event()  # set by SIGTERM; Ctrl-C stays a KeyboardInterrupt (130)
    with on_sigterm(lambda signum, frame: stop.set()):
        service.start()
        click.echo(f"gpufleet serve: {service.url} (sync every {format_duration(every)} from "
                   f"{client.safe_url} into {safe_url(engine)})", err=True)
        try:
            while not stop.wait(0.5):
                pass
            click.echo("gpufleet serve: terminated, shutting down", err=True)
        finally:
            service.stop()


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
@click.option("--every", envvar=env("every"), default="5m", show_default=True,
              metavar="DURATION", help="Sync interval (a CronJob needs a divisor of 1h or 24h).")
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
@click.option("--oidc-issuer", envvar=env("oidc-issuer"), metavar="URL",
              help="Accept OIDC bearer tokens of this https issuer (serve --oidc-issuer); "
                   "needs --oidc-audience and --scopes-configmap.")
@click.option("--oidc-audience", envvar=env("oidc-audience"), metavar="AUD",
              help="The audience ('aud') an OIDC token must be issued for.")
@click.option("--oidc-scope-claim", envvar=env("oidc-scope-claim"),
              default=onboard.DEFAULT_SCOPE_CLAIM, show_default=True, metavar="CLAIM",
              help="Token claim holding the caller's groups.")
@click.option("--scopes-configmap", envvar=env("scopes-configmap"), metavar="NAME",
              help=f"ConfigMap whose key '{onboard.SCOPES_KEY}' maps OIDC groups to scopes "
                   "(serve --scopes-file).")
@click.option("--allow-unauthenticated", is_flag=True, envvar=env("allow-unauthenticated"),
              help="UNSAFE: render a service that answers anyone who reaches it, without a "
                   "token (refused unless given, when neither --tokens-secret nor "
                   "--oidc-issuer is).")
@click.option("--allow-from-namespace", "allow_from_namespaces", multiple=True,
              envvar=env("allow-from-namespace"), metavar="NS",
              help="A namespace whose pods may reach the service (repeat: ingress "
                   "controller, monitoring). Default: only the service's own namespace.")
@click.option("--forwarded-allow-ips", envvar=env("forwarded-allow-ips"), default="",
              metavar="IP[,CIDR...]",
              help="Proxies whose X-Forwarded-For the service believes (serve "
                   "--forwarded-allow-ips): the cluster network's CIDR behind an ingress or "
                   "an OpenShift route. Default: none.")
@click.option("--prune-stale-after", type=DURATION, envvar=env("prune-stale-after"),
              metavar="DURATION", help="Let the Deployment delete what has been stale for "
              "longer than this after each sync (serve --prune-stale-after). Default: never.")
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
def hub_render(out: str | None, namespace: str, image: str, kind: str, every: str,
               hub_url: str | None, db_secret: str, hub_token_secret: str,
               hub_ca_configmap: str | None, hub_ca_key: str, tls_secret: str | None,
               tokens_secret: str | None, oidc_issuer: str | None,
               oidc_audience: str | None, oidc_scope_claim: str,
               scopes_configmap: str | None, allow_unauthenticated: bool,
               allow_from_namespaces: tuple[str, ...], forwarded_allow_ips: str,
               prune_stale_after: float | None, replicas: int, cpu_limit: float,
               grafana: bool, cluster_label: str,
               **_: Any) -> None:
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
    values = onboard.hub_service_values(
        hub_url=hub_url, namespace=namespace, image=image, kind=kind, every=seconds,
        db_secret=db_secret, hub_token_secret=hub_token_secret,
        hub_ca_configmap=hub_ca_configmap, hub_ca_key=hub_ca_key, tls_secret=tls_secret,
        tokens_secret=tokens_secret, prune_stale_after=prune_stale_after,
        oidc_issuer=oidc_issuer, oidc_audience=oidc_audience,
        oidc_scope_claim=oidc_scope_claim, scopes_configmap=scopes_configmap,
        allow_unauthenticated=allow_unauthenticated,
        allow_from_namespaces=allow_from_namespaces,
        forwarded_allow_ips=proxy_addresses(forwarded_allow_ips), replicas=replicas,
        cpu_limit=cpu_limit)
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
