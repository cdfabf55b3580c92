"""Signing in with a browser (/login): the form, server-side sessions, the cookie.

Against the real service over a real inventory (a hub Prometheus fed by agents with the real
exporter samples, one sync), behind a tokens file made with `gpufleet serve token create`.
Headless Chromium, driven over the DevTools protocol, signs in through the form as a person
does and reads the page it lands on; plain HTTP checks what a browser hides (cookie flags,
expiry, eviction, replay after sign-out, the log).
"""

# ruff: noqa: F811  (the served inventory's fixtures are imported and requested by name)
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
import requests
import yaml

from hub.service import Authenticator, OidcVerifier, Sessions, TlsFiles, TokenFile, token_entry
from hub.service import _session as session
from hub.service._auth import Caller, Scope
from hub.service._deps import MAX_LIMIT
from tests.support.browser import Browser, Dom
from tests.test_api import hub_store  # noqa: F401  (module fixture: the real hub store)
from tests.test_api_access import (  # noqa: F401  (fixtures: the served inventory)
    AUDIENCE,
    TEAM_NS,
    Issuer,
    db_url,
    get,
    issuer,
    layout,
    make_cert,
    serve,
    tokens,
)
from tests.test_service_page import _cells, _count


@pytest.fixture(scope="module")
def service(db_url: str, tokens: tuple[Path, dict[str, str]]) -> Iterator[Any]:
    from hub.service import SignInLimit

    started = serve(db_url, Authenticator(tokens=TokenFile(tokens[0])), metrics_open=False)
    # every test of the module signs in from 127.0.0.1, many on purpose with bad forms
    started.app.state.gate.login.limit = SignInLimit(burst=10_000, global_burst=10_000)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    browser = Browser()
    yield browser
    browser.close()


@pytest.fixture()
def browser(chromium: Browser) -> Browser:
    chromium.clear_cookies()  # every test starts signed out
    return chromium


@pytest.fixture(scope="module")
def foreign(service: Any, tokens: tuple[Path, dict[str, str]]) -> dict[str, str]:
    """Another team's namespace and one of its pods (what the team must never see)."""
    items = get(service, "/api/v1/allocations", tokens[1]["admin"],
                limit=MAX_LIMIT).json()["items"]
    other = next(a for a in items if a["namespace"] != TEAM_NS and a["pod"])
    return {"namespace": other["namespace"], "pod": other["pod"]}


def path_of(url: str) -> str:
    return urlsplit(url).path


def sign_in(browser: Browser, service: Any, token: str) -> Dom:
    browser.open(service.url + "/")
    assert path_of(browser.location) == "/login"  # signed out: to the form
    browser.submit("login", token=token)
    return browser.dom()


def api_all(service: Any, path: str, token: str, **params: Any) -> list[dict[str, Any]]:
    r = get(service, path, token, limit=MAX_LIMIT, **params)
    assert r.status_code == 200, r.text
    assert r.json()["continue"] is None
    return r.json()["items"]


def assert_matches_api(dom: Dom, service: Any, token: str) -> set[str]:
    """The page's clusters, stale GPUs and findings are the API's for the same token."""
    clusters = {c["cluster"]: c for c in api_all(service, "/api/v1/clusters", token)}
    shown = {r["cluster"]: r for r in _cells(dom, "clusters")}
    assert set(shown) == set(clusters)
    for name, c in clusters.items():
        assert (shown[name]["state"], int(shown[name]["nodes"]), int(shown[name]["gpus"])) == (
            c["state"], c["nodes"], c["gpus"])
    stale = api_all(service, "/api/v1/gpus", token, state="stale")
    # stale GPUs one line per cluster, with how many
    assert sum(int(r["stale_gpus"]) for r in _cells(dom, "stale-clusters")) == len(stale)
    assert _count(dom, "stale-clusters") == len({g["cluster"] for g in stale})
    assert _count(dom, "findings") == len(api_all(service, "/api/v1/findings", token))
    return set(clusters)


# -- in Chromium -------------------------------------------------------------------------------
def test_a_scoped_token_signed_in_through_the_form_sees_only_its_part(
        service, tokens, layout, foreign, browser):
    team = tokens[1]["team"]
    dom = sign_in(browser, service, team)
    assert path_of(browser.location) == "/"
    assert [e["text"] for e in dom.find("strong", id="signed-in-name")] == ["team"]
    assert dom.find("button", id="logout")
    assert browser.evaluate("document.cookie") == ""  # HttpOnly: no script reads it
    [cookie] = browser.cookies()
    assert cookie["name"] == session.COOKIE and cookie["httpOnly"]
    assert cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    assert team not in cookie["value"]  # the browser keeps a session id, never the token

    assert assert_matches_api(dom, service, team) == {layout["cluster"]}
    html = browser.evaluate("document.documentElement.outerHTML")
    for pod in layout["foreign_pods"]:
        assert pod not in html, pod
    cells = {e["text"].strip() for e in dom.elements if e["tag"] in ("td", "a")}
    links = " ".join(e["attrs"].get("href", "") for e in dom.find("a"))
    for name in layout["others"] | {foreign["namespace"]}:  # short names: whole cells
        assert name not in cells and f"={name}" not in links, name
    # its own pods by name, the other team's on its GPUs only as "other", like the API
    browser.open(f"{service.url}/?q={quote(TEAM_NS)}")
    mine = _cells(browser.dom(), "search-allocations")
    api_mine = api_all(service, "/api/v1/allocations", team, namespace=TEAM_NS)
    assert mine and sorted(r["pod"] for r in mine) == sorted(a["pod"] for a in api_mine)
    browser.open(f"{service.url}/?q={quote(foreign['namespace'])}")
    searched = browser.dom()
    assert {r["namespace"] for r in _cells(searched, "search-allocations")} <= {"other"}
    assert foreign["pod"] not in browser.evaluate("document.documentElement.outerHTML")


def test_a_whole_fleet_token_signed_in_sees_everything(service, tokens, layout, foreign,
                                                       browser):
    admin = tokens[1]["admin"]
    dom = sign_in(browser, service, admin)
    assert [e["text"] for e in dom.find("strong", id="signed-in-name")] == ["admin"]
    shown = assert_matches_api(dom, service, admin)
    assert shown == {layout["cluster"]} | layout["others"]
    browser.open(f"{service.url}/?q={quote(foreign['namespace'])}")
    pods = {r["pod"] for r in _cells(browser.dom(), "search-allocations")}
    assert foreign["pod"] in pods


def test_a_wrong_token_stays_on_the_form_saying_sign_in_failed(service, browser):
    dom = sign_in(browser, service, "gpf_not-a-token-of-ours")
    assert path_of(browser.location) == "/login"
    assert [e["text"].strip() for e in dom.find("p", id="login-failed")] == ["Sign-in failed."]
    assert "gpf_not-a-token-of-ours" not in browser.evaluate(
        "document.documentElement.outerHTML")
    assert browser.cookies() == []
    browser.open(service.url + "/")
    assert path_of(browser.location) == "/login"


def test_after_signing_out_the_page_sends_the_browser_to_the_form(service, tokens, browser):
    sign_in(browser, service, tokens[1]["team"])
    assert path_of(browser.location) == "/"
    browser.submit("signed-in")  # the page's "Sign out" button
    assert path_of(browser.location) == "/login"
    assert browser.cookies() == []
    browser.open(service.url + "/")
    assert path_of(browser.location) == "/login"


# -- over HTTP -------------------------------------------------------------------------------------
def post_login(service: Any, token: str, **kwargs: Any) -> requests.Response:
    return requests.post(service.url + "/login", data={"token": token}, timeout=10,
                         allow_redirects=False, **kwargs)


def set_cookie(response: requests.Response) -> Any:
    jar: SimpleCookie = SimpleCookie()
    jar.load(response.headers["Set-Cookie"])
    return jar[session.COOKIE]


def with_cookie(service: Any, path: str, value: str, **headers: str) -> requests.Response:
    return requests.get(service.url + path, timeout=10, allow_redirects=False,
                        headers={"Cookie": f"{session.COOKIE}={value}", **headers})


def test_the_cookie_is_httponly_strict_and_opens_the_page_and_the_api_scoped(service, tokens,
                                                                            layout):
    r = post_login(service, tokens[1]["team"])
    assert r.status_code == 303 and r.headers["Location"] == "/"
    header = r.headers["Set-Cookie"]
    assert "HttpOnly" in header and "SameSite=Strict" in header and "Secure" not in header
    cookie = set_cookie(r)
    assert cookie["path"] == "/"
    assert 8 * 3600 - 60 < int(cookie["max-age"]) <= 8 * 3600
    sid = cookie.value
    page = with_cookie(service, "/", sid, Accept="text/html")
    assert page.status_code == 200 and 'id="signed-in-name">team<' in page.text
    assert 'id="logout"' in page.text
    proxied = get(service, "/", tokens[1]["team"])  # a bearer header: nothing to sign out of
    assert 'id="signed-in-name">team<' in proxied.text and 'id="logout"' not in proxied.text
    clusters = with_cookie(service, "/api/v1/clusters", sid)
    assert [c["cluster"] for c in clusters.json()["items"]] == [layout["cluster"]]
    assert with_cookie(service, "/metrics", sid).status_code == 403  # the same scope rules
    # a bearer token wins over the cookie; a bad one is not rescued by it
    r = requests.get(service.url + "/api/v1/clusters", timeout=10,
                     headers={"Cookie": f"{session.COOKIE}={sid}",
                              "Authorization": "Bearer gpf_wrong"})
    assert r.status_code == 401
    # without anything: a browser goes to the form, an API client gets its 401 JSON
    assert requests.get(service.url + "/", headers={"Accept": "text/html"}, timeout=10,
                        allow_redirects=False).headers["Location"] == "/login"
    for path, accept in (("/", "application/json"), ("/", "*/*"),
                         ("/api/v1/clusters", "text/html")):
        r = requests.get(service.url + path, headers={"Accept": accept}, timeout=10,
                         allow_redirects=False)
        assert r.status_code == 401 and r.headers["Content-Type"] == "application/json"
    assert requests.get(service.url + "/healthz", timeout=10).status_code in (200, 503)


def test_over_tls_the_cookie_is_secure(db_url, tokens, tmp_path):
    ca = make_cert(tmp_path, "login")
    service = serve(db_url, Authenticator(tokens=TokenFile(tokens[0])),
                    tls=TlsFiles(tmp_path / "tls.crt", tmp_path / "tls.key"))
    try:
        r = post_login(service, tokens[1]["admin"], verify=str(ca))
        assert r.status_code == 303 and "; Secure" in r.headers["Set-Cookie"]
    finally:
        service.stop()


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def test_a_session_ends_after_its_ttl_or_when_its_token_expires(db_url, tokens, issuer,
                                                                 layout, tmp_path):
    clock = Clock()
    scopes = tmp_path / "scopes.yaml"
    scopes.write_text(yaml.safe_dump({"scopes": [{"group": "team", "clusters": [
        layout["cluster"]], "namespaces": [TEAM_NS]}]}))
    auth = Authenticator(tokens=TokenFile(tokens[0]),
                         oidc=OidcVerifier(issuer.url, AUDIENCE, _scopes(scopes)))
    service = serve(db_url, auth, sessions=Sessions(ttl=600, clock=clock))
    try:
        static = set_cookie(post_login(service, tokens[1]["team"]))
        assert int(static["max-age"]) == 600
        jwt_expiring = issuer.token("ec-1", ["team"], expires_in=120)
        oidc = set_cookie(post_login(service, jwt_expiring))
        assert 60 < int(oidc["max-age"]) <= 120  # the token's expiry, not the TTL
        assert with_cookie(service, "/api/v1/clusters", oidc.value).status_code == 200
        clock.now += 121
        assert with_cookie(service, "/api/v1/clusters", oidc.value).status_code == 401
        assert with_cookie(service, "/api/v1/clusters", static.value).status_code == 200
        clock.now += 600
        assert with_cookie(service, "/api/v1/clusters", static.value).status_code == 401
        r = with_cookie(service, "/", static.value, Accept="text/html")
        assert r.status_code == 303 and r.headers["Location"] == "/login"
        # an OIDC caller in no mapped group signs in to nothing: refused, no session
        r = post_login(service, issuer.token("rsa-1", ["nobody"]))
        assert r.status_code == 403 and "Set-Cookie" not in r.headers
    finally:
        service.stop()


def _scopes(path: Path) -> Any:
    from hub.service import load_group_scopes

    return load_group_scopes(path)


def test_sessions_are_capped_per_person_and_a_full_store_makes_room_from_the_heaviest(
        db_url, tokens):
    """Many sign-ins of one person replace their own oldest sessions; a full store makes
    room with the oldest session of the person signing in, or of whoever holds the most,
    so nobody is refused while someone holds two."""
    sessions = Sessions(limit=3, per_person=2)
    service = serve(db_url, Authenticator(tokens=TokenFile(tokens[0])), sessions=sessions)
    try:
        admin = [set_cookie(post_login(service, tokens[1]["admin"])).value for _ in range(3)]
        assert len(set(admin)) == 3 and len(sessions) == 2
        assert [with_cookie(service, "/api/v1/clusters", sid).status_code
                for sid in admin] == [401, 200, 200]
        team = set_cookie(post_login(service, tokens[1]["team"])).value
        assert len(sessions) == 3  # full
        more = [set_cookie(post_login(service, tokens[1]["team"])).value for _ in range(2)]
        # full: each further team sign-in replaced team's own oldest; admin kept theirs
        assert len(sessions) == 3
        assert [with_cookie(service, "/api/v1/clusters", sid).status_code
                for sid in [*admin[1:], team, *more]] == [200, 200, 401, 401, 200]
        sessions.limit = 2  # and someone new, in a store full of admin's two and team's one:
        assert sessions.create(Caller(Scope("x"), "x", person="token:x")) is not None
        assert [with_cookie(service, "/api/v1/clusters", sid).status_code
                for sid in [*admin[1:], more[-1]]] == [401, 200, 200]  # the heaviest's oldest
    finally:
        service.stop()


@pytest.mark.parametrize("store", ["memory", "sqlite", "postgresql"])
def test_a_full_store_of_different_people_refuses_the_next_one(db_url, store, request):
    from hub.inventory import _db, ensure_schema
    from hub.service import DbSessions

    url = request.getfixturevalue("pg_url") if store == "postgresql" else db_url
    writer = _db.make_engine(url)
    try:
        ensure_schema(writer)
        sessions: Any = (Sessions(per_person=2) if store == "memory"
                         else DbSessions(writer, per_person=2))
        sessions.limit = len(sessions) + 2  # the module's database holds other sessions
        made = {p: sessions.create(Caller(Scope(p), p, person=f"token:{p}"))
                for p in ("a", "b")}
        with pytest.raises(session.SessionsFull):
            sessions.create(Caller(Scope("c"), "c", person="token:c"))
        again = sessions.create(Caller(Scope("a"), "a", person="token:a"))  # a's own goes
        assert sessions.get(made["a"][0]) is None and sessions.get(again[0]) is not None
        assert sessions.get(made["b"][0]) is not None and len(sessions) == sessions.limit
    finally:
        writer.dispose()


def test_fresh_jwts_of_one_subject_are_one_person_and_cannot_fill_the_store(db_url, tokens,
                                                                            issuer, tmp_path):
    """The probe: 500 fresh JWTs of one OIDC subject filled all 10,000 sessions in a minute
    and every other sign-in got 503. Now they are one person's 20 sessions."""
    from hub.service import SignInLimit

    scopes = tmp_path / "scopes.yaml"
    scopes.write_text(yaml.safe_dump({"scopes": [{"group": "team", "clusters": "*"}]}))
    auth = Authenticator(tokens=TokenFile(tokens[0]),
                         oidc=OidcVerifier(issuer.url, AUDIENCE, _scopes(scopes)))
    sessions = Sessions(limit=100)
    service = serve(db_url, auth, sessions=sessions)
    service.app.state.gate.login.limit = SignInLimit(burst=10_000, global_burst=10_000)
    try:
        with requests.Session() as http:
            for _ in range(500):
                r = http.post(service.url + "/login", timeout=10, allow_redirects=False,
                              data={"token": issuer.token("ec-1", ["team"],
                                                          subject="mallory")})
                assert r.status_code == 303
                http.cookies.clear()  # a fresh browser each time, as the probe
        assert len(sessions) == session.MAX_PER_PERSON
        other = post_login(service, issuer.token("ec-1", ["team"], subject="alice"))
        assert other.status_code == 303
        assert with_cookie(service, "/api/v1/clusters", set_cookie(other).value
                           ).status_code == 200
        assert post_login(service, tokens[1]["team"]).status_code == 303
    finally:
        service.stop()


def test_sessions_in_the_database_are_shared_by_replicas_and_survive_a_restart(db_url,
                                                                                tokens):
    """Two services on one inventory (replicas): a session made on one opens the other,
    a sign-out on either ends it, and a new service after a restart still knows it. The
    table holds only the sha256 of each id."""
    import sqlalchemy as sa

    from hub.inventory import _db
    from hub.inventory import sessions as table
    from hub.service import DbSessions

    writer = _db.make_engine(db_url)
    auth = Authenticator(tokens=TokenFile(tokens[0]))
    one = serve(db_url, auth, sessions=DbSessions(writer))
    two = serve(db_url, auth, sessions=DbSessions(writer))
    try:
        sid = set_cookie(post_login(one, tokens[1]["team"])).value
        assert with_cookie(two, "/api/v1/clusters", sid).status_code == 200
        with writer.connect() as conn:
            stored = conn.execute(sa.select(table)).mappings().all()
        assert sid not in repr(stored) and tokens[1]["team"] not in repr(stored)
        assert any(row["id_sha256"] == session._key(sid) for row in stored)
        one.stop()
        one = serve(db_url, auth, sessions=DbSessions(writer))  # restarted
        assert with_cookie(one, "/", sid).status_code == 200
        requests.post(two.url + "/logout", timeout=10, allow_redirects=False,
                      headers={"Cookie": f"{session.COOKIE}={sid}"})
        assert with_cookie(one, "/api/v1/clusters", sid).status_code == 401
    finally:
        one.stop()
        two.stop()
        writer.dispose()


def test_database_sessions_are_capped_per_person_and_in_all(db_url, tokens):
    from hub.inventory import _db
    from hub.service import DbSessions

    writer = _db.make_engine(db_url)
    store = DbSessions(writer, per_person=3)
    store.limit = len(store) + 4  # the module's database holds other tests' sessions
    try:
        admin = Caller(Scope("admin"), "admin", person="token:admin-db")
        made = [store.create(admin) for _ in range(4)]
        assert store.get(made[0][0]) is None and store.get(made[1][0]) is not None
        team = Caller(Scope("team"), "team", person="token:team-db")
        first_team = store.create(team)  # now full
        second_team = store.create(team)  # full: team's own oldest makes room
        assert store.get(first_team[0]) is None and store.get(second_team[0]) is not None
        store.create(Caller(Scope("x"), "x", person="token:x-db"))  # new: the heaviest's
        assert store.get(made[1][0]) is None and store.get(made[2][0]) is not None
        assert store.get(second_team[0]) is not None
    finally:
        writer.dispose()


def _guess() -> str:
    import secrets

    return "gpf_" + secrets.token_urlsafe(32)  # a fresh prefix each time


def test_ten_wrong_tokens_from_one_address_keep_nobody_else_out(db_url, tokens):
    """The probe: behind an ingress every browser shares one address, and 10 wrong tokens
    a minute from it kept everyone out of /login (a valid administrator got 429)."""
    service = serve(db_url, Authenticator(tokens=TokenFile(tokens[0])))
    try:
        assert [post_login(service, _guess()).status_code for _ in range(10)] == [401] * 10
        assert post_login(service, tokens[1]["admin"]).status_code == 303
        assert post_login(service, tokens[1]["team"]).status_code == 303
    finally:
        service.stop()


def test_one_wrong_token_tried_again_and_again_locks_only_it_and_the_lock_grows(db_url,
                                                                               tokens):
    """Five failures with one token lock that token a minute, then twice as long while it
    goes on. Wrong tokens sharing a person's first characters lock nobody out (5 of them
    did: the limit was keyed by the first 8 characters)."""
    service = serve(db_url, Authenticator(tokens=TokenFile(tokens[0])))
    team = tokens[1]["team"]
    try:
        near = [team[:8] + _guess()[4:] for _ in range(5)]
        assert [post_login(service, t).status_code for t in near] == [401] * 5
        assert post_login(service, team).status_code == 303
        wrong = _guess()
        assert [post_login(service, wrong).status_code for _ in range(5)] == [401] * 5
        blocked = post_login(service, wrong)
        assert blocked.status_code == 429 and "Set-Cookie" not in blocked.headers
        assert 55 <= int(blocked.headers["Retry-After"]) <= 60
        assert post_login(service, team).status_code == 303
        assert post_login(service, tokens[1]["admin"]).status_code == 303
    finally:
        service.stop()
    assert session.guessed(team) != session.guessed(team[:-1] + "x")
    clock = Clock()
    limit = session.SignInLimit(burst=5, window=60, max_backoff=600, clock=clock)
    key = session.guessed("gpf_abcd")
    waits = []
    for _ in range(5):  # lockouts in a row: 60, 120, 240, 480, then the cap
        for _ in range(5):
            limit.failed(key)
        waits.append(limit.wait(key))
        clock.now += waits[-1]
    assert waits == [60, 120, 240, 480, 600] and limit.allow(session.guessed("gpf_other"))
    clock.now += 60  # a clean window: back to a minute
    for _ in range(5):
        limit.failed(key)
    assert limit.wait(key) == 60


def test_sprayed_guesses_are_answered_429_and_lock_no_valid_token_out(db_url, tokens):
    """A spray of failures makes every failure a 429, but a valid token still signs in,
    whether or not it signed in before (it locked out everyone who had not)."""
    from hub.service import SignInLimit

    service = serve(db_url, Authenticator(tokens=TokenFile(tokens[0])))
    service.app.state.gate.login.limit = SignInLimit(global_burst=10, window=3600)
    try:
        assert post_login(service, tokens[1]["admin"]).status_code == 303
        assert [post_login(service, _guess()).status_code for _ in range(10)] \
            == [401] * 9 + [429]
        refused = post_login(service, _guess())
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 3000
        assert post_login(service, tokens[1]["team"]).status_code == 303  # never signed in
        assert post_login(service, tokens[1]["admin"]).status_code == 303
    finally:
        service.stop()


def test_forwarded_for_is_believed_only_from_forwarded_allow_ips(db_url, tokens, caplog):
    """The probe: from loopback, X-Forwarded-For picked the address the limit counted (50
    guesses, no 429). Now the header is ignored unless the peer is a listed proxy, and
    the limit counts the tokens tried whatever the address says."""
    caplog.set_level(logging.INFO, logger="gpufleet.auth")
    auth = Authenticator(tokens=TokenFile(tokens[0]))
    service = serve(db_url, auth)
    try:
        answers = [post_login(service, _guess(),
                              headers={"X-Forwarded-For": f"198.51.100.{i}"}).status_code
                   for i in range(50)]
        assert answers == [401] * 29 + [429] * 21
        assert "198.51.100." not in caplog.text and "sign-in from 127.0.0.1 failed" in caplog.text
    finally:
        service.stop()
    caplog.clear()
    proxied = serve(db_url, auth, forwarded_allow_ips=["127.0.0.1"])
    try:
        post_login(proxied, _guess(), headers={"X-Forwarded-For": "203.0.113.7"})
        assert "sign-in from 203.0.113.7 failed" in caplog.text
    finally:
        proxied.stop()


def test_serve_checks_forwarded_allow_ips():
    from click.testing import CliRunner

    from hub.cli import cli

    result = CliRunner().invoke(cli, ["serve", "--hub-url", "http://127.0.0.1:1",
                                      "--forwarded-allow-ips", "10.0.0.0/8,ingress"])
    assert result.exit_code == 2
    assert "--forwarded-allow-ips: 'ingress' is not an IP address or network" in result.output


def test_a_session_cookie_is_dead_after_sign_out_or_when_its_token_is_removed(db_url,
                                                                              tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"tokens": [token_entry("a", "gpf_token-a"),
                                               token_entry("b", "gpf_token-b")]}))
    service = serve(db_url, Authenticator(tokens=TokenFile(path)))
    try:
        a = set_cookie(post_login(service, "gpf_token-a")).value
        out = requests.post(service.url + "/logout", timeout=10, allow_redirects=False,
                            headers={"Cookie": f"{session.COOKIE}={a}"})
        assert out.status_code == 303 and out.headers["Location"] == "/login"
        assert set_cookie(out).value == "" and set_cookie(out)["max-age"] == "0"
        assert with_cookie(service, "/api/v1/clusters", a).status_code == 401  # replayed
        b = set_cookie(post_login(service, "gpf_token-b")).value
        assert with_cookie(service, "/api/v1/clusters", b).status_code == 200
        path.write_text(yaml.safe_dump({"tokens": [token_entry("a", "gpf_token-a")]}))
        assert with_cookie(service, "/api/v1/clusters", b).status_code == 401  # revoked
    finally:
        service.stop()


def refused_count(service: Any, admin: str) -> float:
    """gpufleet_api_refused_requests_total{reason="unauthenticated"} as /metrics says now."""
    text = get(service, "/metrics", admin).text
    line = next(x for x in text.splitlines() if x.startswith(
        'gpufleet_api_refused_requests_total{reason="unauthenticated"}'))
    return float(line.split()[-1])


def test_failed_sign_ins_are_counted_and_no_token_or_session_id_reaches_the_log(
        service, tokens, caplog):
    caplog.set_level(logging.DEBUG)
    admin = tokens[1]["admin"]

    def refused() -> float:
        return refused_count(service, admin)

    before = refused()
    bad = post_login(service, "gpf_wrong-sign-in-token")
    assert bad.status_code == 401 and "Set-Cookie" not in bad.headers
    assert "Sign-in failed." in bad.text and "gpf_wrong-sign-in-token" not in bad.text
    assert refused() == before + 1
    sid = set_cookie(post_login(service, tokens[1]["team"])).value
    with_cookie(service, "/", sid, Accept="text/html")
    requests.post(service.url + "/logout", headers={"Cookie": f"{session.COOKIE}={sid}"},
                  timeout=10, allow_redirects=False)
    assert "signed in: team" in caplog.text  # the name is logged, nothing secret
    for secret in ("gpf_wrong-sign-in-token", tokens[1]["team"], admin, sid):
        assert secret not in caplog.text


def test_a_browsers_first_visit_is_sent_to_sign_in_not_counted_as_refused(service, tokens,
                                                                        caplog):
    caplog.set_level(logging.INFO)
    admin = tokens[1]["admin"]

    def refused() -> float:
        return refused_count(service, admin)

    before = refused()
    first = requests.get(service.url + "/", timeout=10, allow_redirects=False,
                         headers={"Accept": "text/html,application/xhtml+xml"})
    assert first.status_code == 303 and first.headers["Location"] == "/login"
    assert refused() == before and "refused /" not in caplog.text
    # a script without a token is still refused, and counted
    script = requests.get(service.url + "/api/v1/gpus", timeout=10)
    assert script.status_code == 401 and refused() == before + 1


def test_sign_in_refuses_other_sites_urls_and_unreadable_forms(service, tokens):
    team = tokens[1]["team"]
    for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "same-site"}):
        r = post_login(service, team, headers=headers)
        assert r.status_code == 403 and "Set-Cookie" not in r.headers, headers
    host = urlsplit(service.url).netloc
    assert post_login(service, team, headers={"Origin": f"http://{host}"}).status_code == 303
    # a token in a URL is refused and not echoed
    r = requests.get(service.url + "/login", params={"token": team}, timeout=10)
    assert r.status_code == 400 and team not in r.text
    for data, content_type in ((f'{{"token": "{team}"}}', "application/json"),
                               (f"token={team}&token={team}", session.FORM),
                               (f"token={team}&next=/x", session.FORM),
                               ("token=" + "a" * (session.MAX_FORM + 1), session.FORM)):
        r = requests.post(service.url + "/login", data=data, timeout=10,
                          headers={"Content-Type": content_type}, allow_redirects=False)
        assert r.status_code == 400 and "Set-Cookie" not in r.headers, data[:40]
    # sign-out is a form post only, and the rest of the API still refuses POST
    assert requests.get(service.url + "/logout", timeout=10).headers["Allow"] == "POST"
    r = requests.post(service.url + "/api/v1/gpus", timeout=10)
    assert r.status_code == 405 and r.headers["Allow"] == "GET, HEAD"


def test_sessions_store_keeps_no_usable_id_and_expires_with_the_token():
    clock = Clock()
    store = Sessions(ttl=100, limit=5, clock=clock)
    caller = Caller(Scope("t"), "t", expires_at=clock.now + 30)
    sid, made = store.create(caller)
    assert made.expires_at == clock.now + 30
    assert sid not in repr(store._items)  # stored under its sha256
    assert store.create(Caller(Scope("t"), "t", expires_at=clock.now)) is None
    clock.now += 31
    assert store.get(sid) is None and len(store) == 0
    assert session.session_id(f"{session.COOKIE}=x" + "y" * 200) is None
    assert session.session_id('broken="') is None
