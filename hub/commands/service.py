"""``gpufleet serve`` and ``gpufleet hub render``: thin click wrappers over hub.service."""

from __future__ import annotations

import logging
import threading
from typing import Any

import click
from sqlalchemy.engine import Engine

from hub import inventory as inv
from hub import onboard
from hub import service as svc
from hub.commands.core import database, hub_client
from hub.common import (
    DURATION,
    ConfiguredCommand,
    ConfiguredGroup,
    InputError,
    UnavailableError,
    cluster_label_option,
    db_option,
    env,
    format_duration,
    hub_options,
    lock_timeout_option,
    max_age_option,
    on_sigterm,
    parse_duration,
    parse_listen,
    push_interval_option,
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
                 prune_stale_after: float | None = None) -> svc.Jobs:
    """The scheduled work: sync; then, when asked, a hub-side reconcile and a prune of what
    has been stale for longer than ``prune_stale_after``; then every completed usage bucket
    not collected yet (a push interval after its end); then the findings.

    The findings are exactly `gpufleet report`'s (hub.validate.assess with this client), so
    /api/v1/findings and `gpufleet_findings` agree with what an operator prints.
    """
    from hub import validate as validation

    def sync() -> SyncResult:
        return run_sync(engine, client, stale_after=stale_after, cluster_label=cluster_label,
                        lock_timeout=lock_timeout)

    def reconcile_job() -> None:
        views, covered = validation.nodes_from_hub(client, stale_after=stale_after,
                                                 cluster_label=cluster_label)
        validation.reconcile_run(engine, views, covered, source="hub")

    def findings() -> list[dict[str, Any]]:
        assessed = validation.assess(engine, client, max_age=max_age, push_interval=push_interval,
                                   window=window, cluster_label=cluster_label)
        return [f.as_dict() for f in assessed.findings]

    def usage_job() -> None:
        result = inv.collect_usage(engine, client, bucket=usage_bucket, delay=push_interval,
                                   retention=usage_retention, cluster_label=cluster_label,
                                   step=min(60.0, usage_bucket))
        if result.collected:
            log.info("usage: collected %d bucket(s), %d rows", len(result.collected),
                     result.rows)
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


@click.command(cls=ConfiguredCommand)
@click.option("--every", type=DURATION, default="5m", show_default=True, envvar=env("every"),
              metavar="DURATION", help="Sync interval; a failed sync is retried sooner "
              "(5s, 10s, 20s ... at most DURATION).")
@click.option("--listen", envvar=env("listen"), default="127.0.0.1:8080", show_default=True,
              metavar="HOST:PORT", help="Address of /metrics, /healthz and /api/v1 "
              "(0.0.0.0:8080 in a pod).")
@click.option("--reconcile", is_flag=True, envvar=env("reconcile"),
              help="After each sync, reconcile GPU counts with kube-state-metrics through the "
                   "hub (no access to the spokes needed).")
@click.option("--usage-bucket", type=DURATION, default="1h", show_default=True,
              metavar="DURATION", help="Usage ledger bucket: each completed one is collected "
              "after the sync that follows it (see `gpufleet usage collect`).")
@click.option("--usage-retention", type=DURATION, default="400d", show_default=True,
              metavar="DURATION", help="Usage rows older than this are removed.")
@click.option("--prune-stale-after", type=DURATION, envvar=env("prune-stale-after"),
              metavar="DURATION", help="After each sync, delete GPUs, nodes and clusters "
              "stale for longer than this (as `gpufleet inventory prune`). Default: never.")
@max_age_option
@push_interval_option
@window_option
@stale_after_option
@lock_timeout_option
@hub_options
@cluster_label_option
@db_option
def serve(every: float, listen: str, reconcile: bool, usage_bucket: float,
          usage_retention: float, prune_stale_after: float | None, max_age: float,
          push_interval: float, window: float, stale_after: float, lock_timeout: float,
          cluster_label: str, db: str | None, **opts: Any) -> None:
    """Run the hub service: sync on a schedule and serve the inventory over HTTP.

    \b
    Endpoints (read-only, GET/HEAD):
      /                      a live HTML page of the fleet (search by GPU UUID, node, namespace)
      /healthz               200 while the last sync succeeded within two intervals, else 503
      /metrics               Prometheus metrics (sync duration, failures, GPUs by state, ...)
      /api/v1/openapi.json   the API's OpenAPI description
      /api/v1/clusters, /nodes, /gpus[/UUID[/history]], /findings, /sync-runs
      /api/v1/usage, /idle, /capacity, /events (docs/usage.md)

    After each successful sync it runs the checks of `gpufleet report` (served at
    /api/v1/findings and as gpufleet_findings) and, with --reconcile, a reconcile from
    kube-state-metrics through the hub. Syncs take the same lock as `gpufleet sync`, so a
    CronJob or a second service on the same database never runs beside it. SIGTERM stops it
    cleanly (exit 0); Ctrl-C exits 130.
    """
    if every <= 0:
        raise InputError("--every must be greater than 0")
    if stale_after <= 0:
        raise InputError("--stale-after must be greater than 0")
    if prune_stale_after is not None and prune_stale_after <= stale_after:
        raise InputError("--prune-stale-after must be longer than --stale-after")
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise InputError(f"--listen: {exc}") from None
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    with hub_client(opts) as client, database(db, create=True) as engine:
        readonly = svc.read_only_engine(db)
        try:
            jobs = service_jobs(engine, client, stale_after=stale_after,
                                cluster_label=cluster_label, lock_timeout=lock_timeout,
                                reconcile=reconcile, max_age=max_age,
                                push_interval=push_interval, window=window,
                                usage_bucket=usage_bucket, usage_retention=usage_retention,
                                prune_stale_after=prune_stale_after)
            try:  # bind first: a port in use fails before anything touches the database
                service = svc.build_service(jobs, every=every, engine=readonly, host=host,
                                            port=port, page_sections=svc.USAGE_SECTIONS)
            except OSError as exc:
                reason = exc.strerror or str(exc)
                raise InputError(f"cannot listen on {listen}: {reason}") from None
            try:
                _prepare_schema(engine)
            except BaseException:
                service.server.server_close()
                raise
            _run(service, client, engine, every)
        finally:
            readonly.dispose()


def _run(service: svc.Service, client: HubClient, engine: Engine, every: float) -> None:
    stop = threading.Event()  # set by SIGTERM; Ctrl-C stays a KeyboardInterrupt (exit 130)
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
@click.option("--prune-stale-after", type=DURATION, envvar=env("prune-stale-after"),
              metavar="DURATION", help="Let the Deployment delete what has been stale for "
              "longer than this after each sync (serve --prune-stale-after). Default: never.")
def hub_render(out: str | None, namespace: str, image: str, kind: str, every: str,
               hub_url: str | None, db_secret: str, hub_token_secret: str,
               hub_ca_configmap: str | None, hub_ca_key: str,
               prune_stale_after: float | None, **_: Any) -> None:
    """Write the hub service's manifests into --out (apply with `kubectl apply -k DIR`).

    Secrets are referenced by name, never rendered: create the database Secret (and the
    token Secret / CA ConfigMap) yourself.
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
        hub_ca_configmap=hub_ca_configmap, hub_ca_key=hub_ca_key,
        prune_stale_after=prune_stale_after)
    files = onboard.render_hub_service(values)
    onboard.write_tree(files, out)
    click.echo(f"wrote {len(files)} files to {out} (kubectl apply -k {out})")


hub_group.name = "hub"
