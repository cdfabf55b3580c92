"""Option groups shared by several commands, each also settable as ``GPUFLEET_<NAME>``."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import click

from hub.common._durations import DURATION
from hub.common._errors import InputError
from hub.common._redact import register_secret
from hub.common._textfiles import read_text

F = Callable[..., Any]


def _stack(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    def apply(func: F) -> F:
        for deco in reversed(decorators):
            func = deco(func)
        return func

    return apply


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange, which lets ``nan`` through (every comparison with it is false):
    an idle threshold of nan silently made every hour busy."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if isinstance(number, float) and math.isnan(number):
            self.fail(f"{value!r} is not a number", param, ctx)
        return number


#: a percentage, 0 to 100, nan refused
PERCENT = FiniteFloatRange(0, 100)


def env(name: str) -> str:
    return "GPUFLEET_" + name.upper().replace("-", "_")


hub_options = _stack(
    click.option("--hub-url", envvar=env("hub-url"), metavar="URL",
                 help="Prometheus HTTP API of the hub store (Thanos Query, ACM rbac-query-proxy)."),
    click.option("--token-file", envvar=env("token-file"), type=click.Path(dir_okay=False),
                 help="File holding a bearer token (or set GPUFLEET_TOKEN). Never printed."),
    click.option("--ca-file", envvar=env("ca-file"), type=click.Path(dir_okay=False),
                 help="CA bundle to verify the hub's TLS certificate."),
    click.option("--cert-file", envvar=env("cert-file"), type=click.Path(dir_okay=False),
                 help="Client certificate for mTLS (Thanos Query)."),
    click.option("--key-file", envvar=env("key-file"), type=click.Path(dir_okay=False),
                 help="Private key of the client certificate."),
    click.option("--insecure-skip-verify", envvar=env("insecure-skip-verify"), is_flag=True,
                 default=False, help="Do not verify the hub's TLS certificate (testing only)."),
    click.option("--connect-timeout", "hub_connect_timeout", envvar=env("connect-timeout"),
                 default="5s", show_default=True, metavar="DURATION",
                 help="How long to wait for the hub to accept a connection: a dead hub fails "
                      "fast."),
    click.option("--read-timeout", "--timeout", "hub_timeout",
                 envvar=[env("read-timeout"), env("timeout")], default="60s", show_default=True,
                 metavar="DURATION",
                 help="How long one hub answer may take once connected (a 100,000-GPU query "
                      "takes seconds); --timeout is its older name."),
)

LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_label_name(value: str, what: str = "--cluster-label") -> str:
    """The label goes into PromQL verbatim (``by (...)``): anything but a Prometheus label
    name would change the query's meaning and, worse, still answer, so refuse it here."""
    if not LABEL_NAME.fullmatch(value or ""):
        raise InputError(f"{what} {value!r} is not a Prometheus label name "
                         "(letters, digits and _, not starting with a digit)")
    return value


def _label_callback(ctx: click.Context, param: click.Parameter, value: str) -> str:
    return check_label_name(value, "--" + (param.name or "").replace("_", "-"))


cluster_label_option = click.option(
    "--cluster-label", envvar=env("cluster-label"), default="cluster", show_default=True,
    callback=_label_callback, metavar="LABEL",
    help="Label that names the cluster on every series (ACM adds 'cluster'); a Prometheus "
         "label name.",
)

def _db_file(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.meta["gpufleet.db_file"] = value


def _db_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--db, else the URL read from --db-file (a mounted Secret: the password stays out of
    the process environment and `ps`), registered as a secret either way."""
    path = ctx.meta.get("gpufleet.db_file")
    if path and value:
        raise InputError("--db and --db-file exclude each other")
    if path:
        value = read_text(path, f"--db-file {path}", max_bytes=64 * 1024).strip()
        if not value or "\n" in value:
            raise InputError(f"--db-file {path} must hold one database URL on one line "
                             "(the content is not shown)")
    if value:
        register_secret(urlsplit(value).password)
    return value


def db_option(command: F) -> F:
    """--db URL or --db-file FILE (the URL in a file), passed to the command as ``db``."""
    command = click.option(
        "--db", envvar=env("db"), metavar="URL", callback=_db_url,
        help="Inventory database as a SQLAlchemy URL "
             "(default: SQLite at $XDG_DATA_HOME/gpufleet/inventory.db).",
    )(command)
    return click.option(
        "--db-file", envvar=env("db-file"), metavar="FILE", expose_value=False,
        is_eager=True, callback=_db_file,
        help="File holding the database URL (e.g. a mounted Secret); instead of --db.",
    )(command)

stale_after_option = click.option(
    "--stale-after", type=DURATION, default="10m", show_default=True, envvar=env("stale-after"),
    metavar="DURATION",
    help="Look-back window: no sample within it means stale (10m covers one missed 300s ACM "
         "push).",
)

lock_timeout_option = click.option(
    "--lock-timeout", type=DURATION, default="0s", show_default=True,
    envvar=env("lock-timeout"), metavar="DURATION",
    help="How long to wait for another sync on the same database to finish.",
)

#: a sync's PromQL requests in flight at once (why 4: hub.inventory._sync)
QUERY_CONCURRENCY = 4

query_concurrency_option = click.option(
    "--query-concurrency", type=click.IntRange(1, 64), default=QUERY_CONCURRENCY,
    show_default=True, envvar=env("query-concurrency"), metavar="N",
    help="PromQL requests in flight at once (a sync's, across its shards). The store "
         "answers several at once far faster than one by one; more than a few loads a "
         "shared store (Thanos Query runs 20 at once by default, for every user).",
)

#: GPUs (and MIG slices) one shard of a sync asks for (why: hub.inventory._sync)
SHARD_SIZE = 20_000

shard_size_option = click.option(
    "--shard-size", type=click.IntRange(100, 10_000_000), default=SHARD_SIZE,
    show_default=True, envvar=env("shard-size"), metavar="GPUS",
    help="GPUs (and MIG slices) per shard: the sync asks its queries once per shard of "
         "whole clusters of about this many, so each answer stays well under a store's "
         "per-query limits and memory follows the shard, not the fleet.",
)

replaced_within_option = click.option(
    "--replaced-within", type=DURATION, default="7d", show_default=True,
    envvar=env("replaced-within"), metavar="DURATION",
    help="A new GPU in a slot another GPU held this recently is a `replaced` event "
         "(slot, old, new); the two keep separate histories.",
)

lemon_threshold_option = click.option(
    "--lemon-threshold", type=float, default=2.0, show_default=True,
    metavar="N", envvar=env("lemon-threshold"),
    help="A GPU or slot failing more than N times a GPU-month in service over the "
         "last 90 days is a finding (`gpufleet inventory lemons` ranks them).",
)

max_age_option = click.option(
    "--max-age", type=DURATION, default="1h", show_default=True, envvar=env("max-age"),
    metavar="DURATION",
    help="Freshness guarantee (adoption contract): a cluster without a GPU sample for longer "
         "is an error.",
)

push_interval_option = click.option(
    "--push-interval", type=DURATION, default="300s", show_default=True,
    envvar=env("push-interval"), metavar="DURATION",
    help="How often spokes push (ACM: 300s); no sample for twice this is a warning.",
)

min_charge_option = click.option(
    "--min-charge", type=DURATION, default="0s", show_default=True,
    envvar=env("min-charge"), metavar="DURATION",
    help="Charge an ended allocation at least this long, as the clouds bill GPU instances "
         "(e.g. 60s); 0s: off. Give `usage collect` and `serve` the same value (env "
         "GPUFLEET_MIN_CHARGE), or the buckets each writes are charged differently.",
)

window_option = click.option(
    "--window", type=DURATION, default="1h", show_default=True, envvar=env("window"),
    metavar="DURATION",
    help="History window of the zero-usage, stuck-collector and exporter-error checks.",
)
