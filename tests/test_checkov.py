"""checkov over every render: the spoke matrix, the ACM policies and the objects inside them,
and the hub service. Any finding that .checkov.yaml does not skip, with its reason, fails.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.clirun import gpufleet

ROOT = Path(__file__).resolve().parents[1]
URL = "https://receive.hub.example.com/api/v1/receive"
SPOKES = [(vendor, exporter, mode, platform)
          for vendor in ("nvidia", "amd") for exporter in ("upstream", "builtin")
          for mode in ("remote-write", "acm") for platform in ("kubernetes", "openshift")]


def _render(*args: str) -> None:
    result = gpufleet(*args)
    assert result.exit_code == 0, result.output


def render_everything(out: Path) -> None:
    for vendor, exporter, mode, platform in SPOKES:
        args = ["spoke", "render", "--cluster", "east", "--vendor", vendor, "--exporter",
                exporter, "--mode", mode, "--platform", platform,
                "--out", str(out / f"spoke-{vendor}-{exporter}-{mode}-{platform}")]
        _render(*args, *(["--remote-write-url", URL] if mode == "remote-write" else []))
    for mode in ("remote-write", "acm"):
        policy = out / f"policy-{mode}"
        _render("policy", "render", "--out", str(policy), "--mode", mode, "--exporter",
                "builtin", *(["--remote-write-url", URL] if mode == "remote-write" else []))
        # checkov does not look inside a Policy: its objects are written out one per file,
        # with ACM's {{hub ... hub}} templates replaced as the hub would (by a value)
        inner = out / f"policy-objects-{mode}"
        inner.mkdir()
        for path in sorted(policy.glob("*.yaml")):
            doc = yaml.safe_load(path.read_text())
            if not doc or doc.get("kind") != "Policy":
                continue
            for template in doc["spec"]["policy-templates"]:
                spec = template["objectDefinition"]["spec"]
                for i, item in enumerate(spec.get("object-templates", [])):
                    text = yaml.safe_dump(item["objectDefinition"])
                    text = re.sub(r"\{\{hub [^}]* hub\}\}", "resolved-by-acm", text)
                    (inner / f"{path.stem}-{i}.yaml").write_text(text)
    for kind in ("deployment", "cronjob"):
        _render("hub", "render", "--out", str(out / f"hub-{kind}"), "--kind", kind,
                "--hub-url", "https://thanos.example.com", "--tokens-secret", "api-tokens")


def test_checkov_finds_nothing_undocumented_in_any_render(tmp_path: Path):
    checkov = Path(sys.executable).parent / "checkov"
    assert checkov.exists(), "checkov missing: `pip install -e .[dev]` installs it"
    out = tmp_path / "renders"
    render_everything(out)
    assert len(list(out.rglob("*.yaml"))) > 100
    proc = subprocess.run(
        [str(checkov), "-d", str(out), "--config-file", str(ROOT / ".checkov.yaml"),
         "--skip-download", "--quiet", "--compact", "-o", "json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [f"{f['check_id']} {f['resource']} in {Path(f['file_path']).parent.name}"
              for report in reports for f in report["results"]["failed_checks"]]
    assert failed == [], "\n".join(failed)
    passed = sum(r["summary"]["passed"] for r in reports)
    assert passed > 500, "checkov must actually have checked the renders"
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_kubernetes_spoke_pods_keep_a_pinned_high_uid(tmp_path: Path):
    """The other half of the CKV_K8S_40 exception: only OpenShift renders leave it out."""
    out = tmp_path / "spoke"
    _render("spoke", "render", "--cluster", "east", "--vendor", "nvidia", "--exporter",
            "builtin", "--remote-write-url", URL, "--platform", "kubernetes",
            "--out", str(out))
    pods = [doc["spec"]["template"]["spec"]
            for path in out.glob("*.yaml")
            for doc in yaml.safe_load_all(path.read_text())
            if doc and doc.get("kind") in ("Deployment", "DaemonSet")]
    assert len(pods) == 2
    for pod in pods:
        assert pod["securityContext"]["runAsUser"] >= 10000
