"""What `gpufleet serve` was told, as one value, and the scheduled work built from it.

:class:`ServeSettings` is every option of `serve` after its checks, made once by
:func:`serve_settings` (the click command only gathers the options), and handed whole to the
workers (hub/service/_workers.py) and to the runtime's jobs
(hub.service.runtime.service_jobs). It holds plain values only
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
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from hub import inventory as inv
from hub import usage
from hub.common import (
    QUERY_CONCURRENCY,
    SHARD_SIZE,
    InputError,
    parse_listen,
    register_secret,
)
from hub.service._auth import (
    Authenticator,
    OidcVerifier,
    TokenFile,
    is_loopback,
    load_group_scopes,
)
from hub.service._tls import TlsFiles
from hub.store import HubSettings

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
    #: the sync's `replaced` window and the checks' lemon line, as `sync` and `report` take
    replaced_within: float = 7 * 86400.0
    lemon_threshold: float = 2.0
    cluster_label: str = "cluster"
    lock_timeout: float = 0.0
    #: the sync's shards (GPUs each) and how many of their queries run at once: the
    #: leader's memory and the hub's load follow them (docs/operations.md)
    shard_size: int = SHARD_SIZE
    query_concurrency: int = QUERY_CONCURRENCY
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
                   full_at: float = usage.FULL_AT,
                   shard_size: int = SHARD_SIZE,
                   query_concurrency: int = QUERY_CONCURRENCY,
                   replaced_within: float = 7 * 86400.0,
                   lemon_threshold: float = 2.0) -> ServeSettings:
    """The settings `serve`'s options describe, or a one-line InputError (exit 2) for the
    first thing wrong with them, in the order an operator reads the options."""
    if every <= 0:
        raise InputError("--every must be greater than 0")
    if stale_after <= 0:
        raise InputError("--stale-after must be greater than 0")
    inv.check_within(replaced_within)
    inv.check_threshold(lemon_threshold)
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
        placement_context=placement_context, full_at=full_at, shard_size=shard_size,
        query_concurrency=query_concurrency, replaced_within=replaced_within,
        lemon_threshold=lemon_threshold)
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
