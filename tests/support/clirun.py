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


def on_terminal(*args: str, timeout: float = 120.0) -> tuple[int, bytes, str]:
    """Run `gpufleet ARGS` in a subprocess whose standard error is a terminal (a pty), as a
    person at a shell sees it: (exit code, what the terminal showed, standard output)."""
    import os
    import pty
    import subprocess
    import sys
    from pathlib import Path

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hub", *args], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=follower, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the other side closed: the command ended
            break
        if not chunk:
            break
        seen += chunk
    out, _ = proc.communicate(timeout=timeout)
    os.close(leader)
    return proc.returncode, seen, out
