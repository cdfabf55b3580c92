"""Issue 37, point 9: what a new user meets in the first hour. Every option honours its
``GPUFLEET_*`` variable (the README says so), a second demo neither takes the first one's
port nor empties its files, a `by:` written as YAML people write it works, and a first
`usage collect` or `usage` that finds nothing says why."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import click
import pytest

from hub.cli import cli
from hub.devstack import _demo as demo
from tests.support.clirun import gpufleet

ROOT = Path(__file__).resolve().parents[1]


def _options(command: click.Command, path: str = "gpufleet") -> list[tuple[str, click.Option]]:
    out = [(path, p) for p in command.params if isinstance(p, click.Option)]
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None:
                out += _options(sub, f"{path} {name}")
    return out


def test_every_option_has_a_gpufleet_variable():
    missing = [f"{where} {p.opts[0]}" for where, p in _options(cli)
               if not p.envvar and p.name not in ("help", "version")
               and any(o.startswith("--") for o in p.opts)]
    assert missing == []
    [hub_port] = [p for where, p in _options(cli) if where == "gpufleet demo"
                  and "--hub-port" in p.opts]
    assert hub_port.envvar == "GPUFLEET_HUB_PORT"


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


def test_demo_reads_its_hub_port_from_the_environment(tmp_path):
    """GPUFLEET_HUB_PORT names the port, as --hub-port does: a taken one is refused in one
    line naming it, before the workdir is touched."""
    taken = _listening()
    try:
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "hub", "demo", "--workdir", str(tmp_path / "demo")],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
            env={**os.environ, "GPUFLEET_HUB_PORT": str(port)})
    finally:
        taken.close()
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: demo: port {port} is taken (another demo still running?); --hub-port 0 "
        "picks a free one"]
    assert not (tmp_path / "demo").exists()


def test_a_second_demo_never_empties_a_running_demos_workdir(tmp_path):
    workdir = tmp_path / "demo"
    demo.prepare_workdir(workdir)
    (workdir / "inventory.db").write_text("the first demo's")
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # the marker names a running demo (here: any live process)
        (workdir / demo.MARKER).write_text(f"made by gpufleet demo\npid {first.pid}\n")
        with pytest.raises(demo.InputError, match=f"in use by a running demo .pid {first.pid}"):
            demo.prepare_workdir(workdir)
        assert (workdir / "inventory.db").read_text() == "the first demo's"
    finally:
        first.kill()
        first.wait()
    demo.prepare_workdir(workdir)  # its demo gone, the directory is the next run's
    assert not (workdir / "inventory.db").exists()
    assert f"pid {os.getpid()}" in (workdir / demo.MARKER).read_text()


def test_usage_config_takes_a_scalar_by(tmp_path):
    """`by: cluster`, as people write YAML, is `--by cluster`, not click's "Value must be an
    iterable"; an empty answer says why it is empty."""
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    assert gpufleet("db", "upgrade", "--db", db).exit_code == 0
    config = tmp_path / "usage.yaml"
    config.write_text("by: cluster\nsince: 2h\n")
    result = gpufleet("usage", "--config", str(config), "--db", db, "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []
    assert "the usage ledger is empty" in result.stderr
    assert "the first hour shows after it ends" in result.stderr
    listed = gpufleet("usage", "--config", str(config), "--db", db, "-o", "csv")
    assert listed.stdout.splitlines()[0].startswith("cluster,")  # grouped by cluster


def test_a_first_collect_with_no_rows_says_when_the_hour_is_collected(hub, tmp_path):
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    result = gpufleet("usage", "collect", "--hub-url", hub.url, "--db", db,
                      "--max-backfill", "3h")
    assert result.exit_code == 0, result.output
    line = result.stdout.strip()
    assert ", 0 rows" in line
    assert "a bucket is collected once it has ended, so the current one (from " in line
    assert ":00:00Z) is collected after " in line
