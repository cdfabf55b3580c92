"""Who may read the API, and which part of the fleet: static tokens, OIDC bearer tokens, scopes.

A caller's token becomes a :class:`Caller` with its :class:`Scope` (the clusters and
namespaces it may see), or is refused.
Two ways in, both optional and combinable:

* a tokens file (YAML) holding the sha256 of each token, never the token, with its scope;
  ``gpufleet serve token create`` makes a token and prints the line to add;
* OIDC bearer tokens (Keycloak, Dex, OpenShift as an OIDC issuer): the JWT's signature is
  checked against the issuer's JWKS (cached, fetched again when a token names an unknown key
  id, at most every ``MIN_REFRESH`` seconds so random key ids cannot make us hammer the
  issuer), then expiry, issuer and audience, with PyJWT. A group in ``--oidc-scope-claim``
  maps to a scope through the scopes file.

Every refusal is the same :class:`Unauthorized` without a hint whether a token exists, and no
token is ever logged: only the token's name (static) or subject (OIDC) is.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import requests

from hub.common import InputError, brief_repr, load_yaml

log = logging.getLogger("gpufleet.auth")

#: Asymmetric algorithms only: an HMAC "signature" made with the public key is a classic forgery.
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
              "EdDSA"]
MIN_REFRESH = 10.0
LEEWAY = 30
OTHER = "other"
TOKEN_PREFIX = "gpf_"


class Unauthorized(Exception):
    """No usable credentials. The message is for the log (never the token), not the caller."""


@dataclass(frozen=True)
class Scope:
    """The part of the fleet a caller sees. ``None`` means every cluster / namespace.

    ``fleet_counts``: whether the fleet-wide numbers stay visible (sync runs, and the
    capacity totals beside the caller's own rows; counts without names). Handlers narrow
    their reads by the scope, and every answer then passes the confine step
    (hub/service/_confine.py), which drops or masks whatever the scope does not cover.
    """

    name: str
    clusters: frozenset[str] | None = None
    namespaces: frozenset[str] | None = None
    fleet_counts: bool = True

    @property
    def unrestricted(self) -> bool:
        return self.clusters is None and self.namespaces is None

    @property
    def empty(self) -> bool:
        """Sees nothing: an OIDC caller none of whose groups the scopes file maps."""
        return self.clusters == frozenset() and not self.fleet_counts

    def allows_cluster(self, cluster: str | None) -> bool:
        return self.clusters is None or (cluster is not None and cluster in self.clusters)

    def allows_namespace(self, namespace: str | None) -> bool:
        return self.namespaces is None or (namespace is not None and namespace in self.namespaces)

    def mask_allocation(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """An allocation row as this caller may see it: another team's is "other", unnamed."""
        out = dict(item)
        if not self.allows_namespace(out.get("namespace")):
            out["namespace"] = OTHER
            for key in ("pod", "container"):
                if key in out:
                    out[key] = None
        return out

    def union(self, other: Scope) -> Scope:
        def join(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
            return None if a is None or b is None else a | b

        return Scope(f"{self.name}+{other.name}", join(self.clusters, other.clusters),
                     join(self.namespaces, other.namespaces),
                     self.fleet_counts or other.fleet_counts)


FULL = Scope("unrestricted")


@dataclass(frozen=True)
class Caller:
    """Who a valid token belongs to: its scope, a name to show (the static token's name, the
    OIDC user), when the token stops being valid (epoch seconds; None: a static token, valid
    until removed from the file) and, for a static token, its sha256, so a session made from
    it can ask the tokens file again whether the token still exists."""

    scope: Scope
    name: str
    expires_at: float | None = None
    token_sha256: str | None = None
    #: who this is, whatever token they came with: ``token:NAME`` for a static token,
    #: ``oidc:SUBJECT`` for an OIDC one; sessions are capped per person (a fresh JWT of
    #: the same subject is the same person)
    person: str = ""


#: the caller of a service without access control (loopback, or --allow-unauthenticated)
ANONYMOUS = Caller(FULL, "")


def _names(value: Any, what: str, source: str) -> frozenset[str] | None:
    if value is None or value == "*" or value == ["*"]:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InputError(f"{source}: {what} must be a list of names or '*'")
    return frozenset(value)


def parse_scope(name: str, data: Any, source: str) -> Scope:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{source}: the scope of {name!r} must be a mapping")
    unknown = set(data) - {"clusters", "namespaces", "fleet_counts"}
    if unknown:
        raise InputError(f"{source}: unknown key(s) in the scope of {name!r}: "
                         f"{', '.join(sorted(unknown))}")
    fleet_counts = data.get("fleet_counts", True)
    if not isinstance(fleet_counts, bool):  # "no" in quotes is a true string
        raise InputError(f"{source}: fleet_counts of {name!r} must be true or false, not "
                         f"{brief_repr(fleet_counts)}")
    return Scope(name, _names(data.get("clusters"), "clusters", source),
                 _names(data.get("namespaces"), "namespaces", source), fleet_counts)


def _load_yaml(path: str | Path, key: str) -> list[dict[str, Any]]:
    # bounded and decoded here: a binary or alias-bomb file is an InputError, which a
    # running service's reload logs while it keeps the last good file
    data = load_yaml(path, f"{key} file {path}")
    entries = (data or {}).get(key, []) if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InputError(f"{path}: expected a mapping with a list '{key}:'")
    return entries


# -- static tokens ------------------------------------------------------------------------------
def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_entry(name: str, token: str, clusters: Iterable[str] = (),
                namespaces: Iterable[str] = ()) -> dict[str, Any]:
    scope: dict[str, Any] = {}
    if clusters:
        scope["clusters"] = sorted(clusters)
    if namespaces:
        scope["namespaces"] = sorted(namespaces)
    return {"name": name, "sha256": hash_token(token), "scope": scope or {"clusters": "*"}}


def load_tokens(path: str | Path) -> dict[str, Scope]:
    """sha256 hex -> scope. A clear-text token in the file is an error, not a convenience."""
    out: dict[str, Scope] = {}
    for entry in _load_yaml(path, "tokens"):
        name = entry.get("name")
        digest = str(entry.get("sha256", "")).lower()
        if not isinstance(name, str) or not name:
            raise InputError(f"{path}: every token needs a name")
        if "token" in entry or len(digest) != 64 or any(c not in "0123456789abcdef"
                                                         for c in digest):
            raise InputError(f"{path}: token {name!r} needs 'sha256:' (64 hex digits) and no "
                             "clear-text token (make one with `gpufleet serve token create`)")
        out[digest] = parse_scope(name, entry.get("scope"), str(path))
    return out


class TokenFile:
    """The tokens file, read again when it changes (a Secret update adds a team live)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._stamp: tuple[float, int] | None = None
        self._tokens: dict[str, Scope] = {}
        self._lock = threading.Lock()
        try:
            self._reload()
        except OSError as exc:
            raise InputError(f"cannot read the tokens file {path}: {exc.strerror}") from None

    def _reload(self) -> None:
        st = self.path.stat()
        stamp = (st.st_mtime, st.st_size)
        if stamp != self._stamp:
            self._tokens = load_tokens(self.path)
            self._stamp = stamp

    def lookup_sha256(self, digest: str) -> Scope | None:
        """The scope of the token with this sha256 in the file as it is now (None: gone)."""
        with self._lock:
            try:
                self._reload()
            except (OSError, InputError) as exc:  # keep the last good file
                log.warning("tokens file not reloaded: %s", exc)
            for known, scope in self._tokens.items():
                if hmac.compare_digest(known, digest):
                    return scope
        return None


def load_group_scopes(path: str | Path) -> dict[str, Scope]:
    """Scopes file: ``scopes: [{group: NAME, clusters: [...], namespaces: [...]}]``."""
    out: dict[str, Scope] = {}
    for entry in _load_yaml(path, "scopes"):
        group = entry.pop("group", None)
        if not isinstance(group, str) or not group:
            raise InputError(f"{path}: every scope needs a 'group'")
        out[group] = parse_scope(group, entry, str(path))
    return out


# -- OIDC -----------------------------------------------------------------------------------------
class JwksCache:
    """The issuer's signing keys by key id; fetched on first use and on an unknown key id."""

    def __init__(self, issuer: str, session: requests.Session, *, timeout: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.issuer = issuer.rstrip("/")
        self.session = session
        self.timeout = timeout
        self.clock = clock
        self._keys: dict[str, jwt.PyJWK] = {}
        self._jwks_uri: str | None = None
        self._fetched_at: float | None = None
        self._lock = threading.Lock()

    def _get(self, url: str) -> Any:
        r = self.session.get(url, timeout=self.timeout, allow_redirects=False)
        r.raise_for_status()
        return r.json()

    def _refresh(self) -> None:
        if self._jwks_uri is None:
            config = self._get(self.issuer + "/.well-known/openid-configuration")
            if str(config.get("issuer", "")).rstrip("/") != self.issuer:
                raise Unauthorized("the issuer's discovery document names another issuer")
            self._jwks_uri = str(config["jwks_uri"])
        keys = jwt.PyJWKSet.from_dict(self._get(self._jwks_uri))
        self._keys = {k.key_id: k for k in keys.keys if k.key_id}

    def warm(self) -> bool:
        """Fetch the keys now (at start-up), so a wrong issuer URL shows in the log at once
        rather than as 401s; False (and a warning) when the issuer cannot be reached."""
        with self._lock:
            self._fetched_at = self.clock()
            try:
                self._refresh()
            except (requests.RequestException, ValueError, KeyError, jwt.PyJWKError,
                    Unauthorized) as exc:
                log.warning("OIDC issuer %s: cannot fetch its keys yet (%s); tokens are "
                            "refused until it answers", self.issuer, type(exc).__name__)
                return False
        return True

    def key(self, kid: str) -> jwt.PyJWK:
        """The key with this id. A cached key is answered at once, without a lock: a refresh
        in flight (a stalled issuer, a stranger's random key id) never holds up callers whose
        key is known. An unknown id starts a refresh (at most one at a time, at most every
        MIN_REFRESH seconds); others asking for unknown ids meanwhile are refused, not
        queued behind it."""
        found = self._keys.get(kid)  # the dict is replaced whole by a refresh, never edited
        if found is not None:
            return found
        if not self._lock.acquire(blocking=False):
            raise Unauthorized("unknown signing key id (the issuer's keys are being fetched)")
        try:
            if kid not in self._keys and (self._fetched_at is None
                                          or self.clock() - self._fetched_at >= MIN_REFRESH):
                self._fetched_at = self.clock()  # a failed fetch waits its turn as well
                try:
                    self._refresh()
                except (requests.RequestException, ValueError, KeyError,
                        jwt.PyJWKError) as exc:  # Unauthorized (wrong issuer) passes through
                    raise Unauthorized(f"cannot fetch the issuer's keys: "
                                       f"{type(exc).__name__}") from None
            found = self._keys.get(kid)
        finally:
            self._lock.release()
        if found is None:
            raise Unauthorized("unknown signing key id")
        return found


class OidcVerifier:
    def __init__(self, issuer: str, audience: str, group_scopes: Mapping[str, Scope], *,
                 claim: str = "groups", session: requests.Session | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if session is None:
            session = requests.Session()
            session.trust_env = False  # no netrc or proxy variables deciding for us
        self.issuer = issuer.rstrip("/")
        self.audience = audience
        self.claim = claim
        self.group_scopes = dict(group_scopes)
        self.jwks = JwksCache(issuer, session, clock=clock)

    def verify(self, token: str) -> Scope:
        return self.identify(token).scope

    def identify(self, token: str) -> Caller:
        """The token's caller: scope from its groups, name from its user claims, and its
        expiry (a browser session made from it ends no later)."""
        try:
            header = jwt.get_unverified_header(token)
            kid = header.get("kid")
            if not isinstance(kid, str):
                raise Unauthorized("token without a key id")
            key = self.jwks.key(kid)
            claims = jwt.decode(token, key, algorithms=ALGORITHMS, audience=self.audience,
                                issuer=[self.issuer, self.issuer + "/"], leeway=LEEWAY,
                                options={"require": ["exp", "iss", "aud"]})
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"token rejected: {type(exc).__name__}") from None
        groups = claims.get(self.claim, [])
        if isinstance(groups, str):
            groups = [groups]
        scope: Scope | None = None
        for group in groups if isinstance(groups, list) else []:
            found = self.group_scopes.get(group) if isinstance(group, str) else None
            if found is not None:
                scope = found if scope is None else scope.union(found)
        if scope is None:
            # Authenticated, but no group of ours: sees nothing (403 everywhere but /healthz).
            scope = Scope(f"oidc:{claims.get('sub', '?')}", frozenset(), frozenset(), False)
        name = next((str(claims[k]) for k in ("preferred_username", "email", "sub")
                     if isinstance(claims.get(k), str) and claims[k]), scope.name)
        subject = claims.get("sub")
        person = f"oidc:{subject}" if isinstance(subject, str) and subject else f"oidc:{name}"
        return Caller(scope, name, float(claims["exp"]), person=person)


# -- the door -------------------------------------------------------------------------------------
@dataclass
class Authenticator:
    """Bearer token -> scope. With nothing configured every caller is unrestricted (the CLI only
    allows that on loopback or with --allow-unauthenticated)."""

    tokens: TokenFile | None = None
    oidc: OidcVerifier | None = None

    @property
    def enabled(self) -> bool:
        return self.tokens is not None or self.oidc is not None

    def bearer(self, authorization: str | None) -> Caller:
        """The caller of an ``Authorization: Bearer TOKEN`` header (everyone, unrestricted,
        when no access is configured)."""
        if not self.enabled:
            return ANONYMOUS
        if not authorization:
            raise Unauthorized("no bearer token")
        kind, _, token = authorization.partition(" ")
        if kind.lower() != "bearer":
            raise Unauthorized("malformed Authorization header")
        return self.identify(token)

    def identify(self, token: str) -> Caller:
        """A token as sent in a header or pasted into the sign-in form -> its caller; the one
        check both ways in go through."""
        token = token.strip()
        if not token or any(c.isspace() for c in token):
            raise Unauthorized("malformed token")
        if self.tokens is not None:
            digest = hash_token(token)
            scope = self.tokens.lookup_sha256(digest)
            if scope is not None:
                return Caller(scope, scope.name, token_sha256=digest,
                              person=f"token:{scope.name}")
        if self.oidc is not None and token.count(".") == 2:
            return self.oidc.identify(token)
        raise Unauthorized("unknown token")

    def still_valid(self, caller: Caller) -> Scope | None:
        """The caller's scope now: a static token removed from the file (or given another
        scope) takes its sessions with it; an OIDC token's scope holds until it expires."""
        if caller.token_sha256 is None:
            return caller.scope
        return self.tokens.lookup_sha256(caller.token_sha256) if self.tokens else None


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")

