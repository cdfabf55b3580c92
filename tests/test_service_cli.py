"""`gpufleet serve` as a real process: start, answer, stop on SIGTERM / Ctrl-C; bad flags."""

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

from hub.devstack import free_port
from tests.support.clirun import gpufleet

SECRET_TOKEN = "tok-s3cret-hub"
SECRET_PASSWORD = "pw-s3cret-url"


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "hub", "serve", *args],
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_status(proc: subprocess.Popen[str], url: str, want: int,
                timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            r = requests.get(url + "/healthz", timeout=2)
        except requests.ConnectionError as exc:
            last = exc
        else:
            last = r.text
            if r.status_code == want:
                return r.json()
        time.sleep(0.1)
    raise AssertionError(f"/healthz never answered {want}: {last}")


def test_serve_syncs_serves_and_exits_0_on_sigterm(hub, tmp_path: Path):
    port = free_port()
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    proc = start("--hub-url", hub.url, "--db", db, "--every", "10s",
                 "--listen", f"127.0.0.1:{port}")
    try:
        url = f"http://127.0.0.1:{port}"
        body = wait_status(proc, url, 200)
        assert body["status"] == "ok" and body["last_sync"]["gpus"] == 0
        assert requests.get(url + "/api/v1/sync-runs", timeout=5).json()["items"][0][
            "status"] == "ok"
        assert "gpufleet_sync_last_success_timestamp_seconds" in requests.get(
            url + "/metrics", timeout=5).text
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert f"gpufleet serve: http://127.0.0.1:{port}" in err
    assert "sync ok: 0 clusters" in err and "terminated, shutting down" in err
    # uvicorn's normal lines are not filed as errors
    assert "INFO uvicorn: " in err and "INFO uvicorn.error" not in err
    with socket.socket() as s:  # nothing listens on the port any more
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def test_two_workers_say_the_start_and_the_end_once(hub, tmp_path: Path):
    """`serve --workers 2` is one service: its banner and its shutdown line come once
    (from the parent), not once per worker."""
    port = free_port()
    log = tmp_path / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "hub", "serve", "--hub-url", hub.url,
                             "--db", f"sqlite:///{tmp_path / 'inv.db'}", "--workers", "2",
                             "--every", "1h", "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        wait_status(proc, f"http://127.0.0.1:{port}", 200)
        deadline = time.monotonic() + 20  # both workers serve (each logs its start)
        while log.read_text().count("Started server process") < 2:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        time.sleep(0.5)  # past the banner each worker says right after its start
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    err = log.read_text()
    assert proc.returncode == 0, err
    assert err.count("gpufleet serve: http://") == 1, err
    assert err.count(f"gpufleet serve: http://127.0.0.1:{port} (sync every 1h") == 1
    assert err.count("terminated, shutting down") == 1, err
    assert err.count("Finished server process") == 2, err  # both workers did stop


def test_unreachable_hub_keeps_serving_503_and_ctrl_c_exits_130(tmp_path: Path):
    port = free_port()
    token = tmp_path / "token"
    token.write_text(SECRET_TOKEN)
    proc = start("--hub-url", f"http://admin:{SECRET_PASSWORD}@127.0.0.1:{free_port()}",
                 "--token-file", str(token), "--db", f"sqlite:///{tmp_path / 'inv.db'}",
                 "--every", "1s", "--listen", f"127.0.0.1:{port}")
    try:
        url = f"http://127.0.0.1:{port}"
        body = wait_status(proc, url, 503)
        deadline = time.monotonic() + 10
        while "unreachable" not in body.get("reason", "") and time.monotonic() < deadline:
            time.sleep(0.2)
            body = requests.get(url + "/healthz", timeout=2).json()
        # the hub's address goes to the log, not to whoever reads the open /healthz
        assert body["reason"].startswith("never synced yet; last error: hub <url> unreachable")
        pages = [requests.get(url + p, timeout=2).text
                 for p in ("/healthz", "/metrics", "/api/v1/sync-runs", "/api/v1/openapi.json")]
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 130, err
    assert "sync failed" in err and "Traceback" not in err
    assert "unreachable" in err and "http://" in err and all("127.0.0.1" not in p for p in pages)
    for text in [out, err, *pages]:
        assert SECRET_PASSWORD not in text and SECRET_TOKEN not in text


def test_bad_listen_is_one_line_exit_2():
    proc = subprocess.run([sys.executable, "-m", "hub", "serve", "--hub-url",
                           "http://127.0.0.1:1", "--listen", "localhost"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: --listen: invalid listen address 'localhost'")
    assert proc.stderr.count("\n") == 1


def test_port_in_use_is_one_line_exit_2(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "hub", "serve", "--hub-url",
                               "http://127.0.0.1:1", "--db", f"sqlite:///{tmp_path / 'x.db'}",
                               "--listen", f"127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"error: cannot listen on 127.0.0.1:{port}: "
                           "Address already in use\n")


def test_a_bad_hub_option_is_one_line_before_any_worker_starts(tmp_path: Path):
    """Every option is checked once, in the parent, before the workers fork: a missing CA
    file is one line and exit 2, not one line per worker, and nothing is bound or created."""
    db = tmp_path / "x.db"
    proc = subprocess.run([sys.executable, "-m", "hub", "serve", "--hub-url",
                           "https://127.0.0.1:1", "--ca-file", str(tmp_path / "missing.pem"),
                           "--db", f"sqlite:///{db}", "--workers", "2",
                           "--listen", f"127.0.0.1:{free_port()}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"error: CA file not found: {tmp_path / 'missing.pem'}\n"
    assert not db.exists()


def test_serve_and_hub_are_listed_commands():
    result = gpufleet("--help")
    assert "serve" in result.output and "hub" in result.output
    assert gpufleet("hub", "--help").output.count("render") >= 1


def test_serve_reconciles_through_the_hub_and_serves_the_reports_findings(hub, fleet,
                                                                           tmp_path: Path):
    """With --reconcile, each sync is followed by a hub-side reconcile; /api/v1/findings
    carries the same checks `gpufleet report` prints (here: a count mismatch)."""
    import json

    from tests.support.nodes import ksm_text
    from tests.support.promql import wait_for
    from tests.support.samples import sample_text

    t4 = sample_text("dcgm-t4-loaded-ericsson-ccd.prom")  # one GPU on node cp-bm14r7
    fleet("east", [t4, ksm_text({"cp-bm14r7": {"nvidia_com_gpu": 2}}, {})])
    wait_for(hub.url, "count(kube_node_status_capacity) + count(DCGM_FI_DEV_GPU_UTIL)",
             lambda r: bool(r) and r[0]["value"][1] == "3")  # cpu + gpu capacity, util
    port = free_port()
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    proc = start("--hub-url", hub.url, "--db", db, "--every", "30s", "--reconcile",
                 "--stale-after", "30s", "--listen", f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_status(proc, url, 200)
        deadline = time.monotonic() + 20
        findings: list = []
        while time.monotonic() < deadline and not findings:
            items = requests.get(url + "/api/v1/findings", timeout=5).json()["items"]
            findings = [f for f in items if f["check"] == "count_mismatch"]
            time.sleep(0.2)
        assert findings and findings[0]["node"] == "cp-bm14r7"
        assert "gpufleet_findings{severity=\"error\"}" in requests.get(
            url + "/metrics", timeout=5).text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=15)
    result = gpufleet("report", "--db", db, "-o", "json")
    assert result.exit_code == 1  # an error finding: the same one the service served
    report = json.loads(result.stdout)
    assert any(f["check"] == "count_mismatch" and f["node"] == "cp-bm14r7"
               for f in report["findings"])


@pytest.mark.parametrize(("args", "needle"), [
    (["", "--clusters", "east"], "token name ''"),
    (["team\nadmin"], "token name 'team\\nadmin'"),
    ([" team"], "token name ' team'"),
    (["team", "--clusters", ""], "--clusters names no cluster"),
    (["team", "--clusters", " , "], "--clusters names no cluster"),
    (["team", "--namespaces", ""], "--namespaces names no namespace"),
    (["team", "--clusters", "east\x00"], "--clusters: 'east\\x00' is not a name"),
])
def test_token_create_refuses_names_and_scopes_that_are_not(args, needle):
    """An empty --clusters read as "no restriction" would print a whole-fleet token."""
    result = gpufleet("serve", "token", "create", *args)
    assert result.exit_code == 2, result.output
    assert needle in result.output and "gpf_" not in result.output
    assert result.output.count("\n") == 1


def test_serve_log_hides_the_oidc_issuer_password(tmp_path: Path):
    """The issuer cannot be reached at start-up, and the log says so: without its password."""
    scopes = tmp_path / "scopes.yaml"
    scopes.write_text("scopes: [{group: platform, clusters: '*'}]\n")
    port = free_port()
    proc = start("--hub-url", "http://127.0.0.1:1", "--db", f"sqlite:///{tmp_path / 'i.db'}",
                 "--listen", f"127.0.0.1:{port}", "--scopes-file", str(scopes),
                 "--oidc-issuer", f"http://gpufleet:{SECRET_PASSWORD}@127.0.0.1:{free_port()}",
                 "--oidc-audience", "gpufleet")
    try:
        wait_status(proc, f"http://127.0.0.1:{port}", 503)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "OIDC issuer http://gpufleet:<redacted>@127.0.0.1" in err
    assert SECRET_PASSWORD not in err
