"""The templates ship inside the wheel: an installed gpufleet renders without the source tree."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(args)}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.slow
def test_installed_wheel_renders_from_bundled_templates(tmp_path):
    # Build the wheel with the project's own backend (no network when hatchling is installed).
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist")]
    if importlib.util.find_spec("hatchling") is not None:
        build.append("--no-build-isolation")
    _run([*build, str(REPO)], cwd=tmp_path)
    [wheel] = (tmp_path / "dist").glob("gpufleet-*.whl")

    # A fresh venv holding only the wheel; dependencies come from this venv's site-packages,
    # added as a plain path, so the editable install's own .pth hook is not loaded there.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
          "--no-index", str(wheel)], cwd=tmp_path)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     cwd=tmp_path).strip())
    (site / "_deps_from_dev_venv.pth").write_text(sysconfig.get_path("purelib") + "\n")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GPUFLEET_"))}
    where = _run([str(python), "-c",
                  "import hub.common._templates as r; print(r.__file__); "
                  "print(r.template_roots()[0])"],
                 cwd=tmp_path, env=env).split()
    assert where[0].startswith(str(site)), "the wheel's hub package must be the one imported"
    assert where[1] == str(site / "hub" / "_bundled" / "templates")

    out = tmp_path / "rendered"
    _run([str(venv / "bin" / "gpufleet"), "spoke", "render", "--cluster", "east", "--vendor",
          "amd", "--mode", "acm", "--exporter", "builtin", "--out", str(out)],
         cwd=tmp_path, env=env)
    assert (out / "hub" / "metrics-allowlist.yaml").is_file()
    daemonset = yaml.safe_load((out / "spoke" / "exporter-daemonset.yaml").read_text())
    assert daemonset["kind"] == "DaemonSet"
    _run([str(venv / "bin" / "gpufleet"), "policy", "render", "--remote-write-url",
          "https://receive.example.com/api/v1/receive", "--out", str(tmp_path / "policy")],
         cwd=tmp_path, env=env)
    assert (tmp_path / "policy" / "policy.yaml").is_file()
    # the instance-type catalog is data in the wheel: reconcile and usage read it installed
    catalog = _run([str(python), "-c",
                    "from hub.kube import shipped_catalog as s, _catalog as c; "
                    "print(c.SHIPPED); print(s().lookup('p5.48xlarge').gpus)"],
                   cwd=tmp_path, env=env).split()
    assert catalog == [str(site / "hub" / "kube" / "instance_types.yaml"), "8"]
    rules = tmp_path / "alerts"
    _run([str(venv / "bin" / "gpufleet"), "alerts", "render", "--out", str(rules)],
         cwd=tmp_path, env=env)
    assert "p5\\\\.48xlarge" in (rules / "gpufleet-alerts.rules.yaml").read_text()
