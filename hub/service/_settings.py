"""What `gpufleet serve` was told, as one value, and the scheduled work built from it.

:class:`ServeSettings` is every option of `serve` after its checks (declared, with defaults
and checks, in hub.common.ServeOptions), made once by :func:`serve_settings` (the click
command only gathers the options), and handed whole to the
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

import logging
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field

from hub import usage
from hub.common import (
    InputError,
    ServeOptions,
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


def _price_table(value: Any) -> Any:
    """``--prices FILE``: the table, read once here (every worker gets the table, not the
    path); a table given in Python is kept."""
    return usage.load_prices(value) if isinstance(value, str) else value


class ServeSettings(ServeOptions):
    """Every option of `gpufleet serve`, checked (hub.common.ServeOptions declares them and
    their defaults, so a test names only what it changes), with what is built from them:
    the database, the hub's settings, the price table and the idle rule."""

    db: str | None = None
    hub: HubSettings = Field(default_factory=lambda: HubSettings(url=""))
    #: the table read from the --prices file the options name
    prices: Annotated[usage.Prices | None,
                      BeforeValidator(_price_table)] = None  # type: ignore[assignment]

    @property
    def idle_rule(self) -> usage.IdleRule:
        return usage.IdleRule(self.idle_threshold, self.idle_for)

    @property
    def host(self) -> str:
        return parse_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return parse_listen(self.listen)[1]

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


def serve_settings(*, db: str | None, hub: HubSettings, **options: Any) -> ServeSettings:
    """The settings `serve`'s options (the fields of hub.common.ServeOptions) describe, or a
    one-line InputError (exit 2) for the first thing wrong with them: each field's own
    check, then those that join several options and read files."""
    settings = ServeSettings.build(db=db, hub=hub, **options)
    usage.check_settings(bucket=settings.usage_bucket, push_interval=settings.push_interval,
                         retention=settings.usage_retention,
                         max_backfill=settings.usage_max_backfill)
    auth = settings.authenticator()
    if not auth.enabled and not is_loopback(settings.host) \
            and not settings.allow_unauthenticated:
        raise InputError(f"--listen {settings.listen} is not a loopback address and no "
                         "access is configured: give --tokens-file or --oidc-issuer (or, "
                         "unsafe, --allow-unauthenticated)")
    settings.tls()  # an unreadable or expired certificate: exit 2 now, not in a worker
    hub.validate()  # the hub's URL, timeouts and TLS files: once, not once per worker
    return settings


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
