"""The exporter image installs only spoke/requirements.txt: a fresh venv holding gpufleet's
wheel (no dependencies) and exactly that set, closed over its own requirements, runs
``gpufleet exporter --backend sim`` and serves GPU metrics, without pandas, numpy, the
kubernetes client, SQLAlchemy, Alembic or cramjam anywhere in it.

Offline: the set's distributions are copied from this environment's installed files (their
RECORD lists them, .dist-info included, so pip in the new venv sees them installed).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "spoke" / "requirements.txt"
HUB_ONLY = {"pandas", "numpy", "kubernetes", "sqlalchemy", "alembic", "cramjam",
            "prometheus-api-client", "jinja2", "rich", "pyjwt", "requests", "pyarrow"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def exporter_requirements() -> list[Requirement]:
    return [Requirement(line) for line in REQUIREMENTS.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def closure(requirements: list[Requirement]) -> dict[str, md.Distribution]:
    """The installed distributions the requirements need, theirs included."""
    env = {**default_environment(), "extra": ""}
    todo = list(requirements)
    found: dict[str, md.Distribution] = {}
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        if _norm(req.name) in found:
            continue
        dist = md.distribution(req.name)
        assert req.specifier.contains(dist.version, prereleases=True), (req, dist.version)
        found[_norm(req.name)] = dist
        todo += [Requirement(r) for r in dist.requires or []]
    return found


def _run(args: list[str], **kwargs) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=180, **kwargs)
    assert proc.returncode == 0, f"{' '.join(args)}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_requirement_set_matches_pyproject():
    import tomllib

    declared = {_norm(Requirement(r).name): str(Requirement(r).specifier) for r in
                tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    for req in exporter_requirements():
        assert declared.get(_norm(req.name)) == str(req.specifier), req
    assert not {_norm(r.name) for r in exporter_requirements()} & HUB_ONLY


@pytest.mark.slow
def test_a_venv_of_only_the_exporter_requirements_runs_the_exporter(tmp_path):
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist")]
    if importlib.util.find_spec("hatchling") is not None:
        build.append("--no-build-isolation")
    _run([*build, str(REPO)], cwd=tmp_path)
    [wheel] = (tmp_path / "dist").glob("gpufleet-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
          "--no-index", str(wheel)], cwd=tmp_path)
    site = Path(_run([str(python), "-c",
                      "import sysconfig; print(sysconfig.get_path('purelib'))"]).strip())
    dists = closure(exporter_requirements())
    assert not set(dists) & HUB_ONLY, sorted(dists)
    for dist in dists.values():
        for f in dist.files or []:
            if f.parts[0] == ".." or "__pycache__" in f.parts:
                continue  # console scripts and byte code: not needed to import
            target = site / f
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(dist.locate_file(f), target)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GPUFLEET_"))}
    missing = _run([str(python), "-c",
                    "import importlib.util as u\n"
                    "for m in ('pandas', 'numpy', 'kubernetes', 'sqlalchemy', 'alembic', "
                    "'cramjam', 'prometheus_api_client'):\n"
                    "    print(m, u.find_spec(m) is None)"], env=env)
    assert all(line.endswith("True") for line in missing.splitlines()), missing

    proc = subprocess.Popen([str(venv / "bin" / "gpufleet"), "exporter", "--backend", "sim",
                             "--listen", "127.0.0.1:0"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = ""
        deadline = time.monotonic() + 60
        while "serving http://" not in line:  # the exporter says where it listens
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "the exporter exited before serving"
            assert time.monotonic() < deadline, "the exporter never said where it serves"
        url = re.search(r"serving (http://\S+/metrics)", line).group(1)  # type: ignore[union-attr]
        with urllib.request.urlopen(url, timeout=10) as r:
            body = r.read().decode()
        assert "DCGM_FI_DEV_GPU_UTIL{" in body and 'UUID="' in body
    finally:
        proc.terminate()
        proc.wait(timeout=30)
