"""``gpufleet exporter`` through click: backend choice, input errors, a real process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from hub.cli import cli
from hub.devstack import free_port
from spoke import LibraryNotFound


def missing(message: str):
    def loader():
        raise LibraryNotFound(message)
    return loader


NO_LIBS = {"loaders": {"nvml": missing("NVML library not found (libnvidia-ml.so.1)"),
                       "amdsmi": missing("AMD SMI library not found")}}


def run(args: list[str], obj: dict | None = None, env: dict | None = None):
    return CliRunner().invoke(cli, ["exporter", *args], obj=obj, env=env)


def one_line_error(result, code: int) -> str:
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


def test_auto_without_any_library_exits_3():
    line = one_line_error(run(["--backend", "auto"], NO_LIBS), 3)
    assert line == "error: no GPU management library found (NVML, AMD SMI)"


def test_default_backend_is_auto():
    assert one_line_error(run([], NO_LIBS), 3).endswith("(NVML, AMD SMI)")


@pytest.mark.parametrize(("backend", "name"), [("nvml", "NVML"), ("amdsmi", "AMD SMI")])
def test_explicit_backend_missing_names_it(backend, name):
    line = one_line_error(run(["--backend", backend], NO_LIBS), 3)
    assert f"{name} library not found" in line


def test_auto_falls_through_to_amd_when_nvml_is_missing(tmp_path: Path):
    """auto opens AMD SMI when NVML is absent; the bad --listen then stops it (exit 2)."""
    from spoke._fakes import FakeAmdGpu, FakeAmdSmi

    fake = FakeAmdSmi([FakeAmdGpu(uuid="u0")])
    obj = {"loaders": {"nvml": NO_LIBS["loaders"]["nvml"], "amdsmi": lambda: fake}}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_line_error(run(["--listen", f"127.0.0.1:{port}"], obj), 2)
    assert line.startswith(f"error: cannot listen on 127.0.0.1:{port}:")
    assert fake.initialised is False  # opened, then shut down again on the way out


@pytest.mark.parametrize(("args", "words"), [
    (["--listen", "nonsense"], "invalid listen address 'nonsense'"),
    (["--listen", "127.0.0.1:70000"], "invalid port 70000"),
    (["--listen", "127.0.0.1:1", "--port", "2"], "not both"),
    (["--interval", "0s"], "--interval must be greater than 0"),
    (["--sim-mig", "9g.1gb"], "invalid MIG profile '9g.1gb'"),
    (["--sim-vendor", "amd", "--sim-mig", "1g.10gb"], "only on NVIDIA"),
    (["--listen", "no-such-host.invalid:0"], "cannot listen on no-such-host.invalid:0"),
    (["--slow-interval", "0s"], "--slow-interval must be greater than 0"),
    (["--sim-idle", "0,x"], "invalid --sim-idle 'x'"),
    (["--sim-gpus", "2", "--sim-idle", "5"], "--sim-idle names GPU 5; the node has GPUs 0-1"),
    (["--sim-vendor", "amd", "--sim-naming", "dcgm-4.7"],
     "--sim-naming applies to --backend sim --sim-vendor nvidia only"),
])
def test_bad_input_is_one_line_exit_2(args, words):
    line = one_line_error(run(["--backend", "sim", *args]), 2)
    assert words in line


def test_port_in_use_is_one_line_exit_2():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_line_error(run(["--backend", "sim", "--listen", f"127.0.0.1:{port}"]), 2)
    assert line == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_click_usage_errors_exit_2():
    result = run(["--interval", "soon"])
    assert result.exit_code == 2 and "invalid duration 'soon'" in result.output
    assert run(["--backend", "cuda"]).exit_code == 2


def test_options_from_environment_and_config_file(tmp_path: Path):
    result = run([], NO_LIBS, env={"GPUFLEET_BACKEND": "sim", "GPUFLEET_LISTEN": "bogus"})
    assert "invalid listen address 'bogus'" in one_line_error(result, 2)
    config = tmp_path / "exporter.yaml"
    config.write_text("backend: sim\nsim-mig: 2g\n")
    result = run(["--config", str(config)])
    assert "invalid MIG profile '2g'" in one_line_error(result, 2)


def test_listed_in_gpufleet_help():
    result = CliRunner().invoke(cli, ["--help"])
    assert "exporter" in result.output
    result = CliRunner().invoke(cli, ["exporter", "--help"])
    assert result.exit_code == 0 and "--sim-node" in result.output


@pytest.mark.parametrize(("args", "series", "node_label"), [
    (["--sim-vendor", "amd"], "gpu_gfx_activity{", "hostname"),
    # dcgm-exporter 4.9's names and units, its driver label, one cadence per costly reading
    (["--sim-naming", "dcgm-4.7", "--slow-interval", "10s", "--prof-interval", "2s"],
     "DCGM_FI_DEV_GPU_UTIL_RATIO{", "Hostname"),
])
def test_real_process_serves_and_stops_on_sigterm(args, series, node_label):
    port = free_port()
    env = {**os.environ, "NODE_NAME": "node-from-env", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from hub.cli import main; main()", "exporter",
         "--backend", "sim", "--listen", f"127.0.0.1:{port}", "--interval", "1s",
         "--sim-gpus", "2", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "exporter did not become healthy"
            time.sleep(0.1)
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        assert text.count(series) == 2
        assert f'{node_label}="node-from-env"' in text
        assert "DCGM_FI_DRIVER_VERSION" not in text  # AMD's label; 4.7's SYSTEM_ spelling
        assert 'gpufleet_exporter_build_info{backend="sim",version="0.1.0"} 1.0' in text
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    assert f"serving http://127.0.0.1:{port}/metrics" in stderr
    assert "Traceback" not in stderr
