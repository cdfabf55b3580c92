"""The settings several commands share, declared once: each field is its option's name,
help, metavar, ``GPUFLEET_<NAME>`` variable, default and check, and the click options of
`serve`, `sync`, `usage collect`, `report`, `validate` and `hub render` are made from the
fields (:func:`options_of`), so a default or a help text changes in one place.

The models are pydantic (already gpufleet's, through the API), frozen, and hold plain values:
a duration is declared as people write it (``"300s"``) and held in seconds. A value that
fails its check is an :class:`InputError` naming the option, one line and exit 2, whether it
came from a flag, the environment, ``--config`` or Python. A ``--config`` key is the
option's long name, as for every other option (hub.common._clibase).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any

import click
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator

from hub.common._durations import DURATION, parse_duration
from hub.common._errors import InputError
from hub.common._options import PERCENT, _stack, check_label_name, env

F = Callable[..., Any]


def _seconds(value: Any) -> Any:
    """A duration as declared (``"10m"``) or given in Python (seconds)."""
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise InputError(str(exc)) from None
    return value


#: seconds, declared and accepted as a Prometheus duration
Duration = Annotated[float, BeforeValidator(_seconds)]


@dataclass(frozen=True)
class Opt:
    """How a field reads on the command line. ``check(value, option)`` raises the one-line
    InputError for a bad value; ``flag`` is a boolean's ``--on/--off`` pair."""

    help: str
    metavar: str | None = None
    type: Any = None
    check: Callable[[Any, str], None] | None = None
    flag: str | None = None
    show_default: bool = True


# -- checks: each names the option it was given as ------------------------------------------
def positive(value: float | None, option: str) -> None:
    if value is not None and not value > 0:
        raise InputError(f"{option} must be greater than 0")


def _within(value: float, option: str) -> None:
    if not 0 < value <= 365 * 86400:
        raise InputError(f"{option} must be greater than 0 and at most 365d")


def _threshold(value: float, option: str) -> None:
    if not (value == value and 0 < value <= 1_000_000):  # NaN fails
        raise InputError(f"{option} must be greater than 0 and at most 1000000 "
                         "(failures per GPU-month)")


def _label(value: str, option: str) -> None:
    check_label_name(value, option)


def _claim(value: str, option: str) -> None:
    if not value.strip() or not value.isprintable():
        raise InputError(f"{option} {value!r} is not a claim name (every OIDC caller would "
                         "have no group and get 403)")


def check_full_at(value: float, option: str = "--full-at") -> None:
    """The free GPUs that score 100 in the ACM placement scores: `serve --full-at`,
    `placement --full-at` and hub.usage.placement_scores."""
    if not (value > 0 and math.isfinite(value)):
        raise InputError(f"{option} {value:g} must be greater than 0 and finite (the free "
                         "GPUs that score 100)")


def _listen(value: str, option: str) -> None:
    from hub.common._httpserve import parse_listen

    try:
        parse_listen(value)
    except ValueError as exc:
        raise InputError(f"{option}: {exc}") from None


def proxy_addresses(text: str | Iterable[str]) -> tuple[str, ...]:
    """``--forwarded-allow-ips``: addresses and networks (``10.128.0.0/14``), or ``*``."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    names = tuple(n.strip() for n in parts if n.strip())
    for name in names:
        if name == "*":
            continue
        try:
            ipaddress.ip_network(name, strict=False)
        except ValueError:
            raise InputError(f"--forwarded-allow-ips: {name!r} is not an IP address or "
                             "network (e.g. 10.128.0.0/14), nor '*'") from None
    return names


class Settings(BaseModel):
    """The base: frozen, no unknown field, declared defaults checked as given ones."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True,
                              arbitrary_types_allowed=True)

    @model_validator(mode="before")
    @classmethod
    def _none_is_default(cls, data: Any) -> Any:
        """click hands an unset option without a default as None: the declared default."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items()
                    if not (v is None and k in cls.model_fields
                            and cls.model_fields[k].default is not None)}
        return data

    @model_validator(mode="after")
    def _checks(self) -> Settings:
        """Each field's own check, in declaration order (the order an operator reads)."""
        for name in type(self).model_fields:
            opt = option_spec(type(self), name)
            if opt is not None and opt.check is not None:
                opt.check(getattr(self, name), "--" + name.replace("_", "-"))
        return self

    @classmethod
    def build(cls, **values: Any) -> Any:
        """The model, or the first problem as a one-line InputError naming the option (a
        type pydantic refuses: a value from Python, or a --config value click let pass)."""
        try:
            return cls(**values)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = "--" + "-".join(str(p) for p in error["loc"][:1]).replace("_", "-")
            raise InputError(f"{where}: {error['msg']}") from None

    def of(self, model: type[BaseModel]) -> dict[str, Any]:
        """This value's fields that ``model`` has too, as keyword arguments: serve's
        settings handed to the sync as `sync`'s would be."""
        return {name: getattr(self, name) for name in model.model_fields}

    @classmethod
    def default(cls, name: str) -> Any:
        """A field's default as declared (``"300s"``: what `--help` and `hub render` show)."""
        return cls.model_fields[name].default


def option_spec(model: type[BaseModel], name: str) -> Opt | None:
    return next((m for m in model.model_fields[name].metadata if isinstance(m, Opt)), None)


def _click_type(model: type[BaseModel], name: str, opt: Opt) -> Any:
    if opt.type is not None:
        return opt.type
    info = model.model_fields[name]
    if any(isinstance(m, BeforeValidator) and m.func is _seconds for m in info.metadata):
        return DURATION
    annotation = info.annotation
    for plain in (int, float, str):
        if annotation in (plain, plain | None):
            return plain
    return None


def _checked(check: Callable[[Any, str], None]) -> Callable[..., Any]:
    """The field's check as a click callback: a bad flag, variable or --config value fails
    as the command starts, named as the command spells the option."""
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None:
            long = next((o for o in param.opts if o.startswith("--")), param.name or "")
            check(value, long)
        return value

    return callback


def option(model: type[BaseModel], name: str, *, flag: str | None = None,
           help: str | None = None) -> Callable[[F], F]:
    """The click option of one field: ``--field-name`` (or ``flag``, whose parameter is
    still the field), its variable ``GPUFLEET_<FLAG>``, default, help and metavar."""
    opt = option_spec(model, name)
    if opt is None:
        raise KeyError(f"{model.__name__}.{name} is not an option")
    info = model.model_fields[name]
    long = flag or "--" + name.replace("_", "-")
    default = info.default
    kwargs: dict[str, Any] = {"help": help or opt.help, "envvar": env(long[2:].split("/")[0])}
    if opt.check is not None:
        kwargs["callback"] = _checked(opt.check)
    if info.annotation is bool:
        kwargs["default"] = default
        if opt.flag is None:
            kwargs["is_flag"] = True
            if not default:
                kwargs.pop("default")
        decls = [opt.flag or long, name]
    else:
        decls = [long, name]
        kwargs["type"] = _click_type(model, name, opt)
        kwargs["metavar"] = opt.metavar
        if default is not None and default != ():
            kwargs["default"] = default
        elif default == ():
            kwargs["default"] = ""
    if kwargs.get("default") not in (None, False, "") or opt.flag:
        kwargs["show_default"] = opt.show_default
    return click.option(*decls, **kwargs)


def options_of(model: type[BaseModel], *names: str, flags: dict[str, str] | None = None,
               helps: dict[str, str] | None = None) -> Callable[[F], F]:
    """The options of these fields (all the model's, given none), in declaration order, as
    one decorator. ``flags`` renames an option where a command always spelt it otherwise
    (`usage collect --bucket` for the ledger's bucket)."""
    chosen = names or tuple(n for n in model.model_fields if option_spec(model, n))
    return _stack(*(option(model, n, flag=(flags or {}).get(n), help=(helps or {}).get(n))
                     for n in chosen))


def pick(model: type[BaseModel], values: dict[str, Any]) -> dict[str, Any]:
    """The values of this model's fields out of a command's keyword arguments."""
    return {k: v for k, v in values.items() if k in model.model_fields}


# -- the models ------------------------------------------------------------------------------
_CLUSTER_LABEL = Opt(
    metavar="LABEL", check=_label,
    help="Label that names the cluster on every series (ACM adds 'cluster'); a Prometheus "
         "label name.")


class SyncSettings(Settings):
    """How a sync reads the hub and writes the inventory (`sync`, `serve`)."""

    stale_after: Annotated[Duration, Opt(
        metavar="DURATION", check=positive,
        help="Look-back window: no sample within it means stale (10m covers one missed 300s "
             "ACM push).")] = "10m"  # type: ignore[assignment]
    replaced_within: Annotated[Duration, Opt(
        metavar="DURATION", check=_within,
        help="A new GPU in a slot another GPU held this recently is a `replaced` event "
             "(slot, old, new); the two keep separate histories.")] = "7d"  # type: ignore[assignment]
    lock_timeout: Annotated[Duration, Opt(
        metavar="DURATION",
        help="How long to wait for another sync on the same database to "
             "finish.")] = "0s"  # type: ignore[assignment]
    #: a sync's PromQL requests in flight at once (why 4: hub.inventory._sync)
    query_concurrency: Annotated[int, Opt(
        metavar="N", type=click.IntRange(1, 64),
        help="PromQL requests in flight at once (a sync's, across its shards). The store "
             "answers several at once far faster than one by one; more than a few loads a "
             "shared store (Thanos Query runs 20 at once by default, for every user).")] = 4
    #: GPUs (and MIG slices) one shard of a sync asks for (why: hub.inventory._sync)
    shard_size: Annotated[int, Opt(
        metavar="GPUS", type=click.IntRange(100, 10_000_000),
        help="GPUs (and MIG slices) per shard: the sync asks its queries once per shard of "
             "whole clusters of about this many, so each answer stays well under a store's "
             "per-query limits and memory follows the shard, not the fleet.")] = 20_000
    cluster_label: Annotated[str, _CLUSTER_LABEL] = "cluster"


class CheckSettings(Settings):
    """What the checks of `report` and `validate` (and serve's after each sync) hold the
    fleet to."""

    max_age: Annotated[Duration, Opt(
        metavar="DURATION",
        help="Freshness guarantee (adoption contract): a cluster without a GPU sample for "
             "longer is an error.")] = "1h"  # type: ignore[assignment]
    window: Annotated[Duration, Opt(
        metavar="DURATION",
        help="History window of the zero-usage, stuck-collector and exporter-error "
             "checks.")] = "1h"  # type: ignore[assignment]
    lemon_threshold: Annotated[float, Opt(
        metavar="N", check=_threshold,
        help="A GPU or slot failing more than N times a GPU-month in service over the last "
             "90 days is a finding (`gpufleet inventory lemons` ranks them).")] = 2.0


class ReportSettings(CheckSettings):
    """`gpufleet report`'s checks: the shared ones and two that only the report is given
    (serve's findings take their defaults, hub.validate's NAMING_MIX_FOR and
    ACM_SILENT_AFTER)."""

    naming_mix_for: Annotated[Duration, Opt(
        metavar="DURATION",
        help="A cluster whose GPUs send both dcgm namings (legacy and dcgm-4.7) for longer "
             "than this is a finding: an exporter upgrade should take "
             "less.")] = "24h"  # type: ignore[assignment]
    #: ACM's ManagedClusterMetricsMissing fires after 15 minutes (hub.validate._checks)
    acm_silent_after: Annotated[Duration, Opt(
        metavar="DURATION",
        help="A cluster ACM manages (acm_managed_cluster_labels) whose newest GPU sample is "
             "older than this is silent, an error: the age at which ACM's own "
             "ManagedClusterMetricsMissing fires. A cluster in maintenance_mode may be "
             "silent (info).")] = "15m"  # type: ignore[assignment]


class LedgerSettings(Settings):
    """How the usage ledger is written (`usage collect`, `serve`): give both the same
    values, or the buckets each writes differ."""

    push_interval: Annotated[Duration, Opt(
        metavar="DURATION",
        help="How often spokes push (ACM: 300s); no sample for twice this is a "
             "warning.")] = "300s"  # type: ignore[assignment]
    min_charge: Annotated[Duration, Opt(
        metavar="DURATION",
        help="Charge an ended allocation at least this long, as the clouds bill GPU instances "
             "(e.g. 60s); 0s: off. Give `usage collect` and `serve` the same value (env "
             "GPUFLEET_MIN_CHARGE), or the buckets each writes are charged "
             "differently.")] = "0s"  # type: ignore[assignment]
    usage_bucket: Annotated[Duration, Opt(
        metavar="DURATION",
        help="Usage ledger bucket, aligned to multiples of it; each is collected once it has "
             "ended (serve: after the sync that follows it). The ledger keeps one size: "
             "another is refused unless `usage collect --replace-grid`.")] = "1h"  # type: ignore[assignment]
    usage_max_backfill: Annotated[Duration, Opt(
        metavar="DURATION",
        help="How far back missed usage buckets are caught up (after a restart or a hub "
             "outage).")] = "48h"  # type: ignore[assignment]
    usage_retention: Annotated[Duration, Opt(
        metavar="DURATION",
        help="Usage rows older than this are removed (at least 1d and the "
             "max backfill).")] = "400d"  # type: ignore[assignment]
    cluster_label: Annotated[str, _CLUSTER_LABEL] = "cluster"


class CollectSettings(LedgerSettings):
    """`usage collect`'s own: it waits its turn beside `serve` rather than failing."""

    lock_timeout: Annotated[Duration, Opt(
        metavar="DURATION",
        help="How long to wait for another ledger writer (`serve`, a second collect) to "
             "finish a bucket: a cron next to `serve` waits its turn rather than leaving its "
             "hours for the next run.")] = "5m"  # type: ignore[assignment]


class IdleSettings(Settings):
    """The one idle rule every idle answer shares: `usage`'s idle GPU-hours, `idle`,
    `report`'s idle list, serve's page and API defaults (hub.usage.IdleRule)."""

    idle_threshold: Annotated[float, Opt(
        type=PERCENT,
        help="Average utilisation % under which an allocated bucket is idle.")] = 5.0
    idle_for: Annotated[Duration, Opt(
        metavar="DURATION",
        help="Allocated time counts as idle only in runs under --idle-threshold at least "
             "this long (what `gpufleet idle --for` lists).")] = "2h"  # type: ignore[assignment]


class AccessSettings(Settings):
    """Who may read what `serve` serves."""

    tokens_file: Annotated[str | None, Opt(
        metavar="FILE", type=click.Path(dir_okay=False),
        help="YAML of static tokens (name, sha256, scope), re-read when it changes; make "
             "entries with `gpufleet serve token create`.")] = None
    oidc_issuer: Annotated[str | None, Opt(
        metavar="URL",
        help="Accept OIDC bearer tokens (JWTs) of this issuer (Keycloak realm URL, Dex, "
             "OpenShift's OAuth as an OIDC issuer); needs --oidc-audience and "
             "--scopes-file.")] = None
    oidc_audience: Annotated[str | None, Opt(
        metavar="AUD", help="The audience ('aud') an OIDC token must be issued for.")] = None
    oidc_scope_claim: Annotated[str, Opt(
        metavar="CLAIM", check=_claim,
        help="Token claim holding the caller's groups, mapped by --scopes-file.")] = "groups"
    scopes_file: Annotated[str | None, Opt(
        metavar="FILE", type=click.Path(dir_okay=False),
        help="YAML mapping OIDC groups to scopes (clusters, namespaces).")] = None
    allow_unauthenticated: Annotated[bool, Opt(
        help="UNSAFE: serve every namespace and pod name to anyone who reaches a "
             "non-loopback --listen address, without a token.")] = False
    metrics_open: Annotated[bool, Opt(
        flag="--metrics-open/--metrics-closed",
        help="Whether /metrics answers without a token (closed: a token whose scope is the "
             "whole fleet).")] = True
    session_ttl: Annotated[Duration, Opt(
        metavar="DURATION", check=positive,
        help="How long a browser stays signed in at /login (at most until its token expires); "
             "sessions live in the inventory database, shared by replicas and kept across a "
             "restart.")] = "8h"  # type: ignore[assignment]
    forwarded_allow_ips: Annotated[tuple[str, ...], BeforeValidator(proxy_addresses), Opt(
        metavar="IP[,CIDR...]", type=str, show_default=False,
        help="Proxies (an ingress controller, the OpenShift router) whose X-Forwarded-For "
             "and X-Forwarded-Proto are believed: addresses or networks, comma-separated, "
             "or '*' for any peer. Default: none, not even loopback, so no client can pick "
             "the address the log and limits see.")] = ()


class TlsSettings(Settings):
    """HTTPS for `serve`."""

    tls_cert_file: Annotated[str | None, Opt(
        metavar="FILE", type=click.Path(dir_okay=False),
        help="Serve HTTPS with this certificate (PEM, chain allowed); re-read when it "
             "changes, as cert-manager rotates it.")] = None
    tls_key_file: Annotated[str | None, Opt(
        metavar="FILE", type=click.Path(dir_okay=False),
        help="Private key of --tls-cert-file (PEM).")] = None

    @model_validator(mode="after")
    def _pair(self) -> TlsSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise InputError("--tls-cert-file and --tls-key-file go together")
        return self


class ServeOptions(SyncSettings, CheckSettings, LedgerSettings, IdleSettings, AccessSettings,
                   TlsSettings):
    """Every option of `gpufleet serve` but the hub's and the database's
    (hub.common.hub_options, db_option): the sync's, the checks', the ledger's, the idle
    rule, access and TLS, and the service's own below. hub.service.ServeSettings adds
    what is built from them."""

    every: Annotated[Duration, Opt(
        metavar="DURATION", check=positive,
        help="Sync interval; a failed sync is retried sooner (5s, 10s, 20s ... at most "
             "DURATION).")] = "5m"  # type: ignore[assignment]
    listen: Annotated[str, Opt(
        metavar="HOST:PORT", check=_listen,
        help="Address of /metrics, /healthz and /api/v1 (0.0.0.0:8080 in a pod). Without "
             "--tokens-file or --oidc-issuer only a loopback address is accepted, unless "
             "--allow-unauthenticated.")] = "127.0.0.1:8080"
    #: processes serving the port (None: the CPUs available)
    workers: Annotated[int | None, Opt(
        metavar="N", type=click.IntRange(1, 64),
        help="Processes serving the port (default: the CPUs available, a container's CPU "
             "limit included). One of them, across workers and replicas, runs the schedule; "
             "every one serves.")] = None
    reconcile: Annotated[bool, Opt(
        help="After each sync, reconcile GPU counts with kube-state-metrics through the hub "
             "(no access to the spokes needed).")] = False
    instance_types: Annotated[str | None, Opt(
        metavar="FILE", type=click.Path(dir_okay=False),
        help="YAML of instance types (and node-label selectors for on-premises servers) with "
             "their GPU count, adding to or overriding the catalog shipped in gpufleet "
             "(docs/operations.md).")] = None
    prune_stale_after: Annotated[Duration | None, Opt(
        metavar="DURATION", type=DURATION,
        help="After each sync, delete GPUs, nodes and clusters stale for longer than this "
             "(as `gpufleet inventory prune`). Default: never.")] = None
    prices: Annotated[str | None, Opt(
        metavar="FILE", type=click.Path(dir_okay=False),
        help="Showback: YAML of prices per GPU-hour by model (as in `gpufleet usage "
             "--prices`); /api/v1/usage then has cost per group.")] = None
    placement_scores: Annotated[bool, Opt(
        help="After each sync (the leader only), write ACM AddOnPlacementScores to the hub's "
             "Kubernetes API, as `gpufleet placement apply` (in a pod: its service account; "
             "needs patch on addonplacementscores and their status).")] = False
    placement_kubeconfig: Annotated[str | None, Opt(
        metavar="FILE",
        help="kubeconfig of the ACM hub for --placement-scores (default: in a pod its "
             "service account, else $KUBECONFIG, then ~/.kube/config).")] = None
    placement_context: Annotated[str | None, Opt(
        metavar="CTX", help="kubeconfig context of the ACM hub for --placement-scores.")] = None
    full_at: Annotated[float, Opt(
        metavar="N", check=check_full_at,
        help="With --placement-scores: free GPUs that score 100 (gpuFree).")] = 64

    @model_validator(mode="after")
    def _prune_after_stale(self) -> ServeOptions:
        if self.prune_stale_after is not None and self.prune_stale_after <= self.stale_after:
            raise InputError("--prune-stale-after must be longer than --stale-after")
        return self


#: the shared options as other commands take them one by one
stale_after_option = option(SyncSettings, "stale_after")
replaced_within_option = option(SyncSettings, "replaced_within")
lock_timeout_option = option(SyncSettings, "lock_timeout")
query_concurrency_option = option(SyncSettings, "query_concurrency")
shard_size_option = option(SyncSettings, "shard_size")
cluster_label_option = option(SyncSettings, "cluster_label")
max_age_option = option(CheckSettings, "max_age")
window_option = option(CheckSettings, "window")
lemon_threshold_option = option(CheckSettings, "lemon_threshold")
push_interval_option = option(LedgerSettings, "push_interval")
min_charge_option = option(LedgerSettings, "min_charge")

#: the defaults as values, for code that takes them as arguments
SYNC = SyncSettings()
LEDGER = LedgerSettings()
CHECKS = CheckSettings()
REPORT = ReportSettings()
IDLE = IdleSettings()
QUERY_CONCURRENCY: int = SYNC.query_concurrency
SHARD_SIZE: int = SYNC.shard_size
