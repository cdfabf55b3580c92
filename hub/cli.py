"""The ``gpufleet`` command: a thin click layer over plain functions.

Subcommands are loaded lazily from the table below so that ``gpufleet query`` does not pay for
importing the Kubernetes client or pandas. Every command accepts ``--config FILE`` (or
``GPUFLEET_CONFIG``): a YAML mapping whose keys are long option names. Precedence is
flags > ``GPUFLEET_*`` environment > config file > defaults, which is click's own order once
the file is handed to click as the context's ``default_map``.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

import click
import yaml

from hub import __version__
from hub.common._errors import InputError

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
}

CONFIG_ENV = "GPUFLEET_CONFIG"


def _config_path(args: list[str], parent: click.Context | None) -> str | None:
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--config" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    ctx = parent
    while ctx is not None:
        if ctx.params.get("config"):
            return ctx.params["config"]
        ctx = ctx.parent
    return os.environ.get(CONFIG_ENV) or None


def _all_option_names(command: click.Command) -> set[str]:
    names: set[str] = set()
    for param in command.params:
        names.add(param.name or "")
    if isinstance(command, click.Group):
        for name in command.list_commands(click.Context(command)):
            sub = command.get_command(click.Context(command), name)
            if sub is not None:
                names |= _all_option_names(sub)
    return names


def load_config(path: str, root: click.Command) -> dict[str, Any]:
    """Read the YAML config; keys are long option names (``hub-url`` or ``hub_url``)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise InputError(f"config file {path} is not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise InputError(f"config file {path} must be a mapping of option names to values")
    known = _all_option_names(root)
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).lstrip("-").replace("-", "_")
        if name not in known or name == "config":
            raise InputError(f"config file {path}: unknown option {key!r}")
        values[name] = value
    return values


class ConfiguredCommand(click.Command):
    """A command whose defaults can come from ``--config FILE``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not any(p.name == "config" for p in self.params):
            self.params.append(
                click.Option(
                    ["--config"],
                    type=click.Path(dir_okay=False),
                    envvar=CONFIG_ENV,
                    help="YAML file of option values (keys are long option names).",
                )
            )

    def make_context(self, info_name, args, parent=None, **extra):  # type: ignore[override]
        path = _config_path(list(args), parent)
        if path and "default_map" not in extra:
            root = parent.find_root().command if parent else self
            extra["default_map"] = load_config(path, root)
        return super().make_context(info_name, args, parent=parent, **extra)


class ConfiguredGroup(click.Group):
    """A group whose subcommands are ConfiguredCommands and which passes --config down."""

    command_class = ConfiguredCommand

    def make_context(self, info_name, args, parent=None, **extra):  # type: ignore[override]
        # A group's own default_map would be keyed by subcommand; subcommands load the file.
        return super().make_context(info_name, args, parent=parent, **extra)


ConfiguredGroup.group_class = ConfiguredGroup


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
