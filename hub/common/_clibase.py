"""The click base every gpufleet command stands on: ``--config FILE`` for any command.

A command's defaults can come from a YAML mapping whose keys are long option names.
Precedence is flags > ``GPUFLEET_*`` environment > config file > defaults, which is click's own
order once the file is handed to click as the context's ``default_map``. The spoke exporter
uses it too, so it lives with the shared helpers.
"""

from __future__ import annotations

import os
from typing import Any

import click

from hub.common._errors import InputError
from hub.common._textfiles import parse_yaml, read_text, refuse_nul

CONFIG_ENV = "GPUFLEET_CONFIG"
ENV_PREFIX = "GPUFLEET_"


def option_envvar(param: click.Option) -> str | None:
    """The variable an option is read from: its own, else ``GPUFLEET_`` and its first long
    name (``--hub-port``: ``GPUFLEET_HUB_PORT``), so every option honours one, as the README
    says, without each command having to remember to declare it."""
    long = next((o for o in param.opts if o.startswith("--")), None)
    if long is None or long in ("--help", "--version"):
        return None
    return ENV_PREFIX + long[2:].upper().replace("-", "_")


def give_envvars(command: click.Command) -> None:
    for param in command.params:
        if isinstance(param, click.Option) and not param.envvar:
            param.envvar = option_envvar(param)


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


def _long_names(command: click.Command) -> dict[str, str]:
    """Each long option name (``read_timeout``, ``timeout``) -> the parameter it sets: an
    option's destination may differ from its names (``--read-timeout/--timeout`` set
    ``hub_timeout``), and a config key is a long option name."""
    out: dict[str, str] = {}
    for param in command.params:
        for opt in getattr(param, "opts", []):
            if opt.startswith("--"):
                out[opt[2:].replace("-", "_")] = param.name or ""
        out.setdefault(param.name or "", param.name or "")
    return out


def _as_declared(param: click.Parameter | None, value: Any) -> Any:
    """A scalar for a repeatable option (``by: cluster``, as people write YAML) as the
    one-item list click expects; click refuses it with "Value must be an iterable"."""
    if param is not None and (getattr(param, "multiple", False) or param.nargs != 1) \
            and isinstance(value, str | int | float | bool):
        return [value]
    return value


def _all_option_names(command: click.Command) -> dict[str, str]:
    names = _long_names(command)
    if isinstance(command, click.Group):
        for name in command.list_commands(click.Context(command)):
            sub = command.get_command(click.Context(command), name)
            if sub is not None:
                names = {**_all_option_names(sub), **names}
    return names


def load_config(path: str, root: click.Command,
                command: click.Command | None = None) -> dict[str, Any]:
    """Read the YAML config; keys are long option names (``hub-url`` or ``hub_url``).

    One file may serve every command, so a key is valid when any command has that option.
    The invoked ``command``'s own options are checked first: only a key it lacks makes us
    load every command to look further, so ``gpufleet exporter --config`` with exporter keys
    never imports the hub's machinery (SQLAlchemy, Alembic, Kubernetes, Jinja2).
    """
    what = f"config file {path}"
    data = parse_yaml(read_text(path, what), what) or {}
    if not isinstance(data, dict):
        raise InputError(f"config file {path} must be a mapping of option names to values")
    own = _long_names(command) if command is not None else {}
    known: dict[str, str] | None = None
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).lstrip("-").replace("-", "_")
        if name not in own and known is None:
            known = _all_option_names(root)
        if name == "config" or (name not in own and name not in (known or {})):
            raise InputError(f"config file {path}: unknown option {key!r}")
        refuse_nul(value, f"{what}: {key}")
        dest = own.get(name) or (known or {}).get(name) or name
        declared = next((p for p in command.params if p.name == dest), None) \
            if command is not None else None
        values[dest] = _as_declared(declared, value)
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
        give_envvars(self)

    def make_context(self, info_name, args, parent=None, **extra):
        path = _config_path(list(args), parent)
        if path and "default_map" not in extra:
            root = parent.find_root().command if parent else self
            extra["default_map"] = load_config(path, root, self)
        return super().make_context(info_name, args, parent=parent, **extra)


class ConfiguredGroup(click.Group):
    """A group whose subcommands are ConfiguredCommands and which passes --config down."""

    command_class = ConfiguredCommand

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        give_envvars(self)

    def make_context(self, info_name, args, parent=None, **extra):
        # A group's own default_map would be keyed by subcommand; subcommands load the file.
        return super().make_context(info_name, args, parent=parent, **extra)


ConfiguredGroup.group_class = ConfiguredGroup
