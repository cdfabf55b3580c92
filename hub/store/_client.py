"""The one door to the hub store's Prometheus HTTP API: auth, TLS, timeouts, request counting.

We speak the HTTP API directly over a ``requests.Session`` rather than through
prometheus-api-client's ``PrometheusConnect``: that client drops Thanos ``warnings`` (a partial
response must fail a sync, not look healthy), puts POSTed queries in the URL, and wraps the
store's own error message in a repr. The session is the I/O seam: tests and the service hand in
their own (``session=``), exactly like an httpx transport; :meth:`HubClient.prometheus_connect`
gives report code a ``PrometheusConnect`` on the same session when DataFrames are wanted.

No secret (token, URL credentials, key) is ever part of an exception message or log line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

from hub.common import InputError, UnavailableError, shorten

TOKEN_ENV = "GPUFLEET_TOKEN"


class PromQLError(InputError):
    """The store rejected the query (HTTP 400/422): the user's PromQL is wrong. Exit 2."""


class HubUnavailable(UnavailableError):
    """The store could not answer: unreachable, 5xx, timeout, auth refused. Exit 3."""


class PartialResponse(UnavailableError):
    """The store answered with warnings (Thanos partial response): data may be missing."""


@dataclass
class QueryResult:
    result_type: str
    result: Any
    warnings: list[str] = field(default_factory=list)


def redact_url(url: str) -> str:
    """The URL without user:password, so it can appear in messages."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        parts = parts._replace(netloc=host)
    return urlunsplit(parts)


def _read_secret_file(path: str, what: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise InputError(f"cannot read {what} file {path}: {exc.strerror}") from None


@dataclass
class HubSettings:
    """How to reach the hub store; built from CLI options, environment or config file."""

    url: str
    token_file: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False
    timeout: float = 60.0

    def validate(self) -> None:
        if not self.url:
            raise InputError("no hub URL: pass --hub-url or set GPUFLEET_HUB_URL")
        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError as exc:
            raise InputError(f"invalid hub URL (--hub-url): {exc}") from None
        if not self.timeout > 0:
            raise InputError(f"--timeout must be greater than 0 (got {self.timeout:g}s)")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InputError(f"invalid hub URL {redact_url(self.url)!r}: expected http(s)://host[:port]")
        if bool(self.cert_file) != bool(self.key_file):
            raise InputError("--cert-file and --key-file must be given together")
        for path, what in ((self.ca_file, "CA"), (self.cert_file, "certificate"),
                           (self.key_file, "key")):
            if path and not Path(path).is_file():
                raise InputError(f"{what} file not found: {path}")
        self._check_tls_files()

    def _check_tls_files(self) -> None:
        """Load the CA and client certificate once here: a file that is not what its flag
        says is the user's input error (2), not a hub that cannot be reached (3)."""
        import ssl

        if self.ca_file:
            try:
                ssl.create_default_context(cafile=self.ca_file)
            except (ssl.SSLError, ValueError, OSError):
                raise InputError(f"--ca-file {self.ca_file} holds no PEM CA certificate") \
                    from None
        if self.cert_file and self.key_file:
            try:
                ssl.create_default_context().load_cert_chain(self.cert_file, self.key_file,
                                                            password=b"")
            except (ssl.SSLError, ValueError, OSError):
                raise InputError(f"--cert-file {self.cert_file} and --key-file {self.key_file} "
                                 "are not a matching PEM certificate and key") from None


def build_session(settings: HubSettings) -> requests.Session:
    """A session carrying the hub's auth and TLS settings."""
    session = requests.Session()
    token = None
    if settings.token_file:
        token = _read_secret_file(settings.token_file, "token")
    elif os.environ.get(TOKEN_ENV):
        token = os.environ[TOKEN_ENV].strip()
    if token:
        session.headers["Authorization"] = f"Bearer {token}"
    if settings.insecure_skip_verify:
        session.verify = False
        import urllib3

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    elif settings.ca_file:
        session.verify = settings.ca_file
    if settings.cert_file and settings.key_file:
        session.cert = (settings.cert_file, settings.key_file)
    session.headers["User-Agent"] = "gpufleet"
    return session


class HubClient:
    """Prometheus-API client for the hub store (Prometheus, Thanos Query, ACM query proxy)."""

    def __init__(self, url: str, *, session: requests.Session | None = None,
                 timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.session = session or requests.Session()
        self.timeout = timeout
        #: number of HTTP requests made: a sync records it, and it must not grow with the fleet
        self.requests = 0

    @classmethod
    def from_settings(cls, settings: HubSettings) -> HubClient:
        settings.validate()
        return cls(settings.url, session=build_session(settings), timeout=settings.timeout)

    @property
    def safe_url(self) -> str:
        return redact_url(self.url)

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> HubClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- API ------------------------------------------------------------------------------
    def query(self, promql: str, time: float | None = None) -> QueryResult:
        """Instant query. POSTed as a form so long PromQL never hits URL length limits."""
        data: dict[str, Any] = {"query": promql}
        if time is not None:
            data["time"] = f"{time:.3f}"
        return self._post("/api/v1/query", data)

    def query_range(self, promql: str, start: float, end: float, step: float) -> QueryResult:
        data = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return self._post("/api/v1/query_range", data)

    def prometheus_connect(self):  # -> prometheus_api_client.PrometheusConnect
        """prometheus-api-client on the same session, for DataFrame-based reporting."""
        from prometheus_api_client import PrometheusConnect

        return PrometheusConnect(self.url, session=self.session, disable_ssl=False)

    # -- transport ------------------------------------------------------------------------
    def _post(self, path: str, data: dict[str, Any]) -> QueryResult:
        for value in data.values():
            try:
                str(value).encode("utf-8")
            except UnicodeEncodeError:
                # A shell argument with bytes that are not UTF-8 arrives as surrogates.
                raise PromQLError("PromQL error: the expression holds bytes that are not "
                                  "valid UTF-8") from None
        self.requests += 1
        try:
            # verify/cert per request: requests lets REQUESTS_CA_BUNDLE in the environment
            # override a session's own `verify`, which would silently ignore --ca-file.
            resp = self.session.post(self.url + path, data=data, timeout=self.timeout,
                                     verify=self.session.verify, cert=self.session.cert)
        except requests.Timeout:
            raise HubUnavailable(
                f"hub {self.safe_url} did not answer within {self.timeout:g}s"
            ) from None
        except requests.exceptions.SSLError as exc:
            raise HubUnavailable(
                f"TLS error talking to hub {self.safe_url}: {_reason(exc)}"
            ) from None
        except requests.ConnectionError as exc:
            raise HubUnavailable(f"hub {self.safe_url} unreachable: {_reason(exc)}") from None
        except OSError as exc:  # e.g. unreadable client certificate
            raise HubUnavailable(
                f"cannot talk to hub {self.safe_url}: {exc.strerror or exc}"
            ) from None
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code in (400, 422) and isinstance(body, dict):
            raise PromQLError(f"PromQL error: {body.get('error') or resp.reason}")
        if resp.status_code in (401, 403):
            raise HubUnavailable(
                f"hub {self.safe_url} refused the request ({resp.status_code} {resp.reason}): "
                "check the token or client certificate"
            )
        if resp.status_code >= 400 or not isinstance(body, dict):
            detail = body.get("error") if isinstance(body, dict) else shorten(resp.text)
            raise HubUnavailable(
                f"hub {self.safe_url} answered {resp.status_code} {resp.reason}"
                + (f": {detail}" if detail else "")
            )
        if body.get("status") != "success":
            raise HubUnavailable(f"hub {self.safe_url} failed: {body.get('error', 'no detail')}")
        data_ = body.get("data") or {}
        return QueryResult(
            result_type=data_.get("resultType", ""),
            result=data_.get("result", []),
            warnings=list(body.get("warnings") or []),
        )


def _reason(exc: Exception) -> str:
    """A short reason without the request (which may carry credentials in the URL)."""
    text = str(exc.args[0]) if exc.args else str(exc)
    for marker in ("Connection refused", "Name or service not known", "timed out",
                   "certificate verify failed", "No route to host", "Connection reset",
                   "Remote end closed connection"):
        if marker in text:
            return marker.lower()
    ssl = re.search(r"\[SSL: [A-Z0-9_]+\] ([a-z0-9 ,_-]+)", text)
    if ssl:  # e.g. "wrong version number" (plain HTTP answered a TLS hello)
        return ssl.group(1).strip()
    inner = re.search(r"\(Caused by (\w+)\(", text)
    if inner:  # the cause's type, whole: never a message cut at its first colon
        return inner.group(1)
    return type(exc).__name__

