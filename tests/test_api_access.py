"""Who may read the API: static tokens and OIDC JWTs signed with real keys, scopes, TLS.

One real inventory (a real hub Prometheus fed by agents with the real exporter samples, one
sync into SQLite) is served by services that differ only in their access settings. The OIDC
issuer is a local HTTP server publishing a discovery document and a JWKS made in the test
from an RSA and an EC key.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import http.client
import http.server
import ipaddress
import json
import logging
import os
import secrets
import signal
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
import requests
import yaml
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from hub.cli import cli
from hub.common import BackgroundHTTPServer, InputError
from hub.devstack import free_port
from hub.inventory import _db as inventory
from hub.inventory import read_only_engine, run_sync
from hub.inventory._writer import apply_observations
from hub.service import (
    Authenticator,
    Jobs,
    OidcVerifier,
    Service,
    TlsFiles,
    TokenFile,
    build_service,
    load_group_scopes,
)
from hub.service import _deps as deps
from hub.service._auth import MIN_REFRESH
from hub.service._serve import GRACE, HEADER_TIMEOUT
from hub.store import HubClient
from tests.test_api import hub_store  # noqa: F401  (module fixture: the real hub store)

AUDIENCE = "gpufleet"
TEAM_NS = "dynamo-workload"


# -- the inventory, served -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def db_url(hub_store: str, tmp_path_factory: pytest.TempPathFactory) -> str:  # noqa: F811
    url = f"sqlite:///{tmp_path_factory.mktemp('access-db') / 'inventory.db'}"
    engine = inventory.make_engine(url, create=True)
    run_sync(engine, HubClient(hub_store, timeout=10), stale_after=600)
    engine.dispose()
    return url


def serve(db_url: str, auth: Authenticator, **kwargs: Any) -> Service:
    def sync() -> Any:
        raise RuntimeError("not syncing in this test")

    return build_service(Jobs(sync=sync), every=3600, engine=read_only_engine(db_url),
                         auth=auth, process_metrics=False, **kwargs).start()


@pytest.fixture(scope="module")
def layout(db_url: str) -> dict[str, Any]:
    """The team's cluster (one running a TEAM_NS pod) and the names it must never see."""
    engine = inventory.make_engine(db_url)
    with engine.connect() as conn:
        allocations = inventory.list_allocations(conn)
        clusters = [c["cluster"] for c in inventory.list_clusters(conn)]
    engine.dispose()
    mine = next(a for a in allocations if a["namespace"] == TEAM_NS)["cluster"]
    foreign_pods = {a["pod"] for a in allocations if a["namespace"] != TEAM_NS}
    assert foreign_pods and len(clusters) > 1
    return {"cluster": mine, "others": set(clusters) - {mine}, "foreign_pods": foreign_pods}


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory, layout: dict[str, Any]
           ) -> tuple[Path, dict[str, str]]:
    """A tokens file made with `gpufleet serve token create`: an admin and a team token."""
    made: dict[str, str] = {}
    entries = []
    for name, args in (("admin", []), ("team", ["--clusters", layout["cluster"],
                                                 "--namespaces", TEAM_NS])):
        result = CliRunner().invoke(cli, ["serve", "token", "create", name, *args, "-o", "json"])
        assert result.exit_code == 0, result.output
        out = json.loads(result.output)
        assert out["token"] not in json.dumps(out["entry"])  # only the hash goes to the file
        made[name] = out["token"]
        entries.append(out["entry"])
    path = tmp_path_factory.mktemp("tokens") / "tokens.yaml"
    path.write_text(yaml.safe_dump({"tokens": entries}))
    return path, made


@pytest.fixture(scope="module")
def static(db_url: str, tokens: tuple[Path, dict[str, str]]) -> Iterator[Service]:
    service = serve(db_url, Authenticator(tokens=TokenFile(tokens[0])), metrics_open=False)
    yield service
    service.stop()


def get(service: Service, path: str, token: str | None = None, **params: Any
        ) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(service.url + path, params=params, headers=headers, timeout=10)


# -- 401 / 403 ----------------------------------------------------------------------------------
@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic YWRtaW46YWRtaW4=", "Bearer ",
                                    "Bearer a b"])
def test_without_a_valid_token_everything_but_healthz_is_401_alike(static, header):
    headers = {"Authorization": header} if header else {}
    bodies = set()
    for path in ("/api/v1/gpus", "/api/v1/openapi.json", "/metrics", "/api/v1/no-such-path"):
        r = requests.get(static.url + path, headers=headers, timeout=10)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
        bodies.add(r.text)
    assert len(bodies) == 1  # no hint which paths or tokens exist
    assert requests.get(static.url + "/healthz", headers=headers, timeout=10).status_code in (
        200, 503)


def test_failed_attempts_are_counted_and_no_token_reaches_the_log(static, tokens, caplog):
    caplog.set_level(logging.DEBUG)
    admin = tokens[1]["admin"]

    def refused(reason: str) -> float:
        text = get(static, "/metrics", admin).text
        line = next(x for x in text.splitlines()
                    if x.startswith(f'gpufleet_api_refused_requests_total{{reason="{reason}"}}'))
        return float(line.split()[-1])

    before = refused("unauthenticated"), refused("forbidden")
    get(static, "/api/v1/gpus", "gpf_wrong-token-value")
    get(static, "/api/v1/gpus", tokens[1]["team"], cluster="not-the-teams-cluster")
    after = refused("unauthenticated"), refused("forbidden")
    assert after[0] == before[0] + 1 and after[1] == before[1] + 1
    assert "gpf_wrong-token-value" not in caplog.text
    assert admin not in caplog.text and tokens[1]["team"] not in caplog.text


def test_a_path_outside_the_scope_is_403_and_a_foreign_gpu_is_unknown(static, tokens, layout):
    team = tokens[1]["team"]
    other = sorted(layout["others"])[0]
    assert get(static, "/api/v1/gpus", team, cluster=other).status_code == 403
    assert get(static, "/api/v1/allocations", team, namespace="default").status_code == 403
    assert get(static, "/metrics", team).status_code == 403  # closed: whole-fleet tokens only
    assert get(static, "/metrics", tokens[1]["admin"]).status_code == 200
    foreign = get(static, "/api/v1/gpus", tokens[1]["admin"], cluster=other).json()["items"][0]
    r = get(static, "/api/v1/gpus/" + requests.utils.quote(foreign["uuid"], safe=""), team)
    assert r.status_code == 404 and foreign["cluster"] not in r.text


def _visible(body: Any, layout: dict[str, Any], found: set[str]) -> None:
    """Every object in an answer is inside the team's scope; collect what was seen."""
    if isinstance(body, list):
        for item in body:
            _visible(item, layout, found)
    elif isinstance(body, dict):
        if isinstance(body.get("cluster"), str):
            assert body["cluster"] == layout["cluster"], body
            found.add("cluster")
        if "namespace" in body and "pod" in body:
            assert body["namespace"] in (TEAM_NS, "other"), body
            if body["namespace"] == "other":
                assert body["pod"] is None and body["container"] is None
                found.add("other")
            else:
                found.add("own")
        for value in body.values():
            _visible(value, layout, found)


def test_a_scoped_token_sees_no_other_teams_pods_in_any_endpoint(static, tokens, layout):
    """Walks every path of the OpenAPI description with the team's token."""
    admin, team = tokens[1]["admin"], tokens[1]["team"]
    spec = get(static, "/api/v1/openapi.json", team).json()
    uuids = [g["uuid"] for g in get(static, "/api/v1/gpus", admin).json()["items"]]
    found: set[str] = set()
    walked = []
    for path, operations in spec["paths"].items():
        if "get" not in operations:  # /logout: a form post, names nothing
            continue
        urls = ([path.replace("{uuid}", requests.utils.quote(u, safe="")) for u in uuids]
                if "{uuid}" in path else [path])
        for url in urls:
            r = get(static, url, team)
            ok = (200, 403, 404, 503) if path == "/healthz" else (200, 403, 404)
            assert r.status_code in ok, (url, r.status_code, r.text)
            for pod in layout["foreign_pods"]:
                assert pod not in r.text, (url, pod)
            for cluster in layout["others"]:
                assert f'"cluster":"{cluster}"' not in r.text, (url, cluster)
            if (r.headers["Content-Type"] == "application/json" and r.status_code == 200
                    and path != "/api/v1/openapi.json"):  # a schema, not data
                _visible(r.json(), layout, found)
        walked.append(path)
    assert "/api/v1/allocations" in walked and "/api/v1/gpus/{uuid}" in walked
    assert {"cluster", "own"} <= found
    # the admin sees the foreign pods: the walk above would notice them
    text = get(static, "/api/v1/allocations", admin).text
    assert all(pod in text for pod in layout["foreign_pods"])


def test_the_tokens_file_is_read_again_when_it_changes(static, tokens):
    path, _ = tokens
    result = CliRunner().invoke(cli, ["serve", "token", "create", "late", "-o", "json"])
    late = json.loads(result.output)
    assert get(static, "/api/v1/clusters", late["token"]).status_code == 401
    data = yaml.safe_load(path.read_text())
    data["tokens"].append(late["entry"])
    path.write_text(yaml.safe_dump(data))
    assert get(static, "/api/v1/clusters", late["token"]).status_code == 200


def test_a_clear_text_token_in_the_file_is_refused(tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"tokens": [{"name": "x", "token": "gpf_abc"}]}))
    with pytest.raises(InputError, match="sha256") as info:
        TokenFile(path)
    assert "gpf_abc" not in str(info.value)


# -- the serve command's guard rails ---------------------------------------------------------
@pytest.mark.parametrize(("args", "needle"), [
    (["--listen", "0.0.0.0:0"], "not a loopback address and no access is configured"),
    (["--oidc-issuer", "https://idp.example"], "needs --oidc-audience"),
    (["--oidc-issuer", "http://idp.example", "--oidc-audience", "a", "--scopes-file", "f"],
     "must be an https:// URL"),
    (["--tls-cert-file", "x.pem"], "go together"),
    (["--session-ttl", "0s"], "--session-ttl must be greater than 0"),
    (["--tokens-file", "/nonexistent/tokens.yaml"], "cannot read the tokens file"),
    (["--tls-cert-file", "/nonexistent/c", "--tls-key-file", "/nonexistent/k"],
     "cannot load the TLS certificate"),
])
def test_serve_refuses_unsafe_or_incomplete_access(args, needle, tmp_path):
    if "--scopes-file" in args:
        (tmp_path / "f").write_text("scopes: []\n")
        args = [a if a != "f" else str(tmp_path / "f") for a in args]
    result = CliRunner().invoke(cli, ["serve", "--hub-url", "http://127.0.0.1:1", *args])
    assert result.exit_code == 2 and needle in result.output, result.output


# -- OIDC -----------------------------------------------------------------------------------------
class Issuer:
    """A local OIDC issuer: discovery document and JWKS, keys replaceable (a rotation)."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {}  # kid -> private key
        self.jwks_hits = 0
        #: while cleared, the JWKS answer waits (an issuer that stalls)
        self.answering = threading.Event()
        self.answering.set()
        issuer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": issuer.url, "jwks_uri": issuer.url + "/jwks"}
                elif self.path == "/jwks":
                    issuer.jwks_hits += 1
                    issuer.answering.wait(30)
                    body = {"keys": [issuer.jwk(k, v) for k, v in issuer.keys.items()]}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = BackgroundHTTPServer("127.0.0.1", 0, Handler).start()
        self.url = self.server.url

    @staticmethod
    def jwk(kid: str, key: Any) -> dict[str, Any]:
        if isinstance(key, rsa.RSAPrivateKey):
            out = jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
            out["alg"] = "RS256"
        else:
            out = jwt.algorithms.ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
            out["alg"] = "ES256"
        return {**out, "kid": kid, "use": "sig"}

    def token(self, kid: str, groups: list[str], *, audience: str = AUDIENCE,
              issuer: str | None = None, expires_in: float = 300,
              subject: str = "someone") -> str:
        """A fresh JWT (its own jti: two tokens of one second still differ)."""
        key = self.keys[kid]
        alg = "RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256"
        now = int(time.time())
        claims = {"iss": issuer or self.url, "aud": audience, "sub": subject,
                  "iat": now, "exp": now + int(expires_in), "groups": groups,
                  "jti": secrets.token_hex(8)}
        return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid})


@pytest.fixture()
def issuer() -> Iterator[Issuer]:
    made = Issuer()
    made.keys["rsa-1"] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    made.keys["ec-1"] = ec.generate_private_key(ec.SECP256R1())
    yield made
    made.server.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def oidc(db_url: str, issuer: Issuer, layout: dict[str, Any], tmp_path: Path
         ) -> Iterator[tuple[Service, Clock]]:
    scopes = tmp_path / "scopes.yaml"
    scopes.write_text(yaml.safe_dump({"scopes": [
        {"group": "platform", "clusters": "*"},
        {"group": "team", "clusters": [layout["cluster"]], "namespaces": [TEAM_NS]},
    ]}))
    clock = Clock()
    verifier = OidcVerifier(issuer.url, AUDIENCE, load_group_scopes(scopes), clock=clock)
    service = serve(db_url, Authenticator(oidc=verifier))
    yield service, clock
    service.stop()


def test_oidc_tokens_signed_with_rsa_and_ec_keys_are_accepted_and_scoped(oidc, issuer, layout):
    service, _ = oidc
    for kid in ("rsa-1", "ec-1"):
        platform = get(service, "/api/v1/clusters", issuer.token(kid, ["platform"]))
        assert platform.status_code == 200 and len(platform.json()["items"]) > 1
        team = get(service, "/api/v1/clusters", issuer.token(kid, ["team", "unmapped"]))
        assert [c["cluster"] for c in team.json()["items"]] == [layout["cluster"]]
    assert issuer.jwks_hits == 1  # cached
    # authenticated but no mapped group: sees nothing
    assert get(service, "/api/v1/clusters", issuer.token("rsa-1", ["x"])).status_code == 403


def hs256_by_hand(header: dict[str, Any], claims: dict[str, Any], secret: bytes) -> str:
    """The classic forgery: HMAC keyed with the issuer's public key (PyJWT will not make it)."""
    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    signing = part(json.dumps(header).encode()) + "." + part(json.dumps(claims).encode())
    mac = hmac.new(secret, signing.encode(), hashlib.sha256).digest()
    return signing + "." + part(mac)


def test_oidc_refuses_expired_foreign_and_forged_tokens(oidc, issuer):
    service, _ = oidc
    public = issuer.keys["rsa-1"].public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    now = int(time.time())
    forged = hs256_by_hand({"alg": "HS256", "kid": "rsa-1", "typ": "JWT"},
                           {"iss": issuer.url, "aud": AUDIENCE, "exp": now + 300,
                            "groups": ["platform"]}, public)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    wrong_key = jwt.encode({"iss": issuer.url, "aud": AUDIENCE, "exp": now + 300,
                            "groups": ["platform"]}, stranger, algorithm="RS256",
                           headers={"kid": "rsa-1"})
    for token in (issuer.token("rsa-1", ["platform"], expires_in=-120),
                  issuer.token("ec-1", ["platform"], audience="another-app"),
                  issuer.token("rsa-1", ["platform"], issuer="https://evil.example"),
                  forged, wrong_key):
        assert get(service, "/api/v1/clusters", token).status_code == 401


def test_oidc_key_rotation_is_picked_up_on_an_unknown_key_id(oidc, issuer):
    service, clock = oidc
    assert get(service, "/api/v1/clusters", issuer.token("rsa-1", ["platform"])).ok
    issuer.keys = {"rsa-2": rsa.generate_private_key(public_exponent=65537, key_size=2048)}
    rotated = issuer.token("rsa-2", ["platform"])
    hits = issuer.jwks_hits
    clock.now += 1  # keys fetched a second ago: not again yet, whatever the callers send
    assert get(service, "/api/v1/clusters", rotated).status_code == 401
    assert issuer.jwks_hits == hits
    clock.now += MIN_REFRESH
    assert get(service, "/api/v1/clusters", rotated).status_code == 200
    assert issuer.jwks_hits == hits + 1
    hits = issuer.jwks_hits
    for _ in range(5):
        bogus = jwt.encode({"x": 1}, issuer.keys["rsa-2"], algorithm="RS256",
                           headers={"kid": "random"})
        assert get(service, "/api/v1/clusters", bogus).status_code == 401
    assert issuer.jwks_hits == hits


def test_a_stalled_issuer_never_holds_up_callers_whose_key_is_cached(oidc, issuer):
    """A stranger's random key id makes the service fetch the keys again; the issuer stalls.
    Callers whose key is cached are answered meanwhile, not queued behind that fetch."""
    service, clock = oidc
    valid = issuer.token("rsa-1", ["platform"])
    assert get(service, "/api/v1/clusters", valid).ok  # keys fetched and cached
    issuer.answering.clear()
    clock.now += MIN_REFRESH
    bogus = jwt.encode({"x": 1}, issuer.keys["rsa-1"], algorithm="RS256",
                       headers={"kid": "random"})
    stranger = threading.Thread(target=get, args=(service, "/api/v1/clusters", bogus))
    hits = issuer.jwks_hits
    try:
        stranger.start()
        while issuer.jwks_hits == hits:  # the refresh is in flight, stalled at the issuer
            time.sleep(0.01)
        for _ in range(5):
            started = time.monotonic()
            assert get(service, "/api/v1/clusters", valid).status_code == 200
            assert time.monotonic() - started < 1.0
        # another unknown key id meanwhile is refused at once, not queued
        started = time.monotonic()
        assert get(service, "/api/v1/clusters", bogus).status_code == 401
        assert time.monotonic() - started < 1.0
    finally:
        issuer.answering.set()
        stranger.join(30)


# -- TLS -----------------------------------------------------------------------------------------
def make_cert(directory: Path, name: str) -> Path:
    """A CA and a server certificate for 127.0.0.1 signed by it; returns the CA file."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"test CA {name}")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=1))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufleet")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (directory / "tls.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    bump = time.time() + len(name)  # a rotation within the same clock tick still differs
    for f in ("tls.key", "tls.crt"):
        os.utime(directory / f, (bump, bump))
    ca_file = directory / f"ca-{name}.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return ca_file


def test_tls_is_verified_by_a_real_client_and_a_rotated_certificate_is_served(db_url, tokens,
                                                                            tmp_path):
    first = make_cert(tmp_path, "one")
    service = serve(db_url, Authenticator(tokens=TokenFile(tokens[0])),
                    tls=TlsFiles(tmp_path / "tls.crt", tmp_path / "tls.key"))
    admin = {"Authorization": f"Bearer {tokens[1]['admin']}"}
    try:
        assert service.url.startswith("https://127.0.0.1:")
        r = requests.get(service.url + "/api/v1/clusters", headers=admin, verify=str(first),
                         timeout=10)
        assert r.status_code == 200 and r.json()["items"]
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(service.url + "/healthz", timeout=10)  # system CAs: not trusted
        with pytest.raises(requests.exceptions.ConnectionError):  # no plain HTTP answer
            requests.get(service.url.replace("https", "http") + "/healthz", timeout=10)
        second = make_cert(tmp_path, "two")  # cert-manager rewrote the Secret
        r = requests.get(service.url + "/healthz", verify=str(second), timeout=10)
        assert r.status_code in (200, 503)
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(service.url + "/healthz", verify=str(first), timeout=10)
        (tmp_path / "tls.key").write_text("half-written")  # a rotation caught mid-way
        os.utime(tmp_path / "tls.key", (time.time() + 60, time.time() + 60))
        r = requests.get(service.url + "/healthz", verify=str(second), timeout=10)
        assert r.status_code in (200, 503)  # still the last good certificate
    finally:
        service.stop()


# -- connections ---------------------------------------------------------------------------------
def test_clients_that_hang_up_early_leave_no_traceback(db_url, capfd):
    service = serve(db_url, Authenticator())
    try:
        host, port = "127.0.0.1", service.server.port
        for i in range(60):
            with socket.create_connection((host, port), timeout=5) as s:
                # linger 0: the close is a reset, the harshest way to leave
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.sendall(b"GET /api/v1/gpus HTTP/1.1\r\nHost: x\r\n\r\n" if i % 2 else b"GE")
        assert get(service, "/healthz").status_code in (200, 503)
    finally:
        service.stop()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception" not in err


def test_tls_handshake_failures_leave_no_traceback(db_url, tmp_path, capfd):
    make_cert(tmp_path, "one")
    service = serve(db_url, Authenticator(),
                    tls=TlsFiles(tmp_path / "tls.crt", tmp_path / "tls.key"))
    try:
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", service.server.port), timeout=5) as s:
                s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                s.recv(100)
        ctx = ssl.create_default_context()
        with pytest.raises(ssl.SSLError):
            raw = socket.create_connection(("127.0.0.1", service.server.port), timeout=5)
            ctx.wrap_socket(raw, server_hostname="127.0.0.1").close()
    finally:
        service.stop()
    assert "Traceback" not in capfd.readouterr().err


def test_a_dead_database_is_a_503_without_driver_details(caplog):
    with socket.socket() as s:  # a closed loopback port: PostgreSQL "unreachable"
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql+psycopg://team_user@127.0.0.1:{port}/inventory"
    service = serve(url, Authenticator())
    try:
        r = get(service, "/api/v1/gpus")
        assert r.status_code == 503
        assert r.json() == {"error": "inventory database unavailable (details in the service "
                                     "log)"}
        health = get(service, "/healthz").text
    finally:
        service.stop()
    for text in (r.text, health):
        assert str(port) not in text and "team_user" not in text
    assert str(port) in caplog.text  # the operator still learns why


def _healthz_seconds(service: Service, source: str | None = None) -> float:
    """One /healthz, timed; from ``source`` (a loopback address) when given, as a kubelet
    probes from its node's address rather than a flood's."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", service.server.port, timeout=10,
                                      source_address=(source, 0) if source else None)
    try:
        conn.request("GET", "/healthz")
        answer = conn.getresponse()
        answer.read()
    finally:
        conn.close()
    assert answer.status in (200, 503) and answer.getheader("Content-Type") == "application/json"
    return time.monotonic() - started


@pytest.mark.parametrize("kind", ["half-sent", "trickling", "idle"])
def test_300_slow_clients_never_delay_the_readiness_probe(db_url, kind):
    """300 connections that send half a request (and stop), trickle one header byte at a
    time, or open and say nothing, all on loopback: /healthz answers within a second while
    they hold on, and the half-sent ones are cut once their head is HEADER_TIMEOUT late."""
    service = serve(db_url, Authenticator(tokens=None))
    held: list[socket.socket] = []
    try:
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", service.server.port), timeout=5)
            if kind != "idle":
                s.sendall(b"GET /api/v1/gpus HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            held.append(s)
        for step in range(5):
            if kind == "trickling":
                for s in held:
                    s.sendall(b"a")
            assert _healthz_seconds(service) < 1.0, (kind, step)
        cut = held[0]
        cut.settimeout(HEADER_TIMEOUT + 5)
        started = time.monotonic()
        while cut.recv(4096):  # the server closes it (an empty read), no answer needed
            pass
        assert time.monotonic() - started <= HEADER_TIMEOUT + 1
        assert _healthz_seconds(service) < 1.0
    finally:
        for s in held:
            s.close()
        service.stop()


def _flood(service: Service, count: int, seconds: float) -> Any:
    import subprocess
    import sys

    flood = subprocess.Popen([sys.executable, "-m", "tests.support.flood",
                              str(service.server.port), str(count), str(seconds)],
                             stdout=subprocess.PIPE, text=True)
    assert flood.stdout is not None and flood.stdout.readline().strip() == "ready"
    return flood


def _flood_counts(flood: Any) -> dict[str, int]:
    return json.loads(flood.communicate(timeout=60)[0].strip().splitlines()[-1])


def test_2500_reopening_idle_connections_never_turn_away_healthz_or_a_token(db_url, tokens):
    """The probe: 2,100 idle connections, each opened again when the server closed it, made
    uvicorn's limit_concurrency (2,000) answer 503 to every request, /healthz included.
    While another process holds 2,500 such connections from one address for 25 s,
    /healthz answers within a second and a token's API request with its 200 each time."""
    service = serve(db_url, Authenticator(tokens=TokenFile(tokens[0])))
    flood = _flood(service, 2500, 25)
    try:
        for _ in range(10):
            assert _healthz_seconds(service) < 1.0
            r = requests.get(service.url + "/api/v1/clusters", timeout=5,
                             headers={"Authorization": f"Bearer {tokens[1]['admin']}"})
            assert r.status_code == 200  # (not timed: a database read on a shared machine)
            time.sleep(0.5)
        assert flood.poll() is None  # all of it under the flood
        assert len(service.server.guard.open) >= 2000  # held, not refused
        counts = _flood_counts(flood)
        assert counts["opened"] >= 2500 and counts["closed_by_server"] > 0  # head deadline
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.wait()
        service.stop()


class _Transport:
    def __init__(self, sock: socket.socket | None = None) -> None:
        self.closed, self.sock = False, sock

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return self.sock if name == "socket" else None


class _Conn:
    def __init__(self, name: str, sock: socket.socket | None = None) -> None:
        self.name, self.transport = name, _Transport(sock)

    def __repr__(self) -> str:
        return self.name


def test_the_connection_guard_closes_the_oldest_idle_never_one_in_flight():
    from hub.service._serve import ConnectionGuard

    guard = ConnectionGuard(total=3, per_client=2)
    a1, a2, a3, b1, c1, d1 = (_Conn(n) for n in ("a1", "a2", "a3", "b1", "c1", "d1"))
    for conn in (a1, a2, a3):
        guard.opened(conn, "A")
    assert a1.transport.closed and list(guard.open) == [a2, a3]  # A's oldest idle
    guard.opened(b1, "B")
    guard.went_busy(a2)  # a request in flight: never closed here
    guard.opened(c1, "C")  # one too many in all: the oldest idle, a3, goes
    assert a3.transport.closed and not a2.transport.closed
    assert list(guard.open) == [a2, b1, c1]
    guard.went_busy(b1)
    guard.went_busy(c1)
    guard.opened(d1, "D")  # every other one busy: the newcomer itself is refused
    assert d1.transport.closed and guard.shed == 3
    guard.went_idle(a2)  # answered: idle again, the newest idle now
    guard.closed(b1)
    assert list(guard.idle) == [a2] and set(guard.open) == {a2, c1}


def test_the_guard_never_closes_a_connection_whose_request_waits_unread():
    """A flood keeps the loop behind: a request sent from the flood's own address (every
    caller behind one router shares it) sits in the kernel unread while newer connections
    open. The guard passes over it to the next oldest; closing it would reset the caller."""
    from hub.service._serve import ConnectionGuard

    pairs = [socket.socketpair() for _ in range(4)]
    try:
        guard = ConnectionGuard(total=3, per_client=2)
        a1, a2, a3, a4 = (_Conn(f"a{i}", server) for i, (server, _) in enumerate(pairs, 1))
        pairs[0][1].sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # a1's, unread
        for conn in (a1, a2, a3):
            guard.opened(conn, "A")
        assert a2.transport.closed and not a1.transport.closed
        assert list(guard.open) == [a1, a3]
        pairs[0][0].recv(65536)  # the loop read it: a1 is an idle connection like any other
        guard.opened(a4, "A")
        assert a1.transport.closed and list(guard.open) == [a3, a4] and guard.shed == 2
    finally:
        for pair in pairs:
            for s in pair:
                s.close()


def test_past_its_bounds_a_flood_loses_its_own_oldest_idle_connections(db_url):
    """Bounds lowered to 64 idle per address and 200 in all: 300 re-opening connections
    from 127.0.0.1 are trimmed to 64, oldest first, while another address's (127.0.0.2)
    idle connections stay open and a probe from a third (127.0.0.3, the node's) answers
    within a second. A probe from the flood's own address may be closed before it sends
    its request: that address is the one paying."""
    service = serve(db_url, Authenticator())
    guard = service.server.guard
    guard.per_client, guard.total = 64, 200
    other = [socket.create_connection(("127.0.0.1", service.server.port), timeout=5,
                                      source_address=("127.0.0.2", 0)) for _ in range(20)]
    flood = _flood(service, 300, 6)
    try:
        for _ in range(4):
            assert _healthz_seconds(service, source="127.0.0.3") < 1.0
            # read from another thread than the loop's: one connection may be in transit
            assert len(guard.idle_of.get("127.0.0.1", ())) <= 64 + 1
            assert len(guard.open) <= 200 + 1
            time.sleep(0.5)
        for s in other:  # not one of them closed: the flood paid for its own
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)
        assert guard.shed > 0 and _flood_counts(flood)["closed_by_server"] > 0
        shed = next(line for line in requests.get(service.url + "/metrics", timeout=5)
                    .text.splitlines() if line.startswith("gpufleet_api_connections_shed_total"))
        assert float(shed.split()[-1]) >= guard.shed // 2 > 0
    finally:
        for s in other:
            s.close()
        if flood.poll() is None:
            flood.kill()
            flood.wait()
        service.stop()


def test_stopping_lets_an_answer_in_flight_finish_and_ignores_idle_connections(db_url):
    service = serve(db_url, Authenticator())
    idle = socket.create_connection(("127.0.0.1", service.server.port), timeout=5)
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(b"}"):  # the whole JSON answer; the connection stays open
        answer += idle.recv(65536)
    assert answer.startswith(b"HTTP/1.1 ")  # a kept-alive connection, idle now
    started = time.monotonic()
    service.stop()
    assert time.monotonic() - started < GRACE + 1
    assert idle.recv(65536) == b""  # closed by the server on the way out
    idle.close()
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(service.url + "/healthz", timeout=2)


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n", 431),
    (b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n", 413),
    (b"NOT HTTP AT ALL\r\n\r\n", 400),
], ids=["huge-head", "huge-body", "not-http"])
def test_oversized_and_malformed_requests_get_a_json_error(db_url, request_bytes, status):
    """Each closes the connection after its answer: nothing of it is read as a request."""
    service = serve(db_url, Authenticator())
    try:
        with socket.create_connection(("127.0.0.1", service.server.port), timeout=5) as s:
            s.sendall(request_bytes)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
        assert b"application/json" in head and json.loads(body)["error"]
    finally:
        service.stop()


def test_serve_process_with_tokens_and_tls_on_a_pod_address(tokens, tmp_path):
    """The command wired end to end: `gpufleet serve` on 0.0.0.0 with a tokens file and a
    certificate; a verifying client with a token reads, one without is refused."""
    from tests.test_service_cli import start

    ca = make_cert(tmp_path, "one")
    port = free_port()
    proc = start("--hub-url", "http://127.0.0.1:1", "--db", f"sqlite:///{tmp_path / 'i.db'}",
                 "--listen", f"0.0.0.0:{port}", "--tokens-file", str(tokens[0]),
                 "--tls-cert-file", str(tmp_path / "tls.crt"),
                 "--tls-key-file", str(tmp_path / "tls.key"), "--metrics-closed")
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.communicate()
            try:
                health = requests.get(url + "/healthz", verify=str(ca), timeout=2)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert health.status_code == 503  # open, and honest: the hub is unreachable
        admin = {"Authorization": f"Bearer {tokens[1]['admin']}"}
        assert requests.get(url + "/metrics", verify=str(ca), timeout=5).status_code == 401
        metrics = requests.get(url + "/metrics", headers=admin, verify=str(ca), timeout=5)
        assert metrics.status_code == 200
        assert "gpufleet_tls_certificate_expiry_timestamp_seconds " in metrics.text
        r = requests.get(url + "/api/v1/clusters", headers=admin, verify=str(ca), timeout=5)
        assert r.status_code in (200, 503)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert f"https://0.0.0.0:{port}" in err or f"https://127.0.0.1:{port}" in err
    assert tokens[1]["admin"] not in out + err and "Traceback" not in err


def test_the_oidc_options_build_a_verifier_that_accepts_the_issuers_tokens(issuer, tmp_path):
    from hub.service import access

    scopes = tmp_path / "scopes.yaml"
    scopes.write_text("scopes:\n  - group: team\n    clusters: [east]\n")
    auth = access(tokens_file=None, oidc_issuer=issuer.url + "/", oidc_audience=AUDIENCE,
                  oidc_scope_claim="roles", scopes_file=str(scopes))
    token = jwt.encode({"iss": issuer.url, "aud": AUDIENCE, "exp": int(time.time()) + 60,
                        "roles": "team"}, issuer.keys["ec-1"], algorithm="ES256",
                       headers={"kid": "ec-1"})
    scope = auth.bearer(f"Bearer {token}").scope
    assert scope.clusters == frozenset({"east"}) and scope.namespaces is None


def test_scopes_mask_other_teams_and_join_groups():
    from hub.service import Scope

    team = Scope("a", frozenset({"east"}), frozenset({"ns-a"}))
    row = {"cluster": "east", "namespace": "ns-b", "pod": "p", "container": "c", "uuid": "u"}
    assert team.mask_allocation(row) == {**row, "namespace": "other", "pod": None,
                                         "container": None}
    assert team.mask_allocation({**row, "namespace": "ns-a"})["pod"] == "p"
    joined = team.union(Scope("b", frozenset({"west"}), None))
    assert joined.clusters == {"east", "west"} and joined.namespaces is None
    assert not team.allows_cluster(None) and Scope("all").allows_cluster(None)


@pytest.mark.parametrize(("text", "needle"), [
    ("scopes: [{clusters: [east]}]", "needs a 'group'"),
    ("scopes: [{group: a, clusters: 3}]", "clusters must be a list"),
    ("scopes: [{group: a, namespace: [x]}]", "unknown key(s)"),
    ("scopes: {group: a}", "expected a mapping with a list 'scopes:'"),
    ("scopes: [", "not valid YAML"),
])
def test_a_bad_scopes_file_is_a_one_line_error(text, needle, tmp_path):
    path = tmp_path / "scopes.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=r"scopes\.yaml") as info:
        load_group_scopes(path)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_an_endpoint_that_applies_no_scope_is_closed_to_scoped_callers(db_url, tokens):
    """The contract for new endpoints: a route answers scoped callers only when it is
    declared ``scoped`` where it is added; otherwise only callers who may see everything,
    so it cannot leak before it learns to filter. Taking a ``scope`` opens nothing."""
    from hub.service._routing import route

    service = serve(db_url, Authenticator(tokens=TokenFile(tokens[0])))

    def everything() -> dict[str, Any]:
        return {"items": ["every team's pods"]}

    def asks_its_scope(scope: deps.CallerScope) -> dict[str, Any]:
        return {"items": ["every team's pods"]}

    route(service.app, "/api/v1/new", everything, dict[str, Any])
    route(service.app, "/api/v1/newer", asks_its_scope, dict[str, Any])
    try:
        for path in ("/api/v1/new", "/api/v1/newer"):
            assert get(service, path, tokens[1]["admin"]).status_code == 200
            r = get(service, path, tokens[1]["team"])
            assert r.status_code == 403 and "pods" not in r.text
    finally:
        service.stop()


def test_a_scoped_caller_pages_allocations_whole_and_tokens_carry_no_foreign_names(static,
                                                                                  tokens,
                                                                                  layout):
    team = tokens[1]["team"]
    whole = get(static, "/api/v1/allocations", team).json()["items"]
    seen: list[Any] = []
    params: dict[str, Any] = {"limit": 1}
    while True:
        body = get(static, "/api/v1/allocations", team, **params).json()
        seen += body["items"]
        if body["continue"] is None:
            break
        decoded = base64.urlsafe_b64decode(body["continue"] + "==").decode()
        assert not any(pod in decoded for pod in layout["foreign_pods"])
        params["continue"] = body["continue"]
    assert seen == whole


def test_an_unreachable_or_wrong_issuer_is_said_at_start(issuer, caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert OidcVerifier(issuer.url, AUDIENCE, {}).jwks.warm()
    assert not OidcVerifier(closed, AUDIENCE, {}).jwks.warm()
    assert f"OIDC issuer {closed}: cannot fetch its keys yet" in caplog.text
    # a discovery document naming another issuer is refused, not trusted
    alias = issuer.url.replace("127.0.0.1", "localhost")  # same server, another name
    assert not OidcVerifier(alias, AUDIENCE, {}).jwks.warm()
    assert f"OIDC issuer {alias}: cannot fetch its keys yet (Unauthorized)" in caplog.text


# -- usage, idle, capacity, events and history under a scope --------------------------------------
def _ledger_db(tmp_path: Path) -> str:
    """Two teams on two clusters: team-a on c-a (busy), team-b on c-b (allocated, idle)."""
    from hub.inventory import _migrate as migrate
    from hub.inventory._normalize import Observation
    from hub.usage import write_bucket

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = inventory.make_engine(url, create=True)
    migrate.ensure_schema(engine)
    now = inventory.now_utc().replace(minute=0, second=0, microsecond=0)
    teams = (("c-a", "GPU-a", "team-a", "train-a", 90.0), ("c-b", "GPU-b", "team-b", "idle-b", 0.0))
    with engine.begin() as conn:
        apply_observations(conn, [
            Observation(cluster, "n1", uuid, "nvidia", index=0, model="H100",
                        allocations={(ns, pod, "main")})
            for cluster, uuid, ns, pod, _ in teams], now)
        for hours_ago in (3, 2, 1):
            start = now - dt.timedelta(hours=hours_ago)
            write_bucket(conn, start.replace(tzinfo=dt.UTC).timestamp(), 3600.0, [
                {"cluster": cluster, "node": "n1", "uuid": uuid, "slice": "", "namespace": ns,
                 "pod": pod, "bucket_start": start, "bucket_end": start + dt.timedelta(hours=1),
                 "vendor": "nvidia", "model": "H100", "gpu_share": 1.0, "gpu_hours": 1.0,
                 "avg_utilisation_pct": util, "max_utilisation_pct": util,
                 "avg_memory_used_mib": 1.0, "max_memory_used_mib": 1.0, "avg_power_w": 1.0,
                 "energy_wh": 1.0, "coverage": 1.0}
                for cluster, uuid, ns, pod, util in teams], 14)
    engine.dispose()
    return url


def test_usage_idle_capacity_events_and_history_apply_the_callers_scope(tmp_path):
    """Team B's token: its own GPU-hours, idle GPU and capacity, fleet-wide capacity totals
    (numbers, no names), only its cluster's events, and team A's GPU history unknown."""
    url = _ledger_db(tmp_path)
    made = {}
    entries = []
    for name, args in (("admin", []), ("team-b", ["--clusters", "c-b", "--namespaces",
                                                  "team-b"])):
        out = json.loads(CliRunner().invoke(
            cli, ["serve", "token", "create", name, *args, "-o", "json"]).output)
        made[name] = out["token"]
        entries.append(out["entry"])
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"tokens": entries}))
    from hub.service import USAGE_SECTIONS

    service = serve(url, Authenticator(tokens=TokenFile(path)), page_sections=USAGE_SECTIONS)
    try:
        team = made["team-b"]
        page = get(service, "/", team)
        assert page.status_code == 200, page.text
        assert "idle-b" in page.text and 'id="usage"' in page.text
        for foreign in ("c-a", "GPU-a", "team-a", "train-a"):
            assert foreign not in page.text, foreign
        whole = get(service, "/", made["admin"]).text
        assert "c-a" in whole and "team-a" in whole  # the admin's page would show them
        assert "train-a" in get(service, "/", made["admin"], q="team-a").text
        searched = get(service, "/", team, q="team-a")
        assert searched.status_code == 200 and "train-a" not in searched.text
        count = 'data-count="search-gpus">({})'
        assert count.format(0) in get(service, "/", team, q="GPU-a").text
        assert count.format(1) in get(service, "/", made["admin"], q="GPU-a").text
        usage = get(service, "/api/v1/usage", team, since="24h")
        assert usage.status_code == 200, usage.text
        assert [(r["namespace"], r["gpu_hours"]) for r in usage.json()["items"]] == [
            ("team-b", 3.0)]
        admin_usage = get(service, "/api/v1/usage", made["admin"], since="24h").json()
        assert {r["namespace"] for r in admin_usage["items"]} == {"team-a", "team-b"}
        idle = get(service, "/api/v1/idle", team, since="24h").json()["items"]
        assert [(r["uuid"], r["pod"]) for r in idle] == [("GPU-b", "idle-b")]
        capacity = get(service, "/api/v1/capacity", team).json()
        assert [(r["model"], r["total"], r["allocated"]) for r in capacity["items"]] == [
            ("H100", 1.0, 1.0)]  # its own cluster's GPUs
        assert (capacity["fleet"]["total"], capacity["fleet"]["allocated"]) == (2.0, 2.0)
        by_cluster = get(service, "/api/v1/capacity", team, by="cluster").json()
        assert [r["cluster"] for r in by_cluster["items"]] == ["c-b"]
        assert by_cluster["fleet"]["total"] == 2.0  # the fleet as a number, no name
        for by in ("model", "cluster", "node"):
            text = get(service, "/api/v1/capacity", team, by=by).text
            assert "train-a" not in text and "c-a" not in text, by
        events = get(service, "/api/v1/events", team).json()["items"]
        assert events and {e["cluster"] for e in events} == {"c-b"}
        assert get(service, "/api/v1/events", team, cluster="c-a").status_code == 403
        assert get(service, "/api/v1/gpus/GPU-a/history", team).status_code == 404
        mine = get(service, "/api/v1/gpus/GPU-b/history", team)
        assert mine.status_code == 200 and "team-a" not in mine.text
        assert {a["pod"] for a in mine.json()["allocations"]} == {"idle-b"}
    finally:
        service.stop()
