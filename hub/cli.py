"""The ``gpufleet`` command: a thin click layer over plain functions.

Subcommands are loaded lazily from the table below so that ``gpufleet query`` does not pay for
importing the Kubernetes client or pandas. Every command accepts ``--config FILE`` (or
``GPUFLEET_CONFIG``): a YAML mapping whose keys are long option names. Precedence is
flags > ``GPUFLEET_*`` environment > config file > defaults, which is click's own order once
the file is handed to click as the context's ``default_map``.
"""

from __future__ import annotations

import importlib
import sys

import click

from hub import __version__
from hub.common import CONFIG_ENV, ConfiguredGroup

# name -> "module:attribute"; modules import only when their command runs or --help lists it.
COMMANDS: dict[str, str] = {
    "query": "hub.commands.core:query",
    "sync": "hub.commands.core:sync",
    "inventory": "hub.commands.core:inventory",
    "db": "hub.commands.core:db",
    "demo": "hub.commands.demo:demo",
    "spoke": "hub.commands.onboard:spoke",
    "policy": "hub.commands.onboard:policy",
    "exporter": "spoke.cli:exporter",
    "serve": "hub.commands.service:serve",
    "hub": "hub.commands.service:hub_group",
    "reconcile": "hub.commands.validate:reconcile",
    "report": "hub.commands.validate:report",
    "alerts": "hub.commands.validate:alerts",
    "usage": "hub.commands.usage:usage",
    "idle": "hub.commands.usage:idle",
    "capacity": "hub.commands.usage:capacity",
    "placement": "hub.commands.placement:placement",
}


class LazyGroup(ConfiguredGroup):
    """The root group: imports a subcommand's module only when it is needed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpufleet")
@click.option(
    "--config",
    type=click.Path(dir_okay=False),
    envvar=CONFIG_ENV,
    help="YAML file of option values for any subcommand (keys are long option names).",
)
@click.pass_context
def cli(ctx: click.Context, config: str | None) -> None:
    """gpufleet: one trusted view of every GPU across many Kubernetes clusters.

    Spoke clusters push GPU metrics with Prometheus remote-write into a hub store (Thanos
    Receive / ACM Observability). gpufleet asks that store with PromQL, keeps a GPU inventory
    database, checks it against Kubernetes and renders what a cluster installs to join.

    Exit codes: 0 ok; 1 problems found; 2 usage or input error (PromQL errors included);
    3 a dependency (hub, database, Kubernetes API, GPU library, lock) is unavailable.
    """


def main() -> None:
    """Console entry point: click's own handling, except that Ctrl-C exits 130, not 1."""
    try:
        rv = cli.main(prog_name="gpufleet", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)
