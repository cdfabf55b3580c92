"""Signing in with a browser: the form at /login, server-side sessions, the cookie.

A browser sends no bearer token by itself, so the live page offers a form where a person
pastes a token (a static token, or an OIDC access or ID token). The token goes through the
very check the API uses (:meth:`Authenticator.identify`) and is then forgotten: what lives on
is a session, a random id (``secrets.token_urlsafe(32)``) mapped to the caller's scope and
name, ending when the token would (an OIDC token's ``exp``) or after the session TTL,
whichever is first. The cookie carries only that id: HttpOnly (no script reads it),
SameSite=Strict (no other site's page sends it), Path=/, Secure when the service speaks TLS.

Why server-side and not a signed cookie: signing out or removing a static token from the
tokens file ends the session at once, nothing about the caller travels to the browser, and
there is no signing key to manage. `serve` keeps them in the inventory database
(:class:`DbSessions`, under the sha256 of the id), so replicas share them and a restart
signs nobody out; :class:`Sessions` is the same in one process's memory.

A person (the OIDC subject, or the static token's name: not the raw token, since an OIDC
user can fetch fresh JWTs at will) holds at most ``MAX_PER_PERSON`` sessions, their own
oldest going first, and the service at most ``MAX_SESSIONS``. When that is full, the oldest
session of whoever holds the most makes room (the new person's own oldest if it is them):
one person, or a few, cannot keep everyone else out; only ``MAX_SESSIONS`` different people
signed in at once make a new sign-in wait (503). Failed sign-ins are limited per token
tried and in all, with backoff (:class:`SignInLimit`; :class:`DbSignInLimit` beside
:class:`DbSessions`, counted across every process), not per client address alone: behind
an ingress every browser shares one; and no limit ever refuses a valid token. Tokens
and session ids are never logged, never put in a URL, and never echoed in an answer.
Sign-in and sign-out are form posts checked for a same-origin request (``Sec-Fetch-Site`` and
``Origin``), so another site cannot sign a visitor in with its own token nor sign them out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from hub import inventory as inv
from hub.common import AccessSettings, html_environment
from hub.service._auth import Authenticator, Caller, Scope, Unauthorized

log = logging.getLogger("gpufleet.auth")

COOKIE = "gpufleet-session"
DEFAULT_TTL: float = AccessSettings().session_ttl  # serve's --session-ttl
MAX_SESSIONS = 10_000
#: sessions one person may hold at once (browsers, devices); their oldest goes first beyond
MAX_PER_PERSON = 20
MAX_PER_TOKEN = MAX_PER_PERSON  # the older name
#: failed sign-ins with one token (by its sha256) in SIGN_IN_WINDOW seconds
SIGN_IN_BURST = 5
SIGN_IN_WINDOW = 60.0
#: failed sign-ins in all in SIGN_IN_WINDOW seconds before every failure answers 429
SIGN_IN_GLOBAL_BURST = 30
#: the longest a lockout grows to (it doubles while failures go on)
SIGN_IN_MAX_BACKOFF = 3600.0
#: the key of the failures in all (never a token's: those start "sha256:")
ALL_KEYS = "*"
#: the largest sign-in form read: a JWT with many groups is a few KiB
MAX_FORM = 16 * 1024
MAX_TOKEN = 8192
FORM = "application/x-www-form-urlencoded"
#: the sign-in page: no script, nothing from another origin, posts only to itself
LOGIN_CSP = ("default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
             "base-uri 'none'; frame-ancestors 'none'")


@dataclass(frozen=True)
class Session:
    caller: Caller
    expires_at: float


def _key(session_id: str) -> str:
    """Sessions are stored under the id's sha256: a dump of the table names no usable id."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def owner_of(caller: Caller) -> str:
    """The sha256 sessions are counted under: the person, not the token they came with."""
    return _key(caller.person or f"name:{caller.name}")


class SessionsFull(Exception):
    """Every session slot is taken, each by a different person: a new sign-in waits for
    one to end rather than signing someone out who holds only one."""


class Sessions:
    """Session id -> caller, in memory (one process; tests, a single replica without a
    database of its own). At most ``per_person`` sessions per person (their oldest goes
    first) and ``limit`` in all (then their own oldest session goes, or else the oldest of
    whoever holds the most; a new person is refused only when everyone holds one)."""

    def __init__(self, *, ttl: float = DEFAULT_TTL, limit: int = MAX_SESSIONS,
                 per_person: int = MAX_PER_PERSON, clock: Callable[[], float] = time.time
                 ) -> None:
        if ttl <= 0 or limit < 1 or per_person < 1:
            raise ValueError("a session needs a positive TTL and room for one")
        self.ttl = ttl
        self.limit = limit
        self.per_person = per_person
        self.clock = clock
        self._items: OrderedDict[str, tuple[Session, str]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def create(self, caller: Caller, owner: str | None = None) -> tuple[str, Session] | None:
        """A new session for ``caller``, counted under ``owner`` (default: the person,
        :func:`owner_of`); None when its token expires at once; SessionsFull when every
        slot is taken by a different person."""
        made = _new_session(caller, self.ttl, self.clock())
        if made is None:
            return None
        session_id, session = made
        owner = owner or owner_of(caller)
        now = self.clock()
        with self._lock:
            for key in [k for k, (s, _) in self._items.items() if s.expires_at <= now]:
                del self._items[key]
            mine = [k for k, (_, o) in self._items.items() if o == owner]
            for key in mine[:max(0, len(mine) - self.per_person + 1)]:
                del self._items[key]
            if len(self._items) >= self.limit:
                held: dict[str, list[str]] = {}
                for key, (_, other) in self._items.items():  # oldest first
                    held.setdefault(other, []).append(key)
                heaviest = held.get(owner) or max(held.values(), key=len)
                if owner not in held and len(heaviest) < 2:
                    raise SessionsFull(f"{len(self._items)} people signed in")
                del self._items[heaviest[0]]
            self._items[_key(session_id)] = (session, owner)
        return session_id, session

    def get(self, session_id: str) -> Session | None:
        key = _key(session_id)
        with self._lock:
            found = self._items.get(key)
            if found is not None and found[0].expires_at <= self.clock():
                del self._items[key]
                found = None
        return found[0] if found is not None else None

    def drop(self, session_id: str) -> None:
        with self._lock:
            self._items.pop(_key(session_id), None)


class DbSessions:
    """Sessions in the inventory database (``hub.inventory.sessions``): every replica of the
    service reads the same ones and a restart signs nobody out. Same caps as
    :class:`Sessions`. ``engine`` must be able to write (the API's own engine cannot)."""

    def __init__(self, engine: Engine, *, ttl: float = DEFAULT_TTL,
                 limit: int = MAX_SESSIONS, per_person: int = MAX_PER_PERSON,
                 clock: Callable[[], float] = time.time) -> None:
        if ttl <= 0 or limit < 1 or per_person < 1:
            raise ValueError("a session needs a positive TTL and room for one")
        self.engine = engine
        self.ttl = ttl
        self.limit = limit
        self.per_person = per_person
        self.clock = clock

    def __len__(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(
                inv.sessions).where(inv.sessions.c.expires_at > self.clock())).scalar_one())

    def create(self, caller: Caller, owner: str | None = None) -> tuple[str, Session] | None:
        made = _new_session(caller, self.ttl, self.clock())
        if made is None:
            return None
        session_id, session = made
        scope = caller.scope
        row = {"id_sha256": _key(session_id), "owner_sha256": owner or owner_of(caller),
               "token_sha256": caller.token_sha256, "caller": caller.name[:253],
               "scope": json.dumps({
                   "name": scope.name, "fleet_counts": scope.fleet_counts,
                   "clusters": None if scope.clusters is None else sorted(scope.clusters),
                   "namespaces": None if scope.namespaces is None else sorted(
                       scope.namespaces)}),
               "token_expires_at": caller.expires_at, "created_at": self.clock(),
               "expires_at": session.expires_at}
        with self.engine.begin() as conn:
            added = inv.add_session(conn, row, now=self.clock(), per_owner=self.per_person,
                                    total=self.limit)
        if not added:
            raise SessionsFull(f"{self.limit} people signed in")
        return session_id, session

    def get(self, session_id: str) -> Session | None:
        with self.engine.connect() as conn:
            row = inv.session_row(conn, _key(session_id))
        if row is None:
            return None
        if row["expires_at"] <= self.clock():
            self.drop(session_id)
            return None
        data = json.loads(row["scope"])
        scope = Scope(data["name"], _names(data.get("clusters")),
                      _names(data.get("namespaces")), bool(data.get("fleet_counts", True)))
        caller = Caller(scope, row["caller"], row["token_expires_at"], row["token_sha256"])
        return Session(caller, row["expires_at"])

    def drop(self, session_id: str) -> None:
        with self.engine.begin() as conn:
            inv.drop_session(conn, _key(session_id))


def _names(value: Any) -> frozenset[str] | None:
    return None if value is None else frozenset(value)


def _new_session(caller: Caller, ttl: float, now: float) -> tuple[str, Session] | None:
    expires = now + ttl
    if caller.expires_at is not None:
        expires = min(expires, caller.expires_at)
    if expires <= now:
        return None
    return secrets.token_urlsafe(32), Session(caller, expires)


def guessed(token: str | None) -> str:
    """The key a sign-in attempt's failures count against: the sha256 of the whole token.

    Not a part of it, nor the subject an OIDC token claims: wrong tokens that share a
    person's first characters, or forged JWTs naming their subject, would lock that person
    out (5 of them did). The same wrong token tried again and again hits one key; a token
    is 32 random bytes (or a signed JWT), so a guess at another is a new key each time, and
    those are what the global limit counts."""
    return "sha256:" + hashlib.sha256((token or "").strip().encode()).hexdigest()[:32]


@dataclass
class _Strikes:
    failures: list[float]
    locked_until: float = 0.0
    lockouts: int = 0


def _strike(strikes: _Strikes, limit: int, now: float, window: float,
            max_backoff: float) -> None:
    """One more failure: ``limit`` of them within ``window`` lock for a window, doubling on
    each lockout that follows (at most ``max_backoff``) until a window passes clean."""
    strikes.failures = [t for t in strikes.failures if now - t < window] + [now]
    if len(strikes.failures) >= limit and strikes.locked_until <= now:
        clean = now - strikes.locked_until >= window and strikes.lockouts
        strikes.lockouts = 1 if clean else strikes.lockouts + 1
        strikes.locked_until = now + min(max_backoff, window * 2 ** (strikes.lockouts - 1))
        strikes.failures = []


class SignInLimit:
    """Failed sign-ins, counted by the token tried rather than where it comes from (behind
    an ingress or router every browser shares one address, and 10 mistakes of one person
    kept everyone out):

    * per token (:func:`guessed`): ``burst`` failures within ``window`` seconds lock that
      token for ``window``, doubling on each lockout that follows (at most ``max_backoff``)
      until a window passes clean: a script retrying a revoked token is not heard;
    * in all: ``global_burst`` failures within ``window`` (someone spraying guesses) make
      every *failed* sign-in answer 429 for the same time (:meth:`spraying`), with the same
      backoff. A valid token is still checked and signs in: a spray never locks out the
      people it cannot guess.

    A successful sign-in does not count. Keys beyond ``clients`` are forgotten, least
    recently seen first (bounded memory)."""

    def __init__(self, *, burst: int = SIGN_IN_BURST, window: float = SIGN_IN_WINDOW,
                 global_burst: int = SIGN_IN_GLOBAL_BURST,
                 max_backoff: float = SIGN_IN_MAX_BACKOFF,
                 clients: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.window = window
        self.global_burst = global_burst
        self.max_backoff = max_backoff
        self.clients = clients
        self.clock = clock
        self._keys: OrderedDict[str, _Strikes] = OrderedDict()
        self._all = _Strikes([])
        self._lock = threading.Lock()

    def _strike(self, strikes: _Strikes, limit: int, now: float) -> None:
        _strike(strikes, limit, now, self.window, self.max_backoff)

    def wait(self, key: str) -> float:
        """Seconds until a sign-in with the token of ``key`` is heard again (0: now)."""
        now = self.clock()
        with self._lock:
            strikes = self._keys.get(key)
            return max(0.0, strikes.locked_until - now if strikes is not None else 0.0)

    def spraying(self) -> float:
        """Seconds a failed sign-in still answers 429 for the failures in all (0: none)."""
        return max(0.0, self._all.locked_until - self.clock())

    def allow(self, key: str) -> bool:
        return self.wait(key) <= 0

    def failed(self, key: str) -> None:
        now = self.clock()
        with self._lock:
            strikes = self._keys.pop(key, None) or _Strikes([])
            self._keys[key] = strikes
            self._strike(strikes, self.burst, now)
            self._strike(self._all, self.global_burst, now)
            while len(self._keys) > self.clients:
                self._keys.popitem(last=False)

    def succeeded(self, key: str) -> None:
        with self._lock:
            self._keys.pop(key, None)


class DbSignInLimit:
    """:class:`SignInLimit`'s rules, counted in the inventory database (``sign_in_strikes``)
    rather than in one process's memory: every worker and replica of `serve` counts the same
    failures, so the documented 5 failures per token hold for the whole deployment (in
    memory, 2 replicas of 2 workers allowed 4 times as many). Wall time (``clock``), since
    the processes compare it; a key's strikes are read and written in one transaction, its
    row locked meanwhile (PostgreSQL), so two processes counting one token lose no failure.
    Keys not seen for a day past the longest lockout are removed as failures come in."""

    def __init__(self, engine: Engine, *, burst: int = SIGN_IN_BURST,
                 window: float = SIGN_IN_WINDOW, global_burst: int = SIGN_IN_GLOBAL_BURST,
                 max_backoff: float = SIGN_IN_MAX_BACKOFF,
                 clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.burst = burst
        self.window = window
        self.global_burst = global_burst
        self.max_backoff = max_backoff
        self.clock = clock

    def _locked_until(self, key: str) -> float:
        with self.engine.connect() as conn:
            row = inv.read_strikes(conn, key)
        return row[1] if row is not None else 0.0

    def wait(self, key: str) -> float:
        """Seconds until a sign-in with the token of ``key`` is heard again (0: now)."""
        return max(0.0, self._locked_until(key) - self.clock())

    def spraying(self) -> float:
        """Seconds a failed sign-in still answers 429 for the failures in all (0: none)."""
        return max(0.0, self._locked_until(ALL_KEYS) - self.clock())

    def allow(self, key: str) -> bool:
        return self.wait(key) <= 0

    def failed(self, key: str) -> None:
        try:
            self._count(key)
        except sa.exc.IntegrityError:  # another process added the key's first row first
            self._count(key)

    def _count(self, key: str) -> None:
        now = self.clock()
        with self.engine.begin() as conn:
            # the same order everywhere (the token, then all): no two transactions deadlock
            for name, limit in ((key, self.burst), (ALL_KEYS, self.global_burst)):
                row = inv.read_strikes(conn, name, for_update=True)
                strikes = _Strikes(*row) if row is not None else _Strikes([])
                _strike(strikes, limit, now, self.window, self.max_backoff)
                inv.write_strikes(conn, name, strikes.failures, strikes.locked_until,
                                  strikes.lockouts, now)
            inv.forget_strikes(conn, unseen_since=now - self.max_backoff - 86400.0)

    def succeeded(self, key: str) -> None:
        with self.engine.begin() as conn:
            inv.forget_strikes(conn, key)


def session_id(cookie_header: str | None) -> str | None:
    """The session id in a Cookie header (None: none, or a header we cannot read)."""
    if not cookie_header:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(cookie_header)
    except CookieError:
        return None
    morsel = jar.get(COOKIE)
    value = morsel.value if morsel is not None else ""
    return value if 0 < len(value) <= 128 else None


def same_origin(sec_fetch_site: str | None, origin: str | None, host: str | None) -> bool:
    """Whether a form post comes from one of our own pages. Browsers send Sec-Fetch-Site (and
    Origin) on a form post; a request with neither (curl, a script) is not a browser being
    steered by another site, so it passes. Origin is compared by host and port only: behind
    a proxy ending TLS the browser says https and we hear http."""
    if sec_fetch_site is not None:
        return sec_fetch_site.strip().lower() in ("same-origin", "none")
    if origin is None:
        return True
    if not host:
        return False
    return urlsplit(origin).netloc.lower() == host.strip().lower()


class Login:
    """The /login and /logout endpoints and the sessions they keep.

    ``on_refused`` is the API's failed-attempt counter: a bad token in the form counts like
    a bad bearer token.
    """

    def __init__(self, auth: Authenticator, sessions: Sessions | DbSessions, *,
                 secure: bool = False, on_refused: Callable[[str], None] = lambda reason: None,
                 limit: SignInLimit | DbSignInLimit | None = None) -> None:
        self.auth = auth
        self.sessions = sessions
        self.secure = secure
        self.on_refused = on_refused
        if limit is None:  # sessions in the database: failures counted there too
            limit = (DbSignInLimit(sessions.engine) if isinstance(sessions, DbSessions)
                     else SignInLimit())
        self.limit = limit

    # -- the session behind a request -------------------------------------------------------
    def caller(self, cookie_header: str | None) -> tuple[Caller, str]:
        """The caller of a request that brings a session cookie (and the session id), or
        Unauthorized: no cookie, an unknown or ended session, a static token since removed."""
        sid = session_id(cookie_header)
        if sid is None:
            raise Unauthorized("no bearer token or session")
        session = self.sessions.get(sid)
        if session is None:
            raise Unauthorized("unknown or expired session")
        scope = self.auth.still_valid(session.caller)
        if scope is None:
            self.sessions.drop(sid)
            raise Unauthorized(f"the token of {session.caller.name!r}'s session is gone")
        caller = session.caller
        if scope != caller.scope:  # the tokens file changed the scope: follow it
            caller = replace(caller, scope=scope)
        return caller, sid

    # -- the endpoints ----------------------------------------------------------------------
    def form(self, request: Request) -> Response:
        """GET /login: the form. It takes no parameter (a token never travels in a URL)."""
        if request.query_params:
            return self._form(400, "This page takes no parameters; paste the token into "
                                   "the form.")
        return self._form(200)

    def submit(self, body: bytes | None, headers: Mapping[str, str],
               client: str = "") -> Response:
        """POST /login: check the token, start a session, send the browser to the page.
        ``body`` is None when it was missing or too large (not read); ``client`` is the
        caller's address (the log names it; limits count the token tried, :func:`guessed`)."""
        key = guessed(_token_field(body, headers.get("content-type", "")))
        wait = self.limit.wait(key)
        if wait > 0:
            log.info("sign-in refused for %s: too many failed attempts with this token",
                     client)
            return self._too_many(wait)
        response = self._submit(body, headers)
        if response.status_code == 303:
            self.limit.succeeded(key)
            return response
        log.info("sign-in from %s failed", client)
        self.limit.failed(key)
        spraying = self.limit.spraying()
        return self._too_many(spraying) if spraying > 0 else response

    def _too_many(self, wait: float) -> Response:
        response = self._form(429, "Too many failed sign-in attempts: wait a little and try "
                                   "again.")
        response.headers["Retry-After"] = str(max(1, math.ceil(wait)))
        return response

    def _submit(self, body: bytes | None, headers: Mapping[str, str]) -> Response:
        if not _same_origin(headers):
            log.info("sign-in refused: a form post from another site")
            return self._form(403, "Sign-in failed: the form was sent from another site.")
        token = _token_field(body, headers.get("content-type", ""))
        if token is None:
            return self._form(400, "Sign-in failed: the form could not be read.")
        try:
            caller = self.auth.identify(token)
        except Unauthorized as exc:
            self.on_refused("unauthenticated")
            log.info("sign-in refused: %s", exc)
            return self._form(401, "Sign-in failed.")
        if caller.scope.empty:
            self.on_refused("forbidden")
            log.info("sign-in refused for %s: no scope", caller.name)
            return self._form(403, "Sign-in failed: your token maps to no part of the fleet "
                                   "(ask for your group to be added to the scopes file).")
        try:
            made = self.sessions.create(caller)
        except SessionsFull as exc:
            log.warning("sign-in refused for %s: no room for a session (%s)", caller.name,
                        exc)
            return self._form(503, "Sign-in failed: the service holds as many sessions as "
                                   "it may; try again later.")
        if made is None:
            self.on_refused("unauthenticated")
            log.info("sign-in refused for %s: the token expires now", caller.name)
            return self._form(401, "Sign-in failed.")
        old = session_id(headers.get("cookie"))
        if old is not None:  # a fresh id on every sign-in: no session fixation
            self.sessions.drop(old)
        new_id, session = made
        log.info("signed in: %s", caller.name)
        max_age = max(1, int(session.expires_at - self.sessions.clock()))
        return redirect("/", self.cookie(new_id, max_age))

    def logout(self, headers: Mapping[str, str]) -> Response:
        """POST /logout: forget the session (if any) and the cookie; back to the form."""
        if not _same_origin(headers):
            return self._form(403, "Sign-out refused: the form was sent from another site.")
        sid = session_id(headers.get("cookie"))
        if sid is not None:
            self.sessions.drop(sid)
        return redirect("/login", self.cookie("", 0))

    # -- helpers ------------------------------------------------------------------------------
    def cookie(self, value: str, max_age: int) -> str:
        secure = "; Secure" if self.secure else ""
        return (f"{COOKIE}={value}; Max-Age={max_age}; Path=/; HttpOnly; "
                f"SameSite=Strict{secure}")

    def _form(self, status: int, message: str | None = None) -> Response:
        html = html_environment().get_template("login.html.j2").render(message=message)
        return HTMLResponse(html, status, headers={"Content-Security-Policy": LOGIN_CSP,
                                                   "Cache-Control": "no-store"})


def _same_origin(headers: Mapping[str, str]) -> bool:
    return same_origin(headers.get("sec-fetch-site"), headers.get("origin"),
                       headers.get("host"))


def _token_field(body: bytes | None, content_type: str) -> str | None:
    """The one ``token`` field of a urlencoded form, or None for anything else."""
    if body is None or content_type.split(";")[0].strip().lower() != FORM:
        return None
    try:
        fields = parse_qs(body.decode("ascii"), keep_blank_values=True,
                          strict_parsing=bool(body), max_num_fields=5,
                          errors="strict")
    except (UnicodeDecodeError, ValueError):
        return None
    values = fields.get("token")
    if set(fields) != {"token"} or values is None or len(values) != 1:
        return None
    token = values[0]
    if len(token) > MAX_TOKEN or any(not ch.isprintable() for ch in token):
        return None
    return token


def redirect(location: str, cookie: str | None = None) -> Response:
    headers = {"Location": location, "Cache-Control": "no-store"}
    if cookie is not None:
        headers["Set-Cookie"] = cookie
    return Response(b"", 303, headers=headers, media_type="text/html")


def wants_html(accept: str | None) -> bool:
    """A browser navigating (Accept names text/html), not an API client (JSON or */*)."""
    return accept is not None and "text/html" in accept.lower()
