"""`gpufleet alerts render`: rules that promtool accepts and whose unit tests pass, freshly
rendered each time; the PrometheusRule carries the same groups."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hub import store as vendors
from hub.validate import _alerts as alerts
from tests.support.clirun import gpufleet
from tests.support.samples import FIXTURES

UNIT_TESTS = FIXTURES / "alerts" / "gpufleet-alerts.test.yaml"
#: the same rules for dcgm-exporter 4.9's names, both namings at once, and a switch
UNIT_TESTS_DCGM47 = FIXTURES / "alerts" / "gpufleet-alerts-dcgm47.test.yaml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool not found on PATH: install the Debian package 'prometheus'")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)


def render(out: Path, *args: str) -> dict[str, str]:
    result = gpufleet("alerts", "render", "--out", str(out), *args)
    assert result.exit_code == 0, result.output
    assert f"wrote 2 files to {out}" in result.stdout
    return {p.name: p.read_text() for p in out.iterdir() if not p.name.startswith(".")}


def test_rendered_rules_pass_promtool_check_and_unit_tests(tmp_path):
    out = tmp_path / "alerts"
    files = render(out)
    assert set(files) == {alerts.RULES_FILE, alerts.PROMETHEUS_RULE_FILE}
    check = promtool("check", "rules", str(out / alerts.RULES_FILE))
    assert check.returncode == 0 and "SUCCESS: 9 rules found" in check.stdout, check.stderr
    for unit_tests in (UNIT_TESTS, UNIT_TESTS_DCGM47):
        shutil.copy(unit_tests, out / unit_tests.name)
        test = promtool("test", "rules", str(out / unit_tests.name))
        assert test.returncode == 0, test.stdout + test.stderr
    # every alert has unit tests
    rules = yaml.safe_load(files[alerts.RULES_FILE])["groups"][0]["rules"]
    tested = {case["alertname"] for t in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
              for case in t.get("alert_rule_test", [])}
    assert {r["alert"] for r in rules} == tested
    assert {r["labels"]["severity"] for r in rules} == {"warning", "critical"}


def test_prometheus_rule_holds_the_same_groups(tmp_path):
    files = render(tmp_path / "a", "--namespace", "openshift-monitoring")
    plain = yaml.safe_load(files[alerts.RULES_FILE])
    crd = yaml.safe_load(files[alerts.PROMETHEUS_RULE_FILE])
    assert (crd["apiVersion"], crd["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert crd["metadata"]["namespace"] == "openshift-monitoring"
    assert crd["spec"] == plain
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(crd["spec"]))
    assert promtool("check", "rules", str(spec)).returncode == 0


def test_expressions_name_both_vendors_both_amd_prefixes_and_both_dcgm_namings():
    text = yaml.safe_dump(alerts.rule_groups(alerts.AlertSettings()))
    for profile in vendors.PROFILES:
        for metric in [*profile.value_fields[vendors.UTILISATION], *profile.timestamp_metrics]:
            for name in profile.names(metric):  # every AMD prefix, both dcgm namings
                assert name in text
    for name in vendors.EXPORTER_HEALTH_METRICS[:2]:
        assert name in text


def test_settings_reach_the_rules(tmp_path):
    files = render(tmp_path / "b", "--max-age", "30m", "--push-interval", "60s", "--window",
                   "2h", "--cluster-label", "managed_cluster")
    rules = {r["alert"]: r for r in yaml.safe_load(files[alerts.RULES_FILE])["groups"][0]["rules"]}
    assert "[30m]" in rules["GpuFleetClusterDataStale"]["expr"]
    assert "[2m]" in rules["GpuFleetClusterDataDelayed"]["expr"]
    assert "[2h]" in rules["GpuFleetGpuZeroUsage"]["expr"]
    assert "by (managed_cluster)" in rules["GpuFleetClusterDataStale"]["expr"]
    assert "cluster)" not in rules["GpuFleetClusterDataStale"]["expr"].replace(
        "managed_cluster)", "")
    assert promtool("check", "rules", str(tmp_path / "b" / alerts.RULES_FILE)).returncode == 0


def test_render_replaces_its_own_output_and_refuses_anything_else(tmp_path):
    out = tmp_path / "alerts"
    render(out)
    render(out, "--max-age", "2h")  # a re-render replaces the directory's files
    assert "[2h]" in (out / alerts.RULES_FILE).read_text()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    result = gpufleet("alerts", "render", "--out", str(foreign))
    assert result.exit_code == 2 and "not written by gpufleet" in result.stderr
    assert (foreign / "notes.txt").read_text() == "keep"
    for args, message in ((["alerts", "render"], "--out DIR is required"),
                          (["alerts", "render", "--out", str(tmp_path / "x"), "--cluster-label",
                            "bad-label"], "not a Prometheus label name"),
                          (["alerts", "render", "--out", str(tmp_path / "x"), "--lookback",
                            "30m"], "--lookback must be longer")):
        result = gpufleet(*args)
        assert result.exit_code == 2 and message in result.stderr, result.output
    assert not (tmp_path / "x").exists()
