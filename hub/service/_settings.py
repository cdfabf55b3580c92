"""What `gpufleet serve` was told, as one value, and the scheduled work built from it.

:class:`ServeSettings` is every option of `serve` after its checks, made once by
:func:`serve_settings` (the click command only gathers the options), and handed whole to the
workers (hub/service/_workers.py) and to :func:`service_jobs`. It holds plain values only
(paths, numbers, names, the hub's :class:`~hub.store.HubSettings`, the parsed prices and the
idle rule), never a thing with a lock, a socket or a session: each worker builds those from
it (its authenticator, TLS files, hub client and engines), so nothing live is shared across
the fork of `--workers N`, and the value would cross a process boundary by pickling as well.

Every check is made here, in the parent, before any worker starts: a bad option is one line
and exit 2 (the tokens file, the scopes file and the TLS files are read once for that, and
read again by each worker).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.engine import Engine

from hub import inventory as inv
from hub import usage
from hub.common import (
    InputError,
    UnavailableError,
    format_duration,
    parse_listen,
    register_secret,
)
from hub.inventory import SyncResult, run_sync
from hub.service._auth import (
    Authenticator,
    OidcVerifier,
    TokenFile,
    is_loopback,
    load_group_scopes,
)
from hub.service._leader import Leadership
from hub.service._scheduler import Jobs
from hub.service._tls import TlsFiles
from hub.store import HubClient, HubSettings

log = logging.getLogger("gpufleet.service")

#: buckets one round of serve's usage catch-up collects at most: `usage collect`'s own guard
#: (more need --yes there); the rest follow in the next rounds, after their syncs
CATCH_UP = usage.CONFIRM_BUCKETS


@dataclass(frozen=True)
class ServeSettings:
    """Every option of `gpufleet serve`, checked. The defaults are the command's own, so a
    test names only what it changes."""

    db: str | None = None
    hub: HubSettings = field(default_factory=lambda: HubSettings(url=""))
    # -- the port and who may read it
    listen: str = "127.0.0.1:8080"
    host: str = "127.0.0.1"
    port: int = 8080
    #: processes serving the port (None: the CPUs available)
    workers: int | None = None
    tokens_file: str | None = None
    oidc_issuer: str | None = None
    oidc_audience: str | None = None
    oidc_scope_claim: str = "groups"
    scopes_file: str | None = None
    metrics_open: bool = True
    session_ttl: float = 8 * 3600.0
    forwarded_allow_ips: tuple[str, ...] = ()
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # -- what the page and the API answer with
    prices: usage.Prices | None = None
    idle_rule: usage.IdleRule = field(default_factory=usage.IdleRule)
    # -- the schedule
    every: float = 300.0
    stale_after: float = 600.0
    cluster_label: str = "cluster"
    lock_timeout: float = 0.0
    reconcile: bool = False
    instance_types: str | None = None
    max_age: float = 3600.0
    push_interval: float = 300.0
    window: float = 3600.0
    usage_bucket: float = 3600.0
    usage_retention: float = 400 * 86400.0
    usage_max_backfill: float = 48 * 3600.0
    min_charge: float = 0.0
    prune_stale_after: float | None = None
    # -- ACM placement scores after each sync (the leader's schedule only)
    placement_scores: bool = False
    placement_kubeconfig: str | None = None
    placement_context: str | None = None
    full_at: float = usage.FULL_AT

    def authenticator(self) -> Authenticator:
        return access(tokens_file=self.tokens_file, oidc_issuer=self.oidc_issuer,
                      oidc_audience=self.oidc_audience, oidc_scope_claim=self.oidc_scope_claim,
                      scopes_file=self.scopes_file)

    def tls(self) -> TlsFiles | None:
        if self.tls_cert_file and self.tls_key_file:
            return TlsFiles(self.tls_cert_file, self.tls_key_file)
        return None

    def catalog(self) -> Any:  # -> hub.kube.Catalog | None
        """GPUs per instance type for the reconcile (None without --reconcile; the shipped
        catalog plus --instance-types otherwise)."""
        if not self.reconcile:
            return None
        from hub.kube import load_catalog

        return load_catalog(self.instance_types)


def serve_settings(*, every: float, listen: str, reconcile: bool, workers: int | None,
                   tokens_file: str | None, oidc_issuer: str | None,
                   oidc_audience: str | None, oidc_scope_claim: str, scopes_file: str | None,
                   allow_unauthenticated: bool, metrics_open: bool, session_ttl: float,
                   forwarded_allow_ips: str, tls_cert_file: str | None,
                   tls_key_file: str | None, usage_bucket: float, usage_retention: float,
                   usage_max_backfill: float, prices: str | None,
                   prune_stale_after: float | None, instance_types: str | None,
                   max_age: float, push_interval: float, min_charge: float, window: float,
                   stale_after: float, lock_timeout: float, cluster_label: str,
                   db: str | None, idle_threshold: float, idle_for: float,
                   hub: HubSettings, placement_scores: bool = False,
                   placement_kubeconfig: str | None = None,
                   placement_context: str | None = None,
                   full_at: float = usage.FULL_AT) -> ServeSettings:
    """The settings `serve`'s options describe, or a one-line InputError (exit 2) for the
    first thing wrong with them, in the order an operator reads the options."""
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
    usage.check_full_at(full_at)
    proxies = proxy_addresses(forwarded_allow_ips)
    price_table = usage.load_prices(prices) if prices else None
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise InputError(f"--listen: {exc}") from None
    settings = ServeSettings(
        db=db, hub=hub, listen=listen, host=host, port=port, workers=workers,
        tokens_file=tokens_file, oidc_issuer=oidc_issuer, oidc_audience=oidc_audience,
        oidc_scope_claim=oidc_scope_claim, scopes_file=scopes_file,
        metrics_open=metrics_open, session_ttl=session_ttl, forwarded_allow_ips=tuple(proxies),
        tls_cert_file=tls_cert_file, tls_key_file=tls_key_file, prices=price_table,
        idle_rule=usage.IdleRule(idle_threshold, idle_for), every=every,
        stale_after=stale_after, cluster_label=cluster_label, lock_timeout=lock_timeout,
        reconcile=reconcile, instance_types=instance_types, max_age=max_age,
        push_interval=push_interval, window=window, usage_bucket=usage_bucket,
        usage_retention=usage_retention, usage_max_backfill=usage_max_backfill,
        min_charge=min_charge, prune_stale_after=prune_stale_after,
        placement_scores=placement_scores, placement_kubeconfig=placement_kubeconfig,
        placement_context=placement_context, full_at=full_at)
    auth = settings.authenticator()
    if not auth.enabled and not is_loopback(host) and not allow_unauthenticated:
        raise InputError(f"--listen {listen} is not a loopback address and no access is "
                         "configured: give --tokens-file or --oidc-issuer (or, unsafe, "
                         "--allow-unauthenticated)")
    if (tls_cert_file is None) != (tls_key_file is None):
        raise InputError("--tls-cert-file and --tls-key-file go together")
    settings.tls()  # an unreadable or expired certificate: exit 2 now, not in a worker
    hub.validate()  # the hub's URL, timeouts and TLS files: once, not once per worker
    return settings


def proxy_addresses(text: str) -> list[str]:
    """``--forwarded-allow-ips``: addresses and networks (``10.128.0.0/14``), or ``*``."""
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


def access(*, tokens_file: str | None, oidc_issuer: str | None, oidc_audience: str | None,
           oidc_scope_claim: str = "groups", scopes_file: str | None) -> Authenticator:
    """The authenticator the options describe; a bad combination or file is exit 2."""
    tokens = TokenFile(tokens_file) if tokens_file else None
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
                                             and is_loopback(parsed.hostname)):
            raise InputError(f"--oidc-issuer must be an https:// URL, not {oidc_issuer!r}")
        oidc = OidcVerifier(oidc_issuer, oidc_audience, load_group_scopes(scopes_file),
                            claim=oidc_scope_claim)
    elif oidc_audience or scopes_file:
        raise InputError("--oidc-audience and --scopes-file need --oidc-issuer")
    return Authenticator(tokens=tokens, oidc=oidc)


def service_jobs(engine: Engine, client: HubClient, settings: ServeSettings, *,
                 stopping: Callable[[], bool] = lambda: False,
                 leader: Leadership | None = None, clock: Callable[[], float] = time.time,
                 catch_up: int = CATCH_UP) -> Jobs:
    """The scheduled work: sync; then, when asked, a hub-side reconcile and a prune of what
    has been stale for longer than ``prune_stale_after``; then every completed usage bucket
    not collected yet (a push interval after its end); then the findings. ``stopping``
    (SIGTERM) ends a usage catch-up between two buckets; the next start resumes it.

    A round's usage catch-up is bounded twice, so it never starves the sync: at most
    ``catch_up`` buckets (`usage collect`'s --yes guard), and no bucket started past half an
    interval (``clock``) after the round began; either way the rest wait for the rounds
    after the next syncs, and one log line says so. ``leader``: its lease fences the sync's
    write, and a catch-up ends between two buckets once the lease is lost.

    The findings are exactly `gpufleet report`'s (hub.validate.assess with this client), so
    /api/v1/findings and `gpufleet_findings` agree with what an operator prints.
    """
    from hub import validate as validation

    s = settings
    catalog = s.catalog()  # GPUs per instance type (None without --reconcile)

    def sync() -> SyncResult:
        return run_sync(engine, client, stale_after=s.stale_after, cluster_label=s.cluster_label,
                        lock_timeout=s.lock_timeout,
                        fence=leader.fence if leader is not None else None)

    def reconcile_job() -> None:
        views, covered = validation.nodes_from_hub(
            client, stale_after=s.stale_after, cluster_label=s.cluster_label,
            keep=catalog.label_keys if catalog is not None else ())
        validation.reconcile_run(engine, views, covered, source="hub", catalog=catalog)

    def findings() -> list[dict[str, Any]]:
        assessed = validation.assess(engine, client, max_age=s.max_age,
                                     push_interval=s.push_interval, window=s.window,
                                     cluster_label=s.cluster_label)
        # with the namespace a finding's message names, so the API can keep it from others
        return [{**f.as_dict(), "namespace": f.namespace} for f in assessed.findings]

    def usage_job() -> None:
        began = clock()
        with engine.connect() as conn:
            starts = usage.pending_buckets(conn, now=began, bucket=s.usage_bucket,
                                           max_backfill=s.usage_max_backfill,
                                           delay=s.push_interval)
        if not starts:
            return
        if len(starts) > catch_up:
            log.info("usage: %d buckets of %s not collected yet, more than %d a round: "
                     "collecting the oldest %d now, the rest in the rounds after the next "
                     "syncs", len(starts), format_duration(s.usage_bucket), catch_up,
                     catch_up)
            starts = starts[:catch_up]
        budget = began + s.every / 2
        late: list[bool] = []

        def stop() -> bool:
            if stopping() or (leader is not None and not leader.holds()):
                return True
            if clock() >= budget:
                late.append(True)
                return True
            return False

        result = usage.collect_usage(engine, client, bucket=s.usage_bucket,
                                     push_interval=s.push_interval, retention=s.usage_retention,
                                     max_backfill=s.usage_max_backfill, starts=starts,
                                     now=began, cluster_label=s.cluster_label,
                                     min_charge=s.min_charge,
                                     lock_timeout=max(s.lock_timeout, 60.0), stop=stop)
        if result.collected:
            log.info("usage: collected %d bucket(s), %d rows", len(result.collected),
                     result.rows)
        if result.stopped and late:
            log.info("usage: catch-up paused after half an interval (%s) so the next sync "
                     "is not late, %d bucket(s) left for the next rounds",
                     format_duration(s.every / 2), result.stopped)
        elif result.stopped:
            log.info("usage: stopped between buckets, %d left for the next start",
                     result.stopped)
        if result.failed:
            raise UnavailableError(f"usage: {len(result.failed)} bucket(s) not collected "
                                   f"({result.failed[0][1]}); retried after the next sync")

    def prune_job() -> None:
        assert s.prune_stale_after is not None
        result = inv.prune(engine, stale_for=s.prune_stale_after, lock_timeout=s.lock_timeout)
        if result.rows:
            log.info("%s", result.summary())
            for row in result.rows:
                log.info("pruned %s %s", row["kind"], " ".join(
                    str(row[k]) for k in ("cluster", "node", "uuid", "slice") if row[k]))

    def placement_job() -> None:
        """The scores as the sync (and the usage after it) left the inventory, valid for
        three intervals: a Placement stops trusting them when this leader stops."""
        from hub import kube, onboard

        with engine.connect() as conn:
            objects = usage.placement_scores(
                conn, now=inv.now_utc(), full_at=s.full_at, valid_for=3 * s.every,
                idle_threshold=s.idle_rule.threshold, idle_for=s.idle_rule.for_seconds)
        api = kube.hub_api_client(s.placement_kubeconfig, s.placement_context)
        with api:
            rows = onboard.apply_scores(api, objects)
        log.info("placement scores: %d applied, %d skipped (no namespace on the hub)",
                 sum(not r["action"].startswith("skipped") for r in rows),
                 sum(r["action"].startswith("skipped") for r in rows))

    after: list[Callable[[], None]] = []
    if s.reconcile:
        after.append(reconcile_job)
    if s.prune_stale_after:
        after.append(prune_job)
    after.append(usage_job)
    if s.placement_scores:  # after usage: reclaimable reads the newest bucket
        after.append(placement_job)
    return Jobs(sync=sync, after_sync=after, findings=findings)
