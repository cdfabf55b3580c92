"""Helpers for tests that read rendered manifests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest


def all_keys(node: Any) -> set[str]:
    """Every mapping key anywhere in a parsed YAML document (to prove nothing was injected)."""
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in all_keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in all_keys(v)}
    return set()


#: Kinds from CRDs: no Kubernetes schema, checked structurally by the tests instead.
CRD_KINDS = {"ServiceMonitor", "Policy", "Placement", "PlacementBinding", "ClusterPolicy",
             "ManagedClusterSetBinding"}

HOSTILE = 'x"\n  evil: true'  # a value that would add a key if it were not quoted


def objects(files: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Parsed manifests by path (kustomizations left out)."""
    import yaml

    return {path: yaml.safe_load(text) for path, text in files.items()
            if path.endswith(".yaml") and not path.endswith("kustomization.yaml")}


def by_kind(files: dict[str, str], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects(files).values() if o["kind"] == kind]


def one(files: dict[str, str], kind: str) -> dict[str, Any]:
    found = by_kind(files, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def assert_core_objects_valid(files: dict[str, str], version: str = "1.30") -> None:
    """Every core Kubernetes object validates strictly against the schemas of ``version``."""
    import kubernetes_validate
    import pytest

    for path, obj in objects(files).items():
        if obj["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path}: {'.'.join(map(str, exc.path))}: {exc.message}")


def promtool_check(config_text: str, tmp_path: Path, kind: str = "config") -> None:
    """promtool on an agent's configuration (``kind="config"``) or a rule file (``"rules"``)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found on PATH: install the Debian package 'prometheus'")
    path = tmp_path / ("prometheus.yml" if kind == "config" else "rules.yml")
    path.write_text(config_text)
    args = (["check", "config", "--agent", "--syntax-only"] if kind == "config"
            else ["check", "rules"])
    proc = subprocess.run([promtool, *args, str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
