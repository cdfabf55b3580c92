"""Option groups shared by several commands, each also settable as ``GPUFLEET_<NAME>``: how
to reach the hub and the database. The settings with a default and a check (the sync's, the
ledger's, serve's) are declared as models in hub.common._settings."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import click

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
