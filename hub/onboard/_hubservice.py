"""The hub service's own manifests (``gpufleet hub render``): Deployment or CronJob.

Secrets are referenced by name only; nothing secret is ever rendered. The served API is
authenticated unless asked otherwise: a Deployment needs a tokens Secret or an OIDC issuer,
or an explicit ``allow_unauthenticated`` that the files and the command say is unsafe; its
NetworkPolicy admits only the namespaces named (the service's own when none are).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from hub.common import InputError, ServeOptions, format_duration, parse_duration
from hub.onboard._render import (
    DEFAULT_EXPORTER_IMAGE,
    DEFAULT_NAMESPACE,
    PLAIN_KEY,
    _choice,
    _dns_subdomain,
    _image,
    _kustomization,
    _labels,
    _render,
    _selector,
    dns_label,
)

KINDS = ("deployment", "cronjob")
#: the service's default sync interval and OIDC group claim: `serve`'s own (its options' model)
DEFAULT_EVERY = parse_duration(ServeOptions.default("every"))
DEFAULT_DB_SECRET = "gpufleet-db"
DEFAULT_TOKEN_SECRET = "gpufleet-hub-token"
DB_SECRET_KEY = "url"
TOKEN_KEY = "token"
DEFAULT_CA_KEY = "ca.crt"
SERVICE_PORT = 8080
#: replicas of the Deployment: one leads the schedule, every one serves, and a drain or a
#: node loss leaves one serving (the PodDisruptionBudget keeps one up)
DEFAULT_REPLICAS = 2
#: CPU limit of a replica; its `serve --workers` follows it (one GIL-bound worker a core)
DEFAULT_CPU_LIMIT = 2.0
#: memory of one replica: the leader's sync (~300 MB at any fleet size, sharded) and each
#: worker's answers (docs/operations.md, sizing)
BASE_MEMORY_MIB = 512
WORKER_MEMORY_MIB = 256
TOKEN_DIR = "/etc/gpufleet/hub-token"
CA_DIR = "/etc/gpufleet/hub-ca"
DB_DIR = "/etc/gpufleet/db"
HUB_NAME = "gpufleet-hub"
TLS_DIR = "/etc/gpufleet/tls"
ACCESS_DIR = "/etc/gpufleet/access"
TOKENS_KEY = "tokens.yaml"
SCOPES_DIR = "/etc/gpufleet/oidc-scopes"
SCOPES_KEY = "scopes.yaml"
DEFAULT_SCOPE_CLAIM: str = ServeOptions.default("oidc_scope_claim")
NO_ACCESS = ("the service would answer anyone who reaches it: give --tokens-secret and/or "
             "--oidc-issuer (with --oidc-audience and --scopes-configmap), or, knowingly, "
             "--allow-unauthenticated")


@dataclass(frozen=True)
class HubServiceValues:
    """Everything that varies in the hub service's manifests; secrets only by name."""

    hub_url: str
    namespace: str = DEFAULT_NAMESPACE
    image: str = DEFAULT_EXPORTER_IMAGE
    kind: str = "deployment"
    every: float = DEFAULT_EVERY
    db_secret: str = DEFAULT_DB_SECRET
    hub_token_secret: str | None = DEFAULT_TOKEN_SECRET
    hub_ca_configmap: str | None = None
    hub_ca_key: str = DEFAULT_CA_KEY
    tls_secret: str | None = None  # a kubernetes.io/tls Secret (tls.crt, tls.key[, ca.crt])
    tokens_secret: str | None = None  # a Secret whose key tokens.yaml is the --tokens-file
    prune_stale_after: float | None = None
    oidc_issuer: str | None = None
    oidc_audience: str | None = None
    oidc_scope_claim: str = DEFAULT_SCOPE_CLAIM
    scopes_configmap: str | None = None  # a ConfigMap whose key scopes.yaml is --scopes-file
    allow_unauthenticated: bool = False
    #: namespaces whose pods the NetworkPolicy admits (ingress controller, monitoring, ...)
    allow_from_namespaces: tuple[str, ...] = ()
    #: proxies whose X-Forwarded-For serve believes (serve --forwarded-allow-ips)
    forwarded_allow_ips: tuple[str, ...] = ()
    replicas: int = DEFAULT_REPLICAS
    cpu_limit: float = DEFAULT_CPU_LIMIT

    @property
    def workers(self) -> int:
        """`serve --workers` of a replica: one a whole core of its CPU limit, at least one."""
        return max(1, int(self.cpu_limit))

    @property
    def memory_limit_mib(self) -> int:
        return BASE_MEMORY_MIB + WORKER_MEMORY_MIB * self.workers

    @property
    def authenticated(self) -> bool:
        return bool(self.tokens_secret or self.oidc_issuer)

    @property
    def admitted_namespaces(self) -> tuple[str, ...]:
        """Who may reach the port: the namespaces given, else only the service's own."""
        return self.allow_from_namespaces or (self.namespace,)


def cron_schedule(every: float) -> str:
    """A cron schedule that fires every ``every`` seconds, when cron can say it exactly.

    Cron counts minutes within the hour and hours within the day, so only divisors of 60
    minutes or of 24 hours repeat evenly; anything else would drift at the hour or day
    boundary and is refused rather than approximated.
    """
    hint = ("use a divisor of 60 minutes (1m, 2m, 5m, 10m, 15m, 30m) or of 24 hours "
            "(1h, 2h, 3h, 4h, 6h, 8h, 12h, 24h)")
    if every < 60 or every % 60:
        raise InputError(f"--every {format_duration(every)} is not whole minutes: a CronJob "
                         f"runs at most once a minute; {hint}")
    minutes = int(every // 60)
    if minutes < 60 and 60 % minutes == 0:
        return "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"
    if minutes % 60 == 0:
        hours = minutes // 60
        if hours == 24:
            return "0 0 * * *"
        if hours < 24 and 24 % hours == 0:
            return "0 * * * *" if hours == 1 else f"0 */{hours} * * *"
    raise InputError(f"--every {format_duration(every)} cannot be a cron schedule; {hint}")


def _hub_url(value: str | None) -> str:
    text = (value or "").strip()
    if not text:
        raise InputError("--hub-url is required: the PromQL endpoint the service queries "
                         "(e.g. the rbac-query-proxy route of ACM Observability)")
    if any(ch.isspace() or not ch.isprintable() for ch in text):
        raise InputError("--hub-url must not contain spaces or control characters")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError("--hub-url must be an http(s) URL with a host")
    if parts.username or parts.password:
        raise InputError("--hub-url must not carry credentials; the token comes from "
                         "--hub-token-secret")
    return text


def _oidc(issuer: str | None, audience: str | None, claim: str | None,
          scopes_configmap: str | None) -> tuple[str | None, str | None, str, str | None]:
    """(issuer, audience, claim, scopes ConfigMap), checked as `serve` will check them."""
    claim_ = (claim or "").strip() or DEFAULT_SCOPE_CLAIM
    if not issuer:
        if audience or scopes_configmap:
            raise InputError("--oidc-audience and --scopes-configmap need --oidc-issuer")
        return None, None, claim_, None
    text = issuer.strip()
    parts = urlsplit(text)
    if (parts.scheme != "https" or not parts.hostname or parts.username or parts.password
            or any(ch.isspace() or not ch.isprintable() for ch in text)):
        raise InputError("--oidc-issuer must be an https:// URL without credentials or spaces")
    aud = (audience or "").strip()
    if not aud or any(ch.isspace() or not ch.isprintable() for ch in aud):
        raise InputError("--oidc-issuer needs --oidc-audience (the 'aud' tokens are issued "
                         "for), one word")
    if not scopes_configmap:
        raise InputError("--oidc-issuer needs --scopes-configmap (a ConfigMap whose key "
                         f"{SCOPES_KEY} maps groups to scopes)")
    if not PLAIN_KEY.match(claim_) or len(claim_) > 253:
        raise InputError(f"--oidc-scope-claim {claim_!r} is not a claim name")
    return text, aud, claim_, _dns_subdomain(scopes_configmap, "--scopes-configmap")


def hub_service_values(*, hub_url: str | None, namespace: str | None = DEFAULT_NAMESPACE,
                       image: str | None = DEFAULT_EXPORTER_IMAGE,
                       kind: str | None = "deployment", every: float = DEFAULT_EVERY,
                       db_secret: str | None = DEFAULT_DB_SECRET,
                       hub_token_secret: str | None = DEFAULT_TOKEN_SECRET,
                       hub_ca_configmap: str | None = None,
                       hub_ca_key: str | None = DEFAULT_CA_KEY, tls_secret: str | None = None,
                       tokens_secret: str | None = None,
                       prune_stale_after: float | None = None,
                       oidc_issuer: str | None = None, oidc_audience: str | None = None,
                       oidc_scope_claim: str | None = DEFAULT_SCOPE_CLAIM,
                       scopes_configmap: str | None = None,
                       allow_unauthenticated: bool = False,
                       allow_from_namespaces: tuple[str, ...] | list[str] = (),
                       forwarded_allow_ips: tuple[str, ...] | list[str] = (),
                       replicas: int = DEFAULT_REPLICAS,
                       cpu_limit: float = DEFAULT_CPU_LIMIT,
                       ) -> HubServiceValues:
    """Check raw option values; InputError names the bad one. Empty secret names mean none.

    A Deployment serves the API, so it must be told who may read it (a tokens Secret, an
    OIDC issuer, or knowingly nobody in particular); a CronJob serves nothing."""
    kind_ = _choice(kind, KINDS, "kind")
    issuer, audience, claim, scopes = _oidc(oidc_issuer, oidc_audience, oidc_scope_claim,
                                            scopes_configmap)
    admitted = tuple(dict.fromkeys(dns_label(ns, "--allow-from-namespace")
                                   for ns in allow_from_namespaces))
    if every < 1:
        raise InputError("--every must be at least 1s")
    if replicas < 1:
        raise InputError("--replicas must be at least 1 (2 or more keep serving through a "
                         "node drain)")
    if not 0.1 <= cpu_limit <= 64:
        raise InputError("--cpu-limit must be between 0.1 and 64 (cores)")
    if kind_ == "cronjob":
        cron_schedule(every)
        if prune_stale_after:
            raise InputError("--prune-stale-after needs --kind deployment (serve prunes; a "
                             "CronJob runs `gpufleet inventory prune` as a job of its own)")
    if prune_stale_after is not None and prune_stale_after < 86400:
        raise InputError("--prune-stale-after must be at least 1d: it deletes inventory rows")
    token = hub_token_secret or None
    ca = hub_ca_configmap or None
    key = hub_ca_key or ""
    if not PLAIN_KEY.match(key) or "/" in key or len(key) > 253:
        raise InputError(f"--hub-ca-key {key!r} is not a valid ConfigMap key")
    values = HubServiceValues(
        hub_url=_hub_url(hub_url),
        namespace=dns_label(namespace, "namespace"),
        image=_image(image, "--image"),
        kind=kind_,
        every=float(every),
        db_secret=_dns_subdomain(db_secret or "", "--db-secret"),
        hub_token_secret=_dns_subdomain(token, "--hub-token-secret") if token else None,
        hub_ca_configmap=_dns_subdomain(ca, "--hub-ca-configmap") if ca else None,
        hub_ca_key=key,
        tls_secret=_dns_subdomain(tls_secret, "--tls-secret") if tls_secret else None,
        tokens_secret=(_dns_subdomain(tokens_secret, "--tokens-secret") if tokens_secret
                       else None),
        prune_stale_after=prune_stale_after,
        oidc_issuer=issuer,
        oidc_audience=audience,
        oidc_scope_claim=claim,
        scopes_configmap=scopes,
        allow_unauthenticated=bool(allow_unauthenticated),
        allow_from_namespaces=admitted,
        forwarded_allow_ips=tuple(forwarded_allow_ips),
        replicas=int(replicas),
        cpu_limit=float(cpu_limit),
    )
    if kind_ == "deployment":  # last: a misspelt name is the more useful message
        if allow_unauthenticated and values.authenticated:
            raise InputError("--allow-unauthenticated contradicts --tokens-secret and "
                             "--oidc-issuer: drop it to require a token")
        if not (values.authenticated or allow_unauthenticated):
            raise InputError(NO_ACCESS)
    return values


def _hub_args(values: HubServiceValues) -> list[str]:
    args = ["--hub-url", values.hub_url, "--db-file", f"{DB_DIR}/{DB_SECRET_KEY}"]
    if values.hub_token_secret:
        args += ["--token-file", f"{TOKEN_DIR}/{TOKEN_KEY}"]
    if values.hub_ca_configmap:
        args += ["--ca-file", f"{CA_DIR}/{values.hub_ca_key}"]
    return args


def _access_args(values: HubServiceValues) -> list[str]:
    """Who may read the API: static tokens, OIDC, or (asked for, said loudly in the
    Deployment) anyone who reaches the pod."""
    args: list[str] = []
    if values.tokens_secret:
        args += ["--tokens-file", f"{ACCESS_DIR}/{TOKENS_KEY}"]
    if values.oidc_issuer and values.oidc_audience:
        args += ["--oidc-issuer", values.oidc_issuer, "--oidc-audience", values.oidc_audience,
                 "--oidc-scope-claim", values.oidc_scope_claim,
                 "--scopes-file", f"{SCOPES_DIR}/{SCOPES_KEY}"]
    if not values.authenticated:
        args.append("--allow-unauthenticated")
    if values.tls_secret:
        args += ["--tls-cert-file", f"{TLS_DIR}/tls.crt", "--tls-key-file", f"{TLS_DIR}/tls.key"]
    return args


def render_hub_service(values: HubServiceValues,
                       extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """All files of ``gpufleet hub render``: relative path -> text, in apply order.

    A Deployment runs ``gpufleet serve`` with a Service and ServiceMonitor for its /metrics;
    a CronJob runs ``gpufleet sync`` and has nothing to scrape, so it gets neither.
    ``extra`` files (the Grafana dashboard) are added before the kustomization lists them.
    """
    every = format_duration(values.every)
    if values.kind == "deployment":
        args = ["serve", "--listen", f"0.0.0.0:{SERVICE_PORT}", "--every", every,
                "--workers", str(values.workers), *_hub_args(values), *_access_args(values)]
        if values.prune_stale_after:
            args += ["--prune-stale-after", format_duration(values.prune_stale_after)]
        if values.forwarded_allow_ips:
            args += ["--forwarded-allow-ips", ",".join(values.forwarded_allow_ips)]
    else:
        args = ["sync", *_hub_args(values)]
    context = {
        "v": values,
        "name": HUB_NAME,
        "labels": _labels(HUB_NAME, "hub", values.namespace),
        "selector": _selector(HUB_NAME, values.namespace),
        "args": args,
        "port": SERVICE_PORT,
        "every": every,
        "schedule": cron_schedule(values.every) if values.kind == "cronjob" else None,
        # A sync that outlives its interval is stopped before the next one is due.
        "deadline": max(60, int(values.every)),
        "db_key": DB_SECRET_KEY,
        "token_key": TOKEN_KEY,
        "token_dir": TOKEN_DIR,
        "ca_dir": CA_DIR,
        "tls_dir": TLS_DIR,
        "access_dir": ACCESS_DIR,
        "tokens_key": TOKENS_KEY,
        "scopes_dir": SCOPES_DIR,
        "scopes_key": SCOPES_KEY,
        "admitted": values.admitted_namespaces,
        "scheme": "HTTPS" if values.tls_secret else "HTTP",
        "db_dir": DB_DIR,
        "cpu_limit": f"{values.cpu_limit:g}",
        "cpu_request": f"{max(100, int(values.cpu_limit * 250))}m",
        "memory_limit": f"{values.memory_limit_mib}Mi",
    }
    files: dict[str, str] = {
        "namespace.yaml": _render(
            "templates/common/namespace.yaml.j2", ns_name=values.namespace,
            ns_labels={**_labels(values.namespace, "namespace", values.namespace),
                       "pod-security.kubernetes.io/enforce": "restricted"}),
        "serviceaccount.yaml": _render("templates/hubservice/serviceaccount.yaml.j2",
                                              **context),
    }
    if values.kind == "deployment":
        for name in ("service.yaml", "networkpolicy.yaml", "deployment.yaml",
                     "poddisruptionbudget.yaml", "servicemonitor.yaml"):
            files[name] = _render(f"templates/hubservice/{name}.j2", **context)
    else:
        files["cronjob.yaml"] = _render("templates/hubservice/cronjob.yaml.j2",
                                               **context)
    files.update(extra or {})
    files["kustomization.yaml"] = _kustomization(files)
    return files
