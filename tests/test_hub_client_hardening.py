"""The hub client's handling of secrets and of hostile answers (issue 14, hardening).

A rotated token file is picked up without a restart; ~/.netrc never replaces the bearer token;
--insecure-skip-verify quiets the warning for the hub host only; a token with a line break is
refused without being echoed; a hub (or a proxy in front of it) that echoes the request into an
HTML error page cannot get the token into any error text the CLI prints, the database stores or
the service serves.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import warnings
from pathlib import Path

import pytest
import requests

from hub.devstack import free_port
from hub.store import HubClient, HubSettings
from tests.support.clirun import gpufleet
from tests.support.httpstub import Request, Response, StubServer, json_response
from tests.test_service_cli import start, wait_status

OK = json_response(200, {"status": "success", "data": {"resultType": "vector", "result": []}})
TOKEN_A = "tok-rotation-first-0001"
TOKEN_B = "tok-rotation-second-0002"


@pytest.fixture
def recorder():
    front = StubServer(lambda req: OK)
    yield front
    front.stop()


def test_a_rotated_token_file_is_used_from_the_next_request(recorder, tmp_path: Path):
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    token_file = secret_dir / "token"
    token_file.write_text(TOKEN_A + "\n")
    client = HubClient.from_settings(HubSettings(recorder.url, token_file=str(token_file)))
    client.query("vector(1)")
    assert recorder.seen[-1].headers["Authorization"] == f"Bearer {TOKEN_A}"
    # kubelet rotates a mounted Secret by swapping the file for a new one
    new = secret_dir / "token.new"
    new.write_text(TOKEN_B + "\n")
    os.replace(new, token_file)
    client.query("vector(1)")
    assert recorder.seen[-1].headers["Authorization"] == f"Bearer {TOKEN_B}"


def test_netrc_never_replaces_the_bearer_token(recorder, tmp_path: Path, monkeypatch):
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine 127.0.0.1 login netrc-user password netrc-password\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(netrc))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN_A)
    # plain requests does use that entry: the case is real
    requests.post(recorder.url + "/api/v1/query", data={"query": "1"}, timeout=5)
    assert recorder.seen[-1].headers["Authorization"].startswith("Basic ")
    ok = gpufleet("query", "vector(1)", "--hub-url", recorder.url, "--token-file",
                  str(token_file))
    assert ok.exit_code == 0, ok.output
    assert recorder.seen[-1].headers["Authorization"] == f"Bearer {TOKEN_A}"
    ok = gpufleet("query", "vector(1)", "--hub-url", recorder.url)
    assert ok.exit_code == 0, ok.output
    assert "Authorization" not in recorder.seen[-1].headers


@pytest.fixture
def https_stub(tmp_path: Path):
    """The recorder over TLS with a self-signed certificate for 127.0.0.1 and localhost."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", "k.pem", "-out", "c.pem", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   cwd=tmp_path, check=True, capture_output=True)
    front = StubServer(lambda req: OK)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    front.socket = ctx.wrap_socket(front.socket, server_side=True)
    yield front
    front.stop()


def test_insecure_skip_verify_quiets_the_warning_for_the_hub_only(https_stub):
    port = https_stub.server_address[1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client = HubClient.from_settings(HubSettings(f"https://127.0.0.1:{port}",
                                                     insecure_skip_verify=True))
        client.query("vector(1)")
        assert not [w for w in caught if "Unverified HTTPS" in str(w.message)]
        requests.post(f"https://localhost:{port}/api/v1/query", verify=False, timeout=5)
    assert [w for w in caught if "host 'localhost'" in str(w.message)], \
        "another host must still warn"


@pytest.mark.parametrize("content", ["first-line-secret\nsecond-line-secret\n",
                                     "tok-with space-secret"])
def test_a_token_that_is_not_one_word_is_refused_without_echoing_it(recorder, tmp_path,
                                                                   content):
    token_file = tmp_path / "token"
    token_file.write_text(content)
    result = gpufleet("query", "vector(1)", "--hub-url", recorder.url,
                      "--token-file", str(token_file))
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "the token is not shown" in result.stderr
    for part in content.split():
        assert part not in result.output
    assert not recorder.seen, "nothing may be sent with such a token"


SECRET = "tok-echoed-by-the-proxy-7781"


def echoing_proxy(req: Request) -> Response:
    """A broken proxy's HTML error page quoting the request headers, with noise around."""
    page = ("<html><body><h1>502 Bad Gateway</h1>\x00\x1b[31m<pre>"
            f"Authorization: {req.headers.get('Authorization')}\n" + "x" * 5000
            + "</pre></body></html>")
    return Response(502, page.encode(), "text/html")


def test_a_hub_error_page_is_truncated_sanitised_and_never_shows_the_token(tmp_path: Path):
    proxy = StubServer(echoing_proxy)
    token_file = tmp_path / "token"
    token_file.write_text(SECRET)
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    try:
        result = gpufleet("sync", "--hub-url", proxy.url, "--token-file", str(token_file),
                          "--db", db)
    finally:
        proxy.stop()
    assert result.exit_code == 3
    line = result.stderr.strip()
    assert "answered 502 Bad Gateway: 502 Bad Gateway Authorization: Bearer <redacted>" in line
    assert SECRET not in result.output and "\x00" not in line and "\x1b" not in line
    assert len(line) < 400 and line.endswith("…")
    runs = json.loads(gpufleet("inventory", "sync-runs", "--db", db, "-o", "json").stdout)
    assert runs[0]["status"] == "failed" and "<redacted>" in runs[0]["error"]
    assert SECRET not in json.dumps(runs)


def test_serve_never_shows_the_token_in_health_sync_runs_or_log(tmp_path: Path):
    proxy = StubServer(echoing_proxy)
    token_file = tmp_path / "token"
    token_file.write_text(SECRET)
    port = free_port()
    proc = start("--hub-url", proxy.url, "--token-file", str(token_file), "--db",
                 f"sqlite:///{tmp_path / 'inv.db'}", "--every", "1h",
                 "--listen", f"127.0.0.1:{port}")
    try:
        url = f"http://127.0.0.1:{port}"
        health = wait_status(proc, url, 503)
        while not health.get("last_error"):
            health = wait_status(proc, url, 503)
        runs = requests.get(url + "/api/v1/sync-runs", timeout=5).text
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
        proxy.stop()
    assert "<redacted>" in health["last_error"]
    for text in (json.dumps(health), runs, stderr):
        assert SECRET not in text
    assert "<redacted>" in stderr


def test_an_old_leaked_error_is_redacted_when_served(tmp_path: Path):
    """A sync_runs row stored by an older gpufleet, unredacted: the API must not serve it."""
    from hub.common import register_secret
    from hub.inventory import _db, read_only_engine
    from hub.inventory import _migrate as migrate
    from hub.service._api import sync_runs
    from hub.service._auth import FULL

    old_secret = "tok-stored-by-an-older-release-55"
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    engine = _db.make_engine(url, create=True)
    migrate.ensure_schema(engine)
    with engine.begin() as conn:
        _db.record_run(conn, started_at=_db.now_utc(), status="failed", requests=1,
                       error=f"Invalid header value b'Bearer {old_secret}\\n'")
    register_secret(old_secret)  # as serve does when it reads the token file
    body = sync_runs(read_only_engine(url), FULL)  # the handler, called as a function
    assert body["items"][0]["error"] == (
        "Invalid header value b'Bearer <redacted>\\n'")
