"""Issue 41, settings declared once: a setting's option, variable, `--config` key, default,
help and check all come from its field in hub.common's models, so what `serve`, `sync`,
`usage collect` and `hub render` take cannot drift apart."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import click
import pytest
import yaml
from click.testing import CliRunner

from hub.common import (
    ConfiguredCommand,
    InputError,
    LedgerSettings,
    ServeOptions,
    SyncSettings,
    format_duration,
    options_of,
    parse_duration,
    pick,
)
from hub.common._settings import Duration, option_spec
from tests.support.clirun import gpufleet


def probe(model: type[ServeOptions] | type[Any], *names: str) -> tuple[click.Command, list]:
    """A command taking these fields' options, as `serve` does; it keeps what it built."""
    built: list = []

    @click.command(cls=ConfiguredCommand)
    @options_of(model, *names)
    def command(**opts: Any) -> None:
        built.append(model.build(**pick(model, opts)))

    return command, built


class SlowerServe(ServeOptions):
    """serve's options with one default changed, the way a maintainer would change it."""

    every: Annotated[Duration, option_spec(ServeOptions, "every")] = "7m"  # type: ignore[assignment]


def test_a_default_changed_in_the_model_is_the_options_default_and_help():
    command, built = probe(SlowerServe, "every", "stale_after")
    runner = CliRunner()
    assert runner.invoke(command, [], env={}).exit_code == 0
    assert built[-1].every == 7 * 60
    shown = runner.invoke(command, ["--help"]).output
    assert "[default: 7m]" in " ".join(shown.split())
    assert runner.invoke(command, [], env={"GPUFLEET_EVERY": "90s"}).exit_code == 0
    assert built[-1].every == 90


def test_serve_and_hub_render_take_the_models_default():
    every = ServeOptions.default("every")
    help_text = " ".join(gpufleet("serve", "--help").output.split())
    assert "Sync interval; a failed sync is retried sooner" in help_text
    assert f"[default: {every}]" in help_text
    render_help = " ".join(gpufleet("hub", "render", "--help").output.split())
    assert f"[default: {every}]" in render_help


def test_hub_render_writes_the_models_every_into_the_deployment(tmp_path: Path):
    out = tmp_path / "out"
    result = gpufleet("hub", "render", "--out", str(out), "--hub-url", "http://thanos:9090",
                      "--tokens-secret", "api-tokens")
    assert result.exit_code == 0, result.output
    args = yaml.safe_load_all((out / "deployment.yaml").read_text())
    container = next(d for d in args if d and d["kind"] == "Deployment")[
        "spec"]["template"]["spec"]["containers"][0]
    command = container.get("command", []) + container.get("args", [])
    every = command[command.index("--every") + 1]
    assert parse_duration(every) == parse_duration(ServeOptions.default("every"))
    assert every == format_duration(ServeOptions().every)


def test_a_config_key_and_a_variable_give_the_same_settings(tmp_path: Path):
    values = {"usage-retention": "30d", "stale-after": "2m", "shard-size": 500,
              "forwarded-allow-ips": "10.0.0.0/8, 127.0.0.1", "metrics-open": False,
              "oidc-scope-claim": "roles"}
    config = tmp_path / "gpufleet.yaml"
    config.write_text(yaml.safe_dump(values))
    env = {"GPUFLEET_" + k.upper().replace("-", "_"): str(v).lower() if isinstance(v, bool)
           else str(v) for k, v in values.items()}
    command, built = probe(ServeOptions)
    runner = CliRunner()
    from_file = runner.invoke(command, ["--config", str(config)], env={})
    assert from_file.exit_code == 0, from_file.output
    from_env = runner.invoke(command, [], env=env)
    assert from_env.exit_code == 0, from_env.output
    assert built[0] == built[1]
    assert built[0].usage_retention == 30 * 86400 and built[0].shard_size == 500
    assert built[0].forwarded_allow_ips == ("10.0.0.0/8", "127.0.0.1")
    assert built[0].metrics_open is False and built[0].oidc_scope_claim == "roles"
    # the defaults the models hold are the values other code takes as its own
    assert (ServeOptions().usage_retention, LedgerSettings().push_interval) == (400 * 86400, 300)


def test_usage_collect_spells_the_ledgers_fields_as_it_always_did(tmp_path: Path):
    """`usage collect --bucket/--max-backfill` set the ledger's usage_bucket and
    usage_max_backfill; a --config file uses the same spelling."""
    help_text = " ".join(gpufleet("usage", "collect", "--help").output.split())
    assert "--bucket DURATION" in help_text and "--max-backfill DURATION" in help_text
    assert "--lock-timeout DURATION" in help_text and "[default: 5m]" in help_text
    config = tmp_path / "collect.yaml"
    config.write_text("bucket: 7m\n")
    result = gpufleet("usage", "collect", "--config", str(config), "--db",
                      f"sqlite:///{tmp_path / 'inv.db'}", "--hub-url", "http://127.0.0.1:1")
    assert result.exit_code == 2
    assert "--bucket 7m must be a whole number of push intervals (5m)" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "inv.db").exists()  # nothing half-made


@pytest.mark.parametrize(("args", "env", "message"), [
    (["sync", "--stale-after", "0s"], {}, "--stale-after must be greater than 0"),
    (["sync"], {"GPUFLEET_STALE_AFTER": "0s"}, "--stale-after must be greater than 0"),
    (["sync", "--replaced-within", "400d"], {},
     "--replaced-within must be greater than 0 and at most 365d"),
    (["sync", "--cluster-label", "not a label"], {}, "is not a Prometheus label name"),
    (["serve", "--every", "0s"], {}, "--every must be greater than 0"),
    (["serve", "--forwarded-allow-ips", "nope"], {},
     "--forwarded-allow-ips: 'nope' is not an IP address or network"),
    (["serve", "--full-at", "0"], {}, "--full-at 0 must be greater than 0"),
    (["serve", "--tls-cert-file", "/nonexistent.pem"], {},
     "--tls-cert-file and --tls-key-file go together"),
])
def test_an_invalid_value_is_one_line_naming_the_option(tmp_path: Path, args: list[str],
                                                        env: dict[str, str], message: str):
    result = gpufleet(*args, "--db", f"sqlite:///{tmp_path / 'inv.db'}", "--hub-url",
                      "http://127.0.0.1:1", env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.parametrize("value", ["0", "inf", "-3"])
def test_placement_takes_serve_s_full_at_with_its_check(tmp_path: Path, value: str):
    """`placement scores --full-at` is serve's setting (one declaration): the same default,
    and the same one line for a value no score could be made with."""
    result = gpufleet("placement", "scores", "--full-at", value, "--db",
                      f"sqlite:///{tmp_path / 'inv.db'}")
    assert result.exit_code == 2, result.output
    assert f"--full-at {float(value):g} must be greater than 0" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "inv.db").exists()
    assert f"[default: {ServeOptions.default('full_at')}]" in " ".join(
        gpufleet("placement", "scores", "--help").output.split())


def test_a_model_built_in_python_is_checked_like_the_options():
    with pytest.raises(InputError, match="--stale-after must be greater than 0"):
        SyncSettings(stale_after=0)
    with pytest.raises(InputError, match=r"^--workers: "):
        ServeOptions.build(workers="many")
    with pytest.raises(InputError, match="--prune-stale-after must be longer"):
        ServeOptions(prune_stale_after="5m")
    assert SyncSettings(stale_after="90s").stale_after == 90.0
