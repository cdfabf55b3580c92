"""Run the real `gpufleet` CLI in-process, as a user would, and read its JSON."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner, Result

from hub.cli import cli


def gpufleet(*args: str, env: dict[str, str] | None = None) -> Result:
    runner = CliRunner()
    return runner.invoke(cli, list(args), env=env or {}, catch_exceptions=False)


def gpufleet_json(*args: str, env: dict[str, str] | None = None) -> Any:
    result = gpufleet(*args, "-o", "json", env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)
