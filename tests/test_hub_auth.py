"""Auth to the hub: mTLS against Prometheus's own --web.config.file, and a bearer token.

Prometheus's web config has no bearer auth, so a small token-checking front stands in for
ACM's rbac-query-proxy. The token must reach the server and never appear in any output.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from hub.devstack import PrometheusProcess, hub_config
from tests.support.clirun import gpufleet
from tests.support.httpstub import Request, Response, StubServer, forward

TOKEN = "sha256~s3cr3t-t0ken-value"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.crt", "-days", "2", "-subj", "/CN=gpufleet-test-ca", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
                      ("client", "extendedKeyUsage=clientAuth")):
        (d / f"{name}.ext").write_text(ext + "\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile",
                f"{name}.ext", cwd=d)
    return d


@pytest.fixture
def mtls_hub(pki: Path, tmp_path: Path):
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {
        "cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key"),
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki / "ca.crt"),
    }}))
    proc = PrometheusProcess(tmp_path / "hub", hub_config(),
                             extra_args=[f"--web.config.file={web}"])
    proc.scheme = "https"
    proc.client_cert = (str(pki / "client.crt"), str(pki / "client.key"))
    proc.start()
    yield proc
    proc.stop()


def test_query_and_sync_over_mtls(mtls_hub, pki, tmp_path):
    tls = ["--hub-url", mtls_hub.url, "--ca-file", str(pki / "ca.crt"),
           "--cert-file", str(pki / "client.crt"), "--key-file", str(pki / "client.key")]
    result = gpufleet("query", "vector(42)", *tls, "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["value"] == 42.0
    result = gpufleet("sync", *tls, "--db", f"sqlite:///{tmp_path / 'i.db'}")
    assert result.exit_code == 0, result.output


def test_mtls_without_client_certificate_is_refused(mtls_hub, pki):
    result = gpufleet("query", "vector(1)", "--hub-url", mtls_hub.url,
                      "--ca-file", str(pki / "ca.crt"))
    assert result.exit_code == 3
    assert "TLS error" in result.stderr or "unreachable" in result.stderr


def test_tls_verification_is_on_by_default(mtls_hub, pki):
    result = gpufleet("query", "vector(1)", "--hub-url", mtls_hub.url,
                      "--cert-file", str(pki / "client.crt"),
                      "--key-file", str(pki / "client.key"))
    assert result.exit_code == 3
    assert "certificate verify failed" in result.stderr


def test_half_a_client_certificate_is_an_input_error(pki):
    result = gpufleet("query", "up", "--hub-url", "https://127.0.0.1:1",
                      "--cert-file", str(pki / "client.crt"))
    assert result.exit_code == 2
    assert "--cert-file and --key-file must be given together" in result.stderr


@pytest.fixture
def token_front(hub):
    """Answers 401 unless the request carries the expected bearer token."""
    def check(req: Request) -> Response:
        if req.headers.get("Authorization") != f"Bearer {TOKEN}":
            return Response(401, b'{"status":"error","error":"unauthorized"}')
        return forward(hub.url, req)

    front = StubServer(check)
    yield front
    front.stop()


def test_bearer_token_from_file_is_sent_and_never_printed(token_front, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    ok = gpufleet("query", "vector(7)", "--hub-url", token_front.url,
                  "--token-file", str(token_file))
    assert ok.exit_code == 0 and "7" in ok.stdout
    assert TOKEN not in ok.output
    assert token_front.seen[-1].headers["Authorization"] == f"Bearer {TOKEN}"


def test_bearer_token_from_environment(token_front):
    ok = gpufleet("query", "vector(1)", "--hub-url", token_front.url,
                  env={"GPUFLEET_TOKEN": TOKEN})
    assert ok.exit_code == 0, ok.output


def test_wrong_token_is_refused_without_leaking_it(token_front, tmp_path):
    wrong = "sha256~wrong-but-still-secret"
    token_file = tmp_path / "token"
    token_file.write_text(wrong)
    for args in (["query", "up"], ["sync", "--db", f"sqlite:///{tmp_path / 'i.db'}"]):
        result = gpufleet(*args, "--hub-url", token_front.url, "--token-file", str(token_file))
        assert result.exit_code == 3
        assert "refused the request (401" in result.stderr
        assert wrong not in result.output and wrong not in result.stderr


def test_credentials_in_the_url_are_not_printed():
    result = gpufleet("query", "up", "--hub-url", "http://admin:hunter2@127.0.0.1:1")
    assert result.exit_code == 3
    assert "hunter2" not in result.stderr and "http://127.0.0.1:1" in result.stderr
